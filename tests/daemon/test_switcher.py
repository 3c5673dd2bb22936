"""Switcher: prepare/detach/attach/confirm, rollback, ejection and adoption, on the fake backend."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from contextlib import AbstractContextManager

import pytest

from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon import switcher as sw
from schedswitchd.daemon.backend import Prepared, SchedulerBackend
from schedswitchd.daemon.config import KERNEL, SchedulerConfig
from schedswitchd.daemon.protocol import KernelInfo, SwitchInfo
from schedswitchd.errors import BpfSyscallError, LoadError, SchedExtError

from .fakes import FakeBackend
from .harness import FakeClock

SPEC = SchedulerConfig(object="/nonexistent.bpf.o")
SCHEDS = {"fifo": SPEC, "vtime": SPEC, "gaming": SPEC}


def make(backend: FakeBackend | None = None) -> tuple[sw.Switcher, FakeBackend]:
    backend = backend or FakeBackend()
    return sw.Switcher(backend, timeout_s=1.0, history_size=8), backend


def test_switch_order_and_timings() -> None:
    s, b = make()
    rec = s.switch_to("fifo", SPEC, "lease 1")
    assert rec is not None and rec.ok and rec.result == proto.OK
    assert (rec.previous, rec.target) == (KERNEL, "fifo")
    assert rec.gap_ns is None  # nothing was running: no gap
    assert b.kernel_state() == KernelInfo(state="enabled", ops="fifo_ops", enable_seq=1)
    b.calls.clear()
    rec = s.switch_to("vtime", SPEC, "lease 2")
    assert rec is not None and rec.ok
    # heavy work first, old one freed only after the new one is confirmed
    assert b.calls == [
        "prepare vtime",
        "detach fifo",
        "attach vtime",
        "pin vtime",
        "discard fifo",
    ]
    assert set(rec.phases_ns) == {
        "prepare",
        "prepare.btf",
        "prepare.core",
        "detach",
        "attach",
        "until_enabled",
        "pin",
        "total",
    }
    assert rec.finished
    assert (rec.phases_ns["prepare.btf"], rec.phases_ns["prepare.core"]) == (2, 3)
    assert all(v >= 0 for v in rec.phases_ns.values())
    assert rec.gap_ns is not None and 0 <= rec.gap_ns <= rec.phases_ns["total"]
    assert s.active == "vtime" and len(b.live) == 1


def test_gap_ends_when_the_backend_saw_it_enabled_and_has_its_phases() -> None:
    # The backend confirms after the kernel enabled the new scheduler (50 ms here): that
    # is not part of the gap; its own attach./detach. phases land in the record as they are.
    s, _ = make(FakeBackend(attach_tail_s=0.05))
    s.switch_to("fifo", SPEC, "x")
    at_enabled: list[set[str]] = []
    rec = s.switch_to("vtime", SPEC, "y", lambda r: at_enabled.append(set(r.phases_ns)))
    assert rec is not None and rec.ok and rec.gap_ns is not None
    # copied after on_enabled (a waiting hint's reply), before the pin
    assert at_enabled and not [k for k in at_enabled[0] if k.startswith(("attach.", "detach."))]
    assert {"detach", "attach", "until_enabled"} <= at_enabled[0]
    assert rec.phases_ns["attach"] >= 50_000_000
    assert rec.gap_ns <= rec.phases_ns["detach"] + rec.phases_ns["attach"] - 50_000_000
    assert rec.phases_ns["detach.link_detach"] == 17
    assert (rec.phases_ns["attach.link"], rec.phases_ns["attach.confirm"]) == (11, 13)
    assert not [k for k in rec.phases_ns if k.startswith(("prepare.attach", "prepare.detach"))]
    # a backend that does not say when (None): the gap ends when attach returns
    s2, _ = make()
    s2.switch_to("fifo", SPEC, "x")
    rec2 = s2.switch_to("vtime", SPEC, "y")
    assert rec2 is not None and rec2.gap_ns is not None
    assert rec2.gap_ns >= rec2.phases_ns["detach"] + rec2.phases_ns["attach"]


def test_same_target_is_noop_and_kernel_detaches() -> None:
    s, b = make()
    s.switch_to("fifo", SPEC, "x")
    assert s.switch_to("fifo", SPEC, "x") is None
    rec = s.switch_to(KERNEL, None, "stop")
    assert rec is not None and rec.ok and s.active == KERNEL
    assert b.kernel_state().state == "disabled" and not b.live
    assert s.switch_to(KERNEL, None, "stop") is None


def test_prepare_failure_changes_nothing() -> None:
    s, b = make(FakeBackend(verifier_reject={"gaming"}))
    s.switch_to("fifo", SPEC, "x")
    rec = s.switch_to("gaming", SPEC, "lease")
    assert rec is not None and rec.result == proto.FAILED and not rec.ok
    assert rec.error is not None and rec.error.code == BpfSyscallError.code
    assert rec.error.verifier_log == "R1 invalid mem access"
    assert b.kernel_state().ops == "fifo_ops" and s.active == "fifo"
    assert "detach fifo" not in b.calls


def test_attach_failure_rolls_back_to_previous() -> None:
    s, b = make(FakeBackend(fail_attach={"gaming"}))
    s.switch_to("fifo", SPEC, "x")
    rec = s.switch_to("gaming", SPEC, "lease")
    assert rec is not None and rec.result == proto.ROLLED_BACK
    assert rec.error is not None and rec.error.code == SchedExtError.code
    assert rec.exit is not None and rec.exit.kind_name == "ERROR"
    assert "rollback" in rec.phases_ns
    assert b.kernel_state() == KernelInfo(state="enabled", ops="fifo_ops", enable_seq=2)
    assert s.active == "fifo" and len(b.live) == 1  # the failed one was freed


def test_attach_failure_from_kernel_stays_kernel() -> None:
    s, b = make(FakeBackend(fail_attach={"gaming"}))
    rec = s.switch_to("gaming", SPEC, "lease")
    assert rec is not None and rec.result == proto.ROLLED_BACK and s.active == KERNEL
    assert not b.live


def test_rollback_failure_leaves_kernel_scheduler() -> None:
    b = FakeBackend(fail_attach={"gaming"})
    s, _ = make(b)
    s.switch_to("fifo", SPEC, "x")
    b.fail_attach.add("fifo")
    rec = s.switch_to("gaming", SPEC, "lease")
    assert rec is not None and rec.result == proto.ROLLBACK_FAILED
    assert s.active == KERNEL and b.kernel_state().state == "disabled" and not b.live


def test_detach_failure_keeps_old() -> None:
    b = FakeBackend()
    s, _ = make(b)
    s.switch_to("fifo", SPEC, "x")
    b.fail_detach = True
    rec = s.switch_to("vtime", SPEC, "x")
    assert rec is not None and rec.result == proto.FAILED and s.active == "fifo"
    assert len(b.live) == 1


def test_ran_for_is_on_the_injected_clock() -> None:
    """An ejection's "ran for" (what backoff's stable_s is compared with) is read on the
    clock the switcher was given, the reconciler's, not on the wall clock."""
    clock = FakeClock()
    b = FakeBackend()
    s = sw.Switcher(b, timeout_s=1.0, history_size=8, clock=clock)
    s.switch_to("gaming", SPEC, "x")
    clock.advance(42)
    b.eject()
    found = s.check_ejected()
    assert found is not None and found[1] == 42 * 10**9
    # a rollback re-attaches the old scheduler: its run counts from then
    s.switch_to("fifo", SPEC, "x")
    b.fail_attach.add("vtime")
    clock.advance(5)
    rec = s.switch_to("vtime", SPEC, "y")
    assert rec is not None and rec.result == proto.ROLLED_BACK and s.active == "fifo"
    clock.advance(3)
    b.eject()
    found = s.check_ejected()
    assert found is not None and found[1] == 3 * 10**9


