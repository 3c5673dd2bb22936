"""Prepared standbys: schedulers loaded into the kernel ahead of need, everything but the link.

A switch's prepare phase (open, CO-RE, program verification, maps and their contents, the
struct_ops value) is most of what a switch costs and none of it needs the old scheduler
gone. A standby is a scheduler whose prepare already ran: switching to it is the kernel's
part alone (detach the old link, create the new one). What to hold is the daemon's policy
(:meth:`schedswitchd.daemon.reconcile.Reconciler` asks for launcher intents first, then the
configured default, then the scheduler of the most recent hint); this module keeps the pool
bounded (``[standby] max`` entries, ``max_kernel_bytes`` of kernel memory as the kernel
accounts it: the ``memlock`` of every map and program, from ``/proc/self/fdinfo``) and true:
an entry whose object file, configuration or the kernel facts it was prepared against
(module set, ``hotplug_seq``) changed is dropped at the next look, not attached; for a
scheduler with a profile also its profile file and the CPU topology its values were
computed from (a changed profile file, or a CPU going on- or offline, drops the entry and
the next fill prepares it again).

A standby costs kernel memory and, for objects with kfuncs in modules, holds those modules'
references (``rmmod`` of such a module fails while it is held): ``status`` shows both the
bytes and the entries.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from schedswitchd.daemon.backend import Prepared, SchedulerBackend
from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.prepare_guard import prepare_checked
from schedswitchd.errors import SchedSwitchError

log = logging.getLogger("schedswitchd")

#: After a standby's prepare fails, the pool tries it again no sooner than this (s), then
#: twice as long after each further failure, up to :data:`RETRY_MAX_S`. The daemon's
#: safety-net pass asks for its standbys every second: without the hold, a scheduler that
#: cannot be prepared (no sched_ext in this kernel, a verifier rejection, a missing module
#: BTF) was prepared again, and a warning logged, every second for as long as it was wanted.
RETRY_BASE_S = 10.0
RETRY_MAX_S = 600.0


def _file_key(path: str) -> tuple[int, int, int, int] | None:
    """``(dev, inode, size, mtime ns)`` of ``path`` (symlinks followed), ``None`` if absent:
    a rebuilt object ends a failed standby's hold."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class _Failure:
    """A standby whose prepare failed: what it was tried with, and when to try again."""

    spec: SchedulerConfig
    file_key: tuple[int, int, int, int] | None
    message: str
    count: int
    retry_at_ns: int


class StandbyError(SchedSwitchError):
    """A scheduler a launcher announced cannot be held as a standby (its prepare failed,
    or the pool's bounds leave no room for it)."""

    code = "standby"


@dataclass
class StandbyEntry:
    """One held scheduler: ``prepared`` is the backend's handle (never attached while here);
    ``reason``: why it is held (``intent``, ``default``, ``recent``); ``kernel_bytes``: its
    kernel memory (bytes); ``prepared_ns``: how long its prepare took (ns); ``since``: wall
    clock (unix s) when it was made."""

    name: str
    spec: SchedulerConfig
    prepared: Prepared
    reason: str
    kernel_bytes: int
    prepared_ns: int
    since: float = field(default_factory=time.time)


