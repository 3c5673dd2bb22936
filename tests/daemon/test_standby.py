"""Standbys and launcher intents through the live server (fake backend)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from schedswitchd.cli import ctl, run
from schedswitchd.daemon.policy import NS_PER_S
from schedswitchd.daemon.server import Server

from .fakes import FakeBackend
from .harness import Running


@pytest.fixture
def srv() -> Iterator[Running]:
    running = Running(FakeBackend())
    yield running
    running.stop()


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


def test_a_failing_prepare_is_the_intents_error() -> None:
    running = Running(FakeBackend(verifier_reject={"gaming"}))
    try:
        c = running.client()
        reply = c.request(op="prepare", workload="gaming")
        assert not reply["ok"] and reply["error"]["code"] == "standby", reply
        assert "gaming" in reply["error"]["message"]
        assert running.backend.kernel_state().state == "disabled"
        c.close()
    finally:
        running.stop()


def test_an_expired_intent_is_no_longer_wanted(srv: Running) -> None:
    c = srv.client()
    assert c.request(op="prepare", workload="gaming", ttl_s=30)["ok"]

    def wanted_later(s: Server) -> list[str]:
        rec = s.reconciler
        return [n for n, _, _ in rec.standby_wanted(rec.clock() + 31 * NS_PER_S)]

    assert "gaming" in srv.read(lambda s: [n for n, _, _ in s.reconciler.standby_wanted(0)])

    assert "gaming" not in srv.read(wanted_later)
    c.close()


def test_standby_zero_holds_nothing() -> None:
    running = Running(FakeBackend())
    try:
        running.read(lambda s: s.switcher.configure_standby(0, 0))
        c = running.client()
        assert c.request(op="hint", workload="gaming")["ok"]
        lease = c.request(op="status")["status"]["lease"]["lease"]
        assert c.request(op="release", lease=lease)["ok"]
        server = running.server
        assert server is not None
        running.run(server.reconciler._refill_standby())  # a refill pass, deterministically
        assert not running.read(lambda s: list(s.switcher.standby.entries))
        assert running.backend.calls.count("prepare gaming") == 1
        c.close()
    finally:
        running.stop()


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
    srv.wait_for(lambda s: any(c.startswith("pre-open ") for c in srv.backend.calls))
    opened = [c for c in srv.backend.calls if c.startswith("pre-open ")]
    assert opened == ["pre-open broken fifo gaming vtime"]


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


def test_the_switch_goes_on_once_the_hint_reply_is_written(
    srv: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the kernel runs the hinted scheduler, the worker waits (bounded; 10 s here so
    that a loaded host cannot reorder it) until the hint's reply is written, then pins."""
    from schedswitchd.daemon import reconcile

    monkeypatch.setattr(reconcile, "REPLY_WAIT_S", 10.0)
    rec = srv.read(lambda s: s.reconciler)
    real = rec.reply_sent

    def sent() -> None:
        srv.backend.calls.append("reply sent")
        real()

    monkeypatch.setattr(rec, "reply_sent", sent)
    c = srv.client()
    assert c.request(op="hint", workload="battery")["active"] == "fifo"
    srv.wait_for(lambda s: s.switcher.history[-1].finished)
    calls = srv.backend.calls
    assert calls.index("attach fifo") < calls.index("reply sent") < calls.index("pin fifo")
    c.close()
