"""A flood of clients against a running daemon, and its resident memory before and after:
the driver of ``tests/daemon/test_flood.py`` (fake backend, on the host) and of
``bench/daemon_flood_vm.py`` (the real daemon in the sched_ext VM), in ``tools/`` so that
neither the benchmark stands on ``tests/`` nor the test on ``bench/``.

:func:`measure` warms the daemon up, holds a lease of ``hold`` for the whole run (a game
that runs throughout, so the flood's own hints of the lower-priority ``workload`` switch
nothing), reads the daemon's ``VmRSS``, then forks a child that becomes uid 65534 (a hint
user, not an admin) and runs ``clients`` clients for ``seconds``: each connects, sends 1-20
requests (hint with a 0.5 s TTL, release, status, list, history, an unknown op with up to
500 bytes of junk) reading each reply, and closes. Meanwhile the caller (root, an admin)
asks for ``status`` through ``schedswitchctl``'s connection every 0.2 s; each must be
answered. ``VmRSS`` is read again at the flood's end and after a pause and one more round
of requests.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedswitchd.daemon.launcher_wire import ControlConnection

#: The uid the flood runs as.
NOBODY = 65534


def rss_kib(pid: int) -> int:
    """``VmRSS`` of ``pid`` (``proc(5)``), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@dataclass
class FloodResult:
    """One :func:`measure` run: ``replies`` the flood's clients read, ``statuses`` the
    admin's answered ``status`` requests, ``hold`` the reply to the held hint, the daemon's
    ``VmRSS`` (KiB) ``before`` the flood, at its ``peak`` (its end) and ``after`` it."""

    clients: int
    seconds: float
    replies: int
    statuses: int
    hold: dict[str, Any]
    before: int
    peak: int
    after: int
    fds_before: int = 0
    fds_peak: int = 0

    def line(self) -> str:
        """The figures as one line."""
        return (
            f"flood: {self.clients} clients x {self.seconds:.0f} s, {self.replies} replies, "
            f"{self.statuses} admin statuses; daemon RSS before {self.before / 1024:.1f} MiB, "
            f"at the end {self.peak / 1024:.1f} MiB, after {self.after / 1024:.1f} MiB "
            f"({self.after - self.before:+d} KiB); open fds {self.fds_before} before, "
            f"at most {self.fds_peak} during"
        )


async def _one_client(path: str, until: float, seed: int, workload: str) -> int:
    rnd = random.Random(seed)
    replies = 0
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_unix_connection(path, limit=1 << 20)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        try:
            lease = None
            for _ in range(rnd.randint(1, 20)):
                pick = rnd.random()
                if pick < 0.3:
                    line = {"v": 1, "op": "hint", "workload": workload, "ttl_s": 0.5}
                elif pick < 0.4 and lease:
                    line = {"v": 1, "op": "release", "lease": lease}
                elif pick < 0.6:
                    line = {"v": 1, "op": "status"}
                elif pick < 0.75:
                    line = {"v": 1, "op": "list"}
                elif pick < 0.9:
                    line = {"v": 1, "op": "history", "limit": 50}
                else:
                    line = {"v": 1, "op": "bogus", "x": "y" * rnd.randint(0, 500)}
                writer.write(json.dumps(line).encode() + b"\n")
                await writer.drain()
                raw = await reader.readline()
                if not raw:
                    break
                reply = json.loads(raw)
                replies += 1
                if reply.get("op") == "hint" and reply.get("ok"):
                    lease = reply["lease"]
                elif reply.get("op") == "lease_ended":
                    break
        except (OSError, ValueError):
            pass
        finally:
            writer.close()
    return replies


async def flood(path: str, clients: int, seconds: float, workload: str) -> int:
    """``clients`` clients against the socket ``path`` for ``seconds``; replies read."""
    until = time.monotonic() + seconds
    counts = await asyncio.gather(*(_one_client(path, until, i, workload) for i in range(clients)))
    return sum(counts)


def _flood_as_nobody(path: str, clients: int, seconds: float, workload: str) -> tuple[int, int]:
    """Fork; the child becomes uid 65534 and floods. Returns (pid, read end of a pipe on
    which the child writes its reply count when done)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            total = asyncio.run(flood(path, clients, seconds, workload))
            os.write(write_fd, str(total).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def fd_count(pid: int) -> int:
    """Open file descriptors of ``pid`` (``/proc/PID/fd``)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def warm_up(path: str, workload: str) -> None:
    """Every request kind once, so lazily built things (validators, imports) exist."""
    with ControlConnection(path, timeout_s=120.0) as c:
        lease = c.exchange({"op": "hint", "workload": workload})["lease"]
        for op in ("status", "list", "history"):
            assert c.exchange({"op": op})["ok"]
        c.exchange({"op": "release", "lease": lease})


def measure(
    path: str,
    daemon_pid: int,
    clients: int,
    seconds: float,
    *,
    workload: str,
    hold: str,
    settle_s: float = 0.5,
) -> FloodResult:
    """Flood the daemon ``daemon_pid`` serving on ``path`` (see the module docstring);
    ``settle_s``: the pauses before reading ``VmRSS`` (longer in the slow VM). The held
    lease's connection is closed at the end. AssertionError if an admin status is not
    answered, the flood's child fails or reads no more replies than it has clients."""
    asyncio.run(flood(path, min(clients, 8), 1.0, workload))  # warm every path, as root
    warm_up(path, workload)
    time.sleep(settle_s)
    game = ControlConnection(path, timeout_s=120.0)
    try:
        held = game.exchange({"op": "hint", "workload": hold})
        assert held["ok"], held
        time.sleep(settle_s)
        before = rss_kib(daemon_pid)
        fds_before = fds_peak = fd_count(daemon_pid)
        pid, done_fd = _flood_as_nobody(path, clients, seconds, workload)
        statuses = 0
        waited = 0
        deadline = time.monotonic() + seconds + 60 + 10 * settle_s
        try:
            while True:
                # root, an admin, through schedswitchctl's own connection: its connect
                # waits for room in the accept queue, and the daemon serves it from the
                # admin reserve beyond the connection caps the flood fills
                with ControlConnection(path, timeout_s=10.0 + 20 * settle_s) as admin:
                    reply = admin.exchange({"op": "status"})
                assert reply["ok"], reply
                statuses += 1
                fds_peak = max(fds_peak, fd_count(daemon_pid))
                waited, status = os.waitpid(pid, os.WNOHANG)
                if waited:
                    break
                assert time.monotonic() < deadline, "flood did not end"
                time.sleep(0.2)
        finally:
            if not waited:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
        with os.fdopen(done_fd, "rb") as pipe:
            replies = int(pipe.read() or b"0")
        assert os.waitstatus_to_exitcode(status) == 0 and replies > clients, (status, replies)
        peak = rss_kib(daemon_pid)
        time.sleep(1.0 + settle_s)  # the lease TTLs run out; idle passes
        warm_up(path, workload)  # one more request after the flood, as a user would send
        time.sleep(settle_s)
        after = rss_kib(daemon_pid)
    finally:
        game.close()
    return FloodResult(
        clients, seconds, replies, statuses, held, before, peak, after, fds_before, fds_peak
    )
