"""Benchmark: what a small step of Python costs when it runs soon after a switch of
process, or after rest and a switch, against the same step warm (in the sched_ext VM, or on
this machine with --local).

Why it exists: a standby hit's way in (the client's line to the pool's take) is a row of
small steps of the daemon's own Python, run right after the launcher's process and often
after a quiet while, and in the sched_ext VM (QEMU TCG) they cost far more there than the
same calls warm (``bench/results/daemon_targets.md``, "the way in step by step"). This
bench measures the effect outside the daemon.

How: one process pinned to one CPU, and a partner process (:class:`Partner`) pinned to the
same CPU. After one untimed pass over every step, each trial times every step
(:class:`Steps`) once in each of four ways (:data:`MODES`), all of a trial's measurements
in a shuffled order, so that every row (the reference included) is read over the same
stretch of the run:

- **warm**: the step run once untimed, then timed;
- **again**: the step run once untimed, a round trip with the partner, then the step timed:
  the step ran just before, and another process ran in between. The partner first writes
  one byte in each page of its own :data:`PARTNER_BYTES`, and sends the line a read row
  reads just before it answers, as the launcher sends its line;
- **switch**: the round trip, then the step timed. The step last ran about one trial
  earlier, with the other steps (and their rests) in between;
- **rest**: ``--rest`` s of sleep (default ``switch_latency.REST_S``: a hint in that bench
  comes after as long), then the round trip, then the step timed.

The page gives each row's median and quartiles over ``--trials`` per mode, and its cold
extra: the row's median in a mode less its warm median, less the same difference of the
empty step (``nothing``, the reference: every row is one call of a lambda, timed the same
way). A row is the first thing run after the round trip: rows do not add up to what a
sequence of them costs. Writes ``cold_steps.md`` and ``cold_steps.json`` (every sample)
under ``--out`` (default ``bench/results``).

Usage: ``python bench/cold_steps.py [--trials 9] [--rest 0.5]`` builds the sample
schedulers and gets the kernel if needed (as every VM bench does) and boots the sched_ext
VM once (about 2.5 min at the defaults); ``python bench/cold_steps.py --local --out DIR``
measures on this machine instead (silent for about 2 min at the defaults);
``--from-json FILE`` writes the page again from a saved run, next to it unless ``--out``
says where. Internal sub-command (inside the VM): ``_vm``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from switch_latency import REST_S
from vm_bench import (
    REPO,
    argv_without_out,
    checkout_commit,
    host_prepare,
    interpreter,
    load_text,
    redo_page,
    save_run,
    utc_now,
    vm_run_failed,
)

sys.path.insert(0, str(REPO))

from schedswitchd.daemon.acceptor import FIRST_READ_BYTES
from schedswitchd.daemon.passed_fds import accept_passing
from schedswitchd.daemon.peer import peer_of
from schedswitchd.daemon.policy import Lease
from schedswitchd.daemon.protocol import parse_request

#: The partner process's own memory, bytes: it writes one byte in each page before each
#: answer (as many TLB entries as pages, one cache line each).
PARTNER_BYTES = 16 << 20
#: How many calls the two call rows make (one function, or as many different ones).
CALLS = 50
#: What ``schedswitch-run gaming`` sends: the line the read rows read.
LINE = b'{"v":1,"op":"hint","workload":"gaming"}\n'
#: The ways each step is timed (see the module docstring), in the page's order.
MODES = ("warm", "again", "switch", "rest")
#: The empty step every row is read against.
REFERENCE = "nothing (the reference)"
#: How long a round trip waits for the partner's answer at most, s.
ANSWER_WAIT_S = 10.0
#: The order of each trial's measurements is shuffled with this seed.
SEED = 0
#: The two rows that read the line the client sent.
FIRST_READ = "the daemon's first read (PassingSocket.recv: recvmsg)"
PLAIN_RECV = "a plain recv of the line"


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
    """The steps measured (:attr:`rows`: name -> a call of no arguments), over one
    connection on an abstract ``AF_UNIX`` stream socket: :attr:`server` is the daemon's
    kind of accepted socket (``passed_fds.PassingSocket``, non-blocking), :attr:`client`
    the launcher's end, which sends one :data:`LINE` before each read (:meth:`send_line`,
    or the partner's copy of it). A context manager: its sockets are closed at the end."""

    def __init__(self) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(f"\0cold-steps-{os.getpid()}")
            self.listener.listen(1)
            self.client.connect(self.listener.getsockname())
            self.server, _ = accept_passing(self.listener)
        except OSError:
            self.listener.close()
            self.client.close()
            raise
        self.server.setblocking(False)
        holder, plain, table, many = _WithProperty(), _Plain(), {"a": 1, "b": 2}, _functions(CALLS)

        def same_function() -> None:
            for _ in range(CALLS):
                _one(plain, 1)

        def many_functions() -> None:
            for f in many:
                f(plain, 1)

        self.rows: dict[str, Callable[[], object]] = {
            REFERENCE: lambda: None,
            "one call": lambda: _one(plain, 1),
            f"{CALLS} calls of one function": lambda: same_function(),
            f"{CALLS} calls of {CALLS} functions (each its own code object)": lambda: (
                many_functions()
            ),
            FIRST_READ: lambda: self.server.recv(FIRST_READ_BYTES),
            PLAIN_RECV: lambda: socket.socket.recv(self.server, FIRST_READ_BYTES),
            "the daemon's peer_of (SO_PEERCRED, a Peer)": lambda: peer_of(self.server),
            "the daemon's Lease (a frozen dataclass of 8 fields)": lambda: Lease(
                "1-ab", "gaming", 0, 1, None, 5, None, 1
            ),
            "a plain object of 5 attributes": lambda: _Plain(),
            "the daemon's parse of a kept line (a lock, an OrderedDict)": lambda: parse_request(
                LINE
            ),
            "a property": lambda: holder.x,
            "coroutines 3 deep, stepped by hand": lambda: _run_coroutine(),
            "raise and catch": lambda: _raise_and_catch(),
            "an f-string of 2 fields": lambda: f"{table['a']} lease {table['b']}",
            "bytes lstrip and find": lambda: LINE.lstrip(b"\n").find(b"\n"),
            "a loop over dict values": lambda: [v for v in table.values() if v == 2],
            "time.monotonic_ns": lambda: time.monotonic_ns(),
            "asyncio._get_running_loop (no loop running)": lambda: asyncio._get_running_loop(),
            "os.getpid (a system call: asyncio.get_running_loop makes one)": lambda: os.getpid(),
        }
        #: The rows that read the line the client sent.
        self.reads = frozenset((FIRST_READ, PLAIN_RECV))
        parse_request(LINE)  # kept from now on, as the daemon keeps a launcher's line

    def send_line(self) -> None:
        """The client's line, for the next read row."""
        self.client.sendall(LINE)

    def close(self) -> None:
        """Close the three sockets."""
        for sock in (self.server, self.client, self.listener):
            sock.close()

    def __enter__(self) -> Steps:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class PartnerGone(RuntimeError):
    """The partner process did not answer a round trip (it exited or was killed)."""


