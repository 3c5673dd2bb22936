"""The daemon's change feed: one :class:`Change` per thing that changed, fanned out to every
subscriber (the socket's ``watch`` clients, the D-Bus faces).

Changes are published on the event loop, where every one of them is decided (a switch's
record and an ejection reach the loop from the worker before they are logged; leases and
overrides are made there). Each subscriber has a bounded queue of its own: publishing
never waits, and a subscriber that lets its queue fill is dropped (:attr:`Subscription.
dropped`, its iteration ends), so a slow reader can never hold the daemon back.

Kinds and their fields (``Change.fields``; the wire form is
:class:`schedswitchd.daemon.protocol.WatchEvent`):

- ``switch``: ``previous``, ``target``, ``ok``, ``result`` (``switched``, ``rolled_back``,
  ...), ``reason``, ``gap_ns`` (or ``None``), ``error`` (its message, or ``None``);
- ``ejection``: ``scheduler``, ``exit_kind``, ``reason``, ``message`` (the kernel's exit
  record), ``restart`` (the exit asked for a restart), ``backoff_s`` (``None`` on a restart);
- ``lease_added``: ``lease``, ``workload``, ``uid``, ``pid``;
- ``lease_ended``: ``lease``, ``workload``, ``uid`` (the lease's owner), ``why``;
- ``override``: ``override`` (a scheduler, ``kernel``, or ``None``: following hints),
  ``why``.

A subscription may have a ``viewer`` (a uid that is not an admin's): it then receives the
lease changes of other uids as ``{"hidden": True}`` only (:func:`visible_fields`), the same
rule as ``status``'s ``hidden_leases``: which user runs what, and when, is the holder's
business, but a watcher may still count the leases that decide what runs.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

#: A subscriber's queue bound, changes: beyond it the subscriber is dropped.
QUEUE_MAX = 256

KINDS = frozenset({"switch", "ejection", "lease_added", "lease_ended", "override"})

#: The kinds about one lease, carrying its owner's ``uid``.
LEASE_KINDS = frozenset({"lease_added", "lease_ended"})


@dataclass(frozen=True)
class Change:
    """One change: ``seq`` (1, 2, ... per daemon run: a gap tells a subscriber it missed
    some), ``time`` (wall clock, s since the epoch), ``kind`` (:data:`KINDS`) and its
    ``fields`` (see the module docstring)."""

    seq: int
    time: float
    kind: str
    fields: dict[str, Any] = field(default_factory=dict)


def visible_fields(change: Change, viewer: int | None) -> dict[str, Any]:
    """``change``'s fields as ``viewer`` may see them: all of them for ``None`` (an admin,
    the daemon's own faces) and for every kind but a lease's; a lease change of a uid other
    than ``viewer`` is ``{"hidden": True}`` (no lease id, workload, uid, pid or reason)."""
    if viewer is None or change.kind not in LEASE_KINDS or change.fields.get("uid") == viewer:
        return change.fields
    return {"hidden": True}


class Subscription:
    """One subscriber's queue of changes. Iterate it (``async for``) or :meth:`get`; the
    iteration ends when it is closed or dropped (:attr:`dropped`: its queue filled).
    ``viewer``: whose lease changes it sees in full (:func:`visible_fields`)."""

    def __init__(self, feed: ChangeFeed, maxsize: int, viewer: int | None = None) -> None:
        self._feed = feed
        self.maxsize = maxsize
        self.viewer = viewer
        self._queue: deque[Change] = deque()
        self._ready = asyncio.Event()
        self.closed = False
        #: True when it was dropped for falling :attr:`maxsize` changes behind.
        self.dropped = False

    def _put(self, change: Change) -> None:
        if self.closed:
            return
        if len(self._queue) >= self.maxsize:
            self.dropped = True
            self.close()
            return
        self._queue.append(change)
        self._ready.set()

    async def get(self) -> Change | None:
        """The next change; ``None`` once closed or dropped (what was queued before a
        close is still given; a dropped subscriber's queue is discarded)."""
        while not self._queue:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        if self.dropped:
            return None
        return self._queue.popleft()

    def view(self, change: Change) -> dict[str, Any]:
        """``change``'s fields as this subscriber may see them (:func:`visible_fields`)."""
        return visible_fields(change, self.viewer)

    def close(self) -> None:
        """Stop receiving; a waiting :meth:`get` returns ``None``."""
        if self.closed:
            return
        self.closed = True
        if self.dropped:
            self._queue.clear()
        self._feed._subscribers.discard(self)
        self._ready.set()

    async def __aiter__(self) -> AsyncIterator[Change]:
        while (change := await self.get()) is not None:
            yield change


class ChangeFeed:
    """Publishes :class:`Change` s to subscribers; ``clock``: wall-clock seconds."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._seq = itertools.count(1)
        self._subscribers: set[Subscription] = set()
        #: Subscribers dropped for a full queue since the start.
        self.dropped = 0
        #: The ``seq`` of the last change published (0: none yet).
        self.last_seq = 0

    def publish(self, kind: str, **fields: Any) -> Change:
        """Publish a change of ``kind`` (:data:`KINDS`) with ``fields`` to every subscriber;
        on the event loop. Never waits."""
        if kind not in KINDS:
            raise ValueError(f"unknown change kind {kind!r}")
        change = Change(next(self._seq), self.clock(), kind, fields)
        self.last_seq = change.seq
        for sub in list(self._subscribers):
            sub._put(change)
            if sub.dropped:
                self.dropped += 1
        return change

    def subscribe(self, maxsize: int = QUEUE_MAX, viewer: int | None = None) -> Subscription:
        """A new subscription, receiving changes published from now on; ``viewer``: a uid
        that sees only its own lease changes in full, or ``None`` for every one."""
        sub = Subscription(self, maxsize, viewer)
        self._subscribers.add(sub)
        return sub

    @property
    def subscribers(self) -> int:
        """How many subscriptions are open."""
        return len(self._subscribers)
