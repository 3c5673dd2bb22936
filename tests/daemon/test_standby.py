"""Standbys and launcher intents through the live server (fake backend).

Every server here has a safety-net poll that stands still (a :class:`FakeTimer` nobody
moves): only the test's requests and kicks start reconcile passes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import select
import struct
import termios
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from schedswitchd.cli import ctl, run
from schedswitchd.daemon.ejections import Ejections
from schedswitchd.daemon.feed import ChangeFeed
from schedswitchd.daemon.policy import NS_PER_S, Backoff, Policy
from schedswitchd.daemon.reconcile import _not_held
from schedswitchd.daemon.server import Server
from schedswitchd.daemon.standby import StandbyPool

from .fakes import FakeBackend, FakePrepared
from .harness import Client, FakeClock, FakeTimer, Running

Start = Callable[..., Running]


@pytest.fixture
def start(start_server: Start) -> Start:
    """``start(backend=None, **options)``: the suite's ``start_server`` with the poll
    standing still."""

    def make(backend: FakeBackend | None = None, **options: Any) -> Running:
        return start_server(backend or FakeBackend(), poll_timer=FakeTimer(), **options)

    return make


@pytest.fixture
def srv(start: Start) -> Running:
    return start()


def _prepared(srv: Running) -> Client:
    """A client that announced gaming (held as a standby for 30 s), once a pass after
    that has settled and the reconciler is idle (the refill's heap trim done, and the
    start's pre-open, which the announcement put off, done too), so that nothing is under
    way when the test's hint comes."""
    c = srv.client()
    assert c.request(op="prepare", workload="gaming", ttl_s=30)["ok"]
    srv.passes(1)
    srv.wait_for(lambda s: s.reconciler.idle)
    return c


@pytest.fixture
def held(start: Start) -> tuple[Running, Client]:
    """A server with fifo as the default (running) and gaming held as a standby, and the
    client that announced it."""
    srv = start(default="fifo")
    return srv, _prepared(srv)


def _hold_worker(srv: Running) -> threading.Event:
    """Keep the switch worker busy (as a refill or a heap trim would) until the returned
    event is set; returns once the worker runs the holding call."""
    hold, holding = threading.Event(), threading.Event()

    def busy() -> None:
        holding.set()
        hold.wait(10)

    srv.read(lambda s: s.reconciler.worker.submit(busy))
    assert holding.wait(5)
    return hold


def test_intent_prepares_then_the_hint_is_served_from_the_standby(srv: Running) -> None:
    c = srv.client()
    reply = c.request(op="prepare", workload="gaming", ttl_s=30)
    assert reply["ok"] and reply["op"] == "prepare", reply
    assert reply["scheduler"] == "gaming" and reply["kernel_bytes"] == 4096
    assert srv.backend.kernel_state().state == "disabled"  # prepared, not switched
    status = c.request(op="status")["status"]
    assert [s["scheduler"] for s in status["standby"]] == ["gaming"]
    assert status["standby"][0]["reason"] == "intent gaming"
    hint = c.request(op="hint", workload="gaming")
    assert hint["ok"] and hint["switch"]["standby"] is True, hint
    assert "prepare" not in hint["switch"]["phases_ns"]
    assert srv.backend.calls.count("prepare gaming") == 1
    status = c.request(op="status")["status"]
    assert status["counters"]["standby_hits"] == 1
    c.close()


def test_after_release_the_recent_hint_is_held_for_next_time(srv: Running) -> None:
    c = srv.client()
    assert c.request(op="hint", workload="video-call")["ok"]
    lease = c.request(op="status")["status"]["lease"]["lease"]
    assert c.request(op="release", lease=lease)["ok"]
    srv.wait_for(lambda s: "vtime" in s.switcher.standby.entries)
    hint = c.request(op="hint", workload="video-call")
    assert hint["switch"]["standby"] is True
    c.close()


def test_intent_needs_hint_rights_and_a_known_workload(srv: Running) -> None:
    c = srv.client()
    unknown = c.request(op="prepare", workload="no-such")
    assert not unknown["ok"] and unknown["error"]["code"] == "unknown_workload"
    bad = c.request(op="prepare", workload="gaming", ttl_s=0)
    assert not bad["ok"] and bad["error"]["code"] == "bad_request"
    c.close()


def test_a_failing_prepare_is_the_intents_error(start: Start) -> None:
    running = start(FakeBackend(verifier_reject={"gaming"}))
    c = running.client()
    reply = c.request(op="prepare", workload="gaming")
    assert not reply["ok"] and reply["error"]["code"] == "standby", reply
    assert "gaming" in reply["error"]["message"]
    assert running.backend.kernel_state().state == "disabled"
    c.close()


def test_a_backed_off_schedulers_intent_says_so(start: Start) -> None:
    running = start(FakeBackend(fail_attach={"gaming"}))
    c = running.client()
    hint = c.request(op="hint", workload="gaming")
    assert hint["ok"] and hint["switch"]["result"] == "rolled_back", hint
    reply = c.request(op="prepare", workload="gaming")
    assert not reply["ok"] and reply["error"]["code"] == "standby", reply
    message = reply["error"]["message"]
    assert message.startswith("gaming is held back after 1 failure, "), message
    assert message.endswith("s left; the last: gaming: sched_ext disabled during enable"), message
    assert "[standby] max" not in message
    c.close()


def test_an_expired_intent_is_no_longer_wanted(srv: Running) -> None:
    c = srv.client()
    assert c.request(op="prepare", workload="gaming", ttl_s=30)["ok"]

    def wanted_later(s: Server) -> list[str]:
        rec = s.reconciler
        return [n for n, _, _ in rec.standby_wanted(rec.clock() + 31 * NS_PER_S)]

    assert "gaming" in srv.read(lambda s: [n for n, _, _ in s.reconciler.standby_wanted(0)])

    assert "gaming" not in srv.read(wanted_later)
    c.close()


def test_the_end_of_an_intent_drops_its_standby(start: Start) -> None:
    """An intent's end is a deadline on the reconciler's timer: the pass it kicks (no poll:
    an hour away) no longer wants the intent's standby, and the refill lets it go."""
    srv = start(clock=FakeClock(), poll_s=3600)
    c = srv.client()
    assert c.request(op="prepare", workload="gaming", ttl_s=30)["ok"]
    srv.wait_for(lambda s: s.reconciler.idle and "gaming" in s.switcher.standby.entries)
    timer = srv.poll_timer
    assert timer is not None
    assert srv.read(lambda s: [round(t - timer.now, 3) for t in timer.pending()]) == [30, 3600]
    srv.advance_reconciler(29.9)
    assert srv.read(lambda s: list(s.switcher.standby.entries)) == ["gaming"]
    srv.advance_reconciler(0.2)
    srv.wait_for(lambda s: not s.switcher.standby.entries and not s.reconciler.intents)
    c.close()


def test_standby_zero_holds_nothing(srv: Running) -> None:
    srv.read(lambda s: s.switcher.configure_standby(0, 0))
    c = srv.client()
    assert c.request(op="hint", workload="gaming")["ok"]
    lease = c.request(op="status")["status"]["lease"]["lease"]
    assert c.request(op="release", lease=lease)["ok"]
    server = srv.server
    assert server is not None
    srv.run(server.reconciler._refill_standby())  # a refill pass, deterministically
    assert not srv.read(lambda s: list(s.switcher.standby.entries))
    assert srv.backend.calls.count("prepare gaming") == 1
    c.close()


def test_ctl_prepare_and_status_show_the_standby(
    srv: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ctl.main(["prepare", "gaming", "--ttl", "20", "--socket", srv.path]) == 0
    out = capsys.readouterr().out
    assert "gaming -> gaming: prepared, held 20 s (4 KiB of kernel memory)" in out
    assert ctl.main(["status", "--socket", srv.path]) == 0
    assert "gaming (intent gaming, 4 KiB kernel" in capsys.readouterr().out


def test_run_prepare_only(srv: Running, capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--socket", srv.path, "--prepare-only", "video-call"]) == 0
    assert "video-call -> vtime prepared for 30 s" in capsys.readouterr().err
    assert srv.read(lambda s: list(s.switcher.standby.entries)) == ["vtime"]
    assert run.main(["-q", "--socket", srv.path, "--prepare-only", "no-such"]) == 1
    assert run.main(["-q", "--socket", "/nonexistent/s", "--prepare-only", "gaming"]) == 1
    with pytest.raises(SystemExit):
        run.main(["--socket", srv.path, "--prepare-only", "gaming", "--", "true"])


def test_configured_objects_are_opened_after_the_first_pass(srv: Running) -> None:
    def opened() -> list[str]:
        return [c for c in srv.backend.calls if c.startswith("pre-open ")]

    srv.wait_for(lambda s: len(opened()) == 4)
    # one object per worker job, in the configuration's order
    assert opened() == ["pre-open fifo", "pre-open vtime", "pre-open gaming", "pre-open broken"]


def test_a_hint_during_the_pre_open_waits_for_one_object_not_all() -> None:
    """The hint's pass runs once the object being opened is done, before the others."""
    backend = FakeBackend()
    opening, release = threading.Event(), threading.Event()

    def on_preopen(call: str) -> None:
        if not opening.is_set():
            opening.set()
            release.wait(10)

    backend.on_preopen = on_preopen
    srv = Running(backend, poll_timer=FakeTimer())
    try:
        assert opening.wait(10), "no pre-open began"
        c = srv.client()
        c.send_raw(json.dumps({"v": 1, "op": "hint", "workload": "video-call"}).encode() + b"\n")
        srv.wait_for(lambda s: any(le.workload == "video-call" for le in s.policy.leases.values()))
        release.set()
        reply = c.recv_line()
        assert reply is not None and reply["active"] == "vtime", reply
        srv.wait_for(lambda s: sum(x.startswith("pre-open ") for x in backend.calls) >= 4)
        calls = [x for x in backend.calls if x.startswith(("pre-open ", "prepare "))]
        assert calls[0] == "pre-open fifo", calls
        assert calls[1] == "prepare vtime", calls  # before the rest was opened
        assert sorted(calls[2:]) == ["pre-open broken", "pre-open gaming", "pre-open vtime"]
        c.close()
    finally:
        release.set()
        srv.stop()


def test_a_hint_is_answered_once_it_runs_and_a_later_pin_failure_rolls_back(
    srv: Running,
) -> None:
    """The reply goes out the moment the kernel runs the hinted scheduler (here a standby):
    the worker is still inside the pin when the client has it. A pin failing after the
    reply rolls back to the previous scheduler, backs the hinted one off, and status
    says so."""
    c = srv.client()
    assert c.request(op="hint", workload="battery")["active"] == "fifo"
    assert c.request(op="prepare", workload="gaming", ttl_s=30)["ok"]
    held = threading.Event()
    srv.backend.pin_event = held
    srv.backend.fail_pin.add("gaming")
    try:
        hint = c.request(op="hint", workload="gaming")
        assert hint["ok"] and hint["active"] == "gaming", hint
        sw = hint["switch"]
        assert sw["standby"] is True and sw["result"] == "ok" and sw["finished"] is False
        assert "until_enabled" in sw["phases_ns"] and "pin" not in sw["phases_ns"]
        # the worker goes on into pin(gaming), and stays there until released
        srv.wait_for(lambda s: srv.backend.calls[-1] == "pin gaming")
        assert srv.read(lambda s: (s.switcher.active, s.switcher.history[-1].finished)) == (
            "gaming",
            False,
        )
        assert srv.backend.kernel_state().ops == "gaming_ops"
    finally:
        held.set()
    srv.wait_for(lambda s: s.switcher.active == "fifo" and s.switcher.history[-1].finished)
    status = c.request(op="status")["status"]
    last = status["last_switch"]
    assert (last["target"], last["result"], last["error"]["code"]) == (
        "gaming",
        "rolled_back",
        "pin",
    )
    assert status["active"] == "fifo" and srv.backend.kernel_state().ops == "fifo_ops"
    assert [b["scheduler"] for b in status["backoff"]] == ["gaming"]
    c.close()


def test_the_switch_goes_on_once_the_hint_reply_is_written(start: Start) -> None:
    """After the kernel runs the hinted scheduler, the worker waits (bounded; 10 s here so
    that a loaded host cannot reorder it) until the hint's reply is written, then pins:
    the client's socket holds no reply as attach begins and holds it as pin begins (the
    client reads it only once the switch is over; the loop is kept busy after the attach,
    so that the reply is late)."""
    srv = start(reply_wait_s=10.0)
    c = srv.client()
    seen: list[tuple[str, bool]] = []

    def reply_waiting(call: str) -> None:
        readable, _, _ = select.select([c.sock], [], [], 0)
        seen.append((call, bool(readable)))
        if call.startswith("attach "):
            # the loop is busy for 0.3 s more: a worker that did not wait for the reply
            # would begin the pin before it is written, every time
            srv.loop.call_soon_threadsafe(time.sleep, 0.3)

    srv.backend.on_call = reply_waiting
    c.send_raw(json.dumps({"v": 1, "op": "hint", "workload": "battery"}).encode() + b"\n")
    srv.wait_for(lambda s: any(r.target == "fifo" and r.finished for r in s.switcher.history))
    srv.backend.on_call = None
    reply = c.recv_line()
    assert reply is not None and reply["active"] == "fifo", reply
    assert seen == [("attach fifo", False), ("pin fifo", True)]
    c.close()


@pytest.mark.parametrize("standby", [False, True], ids=["pass", "standby-hit"])
def test_the_switch_goes_on_once_the_client_took_its_reply(start: Start, standby: bool) -> None:
    """After the hint's reply is written, the worker waits (bounded; 10 s here) until the
    client has read it before it goes on (the RCU window's end, pin, freeing the old
    scheduler): a client that reads its reply 0.3 s late has nothing left unread on its
    socket when the pin begins. Through a pass and through a standby hit's direct path."""
    srv = start(default="fifo", reply_wait_s=10.0, reply_taken_wait_s=10.0)
    c = _prepared(srv) if standby else srv.client()
    unread_at_pin: list[int] = []

    def at_call(call: str) -> None:
        if call == "pin gaming":
            got = fcntl.ioctl(c.sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
            unread_at_pin.append(struct.unpack("i", got)[0])

    srv.backend.on_call = at_call
    c.send_raw(json.dumps({"v": 1, "op": "hint", "workload": "gaming"}).encode() + b"\n")
    readable, _, _ = select.select([c.sock], [], [], 10)
    assert readable
    time.sleep(0.3)  # a slow client: a worker that did not wait would pin meanwhile
    reply = c.recv_line()
    assert reply is not None and reply["active"] == "gaming", reply
    assert reply["switch"]["standby"] is standby
    srv.wait_for(lambda s: s.switcher.history[-1].finished)
    srv.backend.on_call = None
    assert unread_at_pin == [0]
    c.close()


# --- the direct path of a standby hit --------------------------------------------------------


def test_a_standby_hit_switches_without_a_reconcile_pass_before_the_reply(
    held: tuple[Running, Client],
) -> None:
    """The hint of a held standby goes straight to the switch: no pass begins between the
    request and the attach (the reconciler's pass count, as status shows it, read as
    attach begins); one runs after the reply (the standby refill, STATUS=)."""
    srv, c = held
    rec = srv.read(lambda s: s.reconciler)
    passes = c.request(op="status")["status"]["counters"]["reconcile_passes"]
    at_attach: list[int] = []
    srv.backend.on_call = lambda call: at_attach.append(rec.passes)
    start = len(srv.backend.calls)
    statuses = len(srv.statuses)
    hint = c.request(op="hint", workload="gaming")
    assert hint["ok"] and hint["active"] == "gaming", hint
    assert hint["switch"]["standby"] is True and hint["switch"]["result"] == "ok"
    assert hint["switch"]["reason"].startswith("lease ") and hint["desired"] == "gaming"
    calls = srv.backend.calls[start:]
    assert calls[: calls.index("attach gaming") + 1] == ["detach fifo", "attach gaming"]
    assert at_attach[0] == passes, (at_attach, passes)
    # the bookkeeping pass after the reply: fifo (the default) held as the standby now
    srv.wait_for(lambda s: "fifo" in s.switcher.standby.entries)
    srv.backend.on_call = None
    after = c.request(op="status")["status"]["counters"]["reconcile_passes"]
    assert after > passes
    assert len(srv.statuses) > statuses and srv.statuses[-1].startswith("running gaming")
    history = c.request(op="history")["entries"]
    assert [(e["previous"], e["target"]) for e in history[-1:]] == [("fifo", "gaming")]
    c.close()


def _failed_hint(
    start: Start, standby: bool
) -> tuple[dict[str, object], dict[str, object], list[str]]:
    """A hint for ``gaming``, whose attach fails, with fifo running: reply, status, and the
    backend's calls from the hint on; with ``standby``, gaming is held as a standby."""
    srv = start(FakeBackend(fail_attach={"gaming"}), default="fifo")
    if standby:
        c = _prepared(srv)
    else:
        c = srv.client()
        srv.passes(1)
    calls_before = len(srv.backend.calls)
    hint = c.request(op="hint", workload="gaming")
    srv.wait_for(lambda s: s.switcher.history[-1].finished)
    srv.passes(1)
    status = c.request(op="status")["status"]
    # the start's pre-open, which the set-up's requests put off, may still open objects
    calls = [c for c in srv.backend.calls[calls_before:] if not c.startswith("pre-open ")]
    assert srv.backend.kernel_state().ops == "fifo_ops"
    c.close()
    return hint, status, calls


def test_a_failed_direct_attach_falls_back_like_the_pass(start: Start) -> None:
    """The standby's attach fails: the old scheduler runs on (rolled back), the target is
    backed off, and the reply and status say what a hint without a standby says."""
    direct, direct_status, calls = _failed_hint(start, standby=True)
    normal, normal_status, _ = _failed_hint(start, standby=False)
    assert direct["switch"]["standby"] is True and normal["switch"]["standby"] is False  # type: ignore[index]
    assert calls[:2] == ["detach fifo", "attach gaming"]
    for reply in (direct, normal):
        sw = reply["switch"]
        assert (sw["target"], sw["result"]) == ("gaming", "rolled_back"), reply  # type: ignore[index]
    keys = ("ok", "scheduler", "desired", "active", "pending")
    assert {k: direct[k] for k in keys} == {k: normal[k] for k in keys}
    assert direct["active"] == "fifo" and direct["desired"] == "fifo"
    for reply in (direct, normal):  # the seconds left may differ by one between the two
        assert str(reply["passed_over"]).startswith("gaming is held back after 1 failure, ")
    view = ("active", "desired")
    assert {k: direct_status[k] for k in view} == {k: normal_status[k] for k in view}
    backoff = [(b["scheduler"], b["failures"]) for b in direct_status["backoff"]]  # type: ignore[attr-defined]
    assert backoff == [("gaming", 1)]
    assert backoff == [(b["scheduler"], b["failures"]) for b in normal_status["backoff"]]  # type: ignore[attr-defined]


def test_a_stale_standby_is_not_taken_by_the_direct_path(held: tuple[Running, Client]) -> None:
    """A held standby whose inputs changed (object rebuilt, module set) is discarded by the
    take, and the hint's switch prepares the scheduler anew (no pass prunes it first: the
    poll stands still, so the hint's own take finds it stale)."""
    srv, c = held
    handle = srv.read(lambda s: cast(FakePrepared, s.switcher.standby.entries["gaming"].prepared))
    srv.backend.stale.add("gaming")
    hint = c.request(op="hint", workload="gaming")
    assert hint["ok"] and hint["active"] == "gaming", hint
    assert hint["switch"]["standby"] is False and "prepare" in hint["switch"]["phases_ns"]
    assert handle.discarded and srv.backend.attached_handle is not handle
    c.close()


def test_a_hits_take_checks_quickly_and_the_refill_in_full(held: tuple[Running, Client]) -> None:
    """The hint's take asks the backend for its quick freshness check (a profiled
    standby's topology is then not read: see KernelBackend.fresh), the pool's refill
    rounds for the full one, so that what the quick one trusts is checked off the hit's
    path."""
    srv, c = held
    checks = srv.backend.fresh_checks
    assert checks and not any(quick for _, quick in checks), checks  # the fill's own
    before = len(checks)
    hint = c.request(op="hint", workload="gaming")
    assert hint["ok"] and hint["switch"]["standby"] is True, hint
    assert checks[before] == ("gaming", True), checks[before:]
    c.close()  # the lease ends: back to fifo, gaming held again as the recent hint
    srv.passes(1)
    srv.wait_for(lambda s: s.reconciler.idle and "gaming" in s.switcher.standby.entries)
    c2 = srv.client()
    assert c2.request(op="prepare", workload="gaming", ttl_s=30)["ok"]
    srv.passes(1)
    srv.wait_for(lambda s: s.reconciler.idle)
    refill = [quick for name, quick in checks[before + 1 :] if name == "gaming"]
    assert refill and not any(refill), checks[before:]  # the held entry re-checked in full
    c2.close()


def test_the_direct_path_notices_an_ejection_first(
    held: tuple[Running, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The running scheduler was ejected and no event said so yet, and it keeps no exit
    record: the direct path records the ejection (from the kernel's state) and backs it off
    as a pass does, then the hint is switched (by a pass)."""
    srv, c = held
    srv.backend.no_exit_record.add("fifo")
    watchers = srv.backend.watchers
    monkeypatch.setattr(srv.backend, "watchers", [])  # no uevent reaches the daemon
    srv.backend.eject()
    srv.backend.watchers = watchers
    hint = c.request(op="hint", workload="gaming")
    assert hint["ok"] and hint["active"] == "gaming", hint
    assert hint["switch"]["previous"] == "kernel" and hint["switch"]["standby"] is True
    history = c.request(op="history")["entries"]
    assert [(e["previous"], e["target"], e["result"]) for e in history[-2:]] == [
        ("fifo", "kernel", "ejected"),
        ("kernel", "gaming", "ok"),
    ]
    status = c.request(op="status")["status"]
    assert [b["scheduler"] for b in status["backoff"]] == ["fifo"]
    c.close()


def _eject_unnoticed(srv: Running, monkeypatch: pytest.MonkeyPatch, **exit_: Any) -> None:
    """The kernel ejects the running scheduler and no event reaches the daemon."""
    watchers = srv.backend.watchers
    monkeypatch.setattr(srv.backend, "watchers", [])
    srv.backend.eject(**exit_)
    srv.backend.watchers = watchers


def test_a_standby_hit_notices_an_ejection_from_the_old_schedulers_exit_record(
    held: tuple[Running, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The running scheduler (which keeps an exit record) was ejected and no event said so
    yet: the standby hit reads no kernel state before its detach; after the switch the old
    scheduler's exit record (a stall, not the SCX_EXIT_UNREG its detach would have left)
    shows the ejection, which is recorded after the switch and backed off as a pass does."""
    srv, c = held
    _eject_unnoticed(srv, monkeypatch)
    hint = c.request(op="hint", workload="gaming")
    assert hint["ok"] and hint["active"] == "gaming", hint
    sw = hint["switch"]
    assert (sw["previous"], sw["standby"], sw["result"]) == ("fifo", True, "ok")
    srv.wait_for(lambda s: s.switcher.history[-1].result == "ejected")
    history = c.request(op="history")["entries"]
    assert [(e["previous"], e["target"], e["result"]) for e in history[-2:]] == [
        ("fifo", "gaming", "ok"),
        ("fifo", "kernel", "ejected"),
    ]
    assert history[-1]["exit"]["kind_name"] == "ERROR_STALL"
    srv.wait_for(lambda s: bool(s.policy.backoff))
    status = c.request(op="status")["status"]
    assert [b["scheduler"] for b in status["backoff"]] == ["fifo"]
    assert status["active"] == "gaming" and status["last_exit"]["kind_name"] == "ERROR_STALL"
    c.close()


def test_a_standby_hit_after_our_own_detach_records_no_ejection(
    held: tuple[Running, Client],
) -> None:
    """The old scheduler's exit record after the standby hit's detach says SCX_EXIT_UNREG
    (the detach's own): no ejection recorded, nothing backed off."""
    srv, c = held
    hint = c.request(op="hint", workload="gaming")
    assert hint["ok"] and hint["switch"]["standby"] is True, hint
    srv.wait_for(lambda s: "fifo" in s.switcher.standby.entries)
    history = c.request(op="history")["entries"]
    assert [e["result"] for e in history] == ["ok", "ok"]
    assert c.request(op="status")["status"]["backoff"] == []
    c.close()


def test_a_failed_pin_after_an_ejection_found_late_does_not_roll_back_to_it(
    held: tuple[Running, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old scheduler had been ejected before the standby hit and the new one's pin
    fails after the reply: the switch does not attach the ejected one again (the kernel's
    own scheduler runs); the ejection is recorded and both are backed off, and the pass
    after it finds nothing to run but the kernel's."""
    srv, c = held
    _eject_unnoticed(srv, monkeypatch)
    srv.backend.fail_pin.add("gaming")
    hint = c.request(op="hint", workload="gaming")
    assert hint["ok"] and hint["switch"]["standby"] is True, hint
    srv.wait_for(lambda s: len(s.policy.backoff) == 2)
    srv.passes(1)
    attaches = [call for call in srv.backend.calls if call.startswith("attach")]
    assert attaches[-1] == "attach gaming", srv.backend.calls
    history = c.request(op="history")["entries"]
    assert [(e["previous"], e["target"], e["result"]) for e in history[-2:]] == [
        ("fifo", "gaming", "rolled_back"),
        ("fifo", "kernel", "ejected"),
    ]
    status = c.request(op="status")["status"]
    assert status["active"] == "kernel" and srv.backend.kernel_state().state == "disabled"
    assert sorted(b["scheduler"] for b in status["backoff"]) == ["fifo", "gaming"]
    c.close()


def test_a_standby_hit_switches_on_the_event_loop_when_the_worker_is_idle(
    held: tuple[Running, Client],
) -> None:
    """With the worker idle, the standby hit's detach and attach run on the event loop's
    thread (no hop to the worker and back before the reply), and its pin and the old
    scheduler's freeing on the worker, after the reply. A hint that comes while the worker
    is busy (held in a call of the test's) is no standby hit: a normal pass switches it on
    the worker, taking the held standby all the same."""
    srv, c = held
    threads: list[tuple[str, str]] = []
    srv.backend.on_call = lambda call: threads.append((call, threading.current_thread().name))
    hint = c.request(op="hint", workload="gaming")
    assert hint["ok"] and hint["switch"]["standby"] is True, hint
    srv.wait_for(lambda s: s.switcher.history[-1].finished)
    srv.backend.on_call = None
    loop_thread = srv.read(lambda s: threading.current_thread().name)
    assert threads[0] == ("attach gaming", loop_thread), threads
    assert threads[1][0] == "pin gaming" and threads[1][1].startswith("switcher"), threads
    # back to the default (fifo, held as a standby by the pass after the switch), with the
    # worker held busy: the hit goes through the worker
    assert c.request(op="release", lease=hint["lease"])["ok"]
    srv.wait_for(lambda s: s.switcher.active == "fifo" and "gaming" in s.switcher.standby.entries)
    srv.passes(1)
    hold = _hold_worker(srv)
    threads.clear()
    srv.backend.on_call = lambda call: threads.append((call, threading.current_thread().name))
    try:
        c.send_raw(json.dumps({"v": 1, "op": "hint", "workload": "gaming"}).encode() + b"\n")
        time.sleep(0.2)
        assert threads == []  # waiting for the worker
    finally:
        hold.set()
    reply = c.recv_line()
    assert reply is not None and reply["active"] == "gaming", reply
    assert reply["switch"]["standby"] is True, reply
    srv.backend.on_call = None
    assert threads[0][0] == "attach gaming" and threads[0][1].startswith("switcher"), threads
    c.close()


def test_notifications_during_a_direct_switch_are_left_to_the_pass_after_it(
    held: tuple[Running, Client],
) -> None:
    """A backend notification while a direct switch is under way (here: the kernel ejects
    the new scheduler while the worker pins it, after the reply) begins no pass of its
    own; the pass that follows the switch records the ejection and backs the scheduler
    off, and the default comes back."""
    srv, c = held
    pinning, hold = threading.Event(), threading.Event()
    srv.backend.pin_event = hold
    srv.backend.on_call = lambda call: pinning.set() if call == "pin gaming" else None
    try:
        hint = c.request(op="hint", workload="gaming")
        assert hint["ok"] and hint["switch"]["standby"] is True, hint
        assert pinning.wait(5)
        passes = srv.read(lambda s: s.reconciler.passes)
        srv.backend.eject()  # its notify() now, from this thread
        srv.read(lambda s: None)  # a pass it kicked would have begun by the second
        assert srv.read(lambda s: s.reconciler.passes) == passes
        status = c.request(op="status")["status"]
        assert status["counters"]["notifications_held"] == 1
        assert status["counters"]["reconcile_passes"] == passes
    finally:
        srv.backend.on_call = None
        hold.set()
    srv.wait_for(lambda s: s.switcher.active == "fifo" and s.switcher.history[-1].finished)
    history = c.request(op="history")["entries"]
    assert [(e["previous"], e["target"], e["result"]) for e in history[-3:]] == [
        ("fifo", "gaming", "ok"),
        ("gaming", "kernel", "ejected"),
        ("kernel", "fifo", "ok"),
    ]
    status = c.request(op="status")["status"]
    assert [b["scheduler"] for b in status["backoff"]] == ["gaming"]
    c.close()


def test_the_direct_path_only_for_its_own_lease_and_no_pass_under_way(
    held: tuple[Running, Client],
) -> None:
    """:meth:`DirectSwitch.standby_hit` picks the direct path only when the policy chooses
    the new lease itself, its scheduler is held and not running, no pass or other direct
    switch is under way, the worker is idle and the running scheduler keeps an exit
    record."""
    from schedswitchd.daemon.policy import Lease

    srv, c = held
    rec = srv.read(lambda s: s.reconciler)

    def probe(workload: str, seq: int, **state: bool) -> object:
        def check(s: Server) -> object:
            lease = Lease(f"p{seq}", workload, 0, 0, None, 0, None, seq)
            s.policy.add(lease)
            owners = {k: rec if k == "_in_pass" else rec.direct for k in state}
            saved = {k: getattr(owners[k], k) for k in state}
            for k, v in state.items():
                setattr(owners[k], k, v)
            try:
                return rec.direct.standby_hit(lease)
            finally:
                for k, v in saved.items():
                    setattr(owners[k], k, v)
                s.policy.remove(lease.id)

        return srv.read(check)

    hit = probe("gaming", 10**6)
    assert isinstance(hit, tuple) and hit[0] == "gaming" and hit[2] == "lease p1000000 gaming"
    assert probe("gaming", 10**6, _in_pass=True) is None
    assert probe("gaming", 10**6, active=True) is None
    hold = _hold_worker(srv)
    try:
        assert probe("gaming", 10**6) is None  # the worker is busy
    finally:
        hold.set()
    srv.wait_for(lambda s: s.reconciler.worker.idle)
    srv.backend.no_exit_record.add("fifo")
    assert probe("gaming", 10**6) is None  # fifo keeps no exit record
    srv.backend.no_exit_record.discard("fifo")
    assert probe("video-call", 10**6) is None  # vtime is not held
    assert probe("battery", 10**6) is None  # fifo runs already
    # a lease of lower priority than a live one is not what the policy picks
    assert c.request(op="hint", workload="broken")["ok"] is True
    assert probe("gaming", 10**6) is None
    c.close()


def test_a_pass_kicked_during_a_hit_on_the_loop_waits_for_its_second_half(
    held: tuple[Running, Client],
) -> None:
    """A pass kicked while the standby hit's first half runs on the loop (here: an admin
    override to fifo, made on the loop inside the attach) switches only once the hit's
    second half (pin, freeing the old scheduler) is over on the worker: the hit's record
    ends ok and pinned, the pass's switch follows, and no handle is left behind."""
    srv, c = held
    rec = srv.read(lambda s: s.reconciler)

    def at_call(call: str) -> None:
        if call == "attach gaming":
            srv.backend.on_call = None
            rec.set_override("fifo")  # on the loop thread: kicks a pass

    srv.backend.on_call = at_call
    hint = c.request(op="hint", workload="gaming")
    assert hint["ok"] and hint["switch"]["standby"] is True, hint
    srv.wait_for(lambda s: s.switcher.active == "fifo" and s.reconciler.idle)
    history = c.request(op="history")["entries"]
    assert [(e["previous"], e["target"], e["result"], e["finished"]) for e in history[-2:]] == [
        ("fifo", "gaming", "ok", True),
        ("gaming", "fifo", "ok", True),
    ]
    assert "pin" in history[-2]["phases_ns"]
    pins = [call for call in srv.backend.calls if call.startswith("pin")]
    assert pins[-2:] == ["pin gaming", "pin fifo"], srv.backend.calls
    held_ids = srv.read(
        lambda s: {id(s.switcher.current)} | {id(e.prepared) for e in s.switcher.standby}
    )
    assert srv.backend.live == held_ids
    c.close()


@contextlib.contextmanager
def _hand_offs(rec: Any) -> Iterator[list[str]]:
    """While in it, the reconciler's ``reply_sent`` and its worker's ``submit`` calls, in
    their order, as ``"reply_sent"`` and ``"submit"``."""
    events: list[str] = []
    submit, reply_sent = rec.worker.submit, rec.reply_sent

    def logged_submit(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        events.append("submit")
        return submit(fn, *args, **kwargs)

    def logged_reply_sent() -> None:
        events.append("reply_sent")
        reply_sent()

    rec.worker.submit = logged_submit
    rec.reply_sent = logged_reply_sent
    try:
        yield events
    finally:
        del rec.worker.submit, rec.reply_sent


def test_a_hit_on_the_loop_wakes_the_worker_only_once_its_reply_is_written(
    held: tuple[Running, Client],
) -> None:
    """The standby hit's second half is held, not submitted, until the hint's reply is
    written: between the send and the reply the worker thread gets no call (under the
    VM's one emulated CPU its wake-up came out of the reply's time); it is submitted in
    reply_sent, and the switch then finishes (pinned) on the worker."""
    srv, c = held
    rec = srv.read(lambda s: s.reconciler)
    with _hand_offs(rec) as events:
        hint = c.request(op="hint", workload="gaming")
        assert hint["ok"] and hint["switch"]["standby"] is True, hint
        srv.wait_for(lambda s: s.switcher.history[-1].finished and s.reconciler.idle)
    assert events[:2] == ["reply_sent", "submit"], events
    history = c.request(op="history")["entries"]
    assert (history[-1]["target"], history[-1]["result"]) == ("gaming", "ok")
    assert "pin" in history[-1]["phases_ns"]
    c.close()


def test_each_hit_holds_its_second_half_until_its_own_reply_is_taken(
    held: tuple[Running, Client],
) -> None:
    """Two standby hits one after the other: the second one's second half, too, waits
    for its reply: each hit hands the reconciler a gate of its own, not yet open (the gate
    is made ahead of a hit; one a hit used, already open, counts no reply and would leave
    the second half to its fallback)."""
    srv, c = held
    rec = srv.read(lambda s: s.reconciler)
    # The gates themselves are kept (not their id()s: a freed gate's address is reused).
    gates: list[tuple[Any, bool]] = []
    gate_for_replies = rec.gate_for_replies

    def logged_gate(gate: Any) -> None:
        if gate is not None:
            gates.append((gate, gate.open))
        gate_for_replies(gate)

    rec.gate_for_replies = logged_gate  # type: ignore[method-assign]
    try:
        first = c.request(op="hint", workload="gaming")
        assert first["ok"] and first["switch"]["standby"] is True, first
        srv.wait_for(lambda s: s.switcher.history[-1].finished and s.reconciler.idle)
        assert c.request(op="release", lease=first["lease"])["ok"]
        srv.wait_for(
            lambda s: s.switcher.active == "fifo" and "gaming" in s.switcher.standby.entries
        )
        srv.passes(1)
        srv.wait_for(lambda s: s.reconciler.idle)
        with _hand_offs(rec) as events:
            second = c.request(op="hint", workload="gaming")
            assert second["ok"] and second["switch"]["standby"] is True, second
            srv.wait_for(lambda s: s.switcher.history[-1].finished and s.reconciler.idle)
    finally:
        del rec.gate_for_replies
    assert events[:2] == ["reply_sent", "submit"], events
    assert len(gates) == 2 and gates[0][0] is not gates[1][0], gates
    assert not gates[0][1] and not gates[1][1], gates
    c.close()


def test_a_hits_second_half_runs_when_its_reply_is_never_reported(start: Start) -> None:
    """A standby hit whose reply is never reported (here: the direct switch called without
    a connection) still finishes its switch -- the switch window closed, pinned, the old
    scheduler freed -- at the next call submitted to the worker: the safety-net poll's
    pass; the worker is idle again after it. Until then the second half is held, not
    submitted (nothing in the hit's step arms a timer for it)."""
    from schedswitchd.daemon.policy import Lease

    srv = start(default="fifo", reply_wait_s=0.2)
    _prepared(srv)
    rec = srv.read(lambda s: s.reconciler)

    async def hit() -> tuple[list[Any], bool]:
        server = srv.server
        assert server is not None
        lease = Lease("x1", "gaming", 0, 0, None, 0, None, 10**6)
        server.policy.add(lease)
        direct = rec.direct.standby_hit(lease)
        assert direct is not None
        return await rec.direct.switch(*direct)

    made, settled = srv.run(hit())
    assert settled and [(r.target, r.finished) for r in made] == [("gaming", False)]
    time.sleep(0.4)  # past reply_wait_s: nothing submits it by itself
    assert srv.read(lambda s: (s.reconciler.worker.holding, s.switcher.history[-1].finished)) == (
        True,
        False,
    )
    srv.advance_poll(1.0)  # the safety-net poll: a pass, whose first call releases it
    srv.wait_for(lambda s: s.switcher.history[-1].finished and s.reconciler.idle)
    calls = srv.backend.calls
    assert calls[calls.index("attach gaming") :][:2] == ["attach gaming", "pin gaming"], calls
    assert srv.backend.windows_open == 0


def test_a_hit_whose_request_fails_after_its_switch_still_releases_it(
    held: tuple[Running, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection reports a hit's reply even when writing it failed (a defect in the
    connection's write here): ``reply_sent`` comes once, so the held second half does not
    wait for another call to the worker; the switch finishes."""
    from schedswitchd.daemon.connection import Connection

    srv, c = held
    rec = srv.read(lambda s: s.reconciler)
    reported: list[int] = []
    reply_sent = rec.reply_sent

    def counting() -> None:
        reported.append(1)
        reply_sent()

    rec.reply_sent = counting  # type: ignore[method-assign]
    real_send = Connection._send

    async def broken(self: Connection, data: bytes) -> bool:
        if b'"op":"hint"' in data:
            raise RuntimeError("a defect in writing the reply")
        return await real_send(self, data)

    monkeypatch.setattr(Connection, "_send", broken)
    hinting = srv.client()
    hinting.send_raw(json.dumps({"v": 1, "op": "hint", "workload": "gaming"}).encode() + b"\n")
    assert hinting.recv_line() is None  # the connection ended without a reply
    srv.wait_for(lambda s: s.switcher.history[-1].finished and s.reconciler.idle)
    del rec.reply_sent
    assert reported == [1]
    hit = srv.read(lambda s: [r for r in s.switcher.history if r.standby][-1])
    assert (hit.target, hit.result, hit.finished) == ("gaming", "ok", True)
    hinting.close()
    c.close()


def test_a_hits_reply_asks_the_policy_again_when_something_changed_meanwhile(
    held: tuple[Running, Client],
) -> None:
    """A standby hit's reply says ``desired`` without asking the policy again only when
    nothing changed since :meth:`DirectSwitch.standby_hit` decided: here an admin override
    to vtime is made during the hit's attach (on the loop's thread), and the reply's
    ``desired`` is vtime (what the policy wants now), not the hit's gaming."""
    srv, c = held
    rec = srv.read(lambda s: s.reconciler)

    def at_call(call: str) -> None:
        if call == "attach gaming":
            srv.backend.on_call = None
            rec.set_override("vtime")  # on the loop thread: a change, kicked

    srv.backend.on_call = at_call
    reply = c.request(op="hint", workload="gaming")
    assert reply["ok"] and reply["switch"]["target"] == "gaming", reply
    assert reply["switch"]["standby"] is True, reply
    assert reply["desired"] == "vtime", reply
    c.close()


def test_a_hit_on_the_loop_wakes_the_worker_only_once_its_client_took_the_reply(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """After a standby hit's reply is written, its second half is submitted to the worker
    only once the client has read the reply (looked at from the loop; bounded by
    ``reply_taken_wait_s``, 10 s here): a client that reads 0.3 s late has nothing left
    unread on its socket when the worker gets the call. The lease's log line waits as
    long."""
    caplog.set_level(logging.INFO, logger="schedswitchd")
    srv = start(default="fifo", reply_wait_s=10.0, reply_taken_wait_s=10.0)
    c = _prepared(srv)
    rec = srv.read(lambda s: s.reconciler)
    unread_at_submit: list[int] = []
    submit = rec.worker.submit

    def logged_submit(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        got = fcntl.ioctl(c.sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        unread_at_submit.append(struct.unpack("i", got)[0])
        return submit(fn, *args, **kwargs)

    rec.worker.submit = logged_submit  # type: ignore[method-assign]
    try:
        c.send_raw(json.dumps({"v": 1, "op": "hint", "workload": "gaming"}).encode() + b"\n")
        readable, _, _ = select.select([c.sock], [], [], 10)
        assert readable
        time.sleep(0.3)  # a slow client
        assert unread_at_submit == []  # nothing submitted while the reply waits unread
        assert not [r for r in caplog.records if r.getMessage().startswith("lease ")]
        reply = c.recv_line()
        assert reply is not None and reply["switch"]["standby"] is True, reply
        srv.wait_for(lambda s: s.switcher.history[-1].finished and s.reconciler.idle)
    finally:
        del rec.worker.submit
    assert unread_at_submit[:1] == [0], unread_at_submit
    assert [r for r in caplog.records if r.getMessage().startswith("lease ")]
    c.close()


def test_a_hits_reply_decides_again_when_a_ttl_ended_during_the_switch(
    held: tuple[Running, Client],
) -> None:
    """The reply's ``desired`` reuses standby_hit's decision only while no lease's TTL (or
    backoff hold) ended since: a hint whose own 0.2 s TTL passes while its switch runs on
    the loop (the attach held 0.3 s here) replies what the policy wants now, the default
    fifo, not the hint's gaming."""
    srv, c = held

    def slow_attach(call: str) -> None:
        if call == "attach gaming":
            srv.backend.on_call = None
            time.sleep(0.3)  # on the loop thread: the switch takes that long

    srv.backend.on_call = slow_attach
    reply = c.request(op="hint", workload="gaming", ttl_s=0.2)
    assert reply["ok"] and reply["switch"]["target"] == "gaming", reply
    assert reply["desired"] == "fifo", reply
    c.close()


def test_a_hits_connection_gives_way_to_its_client_once_the_reply_is_written(
    held: tuple[Running, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After writing a standby hit's reply the connection gives way (``give_way``) once,
    before it parks to wait for the client's take (and so before the reply is reported
    taken and the switch's second half submitted); a reply that released no switch
    (``status``) does not give way."""
    from schedswitchd.daemon import connection

    srv, c = held
    rec = srv.read(lambda s: s.reconciler)
    send, park = connection.Connection._send, connection.Connection._park
    with _hand_offs(rec) as events:

        async def logged_send(self: connection.Connection, data: bytes) -> bool:
            events.append("write")  # before the send: the client may read before it returns
            return await send(self, data)

        def logged_park(self: connection.Connection, *args: Any) -> None:
            events.append("park")
            park(self, *args)

        monkeypatch.setattr(connection.Connection, "_send", logged_send)
        monkeypatch.setattr(connection.Connection, "_park", logged_park)
        monkeypatch.setattr(connection, "give_way", lambda: events.append("give_way"))
        hint = c.request(op="hint", workload="gaming")
        assert hint["ok"] and hint["switch"]["standby"] is True, hint
        srv.wait_for(lambda s: s.switcher.history[-1].finished and s.reconciler.idle)
        assert events[:5] == ["write", "give_way", "park", "reply_sent", "submit"], events
        assert events.count("give_way") == 1, events
        del events[:]
        assert c.request(op="status")["ok"]
    assert events == ["write"], events
    c.close()


def test_a_hits_lease_is_announced_once_its_reply_was_taken_and_before_its_switch(
    held: tuple[Running, Client],
) -> None:
    """A standby hit's ``lease_added`` is published after its reply went out (the reply
    does not wait for the publication), and still before the hit's ``switch`` and the
    lease's ``lease_ended`` on the feed."""
    srv, c = held
    rec = srv.read(lambda s: s.reconciler)
    sub = srv.read(lambda s: s.reconciler.feed.subscribe())
    publish = rec.feed.publish
    with _hand_offs(rec) as events:

        def logged_publish(kind: str, **fields: Any) -> Any:
            events.append(kind)
            return publish(kind, **fields)

        rec.feed.publish = logged_publish  # type: ignore[method-assign]
        try:
            hint = c.request(op="hint", workload="gaming")
            assert hint["ok"] and hint["switch"]["standby"] is True, hint
            srv.wait_for(lambda s: s.switcher.history[-1].finished and s.reconciler.idle)
        finally:
            del rec.feed.publish
    assert events[: events.index("lease_added") + 1] == ["reply_sent", "submit", "lease_added"]
    c.close()
    srv.wait_for(lambda s: not s.policy.leases and s.reconciler.idle)
    kinds = srv.read(lambda s: [(ch.kind, ch.fields.get("lease")) for ch in sub._queue])
    lease = hint["lease"]
    assert kinds[:3] == [("lease_added", lease), ("switch", None), ("lease_ended", lease)], kinds


def test_a_lease_that_ends_before_its_announcement_is_announced_first(srv: Running) -> None:
    """A lease made unannounced (``new_lease(announce=False)``, as a hint's is until its
    reply was taken) that ends first -- its pid exited, its TTL passed, its connection
    closed -- is announced just before its end; announcing it later does nothing."""
    sub = srv.read(lambda s: s.reconciler.feed.subscribe())

    def made_and_ended(s: Server) -> None:
        lease = s.new_lease("gaming", 1000, 1, None, None, announce=False)
        s.end_lease(lease.id, "pid 1 exited")
        s.notices.announce(lease.id)

    srv.read(made_and_ended)
    kinds = srv.read(lambda s: [ch.kind for ch in sub._queue])
    assert kinds == ["lease_added", "lease_ended"], kinds


def test_why_an_intents_scheduler_is_not_held_in_order_of_precedence() -> None:
    policy = Policy(rules={})
    ejections = Ejections(policy, ChangeFeed())
    pool = StandbyPool(FakeBackend(), max_entries=1, max_kernel_bytes=1 << 20)
    now = 100 * NS_PER_S

    def why() -> str:
        return str(_not_held("gaming", policy, ejections, pool, now))

    assert why() == "gaming is not held: [standby] max = 1, max_kernel_bytes = 1048576"
    pool.last_error = ("gaming", "kfunc scx_bpf_nope not found")
    assert why() == "cannot prepare gaming: kfunc scx_bpf_nope not found"
    ejections.holds["gaming"] = now + 7 * NS_PER_S
    assert why() == "gaming is held back after its ejection by a CPU hotplug, 7 s more"
    policy.backoff["gaming"] = Backoff(failures=2, until_ns=now + 30 * NS_PER_S)
    assert why() == "gaming is held back after 2 failures, 30 s left"
    policy.backoff["gaming"] = Backoff(2, now + 30 * NS_PER_S, reason="verifier: R1 !read_ok")
    assert (
        why() == "gaming is held back after 2 failures, 30 s left; the last: verifier: R1 !read_ok"
    )
    policy.backoff["gaming"] = Backoff(failures=2, until_ns=now)  # over: the next reason
    assert why().startswith("gaming is held back after its ejection")