def test_ejection_is_noticed_with_exit_info() -> None:
    s, b = make()
    assert s.check_ejected() is None
    s.switch_to("gaming", SPEC, "x")
    assert s.check_ejected() is None
    b.eject(1026, "watchdog failed")
    found = s.check_ejected()
    assert found is not None
    rec, ran_for = found
    assert rec.result == proto.EJECTED and rec.previous == "gaming" and ran_for >= 0
    assert rec.exit == proto.ExitInfo(
        kind=1026, reason="watchdog failed", message="runnable task stall"
    )
    assert s.last_exit is not None and s.last_exit.kind_name == "ERROR_STALL"
    assert s.active == KERNEL and not b.live
    assert s.check_ejected() is None


def test_unnoticed_ejection_is_counted_not_reattached() -> None:
    # The kernel can finish an ejection between check_ejected() and switch_to() (seen in
    # the VM: "faulty -> faulty" re-attaches with no ejection recorded, so no backoff).
    s, b = make()
    s.switch_to("fifo", SPEC, "x")
    b.eject()
    assert s.switch_to("fifo", SPEC, "again") is None
    assert b.kernel_state().state == "disabled"
    got = s.check_ejected()
    assert got is not None and got[0].result == "ejected" and got[0].previous == "fifo"
    rec = s.switch_to("fifo", SPEC, "after backoff")
    assert rec is not None and rec.ok and b.kernel_state().ops == "fifo_ops"


