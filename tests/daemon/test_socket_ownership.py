"""The daemon unlinks only the socket it bound: a second daemon that refuses to start, or
one that finds something else at its path, leaves the path as it found it."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from schedswitchd.daemon import service
from schedswitchd.errors import ConfigError

from .harness import make_config
from .service_process import daemon_cmd, env


def _second_daemon(config: Path, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        daemon_cmd(config, "--socket", str(path)),
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_refused_second_daemon_leaves_the_live_socket(workdir: Path) -> None:
    config = Path(make_config(workdir).source or "")
    path = workdir / "live.sock"
    first = service.own_socket(str(path), 0o600, None)
    try:
        before = os.lstat(path)
        done = _second_daemon(config, path)
        assert done.returncode == 1, done.stderr
        assert "already listening" in done.stderr
        after = os.lstat(path)
        assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))  # the first one is still reachable
        finally:
            probe.close()
    finally:
        first.close()


def test_a_regular_file_at_the_socket_path_is_kept(workdir: Path) -> None:
    config = Path(make_config(workdir).source or "")
    path = workdir / "plain"
    path.write_text("keep me")
    done = _second_daemon(config, path)
    assert done.returncode == 1, done.stderr
    assert "not a socket" in done.stderr
    assert path.read_text() == "keep me"


def test_a_path_replaced_meanwhile_is_not_unlinked(workdir: Path) -> None:
    """The socket's path names another file by the time the daemon stops (an admin moved
    a new one in): the daemon leaves it."""
    path = workdir / "own.sock"
    sock = service.own_socket(str(path), 0o600, None)
    owned = service.socket_identity(str(path))
    sock.close()
    os.unlink(path)
    path.write_text("someone else's")
    service.unlink_own_socket(str(path), owned)
    assert path.read_text() == "someone else's"
    # and its own is unlinked
    sock = service.own_socket(str(workdir / "b.sock"), 0o600, None)
    owned = service.socket_identity(str(workdir / "b.sock"))
    sock.close()
    service.unlink_own_socket(str(workdir / "b.sock"), owned)
    assert not (workdir / "b.sock").exists()


def test_a_socket_that_cannot_be_finished_is_removed_and_said(workdir: Path) -> None:
    """An unknown ``[socket] group`` or a NUL byte in the path is a ConfigError; the
    socket file bound for it is not left behind."""
    path = workdir / "g.sock"
    with pytest.raises(ConfigError, match="no such group"):
        service.own_socket(str(path), 0o600, "schedswitchd-no-such-group")
    assert not path.exists()
    with pytest.raises(ConfigError, match="NUL byte"):
        service.own_socket(str(workdir / "a\0b.sock"), 0o600, None)
