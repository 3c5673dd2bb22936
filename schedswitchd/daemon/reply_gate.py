"""The reply gate: a switch's worker waits for the replies its new scheduler released.

A hint waits for its switch only until the kernel runs the new scheduler; then its reply
goes out while the switch still has work left (the switch window's end, pins, freeing the
old scheduler). On a machine with few cores that work, done at once, shares the CPU (and
the GIL) with the replies and with their clients reading them. So the one rule a
:class:`ReplyGate` keeps: **the switch's worker goes on once every reply its switch
released has been written and each of their clients has read it from its socket** --
each wait bounded, so that a reply never written or a client that never reads holds the
switch no longer than its bound.

Threads: a gate is made and fed on the event loop (:meth:`ReplyGate.sent`,
:meth:`ReplyGate.release`, :meth:`ReplyGate.untaken`) and waited on by the switch's worker
thread (:meth:`ReplyGate.wait`). The count and the sockets are touched on the loop only;
the worker reads the sockets only after it saw the written event set, and the loop adds
none after setting it.

"Taken" is read with ``SIOCOUTQ``
(:func:`~schedswitchd.cpython_internals.unread_bytes`): for a Unix stream socket what was
written stays charged to the sender until the receiver has read it (``unix(7)``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from schedswitchd.cpython_internals import unread_bytes

#: How often a wait for clients to take their replies looks at their sockets, s.
REPLY_TAKEN_POLL_S = 0.002


class ReplyGate:
    """The replies one switch released and the sockets they were written to. Closed when
    made (a worker that waits, waits); the loop says how many replies it holds
    (:meth:`expect`), and each written one is counted off (:meth:`sent`). See the module
    docstring for who calls what."""

    __slots__ = ("_pending", "_socks", "_written")

    def __init__(self) -> None:
        self._pending = 0
        self._written = threading.Event()
        #: Connected ``AF_UNIX`` stream sockets (or asyncio's views of them) the released
        #: replies were written to.
        self._socks: list[Any] = []

    def expect(self, replies: int) -> None:
        """On the loop: the switch released ``replies`` replies; with none the gate opens
        now."""
        self._pending = replies
        if replies <= 0:
            self._written.set()

    @property
    def written(self) -> bool:
        """Every released reply was written, or the gate was released."""
        return self._written.is_set()

    @property
    def sockets(self) -> tuple[Any, ...]:
        """The sockets the released replies were written to (complete once
        :attr:`written`)."""
        return tuple(self._socks)

    def sent(self, sock: Any | None) -> bool:
        """On the loop: one released reply was written to ``sock`` (``None``: its
        connection has no socket any more, nothing to wait for there). True when that was
        the last one: the written event is set now, and the gate takes no more sockets."""
        if self._written.is_set():
            return False
        if sock is not None:
            self._socks.append(sock)
        self._pending -= 1
        if self._pending > 0:
            return False
        self._written.set()
        return True

    def release(self) -> None:
        """On the loop: stop holding the worker whatever the count says (a later switch's
        gate replaces this one, or none of its replies will come)."""
        self._written.set()

    def untaken(self) -> list[Any]:
        """On the loop, once written: the sockets whose reply their client has not read
        yet (all of it: a partly read reply counts as not taken)."""
        return [sock for sock in self._socks if unread_bytes(sock)]

    def wait(self, written_s: float, taken_s: float) -> bool:
        """On the worker: until every reply was written (at most ``written_s`` s), then
        until their clients read them (at most ``taken_s`` s more, looked at every
        :data:`REPLY_TAKEN_POLL_S` s). True if both happened within their bounds."""
        if not self._written.wait(written_s):
            return False
        socks = list(self._socks)  # complete: the event is set
        deadline = time.monotonic() + taken_s
        while any(unread_bytes(sock) for sock in socks):
            if time.monotonic() >= deadline:
                return False
            time.sleep(REPLY_TAKEN_POLL_S)
        return True
