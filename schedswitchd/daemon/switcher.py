"""The one place that changes which sched_ext scheduler the kernel runs.

The kernel side sits behind :class:`~schedswitchd.daemon.backend.SchedulerBackend`, a small
Protocol implemented by the real backend (loader + ``/sys/kernel/sched_ext`` + bpffs pins)
and, for host tests, by a fake in ``tests/``. :class:`Switcher` drives it:

1. ``prepare`` the new scheduler while the old one still runs (all heavy work), or take
   it ready from the standby pool;
2. ``detach`` the old one (returns once the kernel no longer runs it);
3. ``attach`` the new one (returns once the kernel reads ``enabled`` with its ops name --
   the one confirmation --, and says by when it was enabled: the end of the
   no-scheduler gap). Now the new one runs: the caller's ``on_enabled(record)`` is called,
   so that a waiting request can be answered;
4. ``pin`` the new one; only then ``discard`` the old one's loaded objects.

If 2-4 fail, the new one is discarded and the old one attached (and pinned) again from the
objects kept for that purpose; the record says ``rolled_back`` (or ``rollback_failed`` if
that failed too: the kernel's own scheduler runs) -- also when the failure (4) came after
``on_enabled``: ``finished`` is False until the record's outcome is final. Every attempt
is a :class:`SwitchInfo` with per-phase timings in ns and the no-scheduler gap, kept in
a bounded history.

Threading: a :class:`Switcher` is not thread-safe; the server calls it from one worker
thread only. ``SchedulerBackend.kernel_state`` and ``counters`` must be safe to call from
any thread at any time (they only read sysfs and counters).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

from schedswitchd.daemon.backend import Prepared, SchedulerBackend
from schedswitchd.daemon.config import KERNEL, SchedulerConfig
from schedswitchd.daemon.prepare_guard import prepare_checked
from schedswitchd.daemon.protocol import (
    ADOPTED,
    EJECTED,
    FAILED,
    OK,
    ROLLBACK_FAILED,
    ROLLED_BACK,
    ErrorBody,
    ExitInfo,
    SwitchInfo,
)
from schedswitchd.daemon.standby import StandbyPool
from schedswitchd.errors import SchedSwitchError

#: What the daemon says, once, where a kernel without sched_ext matters.
NO_SCHED_EXT = (
    "this kernel has no sched_ext (/sys/kernel/sched_ext missing): schedulers cannot be "
    "attached; the kernel's own scheduler runs"
)


log = logging.getLogger("schedswitchd")


#: ``on_enabled`` of :meth:`Switcher.switch_to`: called with the live record the moment
#: the new scheduler runs.
OnEnabled = Callable[[SwitchInfo], None]

#: ``SCX_EXIT_UNREG`` (``enum scx_exit_kind``, ``kernel/sched/ext/internal.h``): the exit
#: kind of a scheduler user space unregistered -- what its ``ops.exit`` records when the
#: daemon detaches it.
SCX_EXIT_UNREG = 64

#: Prefixes of a handle's ``timings_ns`` entries that ``attach``/``detach`` record.
_BACKEND_PHASES = ("attach.", "detach.")


def _copy_phases(record: SwitchInfo, prepared: Prepared, prefix: str) -> None:
    """The backend's ``<prefix><phase>`` timings of ``prepared`` into the record as is."""
    for phase, ns in prepared.timings_ns.items():
        if phase.startswith(prefix):
            record.phases_ns[phase] = ns


class _Clock:
    """Phase timer: ``with clock.phase("attach"):`` adds the phase's duration in ns."""

    def __init__(self, record: SwitchInfo) -> None:
        self.record = record
        self.start = time.monotonic_ns()

    def phase(self, name: str) -> _Phase:
        return _Phase(self.record, name)

    def finish(self) -> None:
        self.record.phases_ns["total"] = time.monotonic_ns() - self.start


class _Phase:
    def __init__(self, record: SwitchInfo, name: str) -> None:
        self.record, self.name = record, name

    def __enter__(self) -> None:
        self.begin = time.monotonic_ns()

    def __exit__(self, *exc: object) -> None:
        self.record.phases_ns[self.name] = time.monotonic_ns() - self.begin


