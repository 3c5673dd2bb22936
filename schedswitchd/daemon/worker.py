"""The switcher's one worker thread, which knows whether it is idle and may hold one call.

Switching runs on one thread, so switches are serialised and the event loop never blocks on
the kernel (:mod:`schedswitchd.daemon.reconcile`). A standby hit's first half may run on
the loop instead while this worker is :attr:`SwitchWorker.idle`
(:mod:`schedswitchd.daemon.direct_switch`), and its second half is then *held*
(:meth:`SwitchWorker.hold`): the worker thread is not woken for it until the hit's reply
is out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")


class SwitchWorker(ThreadPoolExecutor):
    """The switcher's one thread, which knows whether it is :attr:`idle`: no call
    submitted to it is queued, held or running. Only the event loop submits (passes,
    refills, heap trims, direct switches), so an idle worker stays idle for as long as the
    loop does not give up its turn: the loop may then use the switcher itself.

    One call may be *held* (:meth:`hold`): not yet submitted -- the worker thread is not
    woken for it --, but submitted ahead of any other (:meth:`submit` releases it first),
    so it is the worker's next call whenever it goes: at :meth:`release`, or before the
    next submission, whichever comes first. Held, release and submit on the loop only."""

    def __init__(self) -> None:
        super().__init__(1, thread_name_prefix="switcher")
        self._pending = 0
        self._count = threading.Lock()
        self._held: Callable[[], object] | None = None

    def hold(self, submit_it: Callable[[], object]) -> None:
        """Keep ``submit_it`` (which submits the held call to this worker) until
        :meth:`release` or the next :meth:`submit`; the worker counts as busy meanwhile.
        A call held already is released first."""
        self.release()
        with self._count:
            self._pending += 1
        self._held = submit_it

    @property
    def holding(self) -> bool:
        """A call is held (:meth:`hold`), not yet submitted."""
        return self._held is not None

    def release(self) -> None:
        """Submit the held call now, if any (its own errors propagate)."""
        submit_it, self._held = self._held, None
        if submit_it is None:
            return
        try:
            submit_it()
        finally:
            self._gone()

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        """Run ``fn(*args, **kwargs)`` on the worker after a held call, if any (released
        first); the worker counts as busy until it returned."""
        if self._held is not None:
            self.release()  # the held call goes first
        with self._count:
            self._pending += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._gone()
            raise
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[Any]) -> None:
        self._gone()

    def _gone(self) -> None:
        with self._count:
            self._pending -= 1

    @property
    def idle(self) -> bool:
        """No call is queued or running on the worker."""
        return self._pending == 0
