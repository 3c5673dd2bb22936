"""Many clients against the daemon's serving path (fake backend): resident memory comes
back afterwards, and an admin's ``status`` is answered throughout (issue 14.10).

The daemon runs in its own process (:mod:`tests.daemon.serve_fake`, memory tuned as the
real one); the flood runs in a forked child as uid 65534 (a hint user, not an admin): each
client loops over hint (with a short TTL), status, list, history, release and a malformed
line. Size: ``$SCHEDSWITCHD_FLOOD_CLIENTS`` clients for ``$SCHEDSWITCHD_FLOOD_S`` seconds
(``make test``: 8 x 3 s; ``make fuzz``: 200 x 30 s). The figures are printed (``-s``).
The flood fills the connection caps, so the admin's ``status`` is served from its reserve.
Every size must meet :data:`SLACK_KIB`: the 200-client flood did not (+2.1-2.6 MiB) while
each connection held asyncio streams (~10 KB; :mod:`schedswitchd.daemon.connection`).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedswitchd.daemon.launcher_wire import ControlConnection

from .harness import Client, make_config

#: Seconds of many clients by design: make test runs it, make unit leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = int(os.environ.get("SCHEDSWITCHD_FLOOD_CLIENTS", "8"))
SECONDS = float(os.environ.get("SCHEDSWITCHD_FLOOD_S", "3"))
#: How far resident memory may stay above its level before the flood (issue 14.10).
SLACK_KIB = 2048


def rss_kib(pid: int) -> int:
    """``VmRSS`` of ``pid`` (``proc(5)``), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def daemon() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    directory = Path(tempfile.mkdtemp(prefix="ssd-flood-"))
    os.chmod(directory, 0o755)  # uid 65534 must reach the socket
    # The flood fills both connection caps: the admin's status needs its reserve.
    config = make_config(directory, per_uid=CLIENTS, max_conn=CLIENTS, max_leases=CLIENTS + 8)
    assert config.source is not None
    path = str(directory / "s.sock")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.daemon.serve_fake", config.source, path],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            assert proc.poll() is None and time.monotonic() < deadline, "daemon did not start"
            time.sleep(0.05)
        yield proc, path
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(directory, ignore_errors=True)


async def _one_client(path: str, until: float, seed: int) -> int:
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
                    line = {"v": 1, "op": "hint", "workload": "battery", "ttl_s": 0.5}
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


async def _flood(path: str, clients: int, seconds: float) -> int:
    until = time.monotonic() + seconds
    counts = await asyncio.gather(*(_one_client(path, until, i) for i in range(clients)))
    return sum(counts)


def _flood_as_nobody(path: str) -> tuple[int, int]:
    """Fork; the child becomes uid 65534 and floods. Returns (pid, read end of a pipe on
    which the child writes its reply count when done)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            total = asyncio.run(_flood(path, CLIENTS, SECONDS))
            os.write(write_fd, str(total).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _warm_up(path: str) -> None:
    """Every request kind once, so lazily built things (validators, imports) exist."""
    c = Client(path)
    try:
        lease = c.request(op="hint", workload="battery")["lease"]
        for op in ("status", "list", "history"):
            assert c.request(op=op)["ok"]
        c.request(op="release", lease=lease)
    finally:
        c.close()


def test_flood_gives_memory_back_and_admins_get_status(
    daemon: tuple[subprocess.Popen[bytes], str],
) -> None:
    proc, path = daemon
    asyncio.run(_flood(path, min(CLIENTS, 8), 1.0))  # warm every path, as root
    _warm_up(path)
    time.sleep(0.5)
    game = Client(path)  # a game runs throughout: the flood's hints do not switch
    assert game.request(op="hint", workload="gaming")["active"] == "gaming"
    time.sleep(0.5)
    before = rss_kib(proc.pid)
    pid, done_fd = _flood_as_nobody(path)
    statuses = 0
    deadline = time.monotonic() + SECONDS + 60
    try:
        while True:
            # root, an admin, through schedswitchctl's own connection: its connect waits
            # for room in the accept queue, and the daemon serves it from the reserve
            with ControlConnection(path, timeout_s=10.0) as admin:
                reply = admin.exchange({"op": "status"})
            assert reply["ok"], reply
            statuses += 1
            waited, status = os.waitpid(pid, os.WNOHANG)
            if waited:
                break
            assert time.monotonic() < deadline, "flood did not end"
            time.sleep(0.2)
    finally:
        if not statuses or not waited:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    with os.fdopen(done_fd, "rb") as pipe:
        replies = int(pipe.read() or b"0")
    assert os.waitstatus_to_exitcode(status) == 0 and replies > CLIENTS
    peak = rss_kib(proc.pid)
    time.sleep(1.5)  # the lease TTLs run out; idle passes
    _warm_up(path)  # one more request after the flood, as a user would send
    time.sleep(0.5)
    after = rss_kib(proc.pid)
    print(
        f"\nflood: {CLIENTS} clients x {SECONDS:.0f} s, {replies} replies, "
        f"{statuses} admin statuses; daemon RSS before {before / 1024:.1f} MiB, "
        f"at the end {peak / 1024:.1f} MiB, after {after / 1024:.1f} MiB "
        f"({after - before:+d} KiB)"
    )
    assert after <= before + SLACK_KIB, f"RSS {before} KiB -> {after} KiB after the flood"
