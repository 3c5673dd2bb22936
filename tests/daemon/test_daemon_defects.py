"""The daemon's defences against its peers and its inputs: a connection's life is bounded
whatever the client does, a status shows others' leases only as counts, and so on."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest

from schedswitchd.cli.ctl import main as ctl_main
from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.server import Server

from .fakes import FakeBackend, FakePrepared
from .harness import Client, FakeClock, FakeTimer, Running, make_config


def test_a_client_that_shuts_its_side_and_never_reads_is_let_go(timed: Running) -> None:
    """Requests, then ``shutdown(SHUT_WR)``, never a read: the replies the socket did not
    take wait in the transport below its high-water mark, then the end of file closes the
    connection; the close's flush is bounded by ``read_timeout_s`` as any reply is, so
    the connection's slot is freed."""
    c = timed.client()
    timed.wait_for(lambda s: len(s.connections) == 1)

    def held(s: Server) -> int:
        transport = next(iter(s.connections.values()))._transport
        return transport.get_write_buffer_size() if transport is not None else 0

    for _ in range(100):  # batches of 20 replies (~12 KB) until the socket is full
        c.send_raw(b'{"v":1,"op":"status"}\n' * 20)
        timed.wait_for(lambda s: all(not conn._busy for conn in s.connections.values()))
        if timed.read(held):
            break
    assert timed.read(held), "the socket took every reply"
    assert timed.read(lambda s: not any(conn._paused for conn in s.connections.values()))
    c.sock.shutdown(socket.SHUT_WR)
    timed.wait_for(lambda s: all(conn.closing for conn in s.connections.values()))
    timed.advance(0.31)
    timed.wait_for(lambda s: not s.connections)
    c.close()


def test_a_pre_open_that_raises_leaves_the_reconcile_loop_alive() -> None:
    """One configured object whose pre-open raises something untyped (a loader defect: a
    ``RecursionError``, which is a ``RuntimeError`` as the worker's shutdown is): the rest
    are pre-opened, and hints still switch."""

    def defect(call: str) -> None:
        if call == "pre-open fifo":
            raise RecursionError("maximum recursion depth exceeded")

    r = Running(FakeBackend(on_preopen=defect))
    try:
        r.wait_for(lambda s: "pre-open vtime" in s.backend.calls)  # type: ignore[attr-defined]
        reply = r.client().request(op="hint", workload="gaming")
        assert reply["ok"] and reply["active"] == "gaming", reply
        assert reply["switch"] is not None and reply["switch"]["result"] == "ok"
    finally:
        r.stop()


class _DefectiveBackend(FakeBackend):
    """A loader defect: preparing ``broken`` raises an exception of no project type."""

    def prepare(self, name: str, spec: SchedulerConfig) -> FakePrepared:
        if name == "broken":
            self.calls.append(f"prepare {name}")
            raise IndexError("struct.unpack_from out of range")
        return super().prepare(name, spec)


def test_a_prepare_that_raises_is_a_failed_switch_backed_off() -> None:
    """The switch is recorded failed (code ``internal``), the running scheduler stays, the
    scheduler is backed off: later passes do not prepare it again during the hold."""
    backend = _DefectiveBackend()
    r = Running(backend, clock=FakeClock())
    try:
        c = r.client()
        assert c.request(op="hint", workload="gaming")["active"] == "gaming"
        reply = c.request(op="hint", workload="broken")
        assert reply["ok"] and reply["active"] == "gaming", reply
        switch = reply["switch"]
        assert switch["target"] == "broken" and switch["result"] == "failed", switch
        assert switch["error"]["code"] == "internal"
        assert "IndexError" in switch["error"]["message"]
        status = c.request(op="status")["status"]
        assert status["last_switch"]["result"] == "failed"
        assert [b["scheduler"] for b in status["backoff"]] == ["broken"]
        r.passes(3)
        assert backend.calls.count("prepare broken") == 1
        assert backend.kernel_state().ops == "gaming_ops"
    finally:
        r.stop()


