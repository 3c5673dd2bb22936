"""Server on a real Unix socket with the fake backend: leases, lifetimes, auth, limits, admin."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedswitchd.cli.ctl import main as ctl_main
from schedswitchd.daemon import protocol as proto
from tests import fuzzing

from .fakes import FakeBackend
from .harness import Client, FakeClock, FakeTimer, Running, as_user


def kernel_ops(r: Running) -> str | None:
    return r.backend.kernel_state().ops


def n_leases(r: Running) -> int:
    return r.read(lambda s: len(s.policy.leases))


# --- leases and what runs ---------------------------------------------------------------------


def test_hint_priority_and_release(srv: Running) -> None:
    launcher = srv.client()
    reply = launcher.request(op="hint", workload="video-call", id=1)
    assert reply["ok"] and reply["id"] == 1 and reply["active"] == "vtime"
    assert reply["switch"]["result"] == "ok" and reply["switch"]["target"] == "vtime"
    assert kernel_ops(srv) == "vtime_ops"
    game = srv.client()
    second = game.request(op="hint", workload="gaming")
    assert second["active"] == "gaming" and kernel_ops(srv) == "gaming_ops"
    status = launcher.request(op="status")["status"]
    assert status["kernel"] == {"state": "enabled", "ops": "gaming_ops", "enable_seq": 2}
    assert status["lease"]["lease"] == second["lease"] and status["leases"] == 2
    assert status["last_switch"]["gap_ns"] is not None
    released = game.request(op="release", lease=second["lease"])
    assert released == {**released, "ok": True, "active": "vtime"}
    assert kernel_ops(srv) == "vtime_ops"
    again = game.request(op="release", lease=second["lease"])
    assert again["error"]["code"] == "unknown_lease"
    listing = launcher.request(op="list")
    assert [x["workload"] for x in listing["leases"]] == ["video-call"]
    assert {x["name"] for x in listing["schedulers"]} == {"fifo", "vtime", "gaming", "broken"}
    history = launcher.request(op="history", limit=2)["entries"]
    assert [(h["previous"], h["target"]) for h in history] == [
        ("vtime", "gaming"),
        ("gaming", "vtime"),
    ]


def test_connection_close_ends_lease(srv: Running) -> None:
    c = srv.client()
    c.request(op="hint", workload="gaming")
    assert n_leases(srv) == 1
    c.close()
    srv.wait_for(lambda s: not s.policy.leases and s.switcher.active == "kernel")
    assert srv.backend.kernel_state().state == "disabled"


def test_hinted_pid_exit_ends_lease(srv: Running) -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        c = srv.client()
        reply = c.request(op="hint", workload="gaming", pid=child.pid)
        assert reply["ok"], reply
        assert c.request(op="list")["leases"][0]["pid"] == child.pid
        child.kill()
        child.wait()
        # the connection stays open: only the pidfd can end this lease
        srv.wait_for(lambda s: not s.policy.leases and s.switcher.active == "kernel")
        assert not srv.read(lambda s: s.leases)
    finally:
        child.kill()


def _deadlines_only(backend: FakeBackend | None = None, **options: Any) -> Running:
    """A server on the reconciler's fake clock and timer whose safety-net poll is an hour
    away: only requests and the deadlines the reconciler arms on that timer start passes."""
    return Running(backend, clock=FakeClock(), poll_timer=FakeTimer(), poll_s=3600, **options)


def _due(r: Running) -> list[float]:
    """When the reconciler's timer calls are due, seconds from now."""
    timer = r.poll_timer
    assert timer is not None
    return r.read(lambda s: [round(t - timer.now, 3) for t in timer.pending()])


def test_ttl_ends_lease() -> None:
    """The lease's TTL is a deadline on the reconciler's timer: the lease holds until it
    falls due, and the pass it kicks ends the lease (no kick, no poll: an hour away)."""
    r = _deadlines_only()
    try:
        c = r.client()
        assert c.request(op="hint", workload="gaming", ttl_s=30)["active"] == "gaming"
        r.wait_for(lambda s: s.reconciler.idle)
        assert _due(r) == [30.0, 3600.0]
        r.advance_reconciler(29.9)
        assert r.read(lambda s: s.switcher.active == "gaming" and len(s.policy.leases) == 1)
        r.advance_reconciler(0.2)
        r.wait_for(lambda s: s.switcher.active == "kernel" and not s.policy.leases, 5)
    finally:
        r.stop()


def test_the_end_of_a_backoff_hold_retries() -> None:
    """A failed switch backs its scheduler off (base_s 30): the hold's end is a deadline
    on the reconciler's timer, whose pass tries the scheduler the lease still asks for."""
    backend = FakeBackend(fail_prepare={"gaming"})
    r = _deadlines_only(backend)
    try:
        c = r.client()
        assert c.request(op="hint", workload="gaming")["active"] == "kernel"  # it failed
        r.wait_for(lambda s: s.reconciler.idle and "gaming" in s.policy.backoff)
        assert 30.0 in _due(r)
        backend.fail_prepare.clear()
        tries = backend.calls.count("prepare gaming")
        r.advance_reconciler(29.9)
        assert backend.calls.count("prepare gaming") == tries  # still held back
        r.advance_reconciler(0.2)
        r.wait_for(lambda s: s.switcher.active == "gaming", 5)
    finally:
        r.stop()


def test_unknown_workload_and_bad_pid(srv: Running) -> None:
    c = srv.client()
    assert c.request(op="hint", workload="nope")["error"]["code"] == "unknown_workload"
    child = subprocess.Popen(["true"])
    child.wait()
    assert c.request(op="hint", workload="gaming", pid=child.pid)["error"]["code"] == "bad_pid"
    assert n_leases(srv) == 0


