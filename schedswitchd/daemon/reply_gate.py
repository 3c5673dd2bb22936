"""The reply gate: a switch's worker waits for the replies its new scheduler released.

A hint waits for its switch only until the kernel runs the new scheduler; then its reply
goes out while the switch still has work left (the switch window's end, pins, freeing the
old scheduler). On a machine with few cores that work, done at once, shares the CPU (and
the GIL) with the replies and with their clients reading them. So the one rule a
:class:`ReplyGate` keeps: **the switch's worker goes on once each reply its switch
released has been taken by its client** -- bounded by the worker's wait, so that a reply
never written holds the switch no longer than that.

"Taken" is the connection's to judge (:class:`~schedswitchd.daemon.connection.Connection`:
it looks at its socket with ``SIOCOUTQ`` until its client read the reply, at most
``reply_taken_wait_s``, doing nothing else meanwhile); it reports each such reply once
(:meth:`ReplyGate.taken`, through ``Reconciler.reply_sent``). The gate only counts.
Right after such a reply's write the connection gives way (:func:`give_way`), so that its
client can read before the daemon's loop goes on.

Threads: a gate is made and fed on the event loop (:meth:`ReplyGate.expect`,
:meth:`ReplyGate.taken`, :meth:`ReplyGate.release`) and waited on by the switch's worker
thread (:meth:`ReplyGate.wait`).
"""

from __future__ import annotations

import os
import threading


def give_way() -> None:
    """After writing a reply its client waits for: give up the CPU, so that the client the
    write woke can read it before this thread's work after the write (the connection's
    parking, the switch's bookkeeping). ``sched_yield(2)``: the thread goes behind the
    tasks waiting for its CPU -- by ``sched(7)`` for the real-time policies, and in
    practice also in the kernel's fair class and in sched_ext, whose default yield ends
    the task's slice and queues it again through the running BPF scheduler's ``enqueue``
    (so the order then is that scheduler's). With nothing waiting the call returns at
    once. It pays where the client waits for the daemon's CPU: a machine whose CPUs are
    all busy, or an emulated VM whose one host thread runs every CPU in turn
    (docs/performance.md, "Standby hit"). ``tests/daemon/test_reply_gate.py`` holds the
    kernel's side for ``SCHED_FIFO``."""
    os.sched_yield()


class ReplyGate:
    """The replies one switch released, counted off as their clients take them. Closed when
    made (a worker that waits, waits); the loop says how many replies it holds
    (:meth:`expect`), and each taken one is counted off (:meth:`taken`). See the module
    docstring for who calls what."""

    __slots__ = ("_pending", "_taken")

    def __init__(self) -> None:
        self._pending = 0
        self._taken = threading.Event()

    def expect(self, replies: int) -> None:
        """On the loop: the switch released ``replies`` replies; with none the gate opens
        now."""
        self._pending = replies
        if replies <= 0:
            self._taken.set()

    @property
    def open(self) -> bool:
        """Every released reply was taken, or the gate was released."""
        return self._taken.is_set()

    def taken(self) -> bool:
        """On the loop: one released reply was taken by its client (or its wait for that
        ended: see the module docstring). True when that was the last one: the gate is
        open now."""
        if self._taken.is_set():
            return False
        self._pending -= 1
        if self._pending > 0:
            return False
        self._taken.set()
        return True

    def release(self) -> None:
        """On the loop: stop holding the worker whatever the count says (a later switch's
        gate replaces this one, or none of its replies will come)."""
        self._taken.set()

    def wait(self, timeout_s: float) -> bool:
        """On the worker: until every released reply was taken, at most ``timeout_s`` s.
        True if that happened in time."""
        return self._taken.wait(timeout_s)