class PendingSwitch:
    """A switch between its two halves (:meth:`Switcher.begin_standby`): the old scheduler
    detached and the new one attached (``running``: it runs now; ``record`` is live), the
    switch window still open; :meth:`finish` does the rest. Not thread-safe: the switcher's
    rules hold (one thread at a time; the first half may run on one thread and
    :meth:`finish` on another, one after the other)."""

    def __init__(self, switcher: Switcher, record: SwitchInfo, clock: _Clock) -> None:
        self.switcher = switcher
        self.record = record
        self.running = False
        self._clock = clock
        self._window: AbstractContextManager[bool] | None = None
        self._old: Prepared | None = None
        self._new: Prepared | None = None
        self._old_spec: SchedulerConfig | None = None
        self._check_old = False
        self._old_attached_ns = 0
        self._detached_ns = 0
        self._gone: tuple[SwitchInfo, int] | None = None
        self._finished = False

    def swap(self, new: Prepared | None, spec: SchedulerConfig | None, *, check_old: bool) -> None:
        """Open the switch window, detach the attached scheduler and attach ``new``
        (``None``: the kernel's own). ``check_old``: whether the old one's exit record is
        read once it is detached (see :meth:`Switcher.begin_standby`)."""
        sw = self.switcher
        old = sw.current
        self._old, self._new, self._old_spec = old, new, sw.current_spec
        self._check_old = check_old and old is not None
        self._old_attached_ns = sw.attached_ns
        window = sw.backend.switch_window()
        self.record.expedited = window.__enter__()
        self._window = window  # left by finish (no ExitStack: on the hit's path)
        self._detached_ns = sw.clock()
        self.running = sw._swap(self.record, old, new, spec, self)
        if self.running:
            # How long the switch took until the new scheduler ran (what a waiting hint's
            # reply waits for); the rest of ``total`` comes after it.
            self.record.phases_ns["until_enabled"] = time.monotonic_ns() - self._clock.start

    def old_gone(self, old: Prepared) -> tuple[SwitchInfo, int] | None:
        """With ``check_old``: whether ``old`` (detached) had been ejected before, from its
        exit record (:meth:`Switcher._ejected_before`); remembered for :meth:`finish`."""
        if not self._check_old or self._gone is not None:
            return self._gone
        self._gone = self.switcher._ejected_before(old, self._old_attached_ns, self._detached_ns)
        return self._gone

    def finish(self) -> tuple[SwitchInfo, int] | None:
        """Close the switch window; if the new scheduler runs, read the old one's exit
        record (with ``check_old``), pin the new one and free the old one (a pin failure
        rolls back, never to an old scheduler the kernel had ejected). Returns the old
        scheduler's ejection found from its exit record (its ``ejected`` record, already in
        the history, and how long it ran, ``clock`` ns) or ``None``; the caller backs it
        off as a pass does for :meth:`Switcher.check_ejected`'s. Idempotent."""
        if self._finished:
            return self._gone
        self._finished = True
        try:
            window, self._window = self._window, None
            if window is not None:
                window.__exit__(None, None, None)
            if self.running and self._new is not None:
                gone = self.old_gone(self._old) if self._old is not None else None
                self.switcher._settle_in(self.record, self._old, self._new, self._old_spec, gone)
        finally:
            self._clock.finish()
            self.record.finished = True
        return self._gone


