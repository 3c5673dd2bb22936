"""Benchmark: what one small step of Python costs when it is the first thing run after a
switch of process, or after rest, against the same step run warm (in the sched_ext VM).

Why it exists: a standby hit's way in (the client's line to the pool's take) is made of
about 25 small steps of the daemon's own Python (accept, the connection, the peer's
credentials, admission, framing, the parse memo, the lease, the policy), and in the sched_ext
VM each of them costs 20-200 us in a hit although most take 1-10 us when run again at once
(``bench/results/daemon_targets.md``). This bench measures that effect alone, outside the
daemon: which kinds of step cost what when run cold, and whether the cost follows the
number of calls or the number of different kinds of step.

One process inside the VM (``--local``: on this machine) measures each step (:data:`STEPS`)
in three ways, ``--trials`` times each (the median is reported):

- **warm**: the step run once untimed, then once timed;
- **after a switch**: a pipe round trip with a partner process pinned to the same CPU
  (which touches 16 MiB of its own memory first), then the step timed: the machine ran
  another process in between, as it runs the launcher before a hint;
- **after rest**: ``--rest`` s of sleep (default 0.5, as ``switch_latency.REST_S``), then
  the round trip, then the step timed, as a hint comes after a quiet while.

Each row also gives its excess over the empty step (``nothing``: the timing itself)
measured the same way in the same run, the reference every row is read against. Writes
``cold_steps.md`` and ``cold_steps.json`` under ``--out`` (default ``bench/results``).

Usage: ``python bench/cold_steps.py [--trials 9] [--rest 0.5] [--local]``. Internal
sub-command (inside the VM): ``_vm``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import socket
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vm_bench import (
    REPO,
    argv_without_out,
    host_prepare,
    interpreter,
    load_text,
    save_run,
    utc_now,
    vm_run_failed,
)

sys.path.insert(0, str(REPO))

from schedswitchd.daemon.peer import Peer
from schedswitchd.daemon.policy import Lease

PAGE = 4096
#: The partner process's own memory, touched before each round trip, bytes.
PARTNER_BYTES = 16 << 20
#: How many calls the two call rows make (one function, or as many different ones).
CALLS = 50
LINE = b'{"v":1,"op":"hint","workload":"gaming"}\n'
_CRED = struct.Struct("3i")
MODES = ("warm", "switch", "rest")


class _Plain:
    def __init__(self) -> None:
        self.a, self.b, self.c, self.d, self.e = 1, 2, 3, None, None


class _WithProperty:
    def __init__(self) -> None:
        self._x = 1

    @property
    def x(self) -> int:
        return self._x


async def _leaf() -> int:
    return 1


async def _middle() -> int:
    return await _leaf()


async def _top() -> int:
    return await _middle()


def _run_coroutine() -> int:
    """Three coroutines deep, stepped by hand as the daemon's connection steps its request."""
    coro = _top()
    try:
        coro.send(None)
    except StopIteration as stop:
        return int(stop.value)
    raise RuntimeError("the coroutine waited")


def _raise_and_catch() -> int:
    try:
        raise KeyError(1)
    except KeyError:
        return 0


def _one(o: _Plain, n: int) -> int | None:
    v = o.a + n
    return None if v == o.b else v * 2


def _functions(count: int) -> list[Callable[[_Plain, int], int | None]]:
    """``count`` functions with ``_one``'s body, each its own code object."""
    source = "".join(
        f"def f{i}(o, n):\n    v = o.a + n + {i}\n    return None if v == o.b else v * 2\n"
        for i in range(count)
    )
    names: dict[str, Any] = {}
    exec(source, names)  # the bench's own source, made above
    return [names[f"f{i}"] for i in range(count)]