def test_prepare_failure_keeps_previous_and_backs_off() -> None:
    r = Running(FakeBackend(verifier_reject={"broken"}))
    try:
        c = r.client()
        c.request(op="hint", workload="gaming")
        reply = c.request(op="hint", workload="broken")
        assert reply["ok"] and reply["active"] == "gaming"
        failed = [h for h in c.request(op="history")["entries"] if h["target"] == "broken"]
        assert failed[0]["result"] == "failed"
        assert failed[0]["error"]["verifier_log"] == "R1 invalid mem access"
        status = c.request(op="status")["status"]
        assert [b["scheduler"] for b in status["backoff"]] == ["broken"]
        assert kernel_ops(r) == "gaming_ops"
    finally:
        r.stop()


def test_ejection_falls_back_and_backs_off(srv: Running) -> None:
    c = srv.client()
    c.request(op="hint", workload="battery")
    c.request(op="hint", workload="gaming")
    srv.backend.eject(1026, "watchdog failed for gaming")
    srv.wait_for(lambda s: s.switcher.active == "fifo", 2)
    status = c.request(op="status")["status"]
    assert status["last_exit"]["kind_name"] == "ERROR_STALL"
    assert status["last_exit"]["reason"] == "watchdog failed for gaming"
    assert status["backoff"][0]["scheduler"] == "gaming" and status["backoff"][0]["failures"] == 1
    assert status["kernel"]["ops"] == "fifo_ops"
    results = [h["result"] for h in c.request(op="history")["entries"]]
    assert results[-2:] == ["ejected", "ok"]
    why = c.request(op="hint", workload="gaming")["passed_over"]  # held: its ejection says why
    assert why.startswith("gaming is held back after 1 failure, "), why
    assert why.endswith(
        "; the last: ejected by the kernel: ERROR_STALL (watchdog failed for gaming: runnable "
        "task stall)"
    ), why


#: The kernel's CPU-hotplug ejection (kernel/sched/ext.c): SCX_EXIT_UNREG_KERN with
#: SCX_ECODE_ACT_RESTART | SCX_ECODE_RSN_HOTPLUG.
UNREG_KERN, HOTPLUG_RESTART = 66, (1 << 48) | (1 << 32)
#: SCX_EXIT_UNREG_BPF: the scheduler's own scx_bpf_exit().
UNREG_BPF = 65


def test_hotplug_ejection_reloads_without_backoff(srv: Running) -> None:
    c = srv.client()
    c.request(op="hint", workload="gaming")
    prepares = srv.backend.calls.count("prepare gaming")
    srv.backend.eject(UNREG_KERN, "unregistered from the kernel", HOTPLUG_RESTART,
                      "cpu 1 going offline, exiting scheduler")  # fmt: skip
    srv.wait_for(
        lambda s: s.switcher.active == "gaming" and srv.backend.attached_handle is not None, 2
    )
    assert srv.backend.calls.count("prepare gaming") == prepares + 1  # loaded again
    status = c.request(op="status")["status"]
    assert status["backoff"] == [] and status["kernel"]["ops"] == "gaming_ops"
    results = [h["result"] for h in c.request(op="history")["entries"]]
    assert results[-2:] == ["ejected", "ok"]
    # A restart loop of the scheduler's own (scx_bpf_exit: SCX_EXIT_UNREG_BPF) is bounded:
    # past MAX_RESTARTS in the window it backs off as usual. (The kernel's hotplug
    # restarts past it wait instead: tests/daemon/test_daemon_defects.py.)
    from schedswitchd.daemon.ejections import MAX_RESTARTS

    for _ in range(MAX_RESTARTS):
        srv.wait_for(lambda s: srv.backend.attached_handle is not None, 2)
        srv.backend.eject(UNREG_BPF, "unregistered from BPF", 1 << 48)
        srv.wait_for(lambda s: srv.backend.attached_handle is not None or bool(s.policy.backoff), 2)
    srv.wait_for(lambda s: "gaming" in s.policy.backoff, 2)
    assert srv.read(lambda s: s.switcher.active) == "kernel"


def test_ejection_without_restart_bit_backs_off(srv: Running) -> None:
    """Only SCX_ECODE_ACT_RESTART restarts: another exit code of the same kind backs off."""
    c = srv.client()
    c.request(op="hint", workload="gaming")
    srv.backend.eject(UNREG_KERN, "unregistered from the kernel", 1 << 32)
    srv.wait_for(lambda s: "gaming" in s.policy.backoff, 2)


DEMO_PROFILE = """
[profile]
name = "demo"
ops_name = "gaming_ops"

[[stats]]
name = "dispatched"
variable = "nr_dispatched"

[modes.fast]
[modes.fast.variables]
slice_ns = 1000
"""


