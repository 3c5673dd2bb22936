"""The reconcile loop: from what the policy wants to what the kernel runs.

A request, a lease's end, a backend notification (``SCXOPS`` uevent or sysfs change), a
timer (a TTL or a backoff hold ending) or the safety-net poll *kicks* the loop; the loop
then runs one pass: notice an ejection (record it, back the scheduler off -- unless its exit
asked for a restart, as the kernel's CPU-hotplug ejection does: then it is simply loaded
again, its profile resolved for the new topology, its restarts bounded by rate:
:class:`~schedswitchd.daemon.ejections.Ejections`), expire leases,
ask the :class:`~schedswitchd.daemon.policy.Policy` what should run and have the
:class:`~schedswitchd.daemon.switcher.Switcher` make it so. Switching runs on one worker
thread (so switches are serialised and the event loop never blocks on the kernel).

Requests that change what runs wait, bounded, for the pass that covers them
(:meth:`Reconciler.settle_records`), so their replies say what runs. A pass covers a request
when it asked the policy after the request's change (a lease added or ended, an override,
a reload; each kicks the loop in the same step as it is made): a pass under way covers a
hint that landed while it waited for the worker before its decision, or before a failed
switch's next candidate was chosen, and answers it; a hint that landed after the decision
is answered by the next pass. A hint waits only
until that pass's switch has the new scheduler running (``early``): the switcher calls back
the moment the kernel confirmed it ``enabled``, and the reply goes out; once it is written
and its client has read it (the connection waits for that, bounded; the worker waits at
most :data:`REPLY_WAIT_S` for all of it),
the worker pins it, frees the previous one, finishes the pass and refills the standby
pool. Should
that rest fail (a pin), the switch rolls back as before and the pass backs the scheduler
off; ``status`` shows the final record.

A hint whose scheduler the pool holds prepared (a *standby hit*) takes a direct path
instead, when the worker is idle (:class:`~schedswitchd.daemon.direct_switch.DirectSwitch`,
:attr:`Reconciler.direct`): the same policy decides, the event loop switches up to the new
scheduler running and answers in that step, and the worker finishes after the reply. The
pass's bookkeeping (logging the switch, a failure's backoff, an ejection the old
scheduler's exit record showed, the deadline, ``STATUS=``, the standby refill) follows the
reply (:meth:`Reconciler.hit_finished`); whatever the direct path could not do is left to
a normal pass, so the outcome is the one the pass would have reached. Backend
notifications that come while the direct switch is under way (its own sched_ext uevents,
or an ejection) start no pass of their own: the pass that follows the switch looks at the
kernel after them, so an ejection during or right after the switch is recorded and
handled there.

After each pass (and after the replies it settles), the standby pool is refilled on the
same worker thread: schedulers announced by launchers (``prepare`` intents, until they
expire), then the configured default, then the most recent hint's scheduler, as many as
``[standby]`` allows (see :mod:`schedswitchd.daemon.standby`).

Time: ``clock`` (monotonic ns, default :func:`time.monotonic_ns`) is what every decision
and status figure reads; the safety-net poll and the deadlines (a lease's TTL or an
intent's end, a backoff hold ending, the adoption grace's end) are armed on ``timer`` (a
:class:`~schedswitchd.daemon.timer.Timer`: the event loop's unless a test gives one it
moves); a deadline N ns away on ``clock`` is armed N / 1e9 s away on the timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from schedswitchd.daemon.backend import UNAVAILABLE, SchedulerBackend
from schedswitchd.daemon.config import KERNEL, Config, SchedulerConfig
from schedswitchd.daemon.direct_switch import DirectSwitch
from schedswitchd.daemon.ejections import Ejections
from schedswitchd.daemon.feed import ChangeFeed
from schedswitchd.daemon.memory_tuning import trim_heap
from schedswitchd.daemon.policy import NS_PER_S, Policy
from schedswitchd.daemon.protocol import SwitchInfo
from schedswitchd.daemon.reply_gate import ReplyGate
from schedswitchd.daemon.standby import StandbyError, StandbyPool
from schedswitchd.daemon.switcher import NO_SCHED_EXT, Switcher
from schedswitchd.daemon.timer import Cancellable, LoopTimer, Timer
from schedswitchd.daemon.worker import SwitchWorker

log = logging.getLogger("schedswitchd")

Clock = Callable[[], int]

#: How long a switch's worker waits, at most, for the replies its ``on_enabled`` released
#: to be written and taken by their clients before it goes on (pins, freeing the old
#: scheduler), s: the default of ``Reconciler(reply_wait_s=...)``. On a machine with few
#: cores the switch's remaining work (the RCU window's end, the watch's reads, pins,
#: freeing the old scheduler) otherwise shares the CPU with the client reading its reply;
#: each connection bounds its own wait for its client (``Server(reply_taken_wait_s=...)``).
REPLY_WAIT_S = 0.25


class Reconciler:
    """Owns the policy, the switcher and the worker thread; runs the reconcile passes.

    ``config``: validated config (replaced by :meth:`apply_config`); ``backend``: the kernel
    side; ``on_change``: called on the loop with a one-line status after every pass
    (systemd ``STATUS=``); ``poll_s``: interval of the safety-net pass besides the
    backend's notifications (s); ``clock``: monotonic ns; ``timer``: where the safety-net
    poll and the deadlines are armed (default: the event loop :meth:`start` runs on; tests
    pass one they move); ``reply_wait_s``: how long a switch's worker waits, at most, for
    the replies its ``on_enabled`` released to be taken by their clients (s,
    :data:`REPLY_WAIT_S`); ``trim``: what gives the C heap back after a switch or a
    standby's prepare, on the worker (default
    :func:`~schedswitchd.daemon.memory_tuning.trim_heap`).
    """

    def __init__(
        self,
        config: Config,
        backend: SchedulerBackend,
        *,
        on_change: Callable[[str], None] | None = None,
        poll_s: float = 1.0,
        clock: Clock = time.monotonic_ns,
        timer: Timer | None = None,
        reply_wait_s: float = REPLY_WAIT_S,
        trim: Callable[[], object] = trim_heap,
    ) -> None:
        self.config = config
        self.backend = backend
        self.on_change = on_change
        self.poll_s = poll_s
        self.clock = clock
        self._timer = timer
        self.reply_wait_s = reply_wait_s
        self.trim = trim
        #: The safety-net poll's next call on ``timer`` (:meth:`_poll`).
        self._poll_call: Cancellable | None = None
        self.policy = Policy(rules=config.hints, default=config.default)
        self.switcher = Switcher(
            backend, config.limits.switch_timeout_s, config.daemon.history_size, clock=clock
        )
        self.worker = SwitchWorker()
        #: One thread for the kernel's view (``kernel_state``, ``counters``): the default
        #: executor would grow to several threads under a burst of ``status`` requests,
        #: and their stacks and C-heap use stay resident after it.
        self.reader = ThreadPoolExecutor(1, thread_name_prefix="kernel-view")
        self.adopted = False
        self.last_pass_ns = clock()
        self._grace_until_ns = 0
        #: Kicks so far: the generation of the newest change (:meth:`kick`).
        self._gen = 0
        #: The generation the running pass covers: :attr:`_gen` when it last read what
        #: requests change (:meth:`_cover`); read by the worker's ``on_enabled``.
        self._pass_gen = 0
        self._wake = asyncio.Event()
        #: Requests waiting in :meth:`settle_records`: (generation, early, future).
        self._waiters: list[tuple[int, bool, asyncio.Future[bool]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The replies of the switch whose ``on_enabled`` released them, which its worker
        #: waits for (see :meth:`reply_sent`, :mod:`~schedswitchd.daemon.reply_gate`).
        self._reply_gate: ReplyGate | None = None
        #: The next deadline's call on ``timer`` (:meth:`_arm_deadline`).
        self._deadline: Cancellable | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop_watch: Callable[[], None] | None = None
        #: Launcher intents: workload -> expiry (``clock`` ns).
        self.intents: dict[str, int] = {}
        #: The scheduler the most recent hint lease asked for (a standby candidate).
        self.recent: str | None = None
        #: Open the configured objects after the next pass (at start and after a reload).
        self._preopen_pending = False
        #: Configured objects the pre-open has still to open, in configuration order.
        self._preopen_left: list[str] = []
        #: (name, entry) whose switch to its reloaded form failed: the old form runs on,
        #: and the same entry is not tried again on every pass.
        self.stale: tuple[str, SchedulerConfig] | None = None
        #: The override an admin ``switch`` replaced: back in force if the switch fails.
        self._override_before: str | None = None
        self._foreign: str | None = None
        #: A reconcile pass is deciding or switching (the direct path then stays out).
        self._in_pass = False
        #: Reconcile passes begun since the start (status ``counters.reconcile_passes``).
        self.passes = 0
        #: The standby hit's direct path (:mod:`~schedswitchd.daemon.direct_switch`).
        self.direct = DirectSwitch(self, self.policy, self.switcher, self.worker)
        #: The reconcile task is in a round: a pass, then its pre-open and standby refill.
        self._round = False
        #: Backend notifications that came during a direct switch, left to the pass that
        #: follows it (status ``counters.notifications_held``).
        self.notes_held = 0
        #: What changed, for the ``watch`` clients and the D-Bus faces (published here:
        #: switches, ejections, overrides, leases a pass expired; the server: leases).
        self.feed = ChangeFeed()
        #: What a pass does with an ejection: backoff, or a restart the exit asked for.
        self.ejections = Ejections(self.policy, self.feed)
        #: :meth:`close` began: a call the worker refuses (shut down) ends the task.
        self._stopping = False
        self._apply_backoff_config()

    # --- life cycle ---------------------------------------------------------------------------

    async def adopt(self) -> None:
        """Take over a scheduler a previous daemon left pinned, if any (before serving)."""
        loop = asyncio.get_running_loop()
        kernel = await loop.run_in_executor(self.reader, self.backend.kernel_state)
        if kernel.state == UNAVAILABLE:
            log.warning("%s", NO_SCHED_EXT)
        record = await loop.run_in_executor(
            self.worker, self.switcher.adopt, self.config.schedulers
        )
        if record is not None:
            self.adopted = True
            log.info(
                "re-adopted pinned scheduler %s",
                record.target,
                extra={"SCHEDULER": record.target},
            )

    def start(self) -> None:
        """Start the backend's notifications, the reconcile task and the safety-net poll."""
        loop = self._loop = asyncio.get_running_loop()
        if self._timer is None:
            self._timer = LoopTimer(loop)

        def notify() -> None:
            # Any thread. While a direct switch is under way its own end runs a pass
            # (hit_finished), which looks at the kernel after everything that notified
            # meanwhile -- the switch's own uevents above all: a pass begun now would only
            # wait for the worker, and take the CPU from the switch and the reply.
            if self.direct.active:
                self.notes_held += 1
                return
            loop.call_soon_threadsafe(self.kick)

        self._stop_watch = self.backend.watch(notify)
        self._tasks.append(asyncio.create_task(self._reconciler(), name="reconcile"))
        self._arm_poll()

    def begin_grace(self) -> None:
        """The socket serves: an adopted scheduler is kept ``adopt_grace_s`` from now
        without leases, so launchers can re-hint. Counted from here, not from the
        adoption: the uevent listener's start-up can take seconds on a slow machine."""
        if self.adopted:
            self._grace_until_ns = self.clock() + int(self.config.daemon.adopt_grace_s * NS_PER_S)
        self._preopen_pending = True
        self.kick()

    async def close(self) -> None:
        """Stop the notifications and the tasks, finish any switch in progress."""
        self._stopping = True
        if self._stop_watch is not None:
            self._stop_watch()
        if self._poll_call is not None:
            self._poll_call.cancel()
            self._poll_call = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._deadline is not None:
            self._deadline.cancel()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(RuntimeError):  # the worker was shut down already
            # (submitted behind a held second half, which so closes its switch window)
            await loop.run_in_executor(self.worker, self.switcher.standby.clear, "stopping")
        await loop.run_in_executor(None, self.worker.shutdown, True)
        await loop.run_in_executor(None, self.reader.shutdown, True)

    def apply_config(self, config: Config) -> None:
        """Take a newly loaded config's rules, default, backoff and switch timeout."""
        self.config = config
        self.policy.rules = config.hints
        self.policy.default = config.default
        self._apply_backoff_config()
        if (
            self.policy.override not in (None, KERNEL)
            and self.policy.override not in config.schedulers
        ):
            self.policy.override = None
            self.feed.publish("override", override=None, why="its scheduler left the configuration")
        self.switcher.timeout_s = config.limits.switch_timeout_s
        self._preopen_pending = True
        self.kick()

    def set_override(self, target: str | None) -> None:
        """An admin ``switch``: ``target`` (a scheduler, ``kernel``) or ``None`` (follow the
        leases again). If its switch fails, the override before it is back in force, so
        a failure changes nothing."""
        self._override_before = self.policy.override
        self.policy.override = target
        if target not in (None, KERNEL):
            self.policy.clear_backoff(target)  # an admin asked explicitly: try it now
        self.feed.publish("override", override=target, why="admin")
        self.kick()

    @property
    def busy(self) -> bool:
        """A reconcile pass or a direct switch is under way."""
        return self._in_pass or self.direct.active

    @property
    def idle(self) -> bool:
        """Nothing is under way or due: no reconcile round (a pass, its pre-open, its
        standby refill) running or kicked, no direct switch, no call queued or running on
        the worker (a heap trim, a refill). What a hint usually meets (status ``idle``)."""
        return (
            not self._round
            and not self.direct.active
            and not self._wake.is_set()
            and self.worker.idle
        )

    @property
    def active_stale(self) -> bool:
        """The running scheduler is an earlier form of its (reloaded) configuration entry."""
        return self.stale is not None and self.stale[0] == self.switcher.active

    def _apply_backoff_config(self) -> None:
        standby = self.config.standby
        self.switcher.configure_standby(standby.max, standby.max_kernel_bytes)
        backoff = self.config.backoff
        self.policy.base_ns = int(backoff.base_s * NS_PER_S)
        self.policy.cap_ns = int(backoff.max_s * NS_PER_S)
        self.policy.stable_ns = int(backoff.stable_s * NS_PER_S)

    # --- kicking and waiting ------------------------------------------------------------------

    def kick(self) -> None:
        """Something changed: have the reconcile task look again."""
        self._gen += 1
        self._wake.set()

    @property
    def changes(self) -> int:
        """How many kicks so far: a request, a lease's end, a reload, a backoff or a
        notification each kicks, so an equal count means the policy's inputs are as they
        were (but for the time)."""
        return self._gen

    async def settle(self) -> tuple[SwitchInfo | None, bool]:
        """Wait for the reconcile pass covering changes so far. Returns the newest switch
        record made meanwhile (or ``None``) and whether the pass finished in time."""
        made, settled = await self.settle_records()
        return (made[-1] if made else None), settled

    async def settle_records(self, *, early: bool = False) -> tuple[list[SwitchInfo], bool]:
        """Like :meth:`settle`, but every switch record made meanwhile, oldest first.
        With ``early``, returns as soon as that pass's switch has its scheduler running
        (the record is then live: ``finished`` False) or the pass ended without one.
        Waits at most ``2 * switch_timeout_s + 5`` s."""
        gen = self._gen
        seq_before = self.switcher.history[-1].seq if self.switcher.history else 0
        timeout = 2 * self.config.limits.switch_timeout_s + 5
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        waiter = (gen, early, fut)
        self._waiters.append(waiter)

        def expire() -> None:
            if not fut.done():
                fut.set_result(False)

        timer = loop.call_later(timeout, expire)
        try:
            settled = await fut
        finally:
            timer.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
        made = [
            r for r in list(self.switcher.history) if r.seq > seq_before and r.result != "ejected"
        ]
        return made, settled

    def _cover(self) -> None:
        """The running pass reads what requests change (leases, the override, the config)
        now, in the same step as its decision: it covers every change kicked so far (each
        change and its kick are made in one step on the loop, so none can fall between)."""
        self._pass_gen = self._gen

    def _release_waiters(self, gen: int, *, early_only: bool) -> int:
        """Answer the waiters covered by pass ``gen`` (with ``early_only``: the early ones);
        returns how many."""
        n = 0
        for w_gen, early, fut in list(self._waiters):
            if w_gen <= gen and (early or not early_only) and not fut.done():
                fut.set_result(True)
                n += 1
        return n

    def _on_enabled(self, record: SwitchInfo) -> None:
        """The switcher's callback (worker thread): the pass's new scheduler runs. Waits,
        at most ``reply_wait_s``, until the replies it releases are written: the
        switch's remaining work would otherwise share the CPU (and the GIL) with them,
        and on a machine with few cores that work delayed the replies it follows."""
        loop, gen = self._loop, self._pass_gen
        if loop is None:
            return
        gate = ReplyGate()
        try:
            loop.call_soon_threadsafe(self._enabled, gen, gate)
        except RuntimeError:  # the loop is closed: the daemon is stopping
            return
        gate.wait(self.reply_wait_s)

    def _enabled(self, gen: int, gate: ReplyGate) -> None:
        released = self._release_waiters(gen, early_only=True)
        self.gate_for_replies(gate if released else None)
        gate.expect(released)

    def gate_for_replies(self, gate: ReplyGate | None) -> None:
        """On the loop: ``gate`` counts the replies written from now on (:meth:`reply_sent`);
        the one it replaces, an earlier switch's, holds its worker no longer."""
        if self._reply_gate is not None:
            self._reply_gate.release()
        self._reply_gate = gate

    def reply_sent(self) -> None:
        """A reply of a request that waited with ``early`` was written and its client took
        it (the connection waited for that, bounded): once all the replies a switch
        released are (its :class:`~schedswitchd.daemon.reply_gate.ReplyGate`), its worker
        goes on; a standby hit's held second half is submitted then
        (:meth:`DirectSwitch.replies_taken
        <schedswitchd.daemon.direct_switch.DirectSwitch.replies_taken>`)."""
        gate = self._reply_gate
        if gate is None or not gate.taken():
            return
        self._reply_gate = None
        self.direct.replies_taken()

    # --- the passes ---------------------------------------------------------------------------

    def _arm_poll(self) -> None:
        timer = self._timer
        assert timer is not None, "the reconciler has not started"
        self._poll_call = timer.call_at(timer.time() + self.poll_s, self._poll)

    def _poll(self) -> None:
        # Safety net behind the backend's notifications: also catches ejections whose event
        # was lost, and keeps the watchdog honest (a stuck worker stops the passes).
        self._arm_poll()
        self.kick()

    async def _reconciler(self) -> None:
        while True:
            self._round = False
            await self._wake.wait()
            self._wake.clear()
            self._round = True
            self._cover()
            seq = self.switcher.history[-1].seq if self.switcher.history else 0
            self._in_pass = True
            self.passes += 1
            try:
                await self.reconcile_once()
            except Exception:
                log.exception("reconcile pass failed")
            finally:
                self._in_pass = False
            self.last_pass_ns = self.clock()
            # What its last decision read: the requests changed up to then are answered.
            self._release_waiters(self._pass_gen, early_only=False)
            switched = bool(self.switcher.history) and self.switcher.history[-1].seq != seq
            if self._preopen_pending:
                # After the pass's replies: the first hint to each configured scheduler then
                # needs no ELF/BTF parse (the backend's spec cache holds it).
                self._preopen_pending = False
                self._preopen_left = list(self.config.schedulers)
            if self._preopen_left:
                done = await self._preopen_some()
                if self._stopping:
                    return
                if not done and not switched:
                    continue  # a change waits: its pass first, the rest of the pre-open after
            try:
                # After the replies, so that no hint waits for a standby's prepare.
                filled = await self._refill_standby()
            except Exception:
                if self._stopping:  # the worker was shut down
                    return
                log.exception("standby refill failed")
                filled = False
            if switched or filled:
                # Give back what the temporaries of a prepare left free in the C heap (see
                # schedswitchd.daemon.memory_tuning); queued behind the worker.
                with contextlib.suppress(RuntimeError):  # the worker was shut down
                    asyncio.get_running_loop().run_in_executor(self.worker, self.trim)

    async def _preopen_some(self) -> bool:
        """Pre-open the configured objects still left (:attr:`_preopen_left`), one per
        worker job, until a change is kicked; True once none is left. A hint that comes
        during the pre-open then waits for one object, not for all of them: under the VM's
        emulation one took 0.1-0.3 s to open, and the first one's vmlinux indexing seconds
        more (the backend's ``preopen``)."""
        loop = asyncio.get_running_loop()
        while self._preopen_left:
            if self._wake.is_set():
                return False
            name = self._preopen_left.pop(0)
            cfg = self.config.schedulers.get(name)
            if cfg is None:
                continue
            try:
                await loop.run_in_executor(self.worker, self.backend.preopen, {name: cfg})
            except Exception:
                if self._stopping:  # the worker was shut down
                    return False
                # A defect of the backend (its preopen logs what it expects): this one
                # object is not pre-opened, its switch reports what fails; the loop and
                # the other objects' pre-open go on.
                log.exception("pre-open of %s failed", name)
        return True

    # --- standbys -----------------------------------------------------------------------------

    def standby_wanted(self, now: int) -> list[tuple[str, SchedulerConfig, str]]:
        """``(name, spec, reason)`` the pool should hold, most wanted first: unexpired
        launcher intents, the configured default, the most recent hint's scheduler; never
        one held back by backoff or a restart hold, the running one or ``kernel``."""
        for workload, until in list(self.intents.items()):
            if until <= now:
                del self.intents[workload]
        names: list[tuple[str, str]] = []
        for workload in sorted(self.intents, key=self.intents.__getitem__, reverse=True):
            rule = self.config.hints.get(workload)
            if rule is not None:
                names.append((rule.scheduler, f"intent {workload}"))
        names.append((self.config.default, "default"))
        if self.config.standby.recent and self.recent is not None:
            names.append((self.recent, "recent hint"))
        out: list[tuple[str, SchedulerConfig, str]] = []
        for name, reason in names:
            spec = self.config.schedulers.get(name)
            hold = self.policy.backoff.get(name)
            if spec is None or name == self.switcher.active or any(n == name for n, *_ in out):
                continue
            if spec.runs_executable:
                continue  # nothing to hold: its program loads itself once started
            if hold is not None and hold.until_ns > now:
                continue
            if self.ejections.holds.get(name, 0) > now:
                continue  # its hotplug restart waits so as to load once (the topology then)
            out.append((name, spec, reason))
        return out

    async def _refill_standby(self) -> bool:
        """Bring the pool to :meth:`standby_wanted`; True if it prepared anything."""
        if self.config.standby.max <= 0 and not self.switcher.standby.entries:
            return False
        wanted = self.standby_wanted(self.clock())
        pool = self.switcher.standby
        held = {id(e.prepared) for e in pool}
        await asyncio.get_running_loop().run_in_executor(
            self.worker, self.switcher.fill_standby, wanted
        )
        return any(id(e.prepared) not in held for e in pool)

    async def prepare_intent(self, workload: str, ttl_s: float) -> str:
        """A launcher announced ``workload``: hold its scheduler as a standby for ``ttl_s``
        seconds. Returns the scheduler's name once it is held (or already runs). Raises
        :class:`KeyError` for a workload with no rule; ``SchedSwitchError`` when the
        scheduler is not held: backed off, held after an ejection, its prepare's error or the
        pool's limits (:class:`StandbyError`)."""
        rule = self.config.hints[workload]
        self.intents[workload] = self.clock() + int(ttl_s * NS_PER_S)
        await self._refill_standby()
        self._arm_deadline(self.clock())
        name = rule.scheduler
        if name in (KERNEL, self.switcher.active) or name in self.switcher.standby.entries:
            return name
        raise _not_held(name, self.policy, self.ejections, self.switcher.standby, self.clock())

    # --- what the standby hit asks (daemon/direct_switch.py's HitHost) ----------------------

    @property
    def in_pass(self) -> bool:
        """A reconcile pass is deciding or switching (a standby hit then stays out)."""
        return self._in_pass

    def hit_claimed(self, target: str) -> None:
        """A hint's lease takes the direct path to ``target``: as a pass would, a client's
        lease ends an adopted scheduler's grace, and ``target`` is the recent hint's."""
        self._grace_until_ns = 0
        self.recent = target

    def hit_finished(
        self, record: SwitchInfo | None, gone: tuple[SwitchInfo, int] | None, target: str
    ) -> None:
        """The bookkeeping a pass does after a switch, for a standby hit's: the old
        scheduler's ejection its exit record showed (``gone``: recorded and backed off, or
        restarted had it asked, as :meth:`Switcher.check_ejected`'s would be), the record
        logged and published, a failed ``target`` backed off; then a pass (the rest:
        deadline, ``STATUS=``, refill)."""
        if gone is not None:
            self.ejections.note(gone, self.clock())
        if record is not None:
            self._switched(record)
            if record.ok:
                self.stale = None
            else:
                self.policy.record_failure(target, self.clock(), reason=_failure(record))
        self.kick()

    async def reconcile_once(self) -> None:
        """One pass (see the module docstring). Each decision is marked with
        :meth:`_cover`, so the pass answers the requests its last decision read; one that
        waits (an adopted scheduler's grace, another program's scheduler) answers those
        made before it began."""
        loop = asyncio.get_running_loop()
        ejected = await loop.run_in_executor(self.worker, self.switcher.check_ejected)
        now = self.clock()
        if ejected is not None:
            self.ejections.note(ejected, now)
        for lease in self.policy.expire(now):
            self.feed.publish(
                "lease_ended",
                lease=lease.id,
                workload=lease.workload,
                uid=lease.owner_uid,
                why="ttl",
            )
        if self.policy.leases or self.policy.override is not None:
            # Clients reconnected (or an admin chose): the grace has done its job, and must
            # not keep an adopted scheduler once their leases are gone.
            self._grace_until_ns = 0
        # While another program's scheduler runs nothing can attach; its departure's uevent
        # kicks us again.
        wait = (self.adopted and now < self._grace_until_ns) or (
            await self._held_by_another_program(loop)
        )
        # A failed switch backs its target off, so the next decision differs; each round
        # removes one candidate, so this ends within len(schedulers) + 1 rounds.
        for _ in range(len(self.config.schedulers) + 2):
            if wait:
                break
            # What landed while the pass waited for the worker, the kernel's state or a
            # failed switch is read here too.
            self._cover()
            decision = self.policy.decide(self.clock())
            target = decision.scheduler
            if decision.lease is not None and target != KERNEL:
                self.recent = target
            if self.ejections.held(target, self.clock()):
                break  # the kernel's own scheduler runs until the hold ends (a deadline)
            spec = self.config.schedulers.get(target)
            reason = decision.why
            if decision.lease is not None:
                reason += f" {decision.lease.id} {decision.lease.workload}"
            refresh = target == self.switcher.active and target != KERNEL
            if refresh and self.stale == (target, spec):
                break  # its new form failed already; the old one runs on (active_stale)
            switch_to = self.switcher.switch_to
            record: SwitchInfo | None = await loop.run_in_executor(
                self.worker, switch_to, target, spec, reason, self._on_enabled
            )
            if record is None:
                break
            self._switched(record)
            if record.ok:
                self.stale = None
                break
            if refresh and spec is not None:
                # The reloaded form of the running scheduler failed; the old form runs
                # (rolled back, or never detached). Not a failure of what runs: no backoff.
                self.stale = (target, spec)
                break
            if target == KERNEL:
                break
            if await self._held_by_another_program(loop):
                # Another program took sched_ext between this pass's look and the attach:
                # not the target's failure; that program's departure kicks a pass again.
                break
            self.policy.record_failure(target, self.clock(), reason=_failure(record))
            if decision.why == "override":
                # A failed admin switch changes nothing: the override before it (or the
                # leases) rule again, and the failed one is not retried on every pass.
                self._restore_override(target)
        self._arm_deadline(now)
        if self.on_change is not None:
            self.on_change(self.summary())

    async def _held_by_another_program(self, loop: asyncio.AbstractEventLoop) -> bool:
        """True while a scheduler the daemon did not attach runs (``BPF_LINK_CREATE`` would
        fail with ``EBUSY``). Such failures are not the target's own, so they must neither
        back it off nor be retried (each try would load the whole object) on every pass."""
        if self.switcher.current is not None:
            return False
        kernel = await loop.run_in_executor(self.reader, self.backend.kernel_state)
        foreign = kernel.ops or "?" if kernel.state in ("enabled", "enabling") else None
        if foreign != self._foreign:
            self._foreign = foreign
            if foreign is not None:
                log.warning(
                    "sched_ext runs %s, which this daemon did not attach; waiting for it "
                    "to end before switching",
                    foreign,
                )
            else:
                log.info("sched_ext is free again")
        return foreign is not None

    def _restore_override(self, failed: str) -> None:
        before = self._override_before if self._override_before != failed else None
        self.policy.override = before
        self._override_before = before
        self.feed.publish("override", override=before, why=f"switch to {failed} failed")
        log.warning(
            "admin override %s failed; %s again",
            failed,
            f"override {before}" if before is not None else "following hints",
            extra={"SCHEDULER": failed},
        )

    def _arm_deadline(self, now: int) -> None:
        deadline = self.policy.next_deadline(now)
        if self.intents:  # an intent's end frees its standby
            first = min(self.intents.values())
            deadline = first if deadline is None else min(deadline, first)
        if self.adopted and now < self._grace_until_ns:
            deadline = min(deadline or self._grace_until_ns, self._grace_until_ns)
        hold_end = self.ejections.next_hold_end(self.clock())
        if hold_end is not None:  # a held restart's end loads its scheduler again
            deadline = hold_end if deadline is None else min(deadline, hold_end)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if deadline is not None:
            delay = max(0.0, (deadline - now) / NS_PER_S)
            timer = self._timer
            assert timer is not None, "the reconciler has not started"
            self._deadline = timer.call_at(timer.time() + delay, self.kick)

    def _switched(self, record: SwitchInfo) -> None:
        """A switch record made: logged and on the feed."""
        self._log_switch(record)
        error = record.error
        self.feed.publish(
            "switch",
            previous=record.previous,
            target=record.target,
            ok=record.ok,
            result=record.result,
            reason=record.reason,
            gap_ns=record.gap_ns,
            error=error.message if error is not None else None,
        )

    def _log_switch(self, record: SwitchInfo) -> None:
        total = record.phases_ns.get("total", 0)
        fields = {"SCHEDULER": record.target, "SWITCH_NS": total}
        if record.ok:
            log.info(
                "switched %s -> %s in %.1f ms (gap %s) [%s]",
                record.previous,
                record.target,
                total / 1e6,
                f"{record.gap_ns / 1e6:.1f} ms" if record.gap_ns is not None else "none",
                record.reason,
                extra=fields,
            )
        else:
            if record.exit is not None:
                fields["EXIT_KIND"] = record.exit.kind_name
            log.error(
                "switch %s -> %s %s: %s",
                record.previous,
                record.target,
                record.result,
                record.error.message if record.error is not None else None,
                extra=fields,
            )
            verifier_log = record.error.verifier_log if record.error is not None else None
            if verifier_log:
                log.error("verifier log for %s:\n%s", record.target, verifier_log, extra=fields)

    def summary(self) -> str:
        """One line for systemd's ``STATUS=``."""
        active = self.switcher.active
        leases = len(self.policy.leases)
        text = f"running {active}; {leases} lease{'s' if leases != 1 else ''}"
        if self.policy.override is not None:
            text += f"; admin override {self.policy.override}"
        return text


def _failure(record: SwitchInfo) -> str:
    """A failed switch's reason for its backoff: its error's message, else its result."""
    return record.error.message if record.error is not None else record.result


def _not_held(
    name: str, policy: Policy, ejections: Ejections, pool: StandbyPool, now: int
) -> StandbyError:
    """Why an intent's scheduler ``name`` is not held after the refill (``now``: the
    policy's clock, ns): backed off after failed switches, held back after a CPU hotplug's
    ejection, its prepare's error, or the pool's limits."""
    hold = policy.backoff.get(name)
    if hold is not None and hold.until_ns > now:  # standby_wanted skips it meanwhile
        return StandbyError(hold.describe(name, now))
    ejected_until = ejections.holds.get(name, 0)
    if ejected_until > now:
        return StandbyError(
            f"{name} is held back after its ejection by a CPU hotplug, "
            f"{(ejected_until - now) / NS_PER_S:.0f} s more"
        )
    if pool.last_error is not None and pool.last_error[0] == name:
        return StandbyError(f"cannot prepare {name}: {pool.last_error[1]}")
    return StandbyError(
        f"{name} is not held: [standby] max = {pool.max_entries}, max_kernel_bytes = "
        f"{pool.max_kernel_bytes}"
    )