class StandbyPool:
    """At most ``max_entries`` standbys holding at most ``max_kernel_bytes`` together.

    Uses the backend's ``prepare``/``discard`` and its ``fresh(prepared, spec)`` (is the
    handle what ``prepare`` would make now?) and ``kernel_bytes(prepared)``.

    Not thread-safe: the switcher's worker thread is its only user. ``hits``: switches
    served from the pool; ``misses``: switches that had to prepare; ``dropped_stale``:
    entries dropped because their inputs changed; ``failures``: standby prepares that
    failed (each logged). A scheduler whose prepare failed is not prepared again for
    :data:`RETRY_BASE_S` seconds, doubling with each further failure up to
    :data:`RETRY_MAX_S`, unless its configuration or its object file changes first (a
    loaded module is not watched here: the hold bounds the wait). While it is held back,
    :meth:`fill` returns ``None`` at once and ``last_error`` gives the last failure with
    the time of the next try. ``clock``: monotonic ns (tests pass their own).
    """

    def __init__(
        self,
        backend: SchedulerBackend,
        max_entries: int,
        max_kernel_bytes: int,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.backend = backend
        self.max_entries = max_entries
        self.max_kernel_bytes = max_kernel_bytes
        self.clock = clock
        self.entries: OrderedDict[str, StandbyEntry] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.dropped_stale = 0
        self.failures = 0
        self.last_error: tuple[str, str] | None = None
        self._failed: dict[str, _Failure] = {}

    def __iter__(self) -> Iterator[StandbyEntry]:
        return iter(list(self.entries.values()))

    @property
    def kernel_bytes(self) -> int:
        """Kernel memory all entries hold, bytes."""
        # list() first: status reads this on the event loop while the worker may change it.
        return sum(e.kernel_bytes for e in list(self.entries.values()))

    def take(self, name: str, spec: SchedulerConfig) -> Prepared | None:
        """The held handle for ``name`` if it is still fresh for ``spec`` (removed from the
        pool: the caller attaches or discards it), else ``None`` (a stale one is
        discarded). Counts a hit or a miss."""
        entry = self.entries.pop(name, None)
        if entry is not None:
            # The configuration entry it was filled from is usually the very object asked
            # for: no field-by-field comparison then (a standby hit's path).
            same = entry.spec is spec or entry.spec == spec
            # quick: a hit waits for this; the refill rounds (fill, prune) check in full.
            if same and self.backend.fresh(entry.prepared, spec, quick=True):
                self.hits += 1
                return entry.prepared
            self._discard(entry, "stale")
        self.misses += 1
        return None

    def drop(self, name: str, why: str) -> None:
        """Discard ``name``'s entry, if any."""
        entry = self.entries.pop(name, None)
        if entry is not None:
            self._discard(entry, why)

    def clear(self, why: str) -> None:
        """Discard every entry."""
        for name in list(self.entries):
            self.drop(name, why)

    def prune(self, wanted: dict[str, SchedulerConfig]) -> None:
        """Drop entries not in ``wanted`` (name -> spec) and those whose inputs changed."""
        for entry in list(self.entries.values()):
            if wanted.get(entry.name) != entry.spec:
                self.drop(entry.name, "no longer wanted")
            elif not self.backend.fresh(entry.prepared, entry.spec):
                self.dropped_stale += 1
                self.drop(entry.name, "its object, configuration or kernel changed")

    def fill(self, name: str, spec: SchedulerConfig, reason: str) -> StandbyEntry | None:
        """Make sure ``name`` is held (prepared now if it is not, or not fresh). Returns the
        entry, or ``None`` when its prepare failed or it does not fit the byte bound; entries
        beyond ``max_entries`` are evicted oldest first. Never raises a
        :class:`SchedSwitchError`."""
        if self.max_entries <= 0:
            return None
        entry = self.entries.get(name)
        if entry is not None and entry.spec == spec and self.backend.fresh(entry.prepared, spec):
            entry.reason = reason
            self.entries.move_to_end(name)
            return entry
        self.drop(name, "replaced")
        failed = self._failed.get(name)
        file_key = _file_key(spec.object)
        if failed is not None and (failed.spec != spec or failed.file_key != file_key):
            failed = None  # its inputs changed: a fresh start
        now = self.clock()
        if failed is not None and now < failed.retry_at_ns:
            wait_s = (failed.retry_at_ns - now) / 1e9
            self.last_error = (
                name,
                f"{failed.message} (failed {failed.count} time(s); next try in {wait_s:.0f} s)",
            )
            return None
        start = time.perf_counter_ns()
        try:
            prepared = prepare_checked(self.backend, name, spec)
        except SchedSwitchError as exc:
            self.failures += 1
            count = failed.count + 1 if failed is not None else 1
            hold_s = min(RETRY_BASE_S * 2 ** (count - 1), RETRY_MAX_S)
            self._failed[name] = _Failure(
                spec, file_key, str(exc), count, self.clock() + int(hold_s * 1e9)
            )
            self.last_error = (name, str(exc))
            log.warning(
                "standby %s not prepared: %s (next try in %.0f s)",
                name,
                exc,
                hold_s,
                extra={"SCHEDULER": name},
            )
            return None
        self._failed.pop(name, None)
        entry = StandbyEntry(
            name,
            spec,
            prepared,
            reason,
            self.backend.kernel_bytes(prepared),
            time.perf_counter_ns() - start,
        )
        if entry.kernel_bytes > self.max_kernel_bytes:
            log.info(
                "standby %s not kept: it holds %d bytes of kernel memory, more than "
                "[standby] max_kernel_bytes = %d",
                name,
                entry.kernel_bytes,
                self.max_kernel_bytes,
            )
            self.backend.discard(prepared)
            return None
        self.entries[name] = entry
        while len(self.entries) > self.max_entries or self.kernel_bytes > self.max_kernel_bytes:
            oldest = next(iter(self.entries))
            self.drop(oldest, "evicted for a newer standby")
        return self.entries.get(name)

    def _discard(self, entry: StandbyEntry, why: str) -> None:
        log.debug("standby %s dropped: %s", entry.name, why)
        self.backend.discard(entry.prepared)