def test_status_shows_profile_mode_and_stats(srv: Running) -> None:
    """A hint with a mode runs the variant SCHEDULER@MODE; status shows the active
    scheduler's profile (its [profile] name, though the configuration names it by path),
    its mode and the counters the backend read for it."""
    (srv.dir / "profiles").mkdir()
    (srv.dir / "profiles" / "demo.toml").write_text(DEMO_PROFILE)
    path = srv.dir / "schedswitchd.toml"
    text = path.read_text()
    text = text.replace(
        '[schedulers.gaming]\nobject = "gaming.bpf.o"\n',
        '[schedulers.gaming]\nobject = "gaming.bpf.o"\nprofile = "profiles/demo.toml"\n',
    ).replace(
        'scheduler = "gaming"\npriority = 50\n',
        'scheduler = "gaming"\npriority = 50\nmode = "fast"\n',
    )
    assert 'profile = "profiles/demo.toml"' in text and 'mode = "fast"' in text
    path.write_text(text)
    c = srv.client()
    assert c.request(op="reload")["ok"]
    assert c.request(op="status")["status"]["profile"] is None  # the kernel's runs
    c.request(op="hint", workload="gaming")
    status = c.request(op="status")["status"]
    assert status["active"] == "gaming@fast" and status["kernel"]["ops"] == "gaming@fast_ops"
    assert status["profile"] == {"name": "demo", "mode": "fast", "stats": {"dispatched": 7}}
    assert not any(k.startswith("profile.") for k in status["counters"])
    handle = srv.backend.attached_handle
    assert handle is not None and handle.spec is not None and handle.spec.mode == "fast"
    assert handle.spec.profile_path == str((srv.dir / "profiles" / "demo.toml").resolve())
    c.request(op="switch", scheduler="gaming")  # the base, no mode
    status = c.request(op="status")["status"]
    assert status["profile"] == {"name": "demo", "mode": None, "stats": {"dispatched": 7}}
    assert c.request(op="switch", scheduler="gaming@fast")["ok"]  # an admin may pick a variant
    assert c.request(op="status")["status"]["active"] == "gaming@fast"


def test_attach_failure_rolls_back() -> None:
    r = Running(FakeBackend(fail_attach={"broken"}))
    try:
        c = r.client()
        c.request(op="hint", workload="video-call")
        c.request(op="hint", workload="broken")
        entry = next(h for h in c.request(op="history")["entries"] if h["target"] == "broken")
        assert entry["result"] == "rolled_back" and entry["exit"]["kind_name"] == "ERROR"
        assert kernel_ops(r) == "vtime_ops"
    finally:
        r.stop()


def test_admin_switch_stop_auto(srv: Running) -> None:
    c = srv.client()
    c.request(op="hint", workload="battery")
    reply = c.request(op="switch", scheduler="vtime")
    assert reply["ok"] and reply["active"] == "vtime" and reply["switch"]["target"] == "vtime"
    assert c.request(op="hint", workload="gaming")["active"] == "vtime"  # override wins
    assert c.request(op="stop")["active"] == "kernel"
    assert srv.backend.kernel_state().state == "disabled"
    assert c.request(op="switch", scheduler="auto")["active"] == "gaming"
    unknown = c.request(op="switch", scheduler="nope")["error"]
    assert unknown["code"] == "unknown_scheduler"
    # what may be asked for, as an unknown hint's error lists the hint rules
    names = ", ".join([*srv.config.schedulers, "kernel", "auto"])
    assert unknown["message"] == f"no scheduler 'nope' (known: {names})", unknown


def test_admin_switch_reports_verifier_log() -> None:
    r = Running(FakeBackend(verifier_reject={"broken"}))
    try:
        reply = r.client().request(op="switch", scheduler="broken")
        assert reply["ok"] is False and reply["error"]["code"] == "bpf_syscall"
        assert reply["error"]["verifier_log"] == "R1 invalid mem access"
    finally:
        r.stop()


def test_reload(srv: Running) -> None:
    c = srv.client()
    path = srv.dir / "schedswitchd.toml"
    text = path.read_text()
    path.write_text(text.replace('default = "kernel"', 'default = "fifo"'))
    reply = c.request(op="reload")
    assert reply["ok"] and "fifo" in reply["schedulers"]
    assert kernel_ops(srv) == "fifo_ops"
    path.write_text(text + "\nbogus = 1\n")
    bad = c.request(op="reload")
    assert bad["error"]["code"] == "config" and "bogus: unknown key" in bad["error"]["message"]
    assert srv.read(lambda s: s.config.default) == "fifo"  # the old config stays


def test_adoption_and_grace() -> None:
    """On the reconciler's clock and timer: the adopted scheduler is kept through the grace
    period and, with no lease, replaced by the default once it has passed: the grace's end
    is a deadline on the timer, whose pass (no kick, no poll) brings the default back."""
    backend = FakeBackend()
    backend.preload("gaming")
    r = _deadlines_only(backend, grace=30.0)
    try:
        status = r.client().request(op="status")["status"]
        assert status["adopted"] and status["active"] == "gaming"
        assert status["kernel"]["ops"] == "gaming_ops" and status["kernel"]["enable_seq"] == 1
        r.wait_for(lambda s: s.reconciler.idle)
        assert _due(r) == [30.0, 3600.0]
        r.advance_reconciler(29.9)
        assert r.read(lambda s: s.switcher.active) == "gaming"
        # no lease arrived within the grace period: back to the default
        r.advance_reconciler(0.2)
        r.wait_for(lambda s: s.switcher.active == "kernel", 5)
    finally:
        r.stop()


def test_adopted_scheduler_kept_when_rehinted() -> None:
    backend = FakeBackend()
    backend.preload("gaming")
    clock = FakeClock()
    r = Running(backend, clock=clock, grace=30.0)
    try:
        c = r.client()
        assert c.request(op="hint", workload="gaming")["switch"] is None  # already runs
        clock.advance(60)  # the grace is over; the lease holds it now
        r.passes(2)
        assert r.backend.enable_seq == 1 and kernel_ops(r) == "gaming_ops"
    finally:
        r.stop()


