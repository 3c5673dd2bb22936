"""A hint bound to a process that is not the caller's descendant, named by a pidfd passed
over the socket (SCM_RIGHTS): real processes, the real server on a real socket, the
launcher's own client (launcher_wire) sending it."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import pytest

from schedswitchd.daemon.launcher_wire import DaemonError, LauncherConnection
from schedswitchd.daemon.passed_fds import MAX_PASSED

from .harness import Running, run_as

NOBODY = 65534


def _sleeper(uid: int | None = None) -> subprocess.Popen[bytes]:
    """A ``sleep`` child of pytest (so never a descendant of a client), as ``uid``."""
    return subprocess.Popen(["sleep", "60"], user=uid)


def _hint_by_pidfd(r: Running, pid: int, hold: Callable[[LauncherConnection], Any]) -> Any:
    """Open a pidfd of ``pid``, hint ``gaming`` with it, then ``hold(connection)``;
    an error reply becomes ``{"code": ...}``."""
    pidfd = os.pidfd_open(pid)
    try:
        with LauncherConnection(r.path, timeout_s=10) as conn:
            try:
                reply = conn.exchange({"op": "hint", "workload": "gaming", "pidfd": True}, (pidfd,))
            except DaemonError as exc:
                return {"code": exc.code, "message": str(exc)}
            return {"reply": reply, "held": hold(conn)}
    finally:
        os.close(pidfd)


def _final_line(conn: LauncherConnection) -> dict[str, Any] | None:
    """The daemon's last line (its lease_ended) once it closes the connection."""
    conn.sock.settimeout(20)
    line = conn._read_line()
    return None if line is None else json.loads(line)


@pytest.mark.root  # processes of another uid
def test_a_pidfd_of_the_callers_own_process_binds_the_lease(srv: Running) -> None:
    game = _sleeper(NOBODY)
    try:

        def hint_and_wait() -> Any:
            # The game is pytest's child, not this client's: a pid would be refused.
            with LauncherConnection(srv.path, timeout_s=10) as conn:
                try:
                    conn.exchange({"op": "hint", "workload": "gaming", "pid": game.pid})
                except DaemonError as exc:
                    by_pid = exc.code
            result = _hint_by_pidfd(srv, game.pid, _final_line)
            return {"by_pid": by_pid, **result}

        results: list[Any] = []
        client = threading.Thread(target=lambda: results.append(run_as(NOBODY, hint_and_wait)))
        client.start()
        srv.wait_for(lambda s: [lease.pid for lease in s.policy.leases.values()] == [game.pid])
        # the lease is in the policy before the pass that switches for it has run
        srv.wait_for(lambda s: s.switcher.active == "gaming")
        game.kill()  # the client holds its connection open: only the pidfd ends the lease
        game.wait()
        client.join(30)
        (result,) = results
        assert result["by_pid"] == "denied", result
        assert result["reply"]["active"] == "gaming"
        assert result["held"]["op"] == "lease_ended", result
        assert result["held"]["why"] == f"pid {game.pid} exited"
        srv.wait_for(lambda s: not s.policy.leases and s.switcher.active == "kernel")
    finally:
        game.kill()
        game.wait()


@pytest.mark.root  # processes of another uid
def test_a_pidfd_of_another_uids_process_is_refused(srv: Running) -> None:
    roots = _sleeper()
    try:
        result = run_as(NOBODY, lambda: _hint_by_pidfd(srv, roots.pid, lambda c: None))
        assert result["code"] == "denied", result
        assert f"process {roots.pid} belongs to uid 0" in result["message"]
        assert srv.read(lambda s: not s.policy.leases)
        # an admin may name anyone's process
        admin = _hint_by_pidfd(srv, _sleeper(NOBODY).pid, lambda c: None)
        assert admin["reply"]["ok"], admin
    finally:
        roots.kill()
        roots.wait()


def _refused(r: Running, fds: tuple[int, ...] = (), **extra: Any) -> DaemonError:
    """The error reply to a ``gaming`` hint with ``pidfd: true`` (and ``extra``)."""
    with LauncherConnection(r.path, timeout_s=10) as conn, pytest.raises(DaemonError) as refusal:
        conn.exchange({"op": "hint", "workload": "gaming", "pidfd": True, **extra}, fds)
    return refusal.value


def test_bad_passed_descriptors(srv: Running) -> None:
    none = _refused(srv)
    assert none.code == "bad_pid" and "no descriptor" in str(none)
    read_end, write_end = os.pipe()
    try:
        pipe = _refused(srv, (read_end,))
        assert pipe.code == "bad_pid" and "not a pidfd" in str(pipe)
    finally:
        os.close(read_end)
        os.close(write_end)
    gone = subprocess.Popen(["true"])
    pidfd = os.pidfd_open(gone.pid)
    gone.wait()
    try:
        exited = _refused(srv, (pidfd,))
        assert exited.code == "bad_pid" and "exited" in str(exited)
    finally:
        os.close(pidfd)
    assert _refused(srv, pid=os.getpid()).code == "bad_request"
    assert srv.read(lambda s: not s.policy.leases)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_passed_descriptors_are_bounded_and_closed_with_the_connection(srv: Running) -> None:
    """The server runs in this process: its descriptor table is this one's."""
    before = _open_fds()
    pipes = [os.pipe() for _ in range(4)]
    try:
        fds = tuple(fd for pair in pipes for fd in pair)
        with LauncherConnection(srv.path, timeout_s=10) as conn:
            assert conn.exchange({"op": "status"}, fds)["ok"]
            kept = _open_fds() - before - len(fds) - 1  # the client's socket
            assert 0 < kept <= MAX_PASSED + 1  # + the server's end of the connection
        srv.wait_for(lambda s: not s.connections)
        srv.wait_for(lambda s: _open_fds() == before + len(fds))
    finally:
        for a, b in pipes:
            os.close(a)
            os.close(b)