def test_adopt() -> None:
    b = FakeBackend()
    b.preload("gaming")
    s, _ = make(b)
    rec = s.adopt(SCHEDS)
    assert rec is not None and rec.result == proto.ADOPTED and s.active == "gaming"
    assert s.switch_to("gaming", SPEC, "x") is None  # already runs
    assert s.adopt(SCHEDS) is None


def test_adopt_unknown_scheduler_refused() -> None:
    b = FakeBackend()
    b.preload("removed")
    s, _ = make(b)
    assert s.adopt(SCHEDS) is None and s.active == KERNEL


def test_history_bounded_and_exit_names() -> None:
    s, _ = make(FakeBackend(fail_prepare={"gaming"}))
    for _ in range(20):
        rec = s.switch_to("gaming", SPEC, "x")
        assert rec is not None and rec.error is not None and rec.error.code == LoadError.code
    assert len(s.history) == 8 and s.history[-1].seq == 20
    assert proto.exit_kind_name(1025) == "ERROR_BPF" and proto.exit_kind_name(5) == "KIND_5"


def test_kernel_target_needs_no_spec_but_scheduler_does() -> None:
    s, _ = make()
    with pytest.raises(ValueError):
        s.switch_to("fifo", None, "x")


def test_no_reattach_while_kernel_is_disabling() -> None:
    s, b = make()
    s.switch_to("fifo", SPEC, "x")
    b.state = "disabling"  # the kernel is ejecting it right now
    assert s.switch_to("fifo", SPEC, "again") is None
    assert s.check_ejected() is None  # still transitional: wait for the next notification
    b.eject()
    found = s.check_ejected()
    assert found is not None and found[0].result == proto.EJECTED


def _protocol_members(proto_cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(proto_cls).items()
        if callable(member) and not name.startswith("_")
    }


def _conformance_problems(backend_cls: type) -> list[str]:
    """How ``backend_cls`` differs from :class:`SchedulerBackend`: missing methods and
    parameters that differ in name, kind or order (annotations are mypy's to check)."""
    problems = []
    for name, want in _protocol_members(SchedulerBackend).items():
        have = getattr(backend_cls, name, None)
        if not callable(have):
            problems.append(f"{backend_cls.__name__}.{name} is missing")
            continue
        shape = [(p.name, p.kind) for p in inspect.signature(have).parameters.values()]
        wanted = [(p.name, p.kind) for p in want.parameters.values()]
        if shape != wanted:
            problems.append(f"{backend_cls.__name__}.{name}{inspect.signature(have)} != {want}")
    return problems


def test_backends_conform_to_the_protocol() -> None:
    """Both backends have every method of the protocol with its parameters (mypy checks
    the types where a backend is passed as one); the check itself can fail."""
    from schedswitchd.daemon.kernel_backend import KernelBackend

    assert len(_protocol_members(SchedulerBackend)) >= 12
    assert _conformance_problems(KernelBackend) == []
    assert _conformance_problems(FakeBackend) == []

    class Drifted(FakeBackend):
        def attach(self, handle: Prepared, timeout: float) -> int | None:
            return None

    del_watch = type("NoWatch", (), {k: v for k, v in vars(FakeBackend).items() if k != "watch"})
    assert _conformance_problems(Drifted) == [
        "Drifted.attach(self, handle: 'Prepared', timeout: 'float') -> 'int | None' != "
        + str(inspect.signature(SchedulerBackend.attach))
    ]
    assert "NoWatch.watch is missing" in _conformance_problems(del_watch)


