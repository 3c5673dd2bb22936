"""The garbage of closed connections, collected in bounded batches and when idle.

CPython 3.11's selector transport keeps a bound method of itself (``_read_ready_cb``), so
every closed connection's transport and socket objects stay as cyclic garbage until a full
collection, which the default thresholds run rarely; under a flood they pile up into
allocator arenas that stay resident once a few survivors are scattered over them
(docs/performance.md, "Memory"). The :class:`ConnectionCollector` collects after every
:data:`COLLECT_EVERY` closed connections, and :data:`COLLECT_IDLE_DELAY_S` after the last
one closed while no switch is under way; the C heap's free pages are then trimmed on the
switch worker.

A full collection walks every object the collector tracks, and most of the serving
daemon's are its imports' (modules, classes, functions): one holds the event loop -- and a
hint that comes meanwhile -- for all of that walk. :func:`freeze_startup_objects` moves
what the serving daemon's imports made out of the collector's reach (``gc.freeze``), so
later collections walk only what came after (docs/performance.md, "Memory").
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable
from concurrent.futures import Executor

from schedswitchd.daemon.memory_tuning import trim_heap
from schedswitchd.daemon.timer import Cancellable, Timer

#: Closed connections after which their cyclic garbage is collected.
COLLECT_EVERY = 128
#: ... or fewer, once no connection is left ...
COLLECT_IDLE = 8
#: ... and then this long after (s), with no connection and no switch under way: run in the
#: close itself, the collection blocked the loop (a hint profile in the VM showed it) right
#: when a launcher's hint followed its status or prepare request (docs/performance.md,
#: "Memory"). The default of ``Server(collect_idle_delay_s=...)``.
COLLECT_IDLE_DELAY_S = 0.5


#: How many objects :func:`freeze_startup_objects` froze (0 until it ran).
_frozen = 0


def freeze_startup_objects() -> int:
    """Collect the start-up's garbage, then have every object left ignored by later
    collections (``gc.freeze()``, CPython's ``gc`` module: they move to its permanent
    generation); returns how many were frozen (``gc.get_freeze_count()``). For the serving
    daemon once its imports are done and before it builds its state: modules, classes and
    functions live as long as the process. A cycle of frozen objects that becomes garbage
    later is never collected (reference counting still frees everything else), so this is
    not for a process that goes on to drop what it had made before the call (a test
    run)."""
    global _frozen
    gc.collect()
    gc.freeze()
    _frozen = gc.get_freeze_count()
    return _frozen


def frozen_objects() -> int:
    """How many objects :func:`freeze_startup_objects` froze, 0 if it did not run: the
    count taken then, since ``gc.get_freeze_count()`` walks the whole frozen list (CPython
    3.11's ``gc_list_size``), too slow for every ``status`` (docs/performance.md,
    "``schedswitchctl status``")."""
    return _frozen


class ConnectionCollector:
    """Counts closed connections (:meth:`closed`) and collects their garbage. ``timer``:
    where the idle collection is armed (called each time: the server's is set when it
    starts); ``in_use``: True when the idle collection is not due any more (a connection
    is open again or a client waits to be accepted, or the server stops: a later close
    arms it again); ``busy``: True while a switch is under way (the collection then waits
    ``idle_delay_s`` more); ``worker``: where the heap trim runs; ``idle_delay_s``:
    :data:`COLLECT_IDLE_DELAY_S`. On the event loop."""

    def __init__(
        self,
        timer: Callable[[], Timer],
        in_use: Callable[[], bool],
        busy: Callable[[], bool],
        worker: Executor,
        idle_delay_s: float = COLLECT_IDLE_DELAY_S,
    ) -> None:
        self.timer = timer
        self.in_use = in_use
        self.busy = busy
        self.worker = worker
        self.idle_delay_s = idle_delay_s
        self._closed = 0
        self._due: Cancellable | None = None

    def closed(self, left: int) -> None:
        """A connection closed; ``left`` connections are still open."""
        self._closed += 1
        if self._closed >= COLLECT_EVERY:
            self.collect()
        elif not left and self._closed >= COLLECT_IDLE:
            self._collect_when_idle()

    def cancel(self) -> None:
        """No idle collection any more (the server is stopping)."""
        if self._due is not None:
            self._due.cancel()
            self._due = None

    def _collect_when_idle(self) -> None:
        """:meth:`collect` ``idle_delay_s`` from now (again from now if one was due), if
        then nothing is in use and no switch is under way."""
        if self._due is not None:
            self._due.cancel()
        timer = self.timer()
        self._due = timer.call_at(timer.time() + self.idle_delay_s, self._idle_collect)

    def _idle_collect(self) -> None:
        self._due = None
        if self.in_use() or self._closed == 0:
            return
        if self.busy():
            self._collect_when_idle()
            return
        self.collect()

    def collect(self) -> None:
        """Free closed connections now and give their memory back (see the module
        docstring): a full collection, then the C heap's trim on the worker."""
        self._closed = 0
        gc.collect()
        with contextlib.suppress(RuntimeError):  # the worker was shut down
            asyncio.get_running_loop().run_in_executor(self.worker, trim_heap)