def test_adoption_grace_counts_from_serving() -> None:
    """A slow start-up (here the uevent watcher, 60 s on the reconciler's clock) must not
    eat the grace (30 s): it counts from when the socket serves."""
    clock = FakeClock()

    class SlowWatchBackend(FakeBackend):
        def watch(self, notify: Callable[[], None]) -> Callable[[], None]:
            clock.advance(60)
            return super().watch(notify)

    backend = SlowWatchBackend()
    backend.preload("gaming")
    r = Running(backend, clock=clock, grace=30.0)
    try:
        r.passes(1)
        c = r.client()
        assert c.request(op="hint", workload="gaming")["switch"] is None  # still adopted
        assert r.backend.enable_seq == 1 and kernel_ops(r) == "gaming_ops"
    finally:
        r.stop()


# --- authorisation (clients really run as another uid) ---------------------------------------


@pytest.mark.root  # setuid/setgroups in a child: needs root
def test_unprivileged_user_refused_admin_ops(srv: Running) -> None:
    def act(c: Client) -> Any:
        return [
            c.request(op="status")["ok"],
            c.request(op="switch", scheduler="fifo")["error"]["code"],
            c.request(op="stop")["error"]["code"],
            c.request(op="reload")["error"]["code"],
        ]

    assert as_user(srv, 12345, act) == [True, "denied", "denied", "denied"]
    stop = as_user(srv, 12345, lambda c: c.request(op="stop"))
    assert "stop is for admins only ([auth] admin_uids, admin_gids)" in stop["error"]["message"]
    assert [c for c in srv.backend.calls if not c.startswith("pre-open")] == []


@pytest.mark.root  # setuid/setgroups in a child: needs root
def test_hint_needs_rights(srv: Running) -> None:
    reply = as_user(srv, 12345, lambda c: c.request(op="hint", workload="gaming"))
    assert reply["error"]["code"] == "denied" and "12345" in reply["error"]["message"]
    # the refusal names what grants the right: a user must not need the source to find it
    assert "[auth] hint_uids, hint_gids" in reply["error"]["message"]
    # uid 65534 may hint (hint_uids), but only for itself or its descendants
    assert as_user(srv, 65534, lambda c: c.request(op="hint", workload="gaming")["ok"])
    foreign = as_user(srv, 65534, lambda c: c.request(op="hint", workload="gaming", pid=1))
    assert foreign["error"]["code"] == "denied"
    mine = as_user(srv, 65534, lambda c: c.request(op="hint", workload="gaming", pid=os.getpid()))
    assert mine["ok"], mine
    assert n_leases(srv) == 0  # each child's connection closed: its lease ended


@pytest.mark.root  # setuid/setgroups in a child: needs root
def test_rights_by_supplementary_group() -> None:
    r = Running()
    try:
        auth = r.config.auth.model_copy(update={"hint_gids": [4242], "admin_gids": [4343]})
        r.read(lambda s: s.apply_config(s.config.model_copy(update={"auth": auth})))
        hint = as_user(r, 23456, lambda c: c.request(op="hint", workload="gaming"), (4242,))
        assert hint["ok"], hint
        denied = as_user(r, 23456, lambda c: c.request(op="stop"), (4242,))
        assert denied["error"]["code"] == "denied"
        admin = as_user(r, 23456, lambda c: c.request(op="stop"), (4343,))
        assert admin["ok"], admin
    finally:
        r.stop()


def test_admin_may_hint_any_pid(srv: Running) -> None:
    assert srv.client().request(op="hint", workload="gaming", pid=1)["ok"]


@pytest.mark.root  # setuid/setgroups in a child: needs root
def test_release_of_anothers_lease_refused(srv: Running) -> None:
    owner = srv.client()
    lease = owner.request(op="hint", workload="gaming")["lease"]
    reply = as_user(srv, 65534, lambda c: c.request(op="release", lease=lease))
    assert reply["error"]["code"] == "denied" and n_leases(srv) == 1


# --- limits ---------------------------------------------------------------------------------------


def test_connection_cap_per_uid() -> None:
    r = Running(per_uid=3, reserve=0)
    try:
        clients = [r.client() for _ in range(3)]
        for c in clients:
            assert c.request(op="status")["ok"]
        extra = r.client()
        reply = extra.recv_line()
        assert reply is not None and reply["error"]["code"] == "limit"
        assert extra.recv_line() is None
        clients[0].close()
        r.wait_for(lambda s: len(s.connections) == 2)
        assert r.client().request(op="status")["ok"]
    finally:
        r.stop()


def test_lease_cap_per_uid() -> None:
    r = Running(max_leases=2)
    try:
        c = r.client()
        assert c.request(op="hint", workload="gaming")["ok"]
        assert c.request(op="hint", workload="battery")["ok"]
        assert c.request(op="hint", workload="video-call")["error"]["code"] == "limit"
    finally:
        r.stop()


def test_oversized_request_answered_then_closed(srv: Running) -> None:
    c = srv.client()
    c.send_raw(b'{"v":1,"op":"status","id":"' + b"x" * 5000 + b'"}\n')
    reply = c.recv_line()
    assert reply is not None and reply["error"]["code"] == "too_large"
    assert c.recv_line() is None


def _nothing_yet(c: Client) -> bool:
    """True if the server has neither written to ``c`` nor closed it (a read that does
    not wait: what the server did within a fake-timer step it did before that returned)."""
    c.sock.settimeout(0.0)
    try:
        return not c.closed() and not c.buf
    finally:
        c.sock.settimeout(10.0)


def test_half_written_request_times_out(timed: Running) -> None:
    c = timed.client()
    c.send_raw(b'{"v":1,"op":"sta')
    timed.wait_for(lambda s: len(s.connections) == 1)
    timed.advance(0.29)
    assert _nothing_yet(c)  # not before the 0.3 s read timeout
    timed.advance(0.02)
    reply = c.recv_line()
    assert reply is not None and reply["error"]["code"] == "timeout"
    assert "0.3 s" in reply["error"]["message"]
    assert c.recv_line() is None