class Steps:
    """The steps measured, over one connected ``AF_UNIX`` stream pair (``server`` the
    accepted end, non-blocking) whose client end sends a request line before each read."""

    def __init__(self) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(f"\0cold-steps-{os.getpid()}")
        self.listener.listen(1)
        self.client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.client.connect(self.listener.getsockname())
        self.server, _ = self.listener.accept()
        self.server.setblocking(False)
        self.lock = threading.Lock()
        self.memo: collections.OrderedDict[bytes, int] = collections.OrderedDict({LINE: 1})
        self.holder = _WithProperty()
        self.plain = _Plain()
        self.table = {"a": 1, "b": 2}
        self.many = _functions(CALLS)
        self.rows: dict[str, Callable[[], object]] = {
            "nothing (the reference)": lambda: None,
            "one call": lambda: _one(self.plain, 1),
            f"{CALLS} calls of one function": self.same_function,
            f"{CALLS} calls of {CALLS} functions": self.many_functions,
            "recv": lambda: self.server.recv(len(LINE)),
            "recvmsg with room for descriptors": lambda: self.server.recvmsg(
                len(LINE), socket.CMSG_SPACE(8)
            ),
            "getsockopt SO_PEERCRED + unpack": lambda: _CRED.unpack(
                self.server.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
            ),
            "the daemon's Lease (a frozen dataclass of 8 fields)": lambda: Lease(
                "1-ab", "gaming", 0, 1, None, 5, None, 1
            ),
            "plain object, 5 attributes": _Plain,
            "the daemon's Peer (__slots__ set by object.__setattr__)": lambda: Peer(1, 0, 0, None),
            "property": lambda: self.holder.x,
            "lock + OrderedDict get/move_to_end": self.memo_hit,
            "coroutines, 3 deep, stepped by hand": _run_coroutine,
            "raise and catch": _raise_and_catch,
            "f-string of 2 fields": lambda: f"{self.table['a']} lease {self.table['b']}",
            "bytes lstrip + find": lambda: LINE.lstrip(b"\n").find(b"\n"),
            "loop over dict values": lambda: [v for v in self.table.values() if v == 2],
            "monotonic_ns": time.monotonic_ns,
            "asyncio get_running_loop (none)": asyncio._get_running_loop,
        }
        #: The rows that read: the client sends a line before each.
        self.reads = {"recv", "recvmsg with room for descriptors"}

    def same_function(self) -> None:
        for _ in range(CALLS):
            _one(self.plain, 1)

    def many_functions(self) -> None:
        for f in self.many:
            f(self.plain, 1)

    def memo_hit(self) -> int | None:
        with self.lock:
            value = self.memo.get(LINE)
            self.memo.move_to_end(LINE)
        return value

    def close(self) -> None:
        for sock in (self.server, self.client, self.listener):
            sock.close()


