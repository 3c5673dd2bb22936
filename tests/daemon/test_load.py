"""Bounded load test: ~150 concurrent clients for ~5 s against a daemon process.

Mixes valid requests, malformed JSON, random bytes, oversized lines, half-written requests
(abandoned, or left to time out) and hints that end by release or by closing. Afterwards:
every reply was a well-formed protocol line, the daemon still runs and answers, no lease
or connection is left, its fd count is back to where it was, and its RSS stayed flat.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.launcher_wire import MAX_REPLY_BYTES
from schedswitchd.errors import ProtocolError

from .harness import make_config

#: Seconds of many clients by design: make test runs it, make unit leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 150
SECONDS = 5.0
MAX_BYTES = 1024  # make_config's limits.max_message_bytes


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Stats:
    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.codes: Counter[str] = Counter()
        self.replies = 0
        self.bad: list[bytes] = []


async def read_reply(
    reader: asyncio.StreamReader, stats: Stats, timeout: float = 10
) -> proto.Reply | None:
    try:
        line = await asyncio.wait_for(reader.readline(), timeout)
    except (OSError, TimeoutError):
        return None
    if not line:
        return None
    try:
        reply = proto.parse_reply(line.rstrip(b"\n"))
    except ProtocolError:
        stats.bad.append(line[:200])
        return None
    stats.replies += 1
    if isinstance(reply, proto.ErrorReply):
        stats.codes[reply.error.code] += 1
    return reply


async def one_session(path: str, rng: random.Random, stats: Stats) -> None:
    reader, writer = await asyncio.open_unix_connection(path, limit=MAX_REPLY_BYTES)
    try:
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice(
                [
                    "status",
                    "list",
                    "history",
                    "hint",
                    "hint_pid",
                    "malformed",
                    "random",
                    "oversized",
                    "half_abandon",
                    "half_timeout",
                    "unknown_op",
                ]
            )
            stats.kinds[kind] += 1
            if kind in ("status", "list", "history"):
                writer.write(b'{"v":1,"op":"%s"}\n' % kind.encode())
                await read_reply(reader, stats)
            elif kind in ("hint", "hint_pid"):
                workload = rng.choice(["gaming", "video-call", "battery", "nope"])
                pid = f',"pid":{os.getpid()}' if kind == "hint_pid" else ""
                writer.write(f'{{"v":1,"op":"hint","workload":"{workload}"{pid}}}\n'.encode())
                reply = await read_reply(reader, stats)
                if isinstance(reply, proto.HintReply) and rng.random() < 0.5:
                    writer.write(f'{{"v":1,"op":"release","lease":"{reply.lease}"}}\n'.encode())
                    await read_reply(reader, stats)
            elif kind == "malformed":
                writer.write(rng.choice([b"{\n", b'{"v":1,"op":}\n', b"[[[[[[\n", b'"x"\n']))
                await read_reply(reader, stats)
            elif kind == "unknown_op":
                writer.write(b'{"v":1,"op":"format-disk"}\n')
                await read_reply(reader, stats)
            elif kind == "random":
                junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
                writer.write(junk.replace(b"\n", b" ") + b"\n")
                await read_reply(reader, stats)
            elif kind == "oversized":
                writer.write(b'{"v":1,"op":"status","id":"' + b"x" * (2 * MAX_BYTES) + b'"}\n')
                await read_reply(reader, stats)
                return  # the daemon closes after a too_large
            elif kind == "half_abandon":
                writer.write(b'{"v":1,"op":"hi')
                return
            elif kind == "half_timeout":
                writer.write(b'{"v":1,"op":"sta')
                await read_reply(reader, stats)  # a timeout reply, then close
                return
            await writer.drain()
    except OSError:  # the daemon may close first (limits); that is not a failure here
        stats.kinds["closed_by_daemon"] += 1
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def drive(path: str, stats: Stats) -> int:
    deadline = time.monotonic() + SECONDS
    sessions = 0

    async def worker(seed: int) -> None:
        nonlocal sessions
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            await one_session(path, rng, stats)
            sessions += 1

    await asyncio.gather(*(worker(i) for i in range(CLIENTS)))
    return sessions


def test_load() -> None:
    work = Path(tempfile.mkdtemp(prefix="ssd-load-"))
    config = make_config(work, read_timeout=0.5, per_uid=400, max_conn=400, max_leases=10000)
    path = str(work / "s.sock")
    log = open(work / "log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.daemon.fake_service",
            "--config",
            str(config.source),
            "--socket",
            path,
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(path):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        fds_before = fd_count(proc.pid)
        stats = Stats()

        async def main() -> tuple[int, int, int]:
            task = asyncio.create_task(drive(path, stats))
            await asyncio.sleep(SECONDS / 3)
            warm = rss_kib(proc.pid)
            sessions = await task
            return warm, rss_kib(proc.pid), sessions

        warm_rss, end_rss, sessions = asyncio.run(main())

        assert proc.poll() is None, "daemon died under load"
        assert not stats.bad, stats.bad[:3]
        # Counts, not a rate: a busy host serves fewer requests in the time, not none.
        assert sessions > CLIENTS and stats.replies > CLIENTS, (sessions, stats.replies)
        assert stats.codes["bad_json"] and stats.codes["too_large"] and stats.codes["timeout"]
        assert stats.codes["unknown_workload"] and stats.codes["unknown_op"]
        assert not stats.codes["internal"], stats.codes

        # every connection closed -> every lease ended, fds back to the baseline
        async def final_status() -> proto.StatusBody:
            reader, writer = await asyncio.open_unix_connection(path, limit=MAX_REPLY_BYTES)
            writer.write(b'{"v":1,"op":"status"}\n')
            reply = proto.parse_reply((await reader.readline()).rstrip(b"\n"))
            writer.close()
            assert isinstance(reply, proto.StatusReply)
            return reply.status

        deadline = time.monotonic() + 10
        while True:
            status = asyncio.run(final_status())
            if (
                status.leases == 0 and fd_count(proc.pid) <= fds_before
            ) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status.leases == 0
        assert fd_count(proc.pid) <= fds_before, (fd_count(proc.pid), fds_before)
        # flat RSS: growth after warm-up bounded (allocator noise, not per-request growth)
        assert end_rss <= warm_rss * 1.2 + 4096, (warm_rss, end_rss)
        print(
            f"\nload: {sessions} sessions, {stats.replies} replies, kinds {dict(stats.kinds)}, "
            f"error codes {dict(stats.codes)}, RSS warm {warm_rss} KiB end {end_rss} KiB"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        finally:
            proc.kill()
            log.close()
