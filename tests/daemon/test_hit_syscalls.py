"""A standby hit's way to its reply asks the kernel for nothing but what the hit needs.

The daemon's serving path (:mod:`tests.daemon.serve_fake`: the real ``Server`` and accept
over the fake backend, which makes no system call of its own) runs under ``strace(1)``.
From the accept of a hint's connection to the write of its reply, the event loop's thread
makes the calls the bare lane of ``bench/hit_floor.py`` makes around its backend, and no
other: after the accept, the socket object's check of its descriptor, non-blocking mode,
the peer's credentials and the read of the line (a ``recvmsg`` here, which keeps a passed
pidfd, where the lane's is a ``recv``). In the sched_ext VM a system call after rest costs
tens to hundreds of microseconds (docs/performance.md, "Standby hit"); an added one -- a log
line written before the reply, ``asyncio.get_running_loop()``, which asks for the process
id -- fails this test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import make_config, start_serve_fake

HINT = b'{"v":1,"op":"hint","workload":"gaming"}\n'
#: The event loop thread's calls from the hit's accept (excluded) to its reply's write
#: (excluded), in order; the fake backend's switch adds none.
EXPECTED = ["getsockname", "ioctl", "getsockopt", "recvmsg"]
#: A line of ``strace -f -o``: ``PID name(...`` for a call begun; one that another thread's
#: line interrupted ends in ``<unfinished ...>`` and goes on in a ``<... name resumed>`` line.
_CALL = re.compile(r"^(\d+)\s+([a-z_0-9]+)\((.*)$")
_RESUMED = re.compile(r"^(\d+)\s+<\.\.\. ([a-z_0-9]+) resumed>(.*)$")
_UNFINISHED = " <unfinished ...>"

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The daemon's serving path under ``strace -f``, fifo its default: (socket path,
    trace file)."""
    directory = Path(tempfile.mkdtemp(prefix="ssd-sys-"))
    path = str(directory / "s.sock")
    trace = tmp_path / "trace.txt"
    proc = None
    try:
        proc = start_serve_fake(
            make_config(directory, default="fifo"), path, ["strace", "-f", "-o", str(trace)]
        )
        yield path, trace
    finally:
        # strace detaches on SIGTERM and leaves the daemon running: it is stopped first.
        with contextlib.suppress(OSError, ValueError, IndexError):
            os.kill(_daemon_pid(trace), signal.SIGTERM)
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        shutil.rmtree(directory, ignore_errors=True)


def _hint(path: str) -> tuple[socket.socket, dict[str, object]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(path)
    sock.sendall(HINT)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(4096)
        assert chunk, "the daemon closed the connection"
        reply += chunk
    return sock, json.loads(reply)


def calls_to_reply(trace: str, main_pid: int) -> list[str] | None:
    """The names of the calls the daemon's main thread (``main_pid``) began between its
    last accept of a connection and that connection's first write, from ``strace -f -o``
    text; ``None`` when that connection's first read found nothing (its client had not
    sent yet: the hit took the other way in)."""
    calls: list[tuple[str, str]] = []  # (name, its arguments and result, joined if split)
    for line in trace.splitlines():
        m = _CALL.match(line)
        if m and int(m.group(1)) == main_pid:
            calls.append((m.group(2), m.group(3).removesuffix(_UNFINISHED)))
            continue
        m = _RESUMED.match(line)
        if m and int(m.group(1)) == main_pid and calls and calls[-1][0] == m.group(2):
            calls[-1] = (m.group(2), calls[-1][1] + m.group(3))
    accepts = [
        i for i, (name, rest) in enumerate(calls) if name == "accept4" and "= -1" not in rest
    ]
    assert accepts, "no accept in the trace"
    start = accepts[-1]
    fd = calls[start][1].rsplit("=", 1)[1].strip()
    names: list[str] = []
    for name, rest in calls[start + 1 :]:
        if name in ("sendto", "sendmsg", "write") and rest.startswith(f"{fd},"):
            return names
        if name == "recvmsg" and rest.startswith(f"{fd},") and "EAGAIN" in rest:
            return None
        names.append(name)
    raise AssertionError(f"no write on descriptor {fd} after its accept")


def _standby_hit(path: str) -> socket.socket:
    """A hint answered from the standby, once the pass after the last lease's end has
    refilled it; its connection, still open."""
    deadline = time.monotonic() + 30
    while True:
        sock, reply = _hint(path)
        switch = reply["switch"]  # None when gaming still ran (the last lease not ended yet)
        if isinstance(switch, dict) and switch["standby"]:
            return sock
        sock.close()
        assert time.monotonic() < deadline, f"no standby hit: {reply}"
        time.sleep(0.2)


def _daemon_pid(trace: Path) -> int:
    """The traced interpreter's pid: the first in the trace (``strace`` forks and execs
    it)."""
    return int(trace.read_text().split(maxsplit=1)[0])


def test_a_standby_hit_makes_only_the_calls_it_needs_before_its_reply(
    traced: tuple[str, Path],
) -> None:
    path, trace = traced
    first, _ = _hint(path)
    first.close()  # its lease ends: fifo runs again, and gaming is held as a standby
    for _ in range(5):
        sock = _standby_hit(path)
        time.sleep(0.5)  # for strace to write the reply's line
        names = calls_to_reply(trace.read_text(), _daemon_pid(trace))
        sock.close()
        if names is not None:
            assert names == EXPECTED
            return
    pytest.fail("in 5 standby hits, the hint's line was never there at the accept")


def test_the_trace_reader_joins_calls_another_thread_interrupted() -> None:
    trace = "\n".join(
        [
            "7 accept4(3, {sa_family=AF_UNIX}, [110 => 2], SOCK_CLOEXEC <unfinished ...>",
            "8 futex(0x1, FUTEX_WAKE_PRIVATE, 1) = 1",
            "7 <... accept4 resumed>) = 9",
            "7 getsockname(9, {sa_family=AF_UNIX}, [128 => 26]) = 0",
            "7 recvmsg(9, {msg_iov=[]}, MSG_CMSG_CLOEXEC <unfinished ...>",
            "8 getpid() = 7",
            "7 <... recvmsg resumed>) = -1 EAGAIN (Resource temporarily unavailable)",
        ]
    )
    assert calls_to_reply(trace, 7) is None  # the split read found nothing
    done = trace.replace("= -1 EAGAIN (Resource temporarily unavailable)", "= 40")
    with pytest.raises(AssertionError, match="no write on descriptor 9"):
        calls_to_reply(done, 7)
    written = done + '\n7 sendto(9, "{}", 2, 0, NULL, 0) = 2'
    assert calls_to_reply(written, 7) == ["getsockname", "recvmsg"]