def test_check_config_reports_a_prepare_that_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--check-config``'s prepare step (the objects' static checks pass here)."""
    from schedswitchd.daemon import check_config as module

    monkeypatch.setattr(module, "inspect_object", lambda *a, **k: ([], []))
    check_config = module.check_config
    r_dir = Path(tempfile.mkdtemp(prefix="ssd-"))
    try:
        config = make_config(r_dir)
        results = {res.name: res for res in check_config(config, _DefectiveBackend())}
        assert not results["broken"].ok
        assert any("IndexError" in p for p in results["broken"].problems)
    finally:
        shutil.rmtree(r_dir, ignore_errors=True)


@pytest.mark.root  # setuid in a forked child
def test_status_and_list_show_a_non_admin_only_its_own_leases() -> None:
    """uid 65534 (may hint, not admin) sees its own lease in full and root's only counted;
    root (admin) sees both."""
    from .harness import as_user

    r = Running()
    try:
        admin = r.client()
        root_lease = admin.request(op="hint", workload="gaming")["lease"]

        def look(c: Client) -> dict[str, Any]:
            mine = c.request(op="hint", workload="battery")["lease"]
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                ctl_main(["status", "--socket", r.path])
                ctl_main(["list", "--socket", r.path])
            return {
                "mine": mine,
                "status": c.request(op="status")["status"],
                "list": c.request(op="list"),
                "ctl": out.getvalue(),
            }

        seen = as_user(r, 65534, look)
        status, listed = seen["status"], seen["list"]
        assert status["leases"] == 2 and status["hidden_leases"] == 1
        assert [x["lease"] for x in status["live_leases"]] == [seen["mine"]]
        assert status["live_leases"][0]["uid"] == 65534
        # root's gaming lease decides what runs: this caller is told only that one does
        assert status["lease"] is None and status["lease_hidden"] is True
        assert [x["lease"] for x in listed["leases"]] == [seen["mine"]]
        assert listed["hidden_leases"] == 1
        # schedswitchctl status and list say so
        assert "another user's lease decides what runs (not shown)" in seen["ctl"]
        assert seen["ctl"].count("1 of other users, not shown") == 2
        # root's lease, its uid and pid appear nowhere (its id does, in the switch's reason)
        text = json.dumps(seen)
        assert f'"owner_pid": {os.getpid()}' not in text and '"uid": 0' not in text
        # the admin sees every lease (the child's ended with its connection: one is left)
        full = admin.request(op="status")["status"]
        assert full["hidden_leases"] == 0 and full["lease"]["lease"] == root_lease
    finally:
        r.stop()


def test_hotplug_restarts_past_the_bound_wait_instead_of_backing_off() -> None:
    """The kernel's CPU-hotplug ejections (``SCX_EXIT_UNREG_KERN``, ``ACT_RESTART |
    RSN_HOTPLUG``) past ``MAX_RESTARTS`` within the window are no failure: the lease keeps
    its scheduler (no backoff, still desired); its restart waits ``RESTART_HOLD_NS``, then
    twice that, and is loaded again when the hold ends."""
    from schedswitchd.daemon.ejections import MAX_RESTARTS

    clock = FakeClock()
    r = Running(clock=clock, poll_timer=FakeTimer(), poll_s=3600.0)
    backend = r.backend
    try:
        c = r.client()
        assert c.request(op="hint", workload="gaming")["active"] == "gaming"
        for _ in range(MAX_RESTARTS):  # at once, as before
            backend.eject(66, "unregistered from the kernel", (1 << 48) | (1 << 32))
            r.wait_for(lambda s: backend.attached_handle is not None)
            r.passes(1)  # the switch's pin done before the next ejection
            clock.advance(0.1)
        for hold_s in (1.0, 2.0):  # RESTART_HOLD_NS, then twice that
            prepares = backend.calls.count("prepare gaming")
            backend.eject(66, "unregistered from the kernel", (1 << 48) | (1 << 32))
            r.passes(2)
            status = c.request(op="status")["status"]
            assert status["backoff"] == [] and status["desired"] == "gaming", status
            assert status["active"] == "kernel" and status["lease"]["workload"] == "gaming"
            assert backend.calls.count("prepare gaming") == prepares  # not yet
            r.advance_reconciler(hold_s - 0.01)
            r.passes(1)
            assert backend.attached_handle is None
            r.advance_reconciler(0.02)  # the hold's end kicks a pass
            r.wait_for(lambda s: backend.attached_handle is not None)
            r.passes(1)
            assert backend.kernel_state().ops == "gaming_ops"
        assert r.read(lambda s: dict(s.policy.backoff)) == {}
    finally:
        r.stop()
