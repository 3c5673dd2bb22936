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
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.errors import SchedSwitchError

if TYPE_CHECKING:  # the switcher imports this module
    from schedswitchd.daemon.switcher import Prepared, SchedulerBackend

log = logging.getLogger("schedswitchd")


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
    failed (the error is also logged; the pool does not retry a failing one until its
    inputs change or it is asked again).
    """

    def __init__(self, backend: SchedulerBackend, max_entries: int, max_kernel_bytes: int) -> None:
        self.backend = backend
        self.max_entries = max_entries
        self.max_kernel_bytes = max_kernel_bytes
        self.entries: OrderedDict[str, StandbyEntry] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.dropped_stale = 0
        self.failures = 0
        self.last_error: tuple[str, str] | None = None

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
            if entry.spec == spec and self.backend.fresh(entry.prepared, spec):
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
        start = time.perf_counter_ns()
        try:
            prepared = self.backend.prepare(name, spec)
        except SchedSwitchError as exc:
            self.failures += 1
            self.last_error = (name, str(exc))
            log.warning("standby %s not prepared: %s", name, exc, extra={"SCHEDULER": name})
            return None
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