def test_read_timeout_runs_from_the_first_byte(timed: Running) -> None:
    """More bytes of the same request do not restart the read timeout."""
    c = timed.client()
    c.send_raw(b'{"v":1,')
    timed.wait_for(lambda s: len(s.connections) == 1)
    timed.advance(0.2)
    c.send_raw(b'"op":')
    timed.advance(0.11)
    reply = c.recv_line()
    assert reply is not None and reply["error"]["code"] == "timeout"


def test_idle_connection_closed_unless_it_holds_a_lease(timed: Running) -> None:
    idle, holder = timed.client(), timed.client()
    holder.request(op="hint", workload="gaming")
    timed.wait_for(lambda s: len(s.connections) == 2)
    timed.advance(0.39)
    assert _nothing_yet(idle)
    timed.advance(0.02)
    reply = idle.recv_line()
    assert reply is not None and reply["error"]["code"] == "timeout"
    assert idle.recv_line() is None
    timed.advance(60)
    assert holder.request(op="status")["ok"] and n_leases(timed) == 1


def test_idle_timeout_runs_from_the_last_request(timed: Running) -> None:
    c = timed.client()
    timed.wait_for(lambda s: len(s.connections) == 1)
    timed.advance(0.3)
    assert c.request(op="status")["ok"]
    timed.advance(0.3)  # 0.6 s after the accept, 0.3 s after the request
    assert _nothing_yet(c)
    timed.advance(0.11)
    reply = c.recv_line()
    assert reply is not None and reply["error"]["code"] == "timeout"


def test_a_client_that_does_not_read_its_replies_is_cut_off(timed: Running) -> None:
    """Replies the client does not take pile up in the daemon only until ``read_timeout_s``
    after the transport's buffer filled: then the connection is aborted."""
    c = timed.client()
    timed.wait_for(lambda s: len(s.connections) == 1)
    c.send_raw(b'{"v":1,"op":"list"}\n' * 4000)  # ~1 MB of replies, none read
    timed.wait_for(lambda s: any(conn._drained is not None for conn in s.connections.values()))
    timed.advance(0.2)
    assert timed.read(lambda s: len(s.connections)) == 1
    timed.advance(0.11)
    timed.wait_for(lambda s: not s.connections)
    assert c.closed()  # what was sent before, then the end


def test_malformed_lines_get_error_replies_and_connection_survives(srv: Running) -> None:
    c = srv.client()
    for line, code in [
        (b"{\n", "bad_json"),
        (b'{"v":1,"op":"dance"}\n', "unknown_op"),
        (b'{"v":9,"op":"status"}\n', "unsupported_version"),
        (b'{"v":1,"op":"hint","workload":"gaming","args":["--x"]}\n', "bad_request"),
    ]:
        c.send_raw(line)
        reply = c.recv_line()
        assert reply is not None and reply["ok"] is False and reply["error"]["code"] == code
    c.send_raw(b"\n\n")  # blank lines are skipped
    assert c.request(op="status")["ok"]


def test_incomplete_request_at_eof(srv: Running) -> None:
    c = srv.client()
    c.send_raw(b'{"v":1,"op":"status"')
    c.sock.shutdown(1)  # SHUT_WR: the client is done writing mid-request
    reply = c.recv_line()
    assert reply is not None and reply["error"]["code"] == "incomplete"


def test_close_keeps_scheduler_attached() -> None:
    r = Running()
    c = r.client()
    c.request(op="hint", workload="gaming")
    r.stop()
    # leases end with the daemon but the (pinned) scheduler stays: a restart must not drop it
    assert r.backend.kernel_state().ops == "gaming_ops"


def test_sigterm_is_not_needed_for_pidfd_cleanup(srv: Running) -> None:
    """Many pid-bound leases created and ended leave no pidfd behind."""
    before = len(os.listdir("/proc/self/fd"))
    c = srv.client()
    for _ in range(20):
        child = subprocess.Popen(["sleep", "10"])
        lease = c.request(op="hint", workload="gaming", pid=child.pid)["lease"]
        c.request(op="release", lease=lease)
        child.send_signal(signal.SIGKILL)
        child.wait()
    c.close()
    srv.wait_for(lambda s: not s.connections)
    assert len(os.listdir("/proc/self/fd")) <= before


# --- arbitrary bytes over the socket --------------------------------------------------------

FRAGMENTS = [
    b'{"v":1,"op":"status"}',
    b'{"v":1,"op":"hint","workload":"gaming"}',
    b'{"v":1,"op":"release","lease":"1-x"}',
    b'{"v":1,"op":"list"}',
    b"\n",
    b"{",
    b"}",
    b'"',
    b"\xff",
    b" ",
    b"x" * 1500,
]


@pytest.fixture(scope="module")
def shared_srv() -> Iterator[Running]:
    running = Running()
    yield running
    running.stop()


@settings(
    max_examples=fuzzing.examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    data=st.binary(max_size=3000) | st.lists(st.sampled_from(FRAGMENTS), max_size=8).map(b"".join)
)
def test_arbitrary_bytes_over_the_socket(shared_srv: Running, data: bytes) -> None:
    """Every non-empty line gets exactly one well-formed reply, in order, or the connection
    is closed after a ``too_large`` reply; the server keeps serving."""
    try:
        c = shared_srv.client()
        try:
            c.send_raw(data + b"\n")
            segments = [s for s in data.split(b"\n") if s]
            for _ in segments:
                reply = c.recv_line()
                assert reply is not None, "connection closed without a reply"
                parsed = proto.parse_reply(json.dumps(reply).encode())
                if isinstance(parsed, proto.ErrorReply) and parsed.error.code == proto.TOO_LARGE:
                    assert c.recv_line() is None
                    break
        finally:
            c.close()
        assert shared_srv.client().request(op="status")["ok"]
    except BaseException as exc:
        fuzzing.record("protocol:socket", f"defect:{fuzzing.exception_name(exc)}")
        fuzzing.flush()
        raise
    fuzzing.record("protocol:socket", "served")
    fuzzing.flush()  # writes only when make fuzz-props asks for the counts