#: The partner's program: its arguments are the CPU, the bytes to touch, the descriptors of
#: its two pipe ends and of the client's socket, and the line it sends when asked.
_PARTNER = """
import os, socket, sys
cpu, size, ask, answer, client_fd = (int(a) for a in sys.argv[1:6])
line = sys.argv[6].encode()
os.sched_setaffinity(0, {cpu})
client = socket.socket(fileno=client_fd)
page = os.sysconf("SC_PAGE_SIZE")
junk = bytearray(size)
while word := os.read(ask, 1):
    junk[::page] = bytes(size // page)
    if word == b"l":
        client.sendall(line)
    os.write(answer, b"r")
"""


class Partner:
    """A process of its own (a new interpreter, not a fork of this one) pinned to ``cpu``
    (the bench's), which answers each byte written to it after writing one byte in each
    page of its own :data:`PARTNER_BYTES`, and first sends :data:`LINE` on ``client`` when
    asked to: a round trip (:meth:`round_trip`) is two switches of process on that CPU. It
    stops at its pipe's end, so also when the bench's process dies. A context manager: at
    its end it is told to stop, and killed if it has not within a second."""

    def __init__(self, client: socket.socket, cpu: int) -> None:
        ask_read, ask_write = os.pipe()
        answer_read, answer_write = os.pipe()
        fds = (ask_read, answer_write, client.fileno())
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _PARTNER, str(cpu), str(PARTNER_BYTES),
                 *map(str, fds), LINE.decode()],
                pass_fds=fds,
            )  # fmt: skip
        except BaseException:
            for fd in (ask_read, ask_write, answer_read, answer_write):
                os.close(fd)
            raise
        os.close(ask_read)
        os.close(answer_write)
        self.pid = self.process.pid
        self._write, self._read = ask_write, answer_read

    def round_trip(self, send_line: bool = False) -> None:
        """One exchange with the partner (``send_line``: it sends :data:`LINE` first).
        Raises :class:`PartnerGone` when it does not answer within :data:`ANSWER_WAIT_S`."""
        try:
            os.write(self._write, b"l" if send_line else b"t")
            ready, _, _ = select.select([self._read], [], [], ANSWER_WAIT_S)
            answer = os.read(self._read, 1) if ready else b""
        except BrokenPipeError:
            answer = b""
        if answer != b"r":
            raise PartnerGone(f"the partner process {self.pid} did not answer")

    def close(self) -> None:
        """Stop the partner and reap it."""
        os.close(self._write)
        os.close(self._read)
        try:
            self.process.wait(1.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Partner:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _time_once(steps: Steps, partner: Partner, name: str, mode: str, rest_s: float) -> int:
    """One measurement of the row ``name`` in ``mode`` (see the module docstring), ns."""
    step = steps.rows[name]
    reads = name in steps.reads
    if mode in ("warm", "again"):
        if reads:
            steps.send_line()
        step()
    if mode == "warm":
        if reads:
            steps.send_line()
    else:
        if mode == "rest":
            time.sleep(rest_s)
        partner.round_trip(send_line=reads)
    start = time.perf_counter_ns()
    step()
    return time.perf_counter_ns() - start


def measure(trials: int, rest_s: float, seed: int = SEED) -> dict[str, dict[str, list[float]]]:
    """Every sample, us, of each row of :class:`Steps` per mode (:data:`MODES`),
    ``trials`` of each, taken in this process pinned to its first allowed CPU (its
    affinity is restored after) with a :class:`Partner`, after one untimed warm pass over
    every row; each trial's measurements in an order shuffled with ``seed``. Raises
    ``OSError`` when a step's socket call fails (``BlockingIOError``: a read row found no
    line) and :class:`PartnerGone`."""
    before = os.sched_getaffinity(0)
    cpu = min(before)
    os.sched_setaffinity(0, {cpu})
    try:
        with Steps() as steps, Partner(steps.client, cpu) as partner:
            partner.round_trip()  # its pages faulted in, untimed
            for name in steps.rows:
                _time_once(steps, partner, name, "warm", rest_s)
            times: dict[str, dict[str, list[float]]] = {
                name: {mode: [] for mode in MODES} for name in steps.rows
            }
            order = [(name, mode) for name in steps.rows for mode in MODES]
            shuffle = random.Random(seed).shuffle
            for _ in range(trials):
                shuffle(order)
                for name, mode in order:
                    ns = _time_once(steps, partner, name, mode, rest_s)
                    times[name][mode].append(ns / 1e3)
    finally:
        os.sched_setaffinity(0, before)
    return times


def medians(samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Each cell's median, us."""
    return {
        name: {mode: statistics.median(values) for mode, values in modes.items()}
        for name, modes in samples.items()
    }


def cold_extra(rows: dict[str, dict[str, float]], name: str, mode: str) -> float:
    """The row ``name``'s median in ``mode`` less its warm median, less the same difference
    of the reference row, us (``rows``: :func:`medians`)."""
    row, ref = rows[name], rows[REFERENCE]
    return (row[mode] - row["warm"]) - (ref[mode] - ref["warm"])


def _cell(values: list[float]) -> str:
    """``median (first quartile-third quartile)``, us."""
    low, _, high = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    digits = 1 if high < 10 else 0
    return f"{statistics.median(values):.1f} ({low:.{digits}f}-{high:.{digits}f})"


def report(samples: dict[str, dict[str, list[float]]], meta: dict[str, str]) -> str:
    """The page (markdown): the run's line, the medians and quartiles of every row per mode,
    then each row's cold extra per mode and its after-rest median over its warm one."""
    rows = medians(samples)
    lines = [
        "# Cold steps: a small step of Python soon after a switch, or after rest",
        "",
        f"Produced by `python bench/cold_steps.py{' ' if meta['argv'] else ''}{meta['argv']}` "
        f"on {meta['date']} (checkout {meta['commit']}); {meta['where']}; host load average "
        f"{meta['load']}; {meta['interpreter']}; {meta['trials']} trials per cell after one "
        f"untimed pass, each trial's measurements in an order shuffled with seed "
        f"{meta.get('seed', SEED)}; us.",
        "",
        "Warm: the step run once untimed, then timed. Again: the step run once untimed, a pipe "
        "round trip with a process on the same CPU that first wrote one byte in each page of "
        f"{int(meta['partner_bytes']) >> 20} MiB of its own (and sent the line a read row "
        "reads), then the step timed. Switch: the round trip, then the step, which last ran "
        "about one trial before, with the other steps and their rests in between. Rest: "
        f"{meta['rest_s']} s of sleep, the round trip, the step. Each step is the first thing "
        "run after the round trip: the rows do not add up to what a sequence of them costs.",
        "",
        "Median (quartiles) per mode:",
        "",
        "| step | " + " | ".join(MODES) + " |",
        "|---|" + "---:|" * len(MODES),
    ]
    for name, modes in samples.items():
        lines.append(f"| {name} | " + " | ".join(_cell(modes[m]) for m in MODES) + " |")
    lines += [
        "",
        "Cold extra: the step's median less its warm median, less the same difference of the "
        "empty step (the reference):",
        "",
        "| step | again | switch | rest | rest / warm |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, m in rows.items():
        ratio = f"{m['rest'] / m['warm']:.1f}x" if m["warm"] > 0 else "-"
        extras = " | ".join(f"{cold_extra(rows, name, mode):+.1f}" for mode in MODES[1:])
        lines.append(f"| {name} | {extras} | {ratio} |")
    return "\n".join(lines) + "\n"


def vm_main(args: argparse.Namespace) -> int:
    """Inside the VM: measure, write every sample to ``cold_steps.json`` under
    ``--results``."""
    samples = measure(args.trials, args.rest)
    Path(args.results, "cold_steps.json").write_text(json.dumps(samples))
    return 0


def host_main(args: argparse.Namespace, argv: list[str]) -> int:
    """Measure (in the VM, or here with ``--local``), then save the run and its page; or,
    with ``--from-json``, write the page again from a saved run."""
    if args.from_json:
        saved = Path(args.from_json)
        out = Path(args.out) if args.out else saved.parent
        return redo_page(
            str(saved), out, "cold_steps.md", lambda s: report(s["samples"], s["meta"])
        )
    out = Path(args.out)
    shown = argv_without_out(argv)
    meta = {
        "argv": f"{shown} --out DIR" if args.local else shown,
        "date": utc_now(),
        "commit": checkout_commit(),
        "load": load_text(),
        "trials": str(args.trials),
        "rest_s": str(args.rest),
        "seed": str(SEED),
        "partner_bytes": str(PARTNER_BYTES),
    }
    if args.local:
        samples = measure(args.trials, args.rest)
        meta["where"] = "on this machine (--local)"
        meta["interpreter"] = interpreter(Path(sys.executable))
    else:
        from tools import vm

        kernel = host_prepare()
        if kernel is None:
            return 1
        script = (
            f'"$PY" "$REPO/bench/cold_steps.py" _vm --trials {args.trials} '
            f'--rest {args.rest} --results "$RESULTS"\n'
        )
        started = time.monotonic()
        result = vm.run_in_vm(
            script, kernel=kernel, timeout=args.timeout, cpus=2, cwd=str(REPO), memory_mib=2048
        )
        if vm_run_failed(result, "cold_steps.json"):
            return 1
        samples = json.loads(result.text("cold_steps.json"))
        meta["where"] = (
            f"in the sched_ext VM ({result.accel}, 2 vCPUs, kernel {kernel.version}; "
            f"VM run {time.monotonic() - started:.0f} s)"
        )
        meta["interpreter"] = interpreter()
    save_run(out, "cold_steps.json", {"meta": meta, "samples": samples},
             report(samples, meta), "cold_steps.md")  # fmt: skip
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _not_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(
        description=(
            "What a small step of Python costs soon after a switch of process, or after rest, "
            "against the same step warm. By default it boots the sched_ext VM once (building "
            "the sample schedulers and getting the kernel if needed; about 2.5 min) and writes "
            "bench/results/cold_steps.{md,json}."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    sub = ap.add_subparsers(dest="cmd", help=argparse.SUPPRESS)
    vmp = sub.add_parser("_vm", allow_abbrev=False)
    vmp.add_argument("--trials", type=_positive, required=True)
    vmp.add_argument("--rest", type=_not_negative, required=True)
    vmp.add_argument("--results", required=True)
    ap.add_argument("--trials", type=_positive, default=9, help="measurements per step and mode")
    ap.add_argument(
        "--rest", type=_not_negative, default=REST_S, help="the sleep before a rest measurement, s"
    )
    ap.add_argument(
        "--local", action="store_true", help="measure on this machine, no VM (needs --out)"
    )
    ap.add_argument(
        "--out",
        help="where the page and its JSON go (VM: bench/results; --from-json: beside the JSON)",
    )
    ap.add_argument("--timeout", type=float, default=900.0, help="the VM run's limit, s")
    ap.add_argument(
        "--from-json", metavar="FILE", help="only write the page again from a saved cold_steps.json"
    )
    args = ap.parse_args(argv)
    if args.cmd == "_vm":
        return vm_main(args)
    if args.local and args.out is None and not args.from_json:
        ap.error("--local needs --out: bench/results holds the VM's figures")
    if args.out is None and not args.from_json:
        args.out = str(REPO / "bench" / "results")
    return host_main(args, argv)


if __name__ == "__main__":
    sys.exit(main())
