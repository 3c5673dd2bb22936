"""``watch``: a line per change (switch, ejection, lease added/ended, override) for as long
as the client stays, read by the real ``schedswitchctl watch``; a watcher that falls behind
is dropped without holding the daemon back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from schedswitchd.cli.daemon_cmds import event_line
from schedswitchd.daemon.feed import QUEUE_MAX

from .harness import Running

ROOT = Path(__file__).resolve().parents[2]
CTL = Path(sys.executable).parent / "schedswitchctl"


class Watcher:
    """``schedswitchctl watch --json`` as a process; its lines collected by a thread."""

    def __init__(self, path: str, *more: str) -> None:
        self.proc = subprocess.Popen(
            [str(CTL), "watch", "--socket", path, *more],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_lines(self, n: int, timeout: float = 10.0) -> list[str]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.lines) >= n, timeout), self.lines
            return list(self.lines)

    def stop(self) -> int:
        self.proc.send_signal(2)  # SIGINT: Ctrl-C
        code = self.proc.wait(10)
        self.thread.join(5)
        return code


def _events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines[1:]]


def test_watch_streams_every_kind_of_change_in_order(srv: Running) -> None:
    watcher = Watcher(srv.path, "--json")
    try:
        first = json.loads(watcher.wait_lines(1)[0])
        assert first["op"] == "watch" and first["active"] == "kernel" and first["override"] is None
        c = srv.client()
        # Each step's switch is published once its pass ends, which may be after the
        # request's reply: the next step waits for it, so that the order is the steps'.
        c.request(op="hint", workload="battery")  # lease_added, switch kernel -> fifo
        watcher.wait_lines(3)
        c.request(op="switch", scheduler="vtime")  # override vtime, switch fifo -> vtime
        watcher.wait_lines(5)
        srv.backend.eject(1026, "watchdog failed for vtime")  # ejection, override dropped,
        watcher.wait_lines(8)  # switch kernel -> fifo (the lease's)
        c.close()  # lease_ended, switch fifo -> kernel
        lines = watcher.wait_lines(10)
        events = _events(lines)
        kinds = [(e["kind"], e["data"].get("target") or e["data"].get("override")) for e in events]
        assert kinds == [
            ("lease_added", None),
            ("switch", "fifo"),
            ("override", "vtime"),
            ("switch", "vtime"),
            ("ejection", None),
            ("override", None),
            ("switch", "fifo"),
            ("lease_ended", None),
            ("switch", "kernel"),
        ], kinds
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(first["seq"] + 1, first["seq"] + 1 + len(events)))
        ejection = events[4]["data"]
        assert ejection["scheduler"] == "vtime" and ejection["exit_kind"] == "ERROR_STALL"
        assert ejection["reason"] == "watchdog failed for vtime" and ejection["backoff_s"] > 0
        assert events[7]["data"]["why"] == "connection closed"
        assert all(e["op"] == "event" and e["ok"] for e in events)
        assert watcher.stop() == 0  # Ctrl-C ends a watch without an error
        srv.wait_for(lambda s: s.reconciler.feed.subscribers == 0, 5)
    finally:
        if watcher.proc.poll() is None:
            watcher.stop()


def test_watch_for_people(srv: Running) -> None:
    watcher = Watcher(srv.path)
    try:
        assert watcher.wait_lines(1)[0] == "running kernel; watching (Ctrl-C ends)"
        c = srv.client()
        c.request(op="switch", scheduler="vtime")
        lines = watcher.wait_lines(3)
        assert lines[1].endswith("override vtime (admin)"), lines
        assert lines[2].endswith(" #2 switch kernel -> vtime: ok [override]"), lines
    finally:
        watcher.stop()


def test_a_watcher_that_stops_reading_is_dropped_and_the_daemon_goes_on(srv: Running) -> None:
    c = srv.client()
    c.send_raw(b'{"v":1,"op":"watch"}\n')
    reply = c.recv_line()
    assert reply is not None and reply["op"] == "watch"
    feed = srv.read(lambda s: s.reconciler.feed)
    assert srv.read(lambda s: s.reconciler.feed.subscribers) == 1

    async def flood() -> None:
        # Far more than the socket buffers and the queue hold, in bursts, with the loop
        # free between them to write what the client will never read.
        import asyncio

        for burst in range(200):
            for i in range(50):
                feed.publish("override", override=None, why=f"burst {burst} {i}")
            await asyncio.sleep(0)

    srv.run(flood(), timeout=60)
    srv.wait_for(lambda s: s.reconciler.feed.subscribers == 0, 10)
    assert feed.dropped == 1
    # The daemon answers others meanwhile, and the watcher's connection ends with a line
    # that says why once it reads what was queued for it.
    other = srv.client()
    assert other.request(op="status")["ok"]
    c.sock.settimeout(10)
    last = None
    while (line := c.recv_line()) is not None:
        last = line
    assert last is not None and last["ok"] is False
    assert last["error"]["code"] == "limit"
    assert f"fell {QUEUE_MAX} changes behind" in last["error"]["message"]


def test_leaving_ends_the_subscription(srv: Running) -> None:
    c = srv.client()
    assert c.request(op="watch")["op"] == "watch"
    srv.wait_for(lambda s: s.reconciler.feed.subscribers == 1, 5)
    c.close()
    srv.wait_for(lambda s: s.reconciler.feed.subscribers == 0, 5)


def test_event_line_says_each_kind() -> None:
    base = {"seq": 7, "time": 0.0}
    cases = [
        ({"kind": "switch", "data": {"previous": "a", "target": "b", "result": "rolled_back",
          "reason": "lease 1-x gaming", "gap_ns": None, "error": "EBUSY"}},
         "#7 switch a -> b: rolled_back [lease 1-x gaming]: EBUSY"),
        ({"kind": "ejection", "data": {"scheduler": "b", "exit_kind": "ERROR", "reason": "r",
          "message": "m", "restart": False, "backoff_s": 5.0}},
         "#7 ejected b: ERROR (r: m); held back 5.0 s"),
        ({"kind": "lease_added", "data": {"lease": "1-x", "workload": "gaming", "uid": 1000,
          "pid": 42}}, "#7 lease 1-x: gaming for uid 1000 pid 42"),
        ({"kind": "lease_ended", "data": {"lease": "1-x", "workload": "gaming", "why": "ttl"}},
         "#7 lease 1-x (gaming) ended: ttl"),
        ({"kind": "override", "data": {"override": None, "why": "admin"}},
         "#7 following hints (admin)"),
    ]  # fmt: skip
    for event, text in cases:
        assert event_line({**base, **event}).endswith(text)


@pytest.mark.root  # setuid in a forked child
def test_a_non_admin_watcher_sees_other_users_lease_events_without_identity(
    srv: Running,
) -> None:
    """uid 65534 (may hint, not admin) watches: its own lease's events in full, root's
    only as ``{"hidden": true}`` (counted, as ``status``'s ``hidden_leases``); root's uid,
    pid and lease id appear in none of its lines. An admin watcher sees root's in full."""
    from .harness import as_user

    admin_watch = Watcher(srv.path, "--json")
    admin_watch.wait_lines(1)
    root = srv.client()
    root_ready = threading.Event()
    root_lease: dict[str, str] = {}

    def root_hints() -> None:
        # root's lease comes and goes while the child watches
        root_ready.wait(10)
        root_lease["id"] = root.request(op="hint", workload="gaming", pid=os.getpid())["lease"]
        root.request(op="release", lease=root_lease["id"])

    thread = threading.Thread(target=root_hints, daemon=True)
    thread.start()

    def watch(c: Any) -> dict[str, Any]:
        c.send_raw(b'{"v":1,"op":"watch"}\n')
        lines = [c.recv_line()]
        mine = srv.client()
        own = mine.request(op="hint", workload="battery")["lease"]
        mine.close()
        # root's lease is made after the child's ended: its events come last
        ended = 0
        while ended < 2:
            line = c.recv_line()
            assert line is not None
            lines.append(line)
            if line.get("kind") == "lease_ended":
                ended += 1
                if ended == 1:  # the parent's thread makes root's lease now
                    os.write(ready_w, b"x")
        return {"own": own, "lines": lines}

    ready_r, ready_w = os.pipe()

    def signal_root() -> None:
        os.read(ready_r, 1)
        root_ready.set()

    relay = threading.Thread(target=signal_root, daemon=True)
    relay.start()
    try:
        seen = as_user(srv, 65534, watch)
        assert "child_error" not in seen, seen
        thread.join(10)
        events = [e for e in seen["lines"][1:] if e["kind"] in ("lease_added", "lease_ended")]
        assert [e["kind"] for e in events] == ["lease_added", "lease_ended"] * 2, events
        own_added, own_ended, root_added, root_ended = events
        assert own_added["data"]["lease"] == seen["own"] and own_added["data"]["uid"] == 65534
        assert own_ended["data"]["lease"] == seen["own"] and own_ended["data"]["why"]
        assert root_added["data"] == {"hidden": True} == root_ended["data"]
        # root's uid and pid appear nowhere; its lease id in no lease event (a switch's
        # reason names the lease that chose it, as status's last_switch does)
        text = json.dumps(seen["lines"])
        assert '"uid": 0' not in text and f'"pid": {os.getpid()}' not in text
        assert root_lease["id"] not in json.dumps(events)
        # the human line says only that one was
        assert event_line(root_added).endswith("another user's lease added (not shown)")

        # an admin's watch has root's lease in full (its switch events come in between,
        # each when its switch ends: wait for root's lease's end itself)
        def root_ended_seen() -> bool:
            return any(
                e["kind"] == "lease_ended" and e["data"].get("lease") == root_lease["id"]
                for e in _events(admin_watch.lines)
            )

        with admin_watch.cond:
            assert admin_watch.cond.wait_for(root_ended_seen, 20), admin_watch.lines
        admin = _events(admin_watch.wait_lines(1))
        full = [e for e in admin if e["data"].get("lease") == root_lease["id"]]
        assert [e["kind"] for e in full[:2]] == ["lease_added", "lease_ended"], admin
        assert full[0]["data"]["uid"] == 0 and full[0]["data"]["pid"] == os.getpid()
        assert full[1]["data"]["uid"] == 0
    finally:
        os.close(ready_r)
        os.close(ready_w)
        admin_watch.stop()
