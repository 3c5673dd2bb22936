"""A fast mutation fuzzer for schedswitchd's untrusted inputs (``make fuzz``).

Each *surface* (:mod:`tools.fuzz_targets`: objects, BTF, profiles and expressions,
configs, protocol) is a :class:`Surface`: a set-up run once per worker (seeds, a base BTF,
the host's topology), a generator that makes input number ``i`` from a
``random.Random`` seeded with ``(seed, i)`` (so any input can be made again from its
index alone), and a run that feeds one input to the code under test and returns the
name of its outcome.

The oracle, applied to every input in a long-lived worker process:

* the run returns, or raises an error of the project's ``SchedSwitchError`` tree: counted
  under the error's class name;
* anything else it raises is a finding (``untyped``), as is a ``MemoryError``
  (``memory``: the worker's address space is limited with ``RLIMIT_AS`` to its size after
  set-up plus ``--mem-headroom``, 1 GiB by default), more than ``--cpu-limit`` seconds of
  CPU on one input (``hang``: ``ITIMER_PROF`` in the worker; the supervisor kills a worker
  whose input runs on well past it, or whose input makes no progress in twice the
  limit plus 5 s of wall time, at least 10 s: blocked), and a worker that dies (``crash``).

Each finding's input is saved under ``OUT/findings/SURFACE/`` (the first few per
signature: kind, exception class and the innermost frame of the project's code), with its
traceback beside it; ``python -m tools.fuzz replay SURFACE FILE`` runs it again. After a
hang, a memory finding or a crash the worker is replaced and the run goes on from the
next input. The supervisor prints and writes (``OUT/report.json``, ``OUT/report.md``)
the count of each outcome per surface, each surface's inputs per second and CPU time,
and exits 1 when anything was found.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import mmap
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from schedswitchd.errors import SchedSwitchError

#: The repository: the workers run from it (``python -m tools.fuzz``).
ROOT = Path(__file__).resolve().parent.parent
#: The surfaces ``make fuzz`` runs, by name: ``module:attribute`` of each :class:`Surface`.
SURFACES = {
    "object": "tools.fuzz_targets:OBJECT",
    "btf": "tools.fuzz_targets:BTF",
    "profile": "tools.fuzz_targets:PROFILE",
    "config": "tools.fuzz_targets:CONFIG",
    "protocol": "tools.fuzz_targets:PROTOCOL",
}
#: Kinds of finding (any other outcome is an accepted input or a typed error).
FINDINGS = ("untyped", "memory", "hang", "crash")
#: Reproducers kept per surface and signature (the rest are counted only).
KEEP_PER_SIGNATURE = 3
_EXIT_RESTART = 3  # the worker's exit status after a finding that needs a fresh process
_PROGRESS_S = 2.0


@dataclass(frozen=True)
class Surface:
    """One fuzzed input surface.

    ``setup()`` -> state (seeds and whatever the runs share), once per worker;
    ``generate(state, rng)`` -> the input bytes; ``run(state, data)`` -> the outcome's
    name for an input the code accepted (e.g. ``"opened"``), raising a
    ``SchedSwitchError`` for one it refused; ``teardown(state)``, if given, when the
    worker is done (a server it started, stopped).
    """

    name: str
    setup: Callable[[], Any]
    generate: Callable[[Any, random.Random], bytes]
    run: Callable[[Any, bytes], str]
    teardown: Callable[[Any], None] | None = None


def load_surface(ref: str) -> Surface:
    """The :class:`Surface` named by ``SURFACES`` key or ``module:attribute``."""
    ref = SURFACES.get(ref, ref)
    module, _, attr = ref.partition(":")
    surface = getattr(importlib.import_module(module), attr)
    if not isinstance(surface, Surface):
        raise TypeError(f"{ref} is not a Surface")
    return surface


def input_rng(seed: int, index: int) -> random.Random:
    """The generator of input ``index`` of a run seeded with ``seed``."""
    return random.Random(seed * 1_000_003 + index)


# --- the worker ---------------------------------------------------------------------------


class _CpuLimit(BaseException):
    """Raised in the worker by ``SIGPROF`` when one input used up its CPU time."""


def _on_prof(signum: int, frame: FrameType | None) -> None:
    raise _CpuLimit


def _vsz() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def signature(kind: str, exc: BaseException | None) -> str:
    """``kind``, the exception's class and the innermost frame of the project's code (or
    the innermost frame): what tells one defect from another."""
    if exc is None:
        return kind
    frames = traceback.extract_tb(exc.__traceback__)
    package = str(ROOT / "schedswitchd")
    ours = [f for f in frames if f.filename.startswith(package)]
    ours = ours or [f for f in frames if f.filename.startswith(str(ROOT))] or frames
    where = ""
    if ours:
        f = ours[-1]
        name = f.filename.removeprefix(str(ROOT) + os.sep)
        where = f" at {name}:{f.lineno}"
    return f"{kind} {type(exc).__module__}.{type(exc).__qualname__}{where}"


def classify(exc: BaseException) -> tuple[str, str]:
    """(outcome, finding kind or ``""``) of an exception a run raised."""
    if isinstance(exc, SchedSwitchError):
        return type(exc).__name__, ""
    if isinstance(exc, _CpuLimit):
        return "hang", "hang"
    if isinstance(exc, MemoryError):
        return "memory", "memory"
    return f"untyped:{type(exc).__name__}", "untyped"


def _emit(out: Any, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def worker(
    surface_ref: str,
    seed: int,
    start: int,
    stop: int,
    cpu_limit: float,
    mem_headroom: int,
    progress_fd: int,
    out: Any,
) -> int:
    """Run inputs ``start`` .. ``stop - 1`` of ``surface_ref``, writing JSON lines to
    ``out`` (``progress`` counts, each ``finding`` with its input and traceback) and the
    index of the input being run, as a little-endian i64, to the shared file open as
    ``progress_fd`` (the supervisor reads it to name the input of a worker that died or
    hangs). Returns 0 when done, :data:`_EXIT_RESTART` after a finding that leaves the
    process unfit."""
    t0 = time.process_time()
    # Warnings are not findings (e.g. compile()'s SyntaxWarning on a generated expression).
    warnings.simplefilter("ignore")
    surface = load_surface(surface_ref)
    state = surface.setup()
    setup_cpu = time.process_time() - t0
    shared = mmap.mmap(progress_fd, 8)
    os.close(progress_fd)
    signal.signal(signal.SIGPROF, _on_prof)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vsz() + mem_headroom
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    counts: Counter[str] = Counter()
    last = time.monotonic()
    run_cpu0 = time.process_time()
    status = 0
    index = start
    while index < stop:
        struct.pack_into("<q", shared, 0, index)
        data = surface.generate(state, input_rng(seed, index))
        exc: BaseException | None = None
        signal.setitimer(signal.ITIMER_PROF, cpu_limit)
        try:
            outcome = surface.run(state, data)
        except BaseException as e:  # the oracle: every exception is judged below
            exc = e
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        index += 1
        kind = ""
        if exc is not None:
            if isinstance(exc, KeyboardInterrupt):
                raise exc
            outcome, kind = classify(exc)
        counts[outcome] += 1
        if kind:
            _emit(
                out,
                {
                    "finding": kind,
                    "index": index - 1,
                    "outcome": outcome,
                    "signature": signature(kind, exc),
                    "input": data.hex(),
                    "traceback": _format(exc),
                },
            )
            if kind in ("hang", "memory"):
                status = _EXIT_RESTART
                break
        now = time.monotonic()
        if now - last >= _PROGRESS_S:
            last = now
            _emit(out, {"progress": index, "counts": counts, "cpu": _cpu(run_cpu0)})
            counts = Counter()
            run_cpu0 = time.process_time()
    _emit(
        out,
        {"progress": index, "counts": counts, "cpu": _cpu(run_cpu0), "setup_cpu": setup_cpu},
    )
    if surface.teardown is not None and status == 0:
        surface.teardown(state)
    return status


def _cpu(since: float) -> float:
    return time.process_time() - since


def _format(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


# --- the supervisor -----------------------------------------------------------------------


@dataclass
class SurfaceResult:
    """What one surface's run counted: inputs, outcomes, findings, CPU and wall time."""

    name: str
    inputs: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    findings: Counter[str] = field(default_factory=Counter)
    signatures: Counter[str] = field(default_factory=Counter)
    saved: list[str] = field(default_factory=list)
    cpu_s: float = 0.0
    setup_cpu_s: float = 0.0
    wall_s: float = 0.0
    workers: int = 0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "surface": self.name,
            "inputs": self.inputs,
            "outcomes": dict(sorted(self.outcomes.items())),
            "findings": dict(sorted(self.findings.items())),
            "signatures": dict(self.signatures.most_common()),
            "saved": self.saved,
            "cpu_s": round(self.cpu_s, 1),
            "setup_cpu_s": round(self.setup_cpu_s, 1),
            "wall_s": round(self.wall_s, 1),
            "workers": self.workers,
        }


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid``, 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Job:
    """One surface's run: its workers one after another, from input ``start`` on."""

    def __init__(
        self,
        ref: str,
        name: str,
        args: argparse.Namespace,
        out_dir: Path,
        start: int,
        stop: int,
    ) -> None:
        self.ref = ref
        self.result = SurfaceResult(name)
        self.args = args
        self.out_dir = out_dir
        self.next_index = start
        self.stop = stop
        self.t_end = 0.0
        self.proc: subprocess.Popen[str] | None = None
        self.t_start = 0.0
        # The shared index: an unnamed file (its descriptor passed to each worker).
        self._fd, path = tempfile.mkstemp(prefix=f"fuzz-{name}-")
        os.unlink(path)
        os.write(self._fd, b"\0" * 8)
        self._progress = mmap.mmap(self._fd, 8)
        self._seen_index = -1
        self._seen_cpu = 0.0
        self._seen_wall = 0.0
        self._pending = ""

    def start(self) -> None:
        if not self.t_start:
            self.t_start = time.monotonic()
        struct.pack_into("<q", self._progress, 0, self.next_index)
        cmd = [
            sys.executable, "-m", "tools.fuzz", "worker", self.ref,
            "--seed", str(self.args.seed), "--start", str(self.next_index),
            "--stop", str(self.stop), "--cpu-limit", str(self.args.cpu_limit),
            "--mem-headroom", str(self.args.mem_headroom), "--progress-fd", str(self._fd),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, pass_fds=(self._fd,)
        )
        os.set_blocking(self.proc.stdout.fileno(), False)  # type: ignore[union-attr]
        self.result.workers += 1
        self._seen_index = -1

    def _current(self) -> int:
        return int(struct.unpack_from("<q", self._progress, 0)[0])

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with contextlib.suppress(BlockingIOError, TypeError):
            chunk = self.proc.stdout.read()
            if chunk:
                self._pending += chunk
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if line:
                self._message(json.loads(line))

    def _message(self, msg: dict[str, Any]) -> None:
        r = self.result
        if "progress" in msg:
            r.outcomes.update(msg["counts"])
            r.inputs += sum(msg["counts"].values())
            r.cpu_s += msg["cpu"]
            r.setup_cpu_s += msg.get("setup_cpu", 0.0)
            self.next_index = msg["progress"]
        elif "finding" in msg:
            self._finding(msg["finding"], msg["index"], msg["signature"],
                          bytes.fromhex(msg["input"]), msg["traceback"])  # fmt: skip

    def _finding(self, kind: str, index: int, sig: str, data: bytes | None, tb: str) -> None:
        r = self.result
        r.findings[kind] += 1
        r.signatures[sig] += 1
        if r.signatures[sig] > KEEP_PER_SIGNATURE:
            return
        if data is None:  # the worker died with it: make it again
            surface = load_surface(self.ref)
            data = surface.generate(surface.setup(), input_rng(self.args.seed, index))
        d = self.out_dir / "findings" / r.name
        d.mkdir(parents=True, exist_ok=True)
        tag = hashlib.sha1(sig.encode()).hexdigest()[:8]
        stem = d / f"{kind}-{tag}-{index}"
        stem.with_suffix(".bin").write_bytes(data)
        stem.with_suffix(".txt").write_text(
            f"{sig}\ninput {index} of seed {self.args.seed}\n\n{tb}"
        )
        r.saved.append(str(stem.with_suffix(".bin")))
        print(f"fuzz: {r.name}: {sig} (input {index}: {stem}.bin)", flush=True)

    def poll(self) -> bool:
        """Read the worker's messages, replace it when it ended early or hangs; ``True``
        when the surface is done."""
        assert self.proc is not None
        self._read()
        rc = self.proc.poll()
        if rc is None:
            self._watch()
            return False
        self._read()
        if self._pending:
            self._message(json.loads(self._pending))
            self._pending = ""
        if rc == 0 and self.next_index >= self.stop:
            self.t_end = time.monotonic()
            self.result.wall_s = self.t_end - self.t_start
            return True
        if rc not in (0, _EXIT_RESTART):  # died without saying why
            index = self._current()
            self._count_lost(index, "crash")
            self._finding("crash", index, f"crash (exit status {rc})", None, "")
            self.next_index = index + 1
        self.start()
        return False

    def _count_lost(self, index: int, outcome: str) -> None:
        """Input ``index``, whose worker died (or was killed) on it, and the inputs the
        worker ran since its last counts (their outcomes lost with it)."""
        lost = index - self.next_index
        if lost > 0:
            self.result.inputs += lost
            self.result.outcomes["ran, outcome lost with the worker"] += lost
        self.result.inputs += 1
        self.result.outcomes[outcome] += 1

    def _watch(self) -> None:
        """Kill a worker stuck on one input (past the CPU limit's signal, or blocked)."""
        assert self.proc is not None
        index = self._current()
        cpu = _proc_cpu(self.proc.pid)
        now = time.monotonic()
        if index != self._seen_index:
            self._seen_index, self._seen_cpu, self._seen_wall = index, cpu, now
            return
        over_cpu = cpu - self._seen_cpu > 2 * self.args.cpu_limit + 5
        blocked = now - self._seen_wall > max(10.0, 2 * self.args.cpu_limit + 5)
        if not (over_cpu or blocked):
            return
        self.proc.kill()
        self.proc.wait()
        self._read()
        why = "CPU limit passed in C code" if over_cpu else "blocked, no progress"
        self._count_lost(index, "hang")
        self._finding("hang", index, f"hang ({why}, killed)", None, "")
        self.next_index = index + 1
        self.start()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._progress.close()
        os.close(self._fd)