def test_slow_switch_does_not_block_other_clients() -> None:
    backend = FakeBackend(gate=threading.Event())  # prepare waits until the gate opens
    r = Running(backend)
    try:
        hinter = r.client()
        hinter.send_raw(b'{"v":1,"op":"hint","workload":"gaming"}\n')
        assert backend.preparing.wait(10)  # the switch now runs on the worker thread
        other = r.client()
        status = other.request(op="status")
        # Answered while the switch is held mid-prepare: it says kernel, not gaming.
        assert status["ok"] and status["status"]["active"] == "kernel"
        assert backend.gate is not None
        backend.gate.set()
        reply = hinter.recv_line()
        assert reply is not None and reply["active"] == "gaming"
    finally:
        assert backend.gate is not None
        backend.gate.set()
        r.stop()


def test_failed_admin_switch_is_tried_once_then_dropped() -> None:
    """A failing override is not retried on every pass: it is dropped (hints rule again),
    the reply carries the error, and the history holds one failure."""
    backend = FakeBackend(fail_prepare={"broken"})
    r = Running(backend)
    try:
        c = r.client()
        assert c.request(op="hint", workload="battery")["active"] == "fifo"
        reply = c.request(op="switch", scheduler="broken")
        assert reply["ok"] is False and reply["op"] == "switch"
        assert "kfunc scx_bpf_nope" in reply["error"]["message"]
        assert "override not taken, hints rule" in reply["error"]["message"]
        r.passes(3)  # later passes do not try it again
        assert backend.calls.count("prepare broken") == 1
        status = c.request(op="status")["status"]
        assert status["override"] is None and status["active"] == "fifo"
        assert [b["scheduler"] for b in status["backoff"]] == ["broken"]
        entries = c.request(op="history")["entries"]
        assert [h["result"] for h in entries if h["target"] == "broken"] == ["failed"]
        assert kernel_ops(r) == "fifo_ops"
        # The admin may ask again at once: the explicit request clears the backoff.
        assert c.request(op="switch", scheduler="broken")["ok"] is False
        assert backend.calls.count("prepare broken") == 2
    finally:
        r.stop()


def test_ejected_override_is_dropped(srv: Running) -> None:
    c = srv.client()
    c.request(op="hint", workload="battery")
    assert c.request(op="switch", scheduler="vtime")["active"] == "vtime"
    srv.backend.eject()
    srv.wait_for(lambda s: s.switcher.active == "fifo")
    srv.passes(3)  # later passes do not bring it back
    assert srv.backend.calls.count("prepare vtime") == 1
    assert c.request(op="status")["status"]["override"] is None


def test_error_replies_echo_id_and_op(srv: Running) -> None:
    c = srv.client()
    c.send_raw(b'{"v":1,"op":"hint","id":42,"workload":"Not A Name"}\n')
    reply = c.recv_line()
    assert reply is not None and reply["ok"] is False
    assert (reply["op"], reply["id"], reply["error"]["code"]) == ("hint", 42, "bad_request")
    c.send_raw(b'{"op":"status","id":"x"}\n')
    reply = c.recv_line()
    assert reply is not None and reply["error"]["code"] == "unsupported_version"
    assert (reply["op"], reply["id"]) == ("status", "x")


