"""A standby hit: the hint whose scheduler the pool holds prepared, switched without a pass.

The same policy decides as in a reconcile pass; when it picks the held scheduler for the
hint's own lease, the worker is idle and the running scheduler keeps an exit record
(:meth:`DirectSwitch.standby_hit`), the event loop itself does the switch's first half
(:meth:`DirectSwitch.switch`: the pool's take, the switch window, ``BPF_LINK_DETACH`` of
the old scheduler, ``BPF_LINK_CREATE`` of the new one and its confirmation; the loop
blocks for the no-scheduler gap and a few ms) and the hint is answered in that same loop
step. The second half (the old scheduler's exit record -- which tells whether the kernel
had ejected it before the detach --, pin, freeing it) runs on the worker, held there
(:meth:`~schedswitchd.daemon.worker.SwitchWorker.hold`) until the client took its reply
(:class:`~schedswitchd.daemon.reply_gate.ReplyGate`); then the reconciler does the pass's
bookkeeping and a pass follows (log line, backoff, deadline, ``STATUS=``, refill).

There is one path for a standby hit. A hint that is not eligible -- the worker busy (a
refill, a heap trim), a running scheduler without an exit record, none of ours running --
kicks a normal pass, which takes the held standby too (``docs/performance.md``, "Standby
hit", has the figure that kept the loop's path and removed the worker's one).

The reconciler is reached only through :class:`HitHost`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from schedswitchd.daemon.config import KERNEL, Config, SchedulerConfig
from schedswitchd.daemon.policy import Decision, Lease, Policy
from schedswitchd.daemon.protocol import SwitchInfo
from schedswitchd.daemon.reply_gate import ReplyGate
from schedswitchd.daemon.switcher import PendingSwitch, Switcher
from schedswitchd.daemon.worker import SwitchWorker

log = logging.getLogger("schedswitchd")


class HitHost(Protocol):
    """What a :class:`DirectSwitch` asks of the reconciler that owns it: the only names it
    uses of it (the daemon's :class:`~schedswitchd.daemon.reconcile.Reconciler`)."""

    @property
    def config(self) -> Config:
        """The configuration in force (its schedulers' entries)."""
        ...

    @property
    def in_pass(self) -> bool:
        """A reconcile pass is deciding or switching (a hit then stays out)."""
        ...

    reply_wait_s: float

    def clock(self) -> int:
        """Monotonic ns, the clock of every decision."""
        ...

    def kick(self) -> None:
        """Have the reconcile task look again."""
        ...

    async def settle_records(self, *, early: bool = False) -> tuple[list[SwitchInfo], bool]:
        """Until the pass covering changes so far ran its switch (``early``): its records."""
        ...

    def hit_claimed(self, target: str) -> None:
        """A hint's lease takes the direct path to ``target``, as a pass would decide it."""
        ...

    def hit_finished(
        self, record: SwitchInfo | None, gone: tuple[SwitchInfo, int] | None, target: str
    ) -> None:
        """The pass's bookkeeping after the hit's switch (``record``, or ``None`` when it
        ended without one) and the old scheduler's ejection it found (``gone``); then a
        pass."""
        ...

    def gate_for_replies(self, gate: ReplyGate | None) -> None:
        """``gate`` counts the replies written from now on."""
        ...


@dataclass
class _Finished:
    """What the worker's second half returns: the switch's record (final) and the old
    scheduler's ejection its exit record showed, if any."""

    record: SwitchInfo
    gone: tuple[SwitchInfo, int] | None


class DirectSwitch:
    """The standby hit of one reconciler (``host``), over its ``policy``, ``switcher`` and
    ``worker``. On the event loop only, but for the held second half on the worker."""

    def __init__(
        self, host: HitHost, policy: Policy, switcher: Switcher, worker: SwitchWorker
    ) -> None:
        self.host = host
        self.policy = policy
        self.switcher = switcher
        self.worker = worker
        #: A direct switch is under way: from its first half to its bookkeeping.
        self.active = False
        #: What the policy decided in the last :meth:`standby_hit` that asked it, and when
        #: (``clock`` ns): a hint's reply built in the same loop step, with nothing that
        #: changes the policy in between, can say that as ``desired`` instead of deciding
        #: again. ``None`` until then, and while a hit's check stopped before deciding.
        self.hit_decision: tuple[Decision, int] | None = None
        #: What waits for that submission (:meth:`after_reply`).
        self._after_reply: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        #: The gate the next hit's reply goes through, made ahead of it: making one makes a
        #: thread lock, which costs the reply its time when made between the kernel
        #: running the new scheduler and the reply (docs/performance.md, "Standby hit").
        #: Replaced once a hit is over (:meth:`_end`), off the reply's path.
        self._next_gate: ReplyGate | None = ReplyGate()
        #: The record the next hit fills in (``Switcher.blank_record``), made ahead of it
        #: for the same reason, and likewise replaced once a hit is over.
        self._next_record: SwitchInfo | None = switcher.blank_record()

    def standby_hit(self, lease: Lease) -> tuple[str, SchedulerConfig, str] | None:
        """``(target, spec, reason)`` when the hint that just added ``lease`` is a standby
        hit (:meth:`switch`), else ``None`` (the hint kicks a normal pass).

        A hit when no pass and no other direct switch is under way, the worker is idle,
        the running scheduler keeps an exit record (``Switcher.late_check_ok``), the
        policy, asked as a pass asks it (leases past their TTL expired first), picks
        ``lease`` itself, its scheduler is not ``kernel`` nor the running one, and the
        pool holds it prepared from its current configuration entry (the take still
        checks that it is fresh). Reads no file."""
        self.hit_decision = None
        if self.host.in_pass or self.active or not self.worker.idle:
            return None
        if not self.switcher.late_check_ok():
            return None
        now = self.host.clock()
        self.policy.expire(now)
        decision = self.policy.decide(now)
        self.hit_decision = (decision, now)
        target = decision.scheduler
        if decision.lease is None or decision.lease.id != lease.id:
            return None
        if target in (KERNEL, self.switcher.active):
            return None
        spec = self.host.config.schedulers.get(target)
        entry = self.switcher.standby.entries.get(target)
        # ``is`` first: the pool's entry was filled from this very configuration entry
        # unless a reload replaced it (a model's == compares every field).
        if spec is None or entry is None or (entry.spec is not spec and entry.spec != spec):
            return None
        self.host.hit_claimed(target)
        return target, spec, f"{decision.why} {lease.id} {lease.workload}"

    async def switch(
        self, target: str, spec: SchedulerConfig, reason: str
    ) -> tuple[list[SwitchInfo], bool]:
        """Switch to a held standby (``target``, ``spec``, ``reason`` from
        :meth:`standby_hit`, in the same loop step). Returns like
        ``Reconciler.settle_records`` with ``early``: at once when the kernel runs
        ``target`` (the record is live; the second half waits for the reply, at most
        ``reply_wait_s``), or once a normal pass took over: when the pool held nothing
        fresh after all (the pass prepares it), or the switch failed and rolled back (the
        pass backs the target off and tries the next candidate); its records follow.

        The loop is blocked for the first half: the kernel's no-scheduler gap plus the
        detach's and attach's own work (every wait in it is bounded by
        ``switch_timeout_s``), which no request could have been answered in sooner
        anyway, since the worker it would otherwise have waited for does the same."""
        self.active = True
        blank, self._next_record = self._next_record, None
        try:
            pending = self.switcher.begin_standby(target, spec, reason, blank)
        except Exception:
            self.active = False
            log.exception("direct switch to %s failed", target)
            self.host.kick()
            return await self.host.settle_records(early=True)
        if pending is None:  # nothing fresh held: a pass prepares it
            self._next_record = blank  # not used
            self.active = False
            self.host.kick()
            return await self.host.settle_records(early=True)
        record = pending.record
        if not pending.running:
            # Failed and rolled back: the window's end here (no pin, nothing to free),
            # then a normal pass takes it from here.
            try:
                finished = _Finished(record, pending.finish())
            except Exception as exc:
                self._end(None, exc, target)
            else:
                self._end(finished, None, target)
            later, settled = await self.host.settle_records(early=True)
            return [record, *later], settled
        gate, self._next_gate = self._next_gate or ReplyGate(), None
        gate.expect(1)
        self.host.gate_for_replies(gate)
        self._hold_rest(pending, target, gate)
        return [record], True

    def _hold_rest(self, pending: PendingSwitch, target: str, gate: ReplyGate) -> None:
        """On the loop, in the reply's step: the second half, held as the worker's next
        call and submitted once the client took the reply (:meth:`replies_taken`) --
        before that, the worker thread is not woken: on one emulated CPU its wake-up and
        its turn at the GIL come out of the reply's time --, ahead of anything this loop
        submits meanwhile (a pass kicked, a refill), which so finds the switch finished.
        A reply that is never taken holds it until the next call submitted to the worker
        at the latest: the reconciler's safety-net poll runs a pass every ``poll_s``, and
        a connection reports its reply even when its request failed. On the worker it
        waits on ``gate`` (bounded by ``reply_wait_s``: it may have been submitted early,
        ahead of another call), then finishes. Nothing else is set up here (no timer): this
        runs between the kernel running the new scheduler and the reply."""
        host = self.host

        def rest() -> _Finished:
            gate.wait(host.reply_wait_s)
            return _Finished(pending.record, pending.finish())

        def submit_rest() -> None:
            # The loop is looked up here, once the reply is out: asyncio's lookup asks the
            # kernel for the process id.
            loop = asyncio.get_running_loop()
            try:
                work = loop.run_in_executor(self.worker, rest)
            except RuntimeError:  # the worker was shut down: the daemon is stopping
                pending.finish()
                self.active = False
                return
            work.add_done_callback(lambda w: self._done(w, target))

        self.worker.hold(submit_rest)

    def replies_taken(self) -> None:
        """On the loop: every reply the hit's gate counted was taken by its client (the
        connection waited for that: :mod:`~schedswitchd.daemon.reply_gate`). A held second
        half is submitted now."""
        self._release_held()

    def after_reply(self, callback: Callable[..., object], *args: Any) -> None:
        """On the loop: ``callback(*args)`` once the client of the standby hit answered in
        this step took its reply (with its second half's submission), or in the next
        step when no such reply is waiting. For what can wait (a log line), so that it
        does not take the CPU from the client reading its reply."""
        if self.worker.holding:
            self._after_reply.append((callback, args))
        else:
            asyncio.get_running_loop().call_soon(callback, *args)

    def _release_held(self) -> None:
        """Submit the worker's held call (the second half), if another submission did not
        already, then run what waited for it (:meth:`after_reply`)."""
        waiting, self._after_reply = self._after_reply, []
        try:
            self.worker.release()
        finally:
            for callback, args in waiting:
                try:
                    callback(*args)
                except Exception:
                    log.exception("after-reply callback failed")

    def _done(self, work: asyncio.Future[_Finished], target: str) -> None:
        """On the loop, once the second half returned: :meth:`_end` with its outcome."""
        error = None if work.cancelled() else work.exception()
        outcome = None if work.cancelled() or error is not None else work.result()
        self._end(outcome, error, target)

    def _end(self, outcome: _Finished | None, error: BaseException | None, target: str) -> None:
        """The hit is over: the reconciler's bookkeeping (``outcome``: the record and the
        old scheduler's ejection; ``None`` after ``error``), then its pass."""
        self.active = False
        if self._next_gate is None:
            self._next_gate = ReplyGate()
        if self._next_record is None:
            self._next_record = self.switcher.blank_record()
        if error is not None:
            log.error("direct switch to %s failed", target, exc_info=error)
        if outcome is None:
            self.host.hit_finished(None, None, target)
        else:
            self.host.hit_finished(outcome.record, outcome.gone, target)