class Switcher:
    """Owns the attached scheduler's handle and the switch history.

    ``backend``: the kernel side; ``timeout_s``: passed to attach/detach; ``history_size``:
    records kept; ``clock``: the monotonic ns clock of the decisions (the reconciler's, so
    that an ejection's "ran for" and the policy's backoff windows share one time line; tests
    pass a fake one). The phase timings of a record (``phases_ns``, ``gap_ns``) are
    measurements and always use :func:`time.monotonic_ns`, as the backend's attach does.
    ``current`` is the attached handle (``None``: the kernel's own scheduler),
    ``current_spec`` the configuration entry it was prepared from; ``attached_ns`` is when
    it was attached (``clock`` ns), for backoff's "ran for"; ``last_exit`` the newest exit
    record read (ejection, failed attach, detach to the kernel's own scheduler).
    """

    def __init__(
        self,
        backend: SchedulerBackend,
        timeout_s: float,
        history_size: int,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.backend = backend
        self.timeout_s = timeout_s
        self.clock = clock
        self.current: Prepared | None = None
        #: The configuration entry ``current`` was prepared from (``None`` for the kernel).
        self.current_spec: SchedulerConfig | None = None
        self.attached_ns = 0
        self.history: collections.deque[SwitchInfo] = collections.deque(maxlen=history_size)
        self.last_exit: ExitInfo | None = None
        #: Prepared schedulers held for instant switches; bounded by :meth:`configure_standby`.
        self.standby = StandbyPool(backend, 0, 0)
        self._seq = 0
        #: Schedulers whose detach left no exit record (``ops.exit`` keeps none): a switch
        #: away from them looks for an ejection before, as a pass does.
        self._exit_unrecorded: set[str] = set()

    def configure_standby(self, max_entries: int, max_kernel_bytes: int) -> None:
        """Bound the standby pool (``[standby]``); entries beyond a smaller bound go."""
        self.standby.max_entries = max_entries
        self.standby.max_kernel_bytes = max_kernel_bytes
        while len(self.standby.entries) > max(max_entries, 0):
            self.standby.drop(next(iter(self.standby.entries)), "[standby] max lowered")

    def fill_standby(self, wanted: Sequence[tuple[str, SchedulerConfig, str]]) -> None:
        """Hold ``wanted`` (``(name, spec, reason)``, most wanted first) as standbys, as many
        as the pool's bounds allow; drop every other entry and stale ones. The attached
        scheduler is never held twice. Blocks while preparing; never raises a
        :class:`SchedSwitchError`."""
        keep = [w for w in wanted if w[0] != self.active][: max(self.standby.max_entries, 0)]
        self.standby.prune({name: spec for name, spec, _ in keep})
        for name, spec, reason in reversed(keep):  # the most wanted is filled last: newest
            self.standby.fill(name, spec, reason)

    @property
    def active(self) -> str:
        """Name of what the daemon has attached, or ``kernel``."""
        return self.current.name if self.current is not None else KERNEL

    def _record(
        self, target: str, result: str, reason: str, *, finished: bool = True, standby: bool = False
    ) -> SwitchInfo:
        self._seq += 1
        record = SwitchInfo(
            seq=self._seq,
            time=time.time(),
            previous=self.active,
            target=target,
            result=result,
            reason=reason,
            standby=standby,
            finished=finished,
        )
        self.history.append(record)
        return record

    def adopt(self, schedulers: Mapping[str, SchedulerConfig]) -> SwitchInfo | None:
        """At start, take over a scheduler a previous daemon left pinned and enabled."""
        prepared = self.backend.adopt(schedulers)
        if prepared is None:
            return None
        record = self._record(prepared.name, ADOPTED, "pinned by a previous daemon")
        self.current = prepared
        self.current_spec = schedulers.get(prepared.name)
        self.attached_ns = self.clock()
        return record

    def switch_to(
        self,
        target: str,
        spec: SchedulerConfig | None,
        reason: str,
        on_enabled: OnEnabled | None = None,
        *,
        pool: bool = True,
    ) -> SwitchInfo | None:
        """Make ``target`` (a scheduler name, with its ``spec``; or ``kernel`` with ``None``)
        run. Returns ``None`` if it already runs from this ``spec``, else the record (check
        ``record.ok``). A running ``target`` whose entry changed (a reload) is switched to
        its new form: prepared anew while the old form runs, then swapped in like any other
        switch (``previous`` and ``target`` are then the same name).
        ``on_enabled(record)`` is called (on this thread) the moment the kernel confirmed
        ``target`` enabled, before the new one is pinned and the old one freed; the record
        is live (``finished`` False) and may still turn ``rolled_back``. Not called for a
        switch to ``kernel`` or one that fails before that moment. ``pool``: False when
        the standby pool was asked already (:meth:`begin_standby` found nothing fresh):
        ``target`` is prepared without asking it again.
        Never raises a :class:`SchedSwitchError`; it lands in ``record.error``.
        """
        if target == self.active:
            if target == KERNEL:
                return None
            if spec is not None and spec != self.current_spec:
                return self._switch_recorded(target, spec, reason, on_enabled, pool)
            # Whether it runs or the kernel is ejecting it (mid-transition, or just done since
            # check_ejected() looked): never re-attach it here. check_ejected() on the next
            # pass records the ejection and its exit info and backs the scheduler off.
            return None
        if target != KERNEL and spec is None:
            raise ValueError(f"switch_to({target!r}) needs the scheduler's spec")
        return self._switch_recorded(target, spec, reason, on_enabled, pool)

    def _switch_recorded(
        self,
        target: str,
        spec: SchedulerConfig | None,
        reason: str,
        on_enabled: OnEnabled | None,
        pool: bool,
    ) -> SwitchInfo:
        record = self._record(target, OK, reason, finished=False)
        pending = PendingSwitch(self, record, _Clock(record))
        try:
            new: Prepared | None = None
            if target != KERNEL:
                assert spec is not None
                start = time.monotonic_ns()
                new = self.standby.take(target, spec) if pool else None
                if new is not None:
                    record.standby = True
                    record.phases_ns["standby"] = time.monotonic_ns() - start
                else:
                    try:
                        with _Phase(record, "prepare"):
                            new = prepare_checked(self.backend, target, spec)
                    except SchedSwitchError as exc:
                        record.result, record.error = FAILED, ErrorBody.of(exc)
                        return record
                    for phase, ns in new.timings_ns.items():
                        if not phase.startswith(_BACKEND_PHASES):
                            record.phases_ns[f"prepare.{phase}"] = ns
            pending.swap(new, spec, check_old=False)
            if pending.running and on_enabled is not None:
                # The new scheduler runs: a waiting request is answered now, while the
                # rest (the window's end, pins, freeing the old one) goes on here.
                on_enabled(record)
        finally:
            pending.finish()
        return record

    def blank_record(self) -> SwitchInfo:
        """A record for a later :meth:`begin_standby` to fill in (its ``blank``): made
        ahead, off a standby hit's path -- building a record validates it, which costs the
        hit its time where assigning its fields does not (docs/performance.md, "Standby
        hit"). Its fields are placeholders (``seq`` 0) until then; it is in no history."""
        return SwitchInfo(
            seq=0,
            time=0.0,
            previous=KERNEL,
            target=KERNEL,
            result=OK,
            reason="",
            standby=True,
            finished=False,
        )

    def begin_standby(
        self, target: str, spec: SchedulerConfig, reason: str, blank: SwitchInfo | None = None
    ) -> PendingSwitch | None:
        """The first half of a switch to ``target``'s held standby, for a caller that answers
        a request between the halves on its own thread (a standby hit on the event loop):
        take the standby (``None``, nothing else done, when the pool holds none fresh for
        ``spec``: :meth:`switch_to` with ``pool=False`` prepares it), open the switch
        window, detach the old scheduler and attach the new one. Returns the pending
        switch: its record is live (``finished`` False; ``ok`` unless the swap failed and
        rolled back), ``running`` says whether ``target`` runs now, and
        :meth:`PendingSwitch.finish` -- on any one thread, once -- does the rest (the
        window's end; pin; free the old scheduler). Only the kernel's detach and attach
        (and a confirmation) run in between: nothing sleeps but their bounded waits
        (``timeout_s``).

        When the old scheduler keeps an exit record (``exit_recorded``), the kernel's
        state is not read before its detach: ``finish`` reads its exit record instead,
        which tells whether the kernel had disabled it before the detach (any kind but
        ``SCX_EXIT_UNREG``, whose ``ops.exit`` the detach itself causes) -- see
        :meth:`PendingSwitch.finish`. Without one the caller must run
        :meth:`check_ejected` first, as a pass does. Never raises a
        :class:`SchedSwitchError`. ``target`` must not be the running scheduler.

        ``blank``: a :meth:`blank_record` to fill in as the switch's record (used unless
        this returns ``None``), else one is made. ``ValueError`` for a used one."""
        if blank is not None and blank.seq != 0:
            raise ValueError(f"record {blank.seq} is not blank")
        start = time.monotonic_ns()
        new = self.standby.take(target, spec)
        if new is None:
            return None
        if blank is None:
            record = self._record(target, OK, reason, finished=False, standby=True)
        else:
            # The fields the constructor would have set, assigned (which pydantic does not
            # validate: the model has no validate_assignment): the record is the same.
            self._seq += 1
            record = blank
            record.seq = self._seq
            record.time = time.time()
            record.previous = self.active
            record.target = target
            record.reason = reason
            self.history.append(record)
        clock = _Clock(record)
        clock.start = start
        record.phases_ns["standby"] = time.monotonic_ns() - start
        pending = PendingSwitch(self, record, clock)
        try:
            pending.swap(new, spec, check_old=self.late_check_ok())
        except BaseException:
            pending.finish()
            raise
        return pending

    def late_check_ok(self) -> bool:
        """Whether a switch away from the attached scheduler may notice its ejection after
        the switch (from its exit record) instead of before it (``check_ejected``)."""
        current = self.current
        return (
            current is not None
            and current.name not in self._exit_unrecorded
            and self.backend.exit_recorded(current)
        )

    def _swap(
        self,
        record: SwitchInfo,
        old: Prepared | None,
        new: Prepared | None,
        spec: SchedulerConfig | None,
        pending: PendingSwitch | None = None,
    ) -> bool:
        """Detach ``old``, attach ``new``. True when ``new`` runs (confirmed by the
        backend's attach); then :meth:`_settle_in` must follow. ``pending``: the switch
        this is part of, asked whether a detached ``old`` had been ejected before (then a
        failed attach does not roll back to it)."""
        gap_start = time.monotonic_ns()
        if old is not None:
            try:
                with _Phase(record, "detach"):
                    self.backend.detach(old, self.timeout_s)
            except SchedSwitchError as exc:
                # The old one may still run; keep it as current and give up on the new one.
                record.result, record.error = FAILED, ErrorBody.of(exc)
                if new is not None:
                    self.backend.discard(new)
                return False
            self.current = None
        if new is None:  # to the kernel's own scheduler
            self.current_spec = None
            record.gap_ns = None
            if old is not None:
                _copy_phases(record, old, "detach.")
                self._harvest_exit(old)
                self.backend.discard(old)
            return False
        try:
            with _Phase(record, "attach"):
                enabled_ns = self.backend.attach(new, self.timeout_s)
        except SchedSwitchError as exc:
            if old is not None:
                _copy_phases(record, old, "detach.")
            record.error = ErrorBody.of(exc)
            record.exit = self.backend.exit_info(new)
            if record.exit is not None:
                self.last_exit = record.exit  # newer than anything read before it
            self.backend.discard(new)
            if old is not None and pending is not None and pending.old_gone(old) is not None:
                self.current_spec = None
                self.backend.discard(old)
                old = None
            record.result = self._roll_back(record, old)
            return False
        gap_end = enabled_ns if enabled_ns is not None else time.monotonic_ns()
        # The backend's phases (detach.*, attach.*) are copied by _settle_in, after the
        # reply: each copy walks every phase of a handle's prepare.
        record.gap_ns = gap_end - gap_start if old is not None else None
        self.current = new
        self.current_spec = spec
        self.attached_ns = self.clock()
        return True

    def _settle_in(
        self,
        record: SwitchInfo,
        old: Prepared | None,
        new: Prepared,
        old_spec: SchedulerConfig | None,
        gone: tuple[SwitchInfo, int] | None = None,
    ) -> None:
        """After the new scheduler runs (and ``on_enabled``): pin it, then free the old
        one. A pin that fails rolls back as a failed attach does: the new one is
        discarded, the old one attached again (the record says ``rolled_back``, or
        ``rollback_failed``); that is what a status after the reply shows. ``gone``: the
        old one had been ejected by the kernel before the switch (not attached again).
        First the backend's phases of the detach and the attach go into the record (not
        before the reply: see :meth:`_swap`)."""
        if old is not None:
            _copy_phases(record, old, "detach.")
        _copy_phases(record, new, "attach.")
        try:
            with _Phase(record, "pin"):
                self.backend.pin(new)
        except SchedSwitchError as exc:
            record.error = ErrorBody.of(exc)
            self.current, self.current_spec = None, old_spec
            self.backend.discard(new)
            if gone is not None and old is not None:
                self.current_spec = None
                self.backend.discard(old)
                old = None
            record.result = self._roll_back(record, old)
            return
        if old is not None:
            self.backend.discard(old)

    def _ejected_before(
        self, old: Prepared, attached_ns: int, detached_ns: int
    ) -> tuple[SwitchInfo, int] | None:
        """After a switch away from ``old`` that skipped ``check_ejected``: its exit record
        says how it ended. ``SCX_EXIT_UNREG`` is the ``ops.exit`` our own detach caused
        (``bpf_scx_unreg()`` -> ``scx_disable(SCX_EXIT_UNREG)``); any other kind means the
        kernel had claimed its exit first (``scx_claim_exit()`` in ``kernel/sched/ext.c``
        takes the first kind only, and the detach flushes the disable work, so the record
        is final when the detach returned): an ejection, recorded as ``check_ejected``
        records one (``previous`` ``old``, result ``ejected``, its exit info), with how long
        it ran (``clock`` ns, until the detach). No record at all: its ``ops.exit`` does
        not keep one, so the next switch away from it looks at the kernel before."""
        info = self.backend.exit_info(old)
        if info is None:
            self._exit_unrecorded.add(old.name)
            log.warning(
                "%s left no exit record on its detach; its ejections are looked for before "
                "its switches from now on",
                old.name,
            )
            return None
        if info.kind == SCX_EXIT_UNREG:
            return None
        self.last_exit = info
        record = self._record(
            KERNEL, EJECTED, f"kernel reports {info.kind_name} (before the switch from it)"
        )
        record.previous = old.name
        record.exit = info
        return record, detached_ns - attached_ns

    def _roll_back(self, record: SwitchInfo, old: Prepared | None) -> str:
        if old is None:
            return ROLLED_BACK  # the kernel's own scheduler was running and still is
        try:
            with _Phase(record, "rollback"):
                self.backend.attach(old, self.timeout_s)
        except SchedSwitchError:
            self.backend.discard(old)
            self.current_spec = None
            return ROLLBACK_FAILED
        self.current = old
        self.attached_ns = self.clock()
        try:
            self.backend.pin(old)
        except SchedSwitchError as exc:
            # It runs; only a restarted daemon could not adopt it. Not worth another gap.
            log.warning("rolled back to %s, but cannot pin it: %s", old.name, exc)
        return ROLLED_BACK

    def _harvest_exit(self, prepared: Prepared) -> ExitInfo | None:
        info = self.backend.exit_info(prepared)
        if info is not None:
            self.last_exit = info
        return info

    def check_ejected(self) -> tuple[SwitchInfo, int] | None:
        """If the kernel no longer runs the attached scheduler (error, stall, sysrq), read
        its exit info, free it, record an ``ejected`` entry and return it with how long it
        ran (``clock`` ns). ``None`` if nothing changed. Transitional states are not ejections."""
        current = self.current
        if current is None:
            return None
        state = self.backend.kernel_state()
        if state.state in ("enabling",) or (
            state.state == "enabled" and state.ops == current.ops_name
        ):
            return None
        if state.state == "disabling":
            return None  # the kernel is mid-way; the next notification finishes the story
        ran_for = self.clock() - self.attached_ns
        record = self._record(KERNEL, EJECTED, f"kernel reports {state.state}")
        record.exit = self._harvest_exit(current)
        # detach() is a no-op for a handle the kernel already dropped, but unpins the link.
        try:
            self.backend.detach(current, self.timeout_s)
        except SchedSwitchError as exc:
            record.error = ErrorBody.of(exc)
        self.backend.discard(current)
        self.current = None
        self.current_spec = None
        return record, ran_for