def test_the_switch_window_spans_detach_and_attach() -> None:
    class WindowBackend(FakeBackend):
        def switch_window(self) -> AbstractContextManager[bool]:
            @contextlib.contextmanager
            def window() -> Iterator[bool]:
                self.calls.append("window open")
                try:
                    yield True
                finally:
                    self.calls.append("window closed")

            return window()

    s, b = make(WindowBackend())
    s.switch_to("fifo", SPEC, "lease 1")
    b.calls.clear()
    rec = s.switch_to("vtime", SPEC, "lease 2")
    assert rec is not None and rec.ok and rec.expedited
    # preparing happens before the window: only the kernel's part runs expedited
    assert b.calls[:4] == ["prepare vtime", "window open", "detach fifo", "attach vtime"]
    assert "window closed" in b.calls
    plain, _ = make()
    plain.switch_to("fifo", SPEC, "lease 1")
    rec = plain.switch_to("vtime", SPEC, "lease 2")
    assert rec is not None and not rec.expedited


def test_a_standby_switch_has_no_prepare() -> None:
    s, b = make()
    s.configure_standby(1, 1 << 30)
    s.switch_to("fifo", SPEC, "lease 1")
    s.fill_standby([("vtime", SPEC, "default")])
    assert b.calls[-1] == "prepare vtime"
    assert [e.name for e in s.standby] == ["vtime"]
    b.calls.clear()
    rec = s.switch_to("vtime", SPEC, "release")
    assert rec is not None and rec.ok and rec.standby
    assert b.calls == ["detach fifo", "attach vtime", "pin vtime", "discard fifo"]
    assert "prepare" not in rec.phases_ns and "standby" in rec.phases_ns
    assert s.standby.hits == 1 and not s.standby.entries  # taken out of the pool


def test_a_stale_standby_is_discarded_and_prepared_anew() -> None:
    s, b = make()
    s.configure_standby(1, 1 << 30)
    s.fill_standby([("vtime", SPEC, "default")])
    b.stale.add("vtime")  # e.g. the object file was rebuilt
    b.calls.clear()
    rec = s.switch_to("vtime", SPEC, "lease")
    assert rec is not None and rec.ok and not rec.standby
    assert b.calls[:2] == ["discard vtime", "prepare vtime"]
    assert s.standby.misses == 1
    assert len(b.live) == 1  # only the attached handle is alive


def test_a_changed_configuration_is_not_served_from_the_pool() -> None:
    s, b = make()
    s.configure_standby(1, 1 << 30)
    s.fill_standby([("vtime", SPEC, "default")])
    other = SchedulerConfig(object="/nonexistent.bpf.o", rodata={"slice_ns": 1})
    rec = s.switch_to("vtime", other, "lease")
    assert rec is not None and not rec.standby
    assert len(b.live) == 1


def test_pool_bounds_entries_and_kernel_bytes() -> None:
    s, b = make()
    s.configure_standby(1, 10_000)
    s.fill_standby([("vtime", SPEC, "intent"), ("gaming", SPEC, "default")])
    assert [e.name for e in s.standby] == ["vtime"]  # the most wanted one
    assert len(b.live) == 1
    b.handle_bytes["gaming"] = 20_000  # more than max_kernel_bytes on its own
    s.fill_standby([("gaming", SPEC, "intent")])
    assert not s.standby.entries and not b.live
    s.configure_standby(2, 1 << 30)
    s.fill_standby([("vtime", SPEC, "intent"), ("gaming", SPEC, "default")])
    assert {e.name for e in s.standby} == {"vtime", "gaming"}
    assert s.standby.kernel_bytes == 4096 + 20_000
    s.configure_standby(0, 0)
    assert not s.standby.entries and not b.live


def test_the_running_scheduler_is_not_held_and_failures_do_not_raise() -> None:
    s, b = make(FakeBackend(fail_prepare={"gaming"}))
    s.configure_standby(2, 1 << 30)
    s.switch_to("fifo", SPEC, "lease")
    s.fill_standby([("fifo", SPEC, "default"), ("gaming", SPEC, "recent hint")])
    assert not s.standby.entries
    assert s.standby.failures == 1 and s.standby.last_error is not None
    assert b.calls.count("prepare fifo") == 1  # only the switch's own