def supervise(args: argparse.Namespace) -> list[SurfaceResult]:
    """Run every surface of ``args.surfaces`` to ``args.inputs`` inputs, each split into
    ``args.shards`` ranges of inputs run by workers of their own, ``args.jobs`` workers at
    a time; returns each surface's counts (its shards' summed)."""
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    n, shards = args.inputs, max(1, args.shards)
    waiting = [
        _Job(ref, ref.rsplit(":", 1)[-1].lower(), args, out_dir, k * n // shards,
             (k + 1) * n // shards)
        for ref in args.surfaces for k in range(shards)
    ]  # fmt: skip
    running: list[_Job] = []
    done: list[_Job] = []
    last_line = time.monotonic()
    try:
        while waiting or running:
            while waiting and len(running) < args.jobs:
                job = waiting.pop(0)
                job.start()
                running.append(job)
            time.sleep(0.2)
            for job in list(running):
                if job.poll():
                    running.remove(job)
                    done.append(job)
                    r = job.result
                    print(f"fuzz: {r.name}: {r.inputs} inputs in {r.wall_s:.0f} s "
                          f"({r.cpu_s:.0f} s CPU): {dict(r.outcomes)}", flush=True)  # fmt: skip
            if running and time.monotonic() - last_line > 60:
                last_line = time.monotonic()
                print("fuzz: " + ", ".join(f"{j.result.name} {j.next_index}" for j in running),
                      flush=True)  # fmt: skip
    finally:
        for job in waiting + running + done:
            job.close()
    return _merged(done)


def _merged(jobs: list[_Job]) -> list[SurfaceResult]:
    """One result per surface, in the order the surfaces finished: its shards' counts and
    CPU summed, its wall time from its first shard's start to its last one's end."""
    out: dict[str, SurfaceResult] = {}
    span: dict[str, tuple[float, float]] = {}
    for job in jobs:
        r = job.result
        m = out.setdefault(r.name, SurfaceResult(r.name))
        m.inputs += r.inputs
        m.outcomes.update(r.outcomes)
        m.findings.update(r.findings)
        m.signatures.update(r.signatures)
        m.saved += r.saved
        m.cpu_s += r.cpu_s
        m.setup_cpu_s += r.setup_cpu_s
        m.workers += r.workers
        t0, t1 = span.get(r.name, (job.t_start, job.t_end))
        span[r.name] = (min(t0, job.t_start), max(t1, job.t_end))
        m.wall_s = span[r.name][1] - span[r.name][0]
    return list(out.values())


def report_markdown(results: list[SurfaceResult], header: str) -> str:
    """The run's counts as a markdown table per surface and a list of findings."""
    lines = [header, "", "| surface | inputs | outcomes | findings | CPU s | inputs/CPU s |",
             "|---|---:|---|---|---:|---:|"]  # fmt: skip
    for r in results:
        outcomes = ", ".join(f"{k} {v:,}" for k, v in sorted(r.outcomes.items()))
        findings = ", ".join(f"{k} {v:,}" for k, v in sorted(r.findings.items())) or "none"
        rate = r.inputs / r.cpu_s if r.cpu_s else 0.0
        lines.append(f"| {r.name} | {r.inputs:,} | {outcomes} | {findings} | {r.cpu_s:.0f} "
                     f"| {rate:,.0f} |")  # fmt: skip
    sigs = [(r.name, s, n) for r in results for s, n in r.signatures.most_common()]
    if sigs:
        lines += ["", "Findings by signature:", ""]
        lines += [f"- {name}: {n:,} x {s}" for name, s, n in sigs]
    return "\n".join(lines) + "\n"


def _replay(args: argparse.Namespace) -> int:
    surface = load_surface(args.surface)
    state = surface.setup()
    found = 0
    for path in args.files:
        try:
            print(f"{path}: {surface.run(state, Path(path).read_bytes())}")
        except BaseException as exc:  # judged as the worker judges it, then the next file
            if isinstance(exc, KeyboardInterrupt):
                raise
            outcome, kind = classify(exc)
            found += bool(kind)
            print(f"{path}: {outcome}: {str(exc)[:300]}")
            if kind:
                traceback.print_exception(exc, limit=-4)
    if surface.teardown is not None:
        surface.teardown(state)
    return 1 if found else 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.fuzz", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="fuzz surfaces and report")
    run.add_argument("surfaces", nargs="*", default=list(SURFACES),
                     help="surface names or module:attribute (default: all five)")  # fmt: skip
    run.add_argument("--inputs", type=int, default=100_000, help="inputs per surface")
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--jobs", "-j", type=int, default=2, help="workers at once")
    run.add_argument("--shards", type=int, default=1,
                     help="workers per surface, each running its own range of inputs")  # fmt: skip
    run.add_argument("--cpu-limit", type=float, default=5.0, help="CPU s per input")
    run.add_argument("--mem-headroom", type=int, default=1 << 30, help="bytes over set-up")
    run.add_argument("--out", default="build/fuzz", help="report and findings directory")
    w = sub.add_parser("worker", help=argparse.SUPPRESS)
    w.add_argument("surface")
    w.add_argument("--seed", type=int, required=True)
    w.add_argument("--start", type=int, required=True)
    w.add_argument("--stop", type=int, required=True)
    w.add_argument("--cpu-limit", type=float, required=True)
    w.add_argument("--mem-headroom", type=int, required=True)
    w.add_argument("--progress-fd", type=int, required=True)
    rp = sub.add_parser(
        "replay", help="run saved inputs of a surface again (exit 1 if one is a finding)"
    )
    rp.add_argument("surface")
    rp.add_argument("files", nargs="+")
    return p


def main(argv: list[str] | None = None) -> int:
    """``run`` (supervisor), ``worker`` (one surface's inputs) or ``replay``."""
    args = _parser().parse_args(argv)
    if args.cmd == "worker":
        # The messages get stdout's pipe to themselves: whatever the code under test
        # prints goes to stderr.
        messages = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        return worker(args.surface, args.seed, args.start, args.stop, args.cpu_limit,
                      args.mem_headroom, args.progress_fd, messages)  # fmt: skip
    if args.cmd == "replay":
        return _replay(args)
    for s in args.surfaces:  # fail early on a bad name, not in a worker
        load_surface(s)
    t0 = time.time()
    results = supervise(args)
    out = Path(args.out)
    head = (f"Fuzz run of {time.strftime('%Y-%m-%d %H:%M', time.gmtime(t0))}-"
            f"{time.strftime('%H:%M UTC', time.gmtime())}, seed {args.seed}, "
            f"{args.inputs:,} inputs per surface in {args.shards} shard(s), {args.jobs} workers "
            f"at once, CPU limit "
            f"{args.cpu_limit} s per input, {args.mem_headroom >> 20} MiB over set-up")  # fmt: skip
    text = report_markdown(results, head)
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps(
        {"header": head, "surfaces": [r.as_dict() for r in results]}, indent=2) + "\n")  # fmt: skip
    print(text)
    return 1 if any(r.findings for r in results) else 0


if __name__ == "__main__":
    # Through the module, not __main__: the surfaces import this module's Surface.
    from tools.fuzz import main as _main

    sys.exit(_main())


__all__ = [
    "FINDINGS", "ROOT", "SURFACES", "Surface", "SurfaceResult", "classify", "input_rng",
    "load_surface", "main", "report_markdown", "signature", "supervise", "worker",
]  # fmt: skip
