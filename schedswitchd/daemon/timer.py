"""Where the daemon's timeouts are scheduled: a clock and a way to call back at a time.

The server arms connection timeouts and lease TTLs on a :class:`Timer`, the reconciler its
safety-net poll. In the daemon it is the event loop (:class:`LoopTimer`); host tests give one
whose clock moves only when they say, so a timeout is tested without waiting for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol


class Cancellable(Protocol):
    """A scheduled call that can be called off (:class:`asyncio.TimerHandle`)."""

    def cancel(self) -> None:
        """Do not run the call (no effect once it ran)."""


class Timer(Protocol):
    """Where the server's timeouts (and the reconciler's safety-net poll) are scheduled:
    ``time()`` is now in seconds on a monotonic
    clock, ``call_at(when, callback, *args)`` runs ``callback(*args)`` on the event loop's
    thread once ``time()`` reaches ``when``. An :class:`asyncio.AbstractEventLoop` is one
    (through :class:`LoopTimer`); tests use one that moves only when they say."""

    def time(self) -> float:
        """Now, seconds (monotonic)."""
        ...

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> Cancellable:
        """Run ``callback(*args)`` at ``when`` (seconds on :meth:`time`'s clock)."""
        ...


class LoopTimer:
    """:class:`Timer` of the running event loop (``loop.time``, ``loop.call_at``)."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def time(self) -> float:
        """``loop.time()``: seconds on the monotonic clock."""
        return self._loop.time()

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> Cancellable:
        """``loop.call_at(when, callback, *args)``."""
        return self._loop.call_at(when, callback, *args)