def test_on_enabled_comes_before_the_pin_and_freeing_the_old_one() -> None:
    s, b = make()
    s.switch_to("fifo", SPEC, "lease 1")
    b.calls.clear()
    seen: list[tuple[list[str], bool, str, int | None]] = []

    def on_enabled(rec: SwitchInfo) -> None:
        seen.append((list(b.calls), rec.finished, s.active, rec.gap_ns))

    rec = s.switch_to("vtime", SPEC, "lease 2", on_enabled)
    assert rec is not None and rec.ok and rec.finished
    # one confirmation (the backend's attach), then the callback, then pin and discard
    assert seen == [(["prepare vtime", "detach fifo", "attach vtime"], False, "vtime", rec.gap_ns)]
    assert b.calls[3:] == ["pin vtime", "discard fifo"]
    assert 0 <= rec.phases_ns["until_enabled"] <= rec.phases_ns["total"]
    # not called for a switch to the kernel, nor for one that fails before running
    called: list[SwitchInfo] = []
    s.switch_to(KERNEL, None, "stop", called.append)
    b.fail_prepare.add("gaming")
    s.switch_to("gaming", SPEC, "lease 3", called.append)
    assert called == []


def test_a_pin_failure_after_on_enabled_rolls_back_to_the_previous() -> None:
    s, b = make()
    s.switch_to("fifo", SPEC, "lease 1")
    b.fail_pin.add("vtime")
    b.calls.clear()
    told: list[str] = []
    rec = s.switch_to("vtime", SPEC, "lease 2", lambda r: told.append(r.result))
    assert told == ["ok"]  # the waiter was told it ran; the record says what happened next
    assert rec is not None and rec.result == proto.ROLLED_BACK and rec.finished
    assert rec.error is not None and rec.error.code == "pin"
    assert b.calls == [
        "prepare vtime",
        "detach fifo",
        "attach vtime",
        "pin vtime",
        "discard vtime",
        "detach vtime",
        "attach fifo",
        "pin fifo",
    ]
    assert s.active == "fifo" and s.current_spec == SPEC and len(b.live) == 1
    assert b.kernel_state().ops == "fifo_ops"
    # without a previous scheduler the kernel's own runs
    k, kb = make()
    kb.fail_pin.add("vtime")
    rec = k.switch_to("vtime", SPEC, "lease 1")
    assert rec is not None and rec.result == proto.ROLLED_BACK and k.active == KERNEL
    assert kb.kernel_state().state == "disabled" and not kb.live


@pytest.mark.parametrize("blank", [False, True])
def test_a_blank_record_filled_by_begin_standby_is_the_record_it_would_make(blank: bool) -> None:
    """The standby hit's record made ahead (``blank_record``) and filled in by assignment
    is the model the constructor makes: the same fields, the same fields set (pydantic's
    ``exclude_unset`` reads them) and the same JSON. Fails when pydantic starts to
    validate or track assignments differently from construction."""

    def hit(s: sw.Switcher, record: SwitchInfo | None) -> SwitchInfo:
        s.configure_standby(1, 1 << 30)
        s.switch_to("fifo", SPEC, "lease 1")
        s.fill_standby([("vtime", SPEC, "default")])
        pending = s.begin_standby("vtime", SPEC, "lease 2-ab gaming", record)
        assert pending is not None and pending.running
        assert s.history[-1] is pending.record
        return pending.record

    s, _ = make()
    made = hit(make()[0], None)
    filled = hit(s, s.blank_record() if blank else None)
    assert filled.seq == made.seq == 2 and filled.previous == "fifo"
    assert abs(filled.time - made.time) < 60
    filled.time = made.time
    for record in (made, filled):
        record.phases_ns = {k: 0 for k in record.phases_ns}
        record.gap_ns = 0
    assert filled.model_fields_set == made.model_fields_set
    assert filled == made
    assert proto.encode(filled) == proto.encode(made)
    assert filled.model_dump(exclude_unset=True) == made.model_dump(exclude_unset=True)


def test_a_used_record_is_not_taken_as_blank() -> None:
    s, _ = make()
    used = s.switch_to("fifo", SPEC, "lease 1")
    assert used is not None
    with pytest.raises(ValueError, match="not blank"):
        s.begin_standby("vtime", SPEC, "lease 2", used)
    assert s.blank_record() not in s.history
