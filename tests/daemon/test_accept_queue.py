"""An admin reaches the daemon while a flood fills its accept queue.

Two halves: the server keeps a long accept queue (asyncio's ``start_unix_server`` re-listens
with its own default of 100 unless told), and the clients' connect waits in the kernel for
room in a full queue, bounded by their timeout, instead of failing at once with ``EAGAIN``
as a non-blocking connect does. Real sockets, no daemon mock.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedswitchd.daemon.acceptor import LISTEN_BACKLOG
from schedswitchd.daemon.launcher_wire import ControlConnection, DaemonUnavailable

from .fakes import FakeBackend
from .harness import Running


@pytest.fixture
def full_queue(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A listener with an accept queue of length 0 that one pending connect already fills
    (``unix_recvq_full``: queue length > backlog), and nothing accepting."""
    path = str(tmp_path / "q.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(0)
    first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    first.connect(path)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    with pytest.raises(BlockingIOError):  # what the old client's connect got
        probe.connect(path)
    probe.close()
    yield listener, path
    first.close()
    listener.close()


def test_connect_waits_for_room_in_a_full_accept_queue(
    full_queue: tuple[socket.socket, str],
) -> None:
    listener, path = full_queue
    result: list[object] = []

    def connect() -> None:
        try:
            result.append(ControlConnection(path, timeout_s=20.0))
        except DaemonUnavailable as exc:
            result.append(exc)

    thread = threading.Thread(target=connect)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive() and not result, result  # waiting, not failed
    accepted, _ = listener.accept()  # room again: the waiting connect completes
    thread.join(20)
    accepted.close()
    assert len(result) == 1 and isinstance(result[0], ControlConnection), result
    result[0].close()


def test_connect_into_a_queue_that_stays_full_is_bounded(
    full_queue: tuple[socket.socket, str],
) -> None:
    _, path = full_queue
    start = time.monotonic()
    with pytest.raises(DaemonUnavailable, match="temporarily unavailable"):
        ControlConnection(path, timeout_s=0.5)
    assert 0.4 < time.monotonic() - start < 10


def _somaxconn() -> int:
    return int(Path("/proc/sys/net/core/somaxconn").read_text())


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to read a backlog")
def test_the_server_keeps_a_long_accept_queue() -> None:
    """``ss -xl`` shows a listening socket's backlog as its Send-Q: the server's is
    :data:`LISTEN_BACKLOG` (capped by ``net.core.somaxconn``), not asyncio's 100."""
    srv = Running(FakeBackend())
    try:
        out = subprocess.run(
            ["ss", "-xlnH", "src", srv.path], capture_output=True, text=True, check=True
        ).stdout.split()
        assert out[:2] == ["u_str", "LISTEN"], out
        assert int(out[3]) == min(LISTEN_BACKLOG, _somaxconn()) > 100, out
    finally:
        srv.stop()
