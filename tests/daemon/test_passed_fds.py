"""The daemon's accepted sockets (:mod:`schedswitchd.daemon.passed_fds`): what the accept
gives and what a read keeps."""

from __future__ import annotations

import array
import os
import socket
from pathlib import Path

from schedswitchd.daemon import passed_fds
from schedswitchd.daemon.passed_fds import PassingSocket, accept_passing


def test_accept_passing_gives_a_passing_socket_that_keeps_passed_descriptors(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            sock, _addr = accept_passing(listener)
            with sock:
                assert type(sock) is PassingSocket
                assert (sock.family, sock.type) == (socket.AF_UNIX, socket.SOCK_STREAM)
                assert not sock.get_inheritable()
                read_end, write_end = os.pipe()
                try:
                    fds = array.array("i", [read_end])
                    client.sendmsg(
                        [b"line\n"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())]
                    )
                    assert sock.recv(100) == b"line\n"
                    kept = sock.take_fd()
                    assert kept is not None and not os.get_inheritable(kept)
                    os.close(kept)
                finally:
                    os.close(read_end)
                    os.close(write_end)


def test_the_read_flags_are_a_plain_int() -> None:
    """``socket.MSG_CMSG_CLOEXEC`` is an ``IntFlag``: ``flags | it`` in each read would run
    the enum's Python code (docs/performance.md, "Standby hit")."""
    assert type(passed_fds._RECV_FLAGS) is int
    assert passed_fds._RECV_FLAGS == socket.MSG_CMSG_CLOEXEC