class Partner:
    """A process pinned to the CPU the bench runs on, answering each byte written to it
    after touching its own :data:`PARTNER_BYTES`: a round trip is two switches of process."""

    def __init__(self) -> None:
        ask_read, ask_write = os.pipe()
        answer_read, answer_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the partner
            junk = bytearray(PARTNER_BYTES)
            while os.read(ask_read, 1):
                junk[::PAGE] = bytes(len(junk) // PAGE)
                os.write(answer_write, b"r")
            os._exit(0)
        os.close(ask_read)
        os.close(answer_write)
        self._write, self._read = ask_write, answer_read

    def round_trip(self) -> None:
        os.write(self._write, b"j")
        os.read(self._read, 1)

    def close(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self._write)
        os.close(self._read)


def measure(trials: int, rest_s: float) -> dict[str, dict[str, float]]:
    """Median µs of each step of :class:`Steps` per mode (``warm``, ``switch``, ``rest``),
    ``trials`` times each, in this process (pinned to its first allowed CPU, with its
    partner). Raises ``OSError`` when a step's socket call fails."""
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    steps = Steps()
    partner = Partner()
    try:
        out: dict[str, dict[str, float]] = {}
        for name, step in steps.rows.items():
            reads = name in steps.reads
            medians: dict[str, float] = {}
            for mode in MODES:
                times = []
                for _ in range(trials):
                    if reads:
                        steps.client.send(LINE)
                    if mode == "warm":
                        if reads:
                            steps.client.send(LINE)  # one line for each read
                        step()
                    elif mode == "rest":
                        time.sleep(rest_s)
                        partner.round_trip()
                    else:
                        partner.round_trip()
                    start = time.perf_counter_ns()
                    step()
                    times.append(time.perf_counter_ns() - start)
                medians[mode] = statistics.median(times) / 1e3
            out[name] = medians
        return out
    finally:
        partner.close()
        steps.close()


def report(rows: dict[str, dict[str, float]], meta: dict[str, str]) -> str:
    """The page: one row per step, its medians and its excess over the reference row."""
    ref = rows["nothing (the reference)"]
    lines = [
        "# Cold steps: one small step of Python, first after a switch or after rest",
        "",
        f"Produced by `python bench/cold_steps.py {meta['argv']}` on {meta['date']}; "
        f"{meta['where']}; host load {meta['load']}; {meta['interpreter']}; "
        f"{meta['trials']} trials per cell, medians, us.",
        "",
        "Warm: the step run once untimed, then timed. After a switch: a pipe round trip with "
        "a process on the same CPU (16 MiB of its memory touched), then the step. After rest: "
        f"{meta['rest_s']} s of sleep, the round trip, the step. Over the reference: the "
        "median minus the empty step's median in the same mode (the timing itself).",
        "",
        "| step | warm | after a switch | after rest | over the reference, switch | "
        "over the reference, rest | rest / warm |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in rows.items():
        ratio = m["rest"] / m["warm"] if m["warm"] > 0 else float("inf")
        lines.append(
            f"| {name} | {m['warm']:.1f} | {m['switch']:.1f} | {m['rest']:.1f} | "
            f"{m['switch'] - ref['switch']:+.1f} | {m['rest'] - ref['rest']:+.1f} | "
            f"{ratio:.1f}x |"
        )
    return "\n".join(lines) + "\n"


def vm_main(args: argparse.Namespace) -> int:
    rows = measure(args.trials, args.rest)
    Path(args.results, "cold_steps.json").write_text(json.dumps(rows))
    return 0


def host_main(args: argparse.Namespace) -> int:
    meta = {
        "argv": argv_without_out(sys.argv[1:]),
        "date": utc_now(),
        "load": load_text(),
        "interpreter": interpreter(),
        "trials": str(args.trials),
        "rest_s": str(args.rest),
    }
    if args.local:
        rows = measure(args.trials, args.rest)
        meta["where"] = "on this machine (--local)"
    else:
        from tools import vm

        kernel = host_prepare()
        if kernel is None:
            return 1
        script = (
            f'"$PY" "$REPO/bench/cold_steps.py" _vm --trials {args.trials} '
            f'--rest {args.rest} --results "$RESULTS"\n'
        )
        result = vm.run_in_vm(
            script, kernel=kernel, timeout=args.timeout, cpus=2, cwd=str(REPO), memory_mib=2048
        )
        if vm_run_failed(result, "cold_steps.json"):
            return 1
        rows = json.loads(result.text("cold_steps.json"))
        meta["where"] = f"in the sched_ext VM ({result.accel}, 2 vCPUs, kernel {kernel.version})"
    page = report(rows, meta)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_run(out, "cold_steps.json", {"meta": meta, "rows": rows}, page, "cold_steps.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0], allow_abbrev=False)
    sub = ap.add_subparsers(dest="cmd")
    vmp = sub.add_parser("_vm", allow_abbrev=False)
    vmp.add_argument("--trials", type=int, required=True)
    vmp.add_argument("--rest", type=float, required=True)
    vmp.add_argument("--results", required=True)
    ap.add_argument("--trials", type=int, default=9, help="measurements per step and mode")
    ap.add_argument("--rest", type=float, default=0.5, help="the rest before a rest row, s")
    ap.add_argument("--local", action="store_true", help="measure on this machine, no VM")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    if args.cmd == "_vm":
        return vm_main(args)
    return host_main(args)


if __name__ == "__main__":
    sys.exit(main())