def test_reload_with_bad_config_is_logged(srv: Running, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("ERROR", logger="schedswitchd")
    (srv.dir / "schedswitchd.toml").write_text("[limits]\nmax_conections = 1\n")
    reply = srv.client().request(op="reload", id=3)
    assert reply["ok"] is False and reply["id"] == 3 and reply["op"] == "reload"
    assert "reload refused, keeping the old configuration" in caplog.text
    assert "max_conections" in caplog.text


# --- defects found by trying the daemon as users and attackers would ------------------------


def _config_text(r: Running) -> str:
    return (r.dir / "schedswitchd.toml").read_text()


def _reload_with(r: Running, c: Client, text: str) -> dict[str, Any]:
    (r.dir / "schedswitchd.toml").write_text(text)
    return c.request(op="reload")


def test_ttl_end_sends_a_final_message_and_closes(timed: Running) -> None:
    """A connection whose lease ended on its own is told so and closed."""
    c = timed.client()
    lease = c.request(op="hint", workload="gaming", ttl_s=30)["lease"]
    timed.advance(29.9)
    assert _nothing_yet(c) and n_leases(timed) == 1
    timed.advance(0.2)
    final = c.recv_line()
    assert final is not None, "closed without a final message"
    assert (final["op"], final["lease"], final["why"]) == ("lease_ended", lease, "ttl")
    proto.parse_reply(json.dumps(final).encode())  # a reply the client side can read
    assert c.recv_line() is None
    timed.wait_for(lambda s: not s.connections and s.switcher.active == "kernel")


def test_pid_exit_sends_a_final_message_and_closes(srv: Running) -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        c = srv.client()
        lease = c.request(op="hint", workload="gaming", pid=child.pid)["lease"]
        child.kill()
        child.wait()
        final = c.recv_line()
        assert final is not None and (final["op"], final["lease"]) == ("lease_ended", lease)
        assert final["why"] == f"pid {child.pid} exited"
        assert c.recv_line() is None
    finally:
        child.kill()


def test_hint_cli_with_ttl_exits_when_the_lease_ends(
    timed: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    """``schedswitchctl hint --ttl`` (its main, in this process: it sets a SIGTERM handler,
    so it runs on the main thread) returns once the daemon ends the lease at its TTL, which
    a helper thread reaches by moving the server's timer."""

    leases_at_29_9: list[int] = []

    def end_the_ttl() -> None:
        try:
            timed.wait_for(lambda s: bool(s.policy.leases), timeout=60)
            timed.advance(29.9)
            leases_at_29_9.append(n_leases(timed))
        finally:
            timed.advance(0.2)  # always: the command waits for the lease's end

    mover = threading.Thread(target=end_the_ttl)
    previous = signal.getsignal(signal.SIGTERM)  # the hold sets its own SIGTERM handler
    mover.start()
    try:
        assert ctl_main(["hint", "gaming", "--ttl", "30", "--socket", timed.path]) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        mover.join(60)
    err = capsys.readouterr().err
    assert "lease" in err and "ttl" in err
    assert leases_at_29_9 == [1]
    timed.wait_for(lambda s: not s.connections)


def test_blank_lines_do_not_keep_an_idle_connection(timed: Running) -> None:
    """Bare newlines are not requests: they do not reset the idle timer."""
    c = timed.client()
    timed.wait_for(lambda s: len(s.connections) == 1)
    for _ in range(3):  # a newline every 0.1 s
        c.send_raw(b"\n")
        timed.advance(0.1)
        assert _nothing_yet(c)
    c.send_raw(b"\n")
    timed.advance(0.15)  # 0.45 s after the accept, 0.15 s after the last newline
    reply = c.recv_line()
    assert reply is not None and reply["error"]["code"] == "timeout"


def test_duplicate_keys_are_refused(srv: Running) -> None:
    """``{"op":"status","op":"stop"}`` must not run ``stop``."""
    c = srv.client()
    c.request(op="hint", workload="gaming")
    c.send_raw(b'{"v":1,"op":"status","op":"stop"}\n')
    reply = c.recv_line()
    assert reply is not None and reply["error"]["code"] == "bad_request"
    assert "duplicate key 'op'" in reply["error"]["message"]
    assert kernel_ops(srv) == "gaming_ops"
    c.send_raw(b'{"v":1,"v":1,"op":"status"}\n')
    reply = c.recv_line()
    assert reply is not None and reply["error"]["code"] == "bad_request"


def test_empty_reload_with_a_live_lease_is_refused_and_shown_in_status(srv: Running) -> None:
    """An empty file would drop every scheduler under a live lease."""
    c = srv.client()
    assert c.request(op="hint", workload="gaming")["active"] == "gaming"
    assert c.request(op="status")["status"]["reload"] is None
    good = _config_text(srv)
    for text in ("", good.split("[schedulers.fifo]")[0].replace('default = "kernel"', "")):
        reply = _reload_with(srv, c, text)
        assert reply["ok"] is False and reply["error"]["code"] == "config", reply
        status = c.request(op="status")["status"]
        assert status["active"] == "gaming" and kernel_ops(srv) == "gaming_ops"
        assert status["reload"]["ok"] is False and status["reload"]["time"] > 0
        assert status["reload"]["error"] == reply["error"]["message"]
    # removing the rule of the live lease is refused too
    reply = _reload_with(srv, c, good.replace("[hints.gaming]", "[hints.gaming-old]"))
    assert reply["ok"] is False and "gaming" in reply["error"]["message"]
    assert _reload_with(srv, c, good)["ok"]
    assert c.request(op="status")["status"]["reload"]["ok"] is True


def test_reload_switches_a_running_scheduler_to_its_changed_tunables(srv: Running) -> None:
    """A changed entry that runs is prepared anew and swapped in."""
    c = srv.client()
    c.request(op="hint", workload="battery")
    first = srv.backend.attached_handle
    assert first is not None and first.spec is not None and first.spec.rodata == {}
    text = _config_text(srv).replace(
        'object = "fifo.bpf.o"', 'object = "fifo.bpf.o"\nrodata = { slice_us = 500 }'
    )
    assert _reload_with(srv, c, text)["ok"]
    srv.wait_for(lambda s: srv.backend.attached_handle is not first)
    now = srv.backend.attached_handle
    assert now is not None and now.spec is not None and now.spec.rodata == {"slice_us": 500}
    last = c.request(op="status")["status"]["last_switch"]
    assert (last["previous"], last["target"], last["result"]) == ("fifo", "fifo", "ok")
    assert first.discarded and kernel_ops(srv) == "fifo_ops"
    # an unchanged reload does not switch again
    seq = last["seq"]
    assert _reload_with(srv, c, text)["ok"]
    assert c.request(op="status")["status"]["last_switch"]["seq"] == seq


def test_failed_refresh_keeps_the_old_form_and_says_so() -> None:
    r = Running()
    try:
        c = r.client()
        c.request(op="hint", workload="battery")
        r.backend.fail_prepare.add("fifo")
        text = _config_text(r).replace(
            'object = "fifo.bpf.o"', 'object = "fifo.bpf.o"\nrodata = { slice_us = 500 }'
        )
        assert _reload_with(r, c, text)["ok"]
        r.wait_for(lambda s: s.reconciler.stale is not None)
        status = c.request(op="status")["status"]
        assert status["active"] == "fifo" and status["active_stale"] is True
        assert status["backoff"] == [] and kernel_ops(r) == "fifo_ops"
        assert r.backend.calls.count("prepare fifo") == 2  # not retried on every pass
    finally:
        r.stop()


def test_failed_admin_switch_changes_nothing(srv: Running) -> None:
    """The override in force and the scheduler it runs stay."""
    srv.backend.fail_prepare.add("broken")
    c = srv.client()
    assert c.request(op="switch", scheduler="vtime")["active"] == "vtime"
    reply = c.request(op="switch", scheduler="broken")
    assert reply["ok"] is False and "running vtime" in reply["error"]["message"]
    status = c.request(op="status")["status"]
    assert status["override"] == "vtime" and status["active"] == "vtime"
    assert kernel_ops(srv) == "vtime_ops" and srv.backend.enable_seq == 1
    failed = [h for h in c.request(op="history")["entries"] if h["target"] == "broken"]
    assert [h["result"] for h in failed] == ["failed"]


def test_another_program_holding_sched_ext_is_not_a_failure(srv: Running) -> None:
    """Only a scheduler's own failures back it off."""
    with srv.backend.lock:  # someone else's scheduler runs
        srv.backend.state, srv.backend.ops = "enabled", "scx_simple"
    c = srv.client()
    reply = c.request(op="hint", workload="gaming")
    assert reply["ok"] and reply["active"] == "kernel"
    status = c.request(op="status")["status"]
    assert status["backoff"] == [] and status["kernel"]["ops"] == "scx_simple"
    assert status["desired"] == "gaming"
    with srv.backend.lock:
        srv.backend.state, srv.backend.ops = "disabled", None
    for notify in list(srv.backend.watchers):
        notify()
    srv.wait_for(lambda s: s.switcher.active == "gaming")
    srv.backend.eject()
    srv.wait_for(lambda s: "gaming" in s.policy.backoff)
    assert srv.read(lambda s: s.policy.backoff["gaming"].failures) == 1


def test_another_program_attaching_during_the_pass_is_not_a_failure(srv: Running) -> None:
    """Another program takes sched_ext after the pass looked (free) and before its attach:
    the attach fails, and the target is not backed off for it; once that program is gone,
    the target runs."""
    real = srv.backend.attach
    raced: list[str] = []

    def racing(prepared: Any, timeout_s: float) -> Any:
        if not raced:  # the other program attaches first, once
            raced.append(prepared.name)
            with srv.backend.lock:
                srv.backend.state, srv.backend.ops = "enabled", "scx_simple"
        return real(prepared, timeout_s)

    srv.backend.attach = racing  # type: ignore[method-assign]
    c = srv.client()
    assert c.request(op="hint", workload="gaming")["ok"]
    srv.wait_for(lambda s: bool(s.switcher.history) and s.switcher.history[-1].finished)
    status = c.request(op="status")["status"]
    assert raced == ["gaming"] and status["active"] == "kernel"
    assert status["last_switch"]["result"] == "rolled_back" and status["backoff"] == []
    with srv.backend.lock:
        srv.backend.state, srv.backend.ops = "disabled", None
    for notify in list(srv.backend.watchers):
        notify()
    srv.wait_for(lambda s: s.switcher.active == "gaming")


def test_grace_ends_once_a_lease_came_and_went() -> None:
    """After re-adoption, a hint then its release runs the default at once."""
    backend = FakeBackend()
    backend.preload("vtime")
    r = Running(backend, grace=30.0, default="fifo")
    try:
        c = r.client()
        lease = c.request(op="hint", workload="video-call")["lease"]
        assert kernel_ops(r) == "vtime_ops"
        reply = c.request(op="release", lease=lease)
        assert reply["active"] == "fifo" and kernel_ops(r) == "fifo_ops"
    finally:
        r.stop()


def test_admins_keep_a_reserve_beyond_the_connection_caps() -> None:
    """A flood by one non-admin uid does not lock out an admin's ``status``."""
    r = Running(per_uid=3, max_conn=4)
    results_r, results_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: uid 65534 takes every connection it may, then holds them
        try:
            os.close(results_r)
            os.close(hold_w)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            held = [r.client() for _ in range(4)]
            out: list[str] = []
            try:
                for c in held:
                    reply = c.recv_line() if out == ["ok"] * 3 else c.request(op="status")
                    out.append(
                        "closed"
                        if reply is None
                        else reply["error"]["code"]
                        if not reply["ok"]
                        else "ok"
                    )
            except BaseException as exc:
                out.append(repr(exc))
            os.write(results_w, json.dumps(out).encode())
            os.close(results_w)
            os.read(hold_r, 1)  # until the parent is done
        finally:
            os._exit(0)
    os.close(results_w)
    os.close(hold_r)
    try:
        with os.fdopen(results_r, "rb") as pipe:
            assert json.loads(pipe.read()) == ["ok", "ok", "ok", "limit"]
        admins = [r.client() for _ in range(4)]  # 3 of the flood + 1 fill the total cap
        assert [a.request(op="status")["ok"] for a in admins] == [True] * 4
    finally:
        os.close(hold_w)
        os.waitpid(pid, 0)
        r.stop()


def test_last_exit_after_a_rollback_is_the_failed_attach(srv: Running) -> None:
    """Status's ``last_exit`` agrees with ``last_switch.exit``."""
    srv.backend.fail_attach.add("broken")
    c = srv.client()
    c.request(op="hint", workload="video-call")
    c.request(op="hint", workload="broken")
    status = c.request(op="status")["status"]
    assert status["last_switch"]["result"] == "rolled_back"
    assert status["last_exit"] == status["last_switch"]["exit"]
    assert status["last_exit"]["reason"] == "init failed"
