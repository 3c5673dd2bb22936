"""Benchmark: switching sched_ext schedulers as the number of loaded modules grows (in the VM).

The case for ``.kmod_btfs``: libbpf reads the BTF of *every* loaded module as soon as a CO-RE
relocation, a kfunc or an attach target is missing from vmlinux. The sample scheduler
``ss_latency`` (``bpf/latency.bpf.c``) reads two facts of the ``uinput`` module's BTF through
CO-RE relocations, so every loader has to look beyond vmlinux for it.

One boot of the sched_ext VM (:mod:`tools.vm`, Debian sid's kernel under qemu) runs the
whole measurement, in the harness's ramroot mode (:mod:`tools.ramroot`): the bench runs in a
tmpfs root holding the venv's interpreter, stdlib and runtime packages, the checkout's
package, ``bench/``, ``tools/``, ``build/bpf``, bpftool, kmod and the decompressed modules it
will insert (file list computed on the host), with the 9p shares unmounted and the 9p modules
removed. So no module is loaded when it starts, and neither bpftool nor Python reads its
files over 9p. Modules are inserted incrementally (pre-decompressed copies, dependency order)
until 1, 10, 100 and 300 module BTFs are present (``/sys/kernel/btf`` minus vmlinux; the
smallest step is ``uinput`` alone). At each step, ``--reps`` repetitions of, in the same run:

(a) libbpf: Debian 12's ``bpftool struct_ops register`` (libbpf 1.1) of the legacy
    ``.struct_ops`` build, from process start to its exit with sched_ext ``enabled``
    (nothing was running before; libbpf ignores ``.kmod_btfs``);
(b) ours, cold: a fresh Python process that imports the loader, parses vmlinux and the
    declared module BTF, loads and attaches the ``.kmod_btfs`` build; from process start to
    ``enabled`` (interpreter start-up and imports included);
(c) the daemon, warm, without ``.kmod_btfs``: ``schedswitchd`` (real kernel backend) runs
    with a bench configuration whose default is ``ss_fifo``; a client sends a hint on its
    socket for a workload mapped to the ``.kmod_btfs``-less build; timed from sending the
    hint to the daemon's reply, which it sends once the kernel reads ``enabled`` (ending the
    lease brings ``ss_fifo`` back, not timed). The client is a launcher's
    (``schedswitch-run``'s :class:`~schedswitchd.daemon.launcher_wire.LauncherConnection`:
    the request written and the reply read by the standard library), for (c), (d) and (e)
    alike; the reply line is then validated whole by the protocol's models, untimed;
(d) the same with the ``.kmod_btfs`` build;
(e) the same as (d) with the scheduler held as a prepared standby: before each sample (not
    timed) a launcher intent (``prepare``) for that workload, then the hint, whose switch is
    detach + link create (the reply says ``standby``). (c) and (d) run with the daemon's
    ``[standby] recent = false`` so that they stay warm prepares; the intent of (e) keeps
    its own scheduler entry held the whole run;
(f) (e)'s reference, the bare lane (``bench/hit_floor.py``): the least a standby hit costs
    with the real backend, one server process for the whole run, timed by the same
    client; measured among the other samples (the machine's speed drifts over a boot)
    with the daemon parked and stopped (``SIGSTOP``), and the lane's server stopped
    outside its own hits.

Every (c)-(e) hint is sent once the daemon's ``status`` says ``idle`` (no reconcile pass,
nor the standby refill after it, running or kicked, no direct switch, nothing queued on
its worker thread; for (e) also with the standby held), as a launcher's hint meets a
daemon at rest, not the tail of the round that refilled the pool after the sample before;
then :data:`REST_S` later, as long as the lane (f) rests before its own hint, so that
neither server meets its hint just after answering a request.

Per switch it also records: the no-scheduler gap (c, d: the daemon's own record, from the
old scheduler's detach starting to the return of ``BPF_LINK_CREATE`` for the new one,
whose ``enabled`` state the daemon confirms right after; a, b cannot prepare
while another scheduler runs, so their gap is the whole switch), the share of the time
spent inside ``bpf(2)`` (ours: the ``syscall.STATS`` counters around our ``bpf()`` wrapper,
which the daemon reports as ``bpf_syscall_ns`` in its status counters) and the daemon's RSS
(``VmRSS`` of its process, with its parts ``RssAnon`` and ``RssFile`` + ``RssShmem``). For
(a)/(b) the daemon is told to run nothing (admin ``stop``).

Outputs under ``--out`` (default ``bench/results``): ``switch_latency.json`` (every sample),
``switch_latency.md`` (the table), ``switch_latency.png`` (latency against module count) and
``switch_profile_{c,d}.txt`` (cProfile of warm switches through the daemon's Switcher and
KernelBackend at the largest count) and, with ``--hint-profile N``, ``switch_profile_e.txt``
(the standby hit's whole path in one process: a timeline of marks by thread and cProfile of
the event loop's, the worker's and the client's threads).

Targets: (c) and (d) flat within 5% from the smallest to the largest count; (d) at 300 at
most half of (a) at 300; the gap of (c)/(d) at most a fifth of their full switch; warm RSS at
most 48 MiB. (e), judged against (f), the bare lane
(``bench/hit_floor.py``): what (e) costs beyond its gap at most 1 ms over what the lane costs
beyond its own (medians per hit, the largest count; the page gives that difference's
bootstrap interval, and ``--hit-reps`` takes more hits of both there than of the other
columns), and (e) at most 0.10 of (a) at the largest count. A lane-relative target
replaces a ratio to (e)'s own gap because the lane shows that no implementation of a hit
reaches such a ratio under single-threaded TCG (docs/performance.md, standby hit). Exit
status 0 when all are met, 2 when not, 1 on failure.

Usage: ``python bench/switch_latency.py [--reps 21] [--hit-reps N] [--counts 1,10,100,300]
[--out DIR]``.
Internal sub-commands (run inside the VM): ``_vm``, ``_cold``, ``_profile``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vm_bench import REPO, SCHED_DIR, host_prepare, load_text, machine, rss_kib, utc_now
from vm_bench import scx as _scx
from vm_bench import wait_scx as _wait

sys.path.insert(0, str(REPO))

DECLARED_MODULE = "uinput"
NEW_OPS = "ss_latency"
BASE_OPS = "ss_fifo"
OBJECTS = {
    "a": "latency.legacy.bpf.o",
    "b": "latency.bpf.o",
    "c": "latency.nokmod.bpf.o",
    "d": "latency.bpf.o",
    "e": "latency.bpf.o",
}
BASE_OBJECT = "fifo.bpf.o"
COLUMNS = {
    "a": "libbpf 1.1 (bpftool)",
    "b": "ours, cold process",
    "c": "daemon warm, no .kmod_btfs",
    "d": "daemon warm, .kmod_btfs",
    "e": "daemon, standby hit",
}
#: The order of one repetition's samples, turned by one each repetition: (a)-(e), then
#: (f), the bare lane (bench/hit_floor.py), (e)'s reference measured among them.
ROTATION = "abcdef"
#: Rest after the daemon was stopped for the lane's hit (:meth:`Daemon.stopped`), s.
SETTLE_S = 0.5
#: Rest between the daemon found idle and each (c)-(e) hint, s: as long as the lane's
#: before its own (``hit_floor.Lane``'s ``pause_s``).
REST_S = 0.5
FLAT_TARGET = 0.05
HALF_TARGET = 0.5
GAP_TARGET = 0.2
#: The report's line on when each (c)-(e) hint is sent (runs with ``hint_when: idle``).
IDLE_NOTE = (
    "Each (c)-(e) hint is sent once the daemon's status says `idle` (no reconcile pass, nor "
    "the standby refill after it, running or kicked, no direct switch, nothing queued on "
    "its worker; for (e) with `lat_standby` held), as a launcher's hint meets a daemon at "
    "rest, and, in runs from 2026-12-05 17:30 UTC on, half a second after that status, as "
    "long as the bare lane (f) rests before its own; runs before 2026-12-02 sent it as "
    "soon as the pool held `lat_standby`, while the round that refilled it could still run."
)
#: The report's line on the timed client (runs with ``hint_client: launcher_wire``).
HINT_CLIENT_NOTE = (
    "Each (c)-(e) hint is timed as a launcher sends it (`schedswitch-run`'s client, "
    "`launcher_wire`: the standard library's json, the reply's envelope checked), its reply "
    "line then validated whole by the protocol's pydantic models, untimed; runs before "
    "2026-12-03 15:00 UTC timed the pydantic client (`DaemonClient`: the request's encode "
    "and the reply's validation, ~1 ms of (e) under TCG, in the time)."
)
#: (e) beyond its gap at most this much over the bare lane beyond its own (ms, medians).
STANDBY_OVER_LANE_MS = 1.0
STANDBY_VS_LIBBPF_TARGET = 0.10
RSS_TARGET_MIB = 48.0
BTF_ROOT = Path("/sys/kernel/btf")


# --- helpers of the VM-side processes ---------------------------------------------------------


# The benchmarked daemon's work directory (its configuration among it), inside the VM.
SCRATCH = Path(tempfile.gettempdir()) / "ssd-bench"


def _now_ns() -> int:
    return time.monotonic_ns()


def _rss_kib() -> int:
    """VmRSS of this process in KiB."""
    return rss_kib()["rss_kib"]


def _module_count() -> int:
    return sum(1 for n in os.listdir(BTF_ROOT) if n != "vmlinux")


# --- (b): one cold load in a fresh process ---------------------------------------------------


def cold_main(obj_path: str, ops: str) -> int:
    """Load + attach ``obj_path`` with a new registry, print one JSON line when ``enabled``,
    then wait for stdin to close and detach."""
    t_main = _now_ns()
    from schedswitchd.bpf.object import open_object
    from schedswitchd.kernel.btf.registry import KernelBtfRegistry
    from schedswitchd.kernel.loader import load_object
    from schedswitchd.kernel.syscall import STATS

    t_imported = _now_ns()
    STATS.reset()
    spec = open_object(obj_path)
    registry = KernelBtfRegistry()
    targets = registry.targets(spec.kmod_btfs)
    obj = load_object(spec, targets, open_btf_object=registry.open_btf_object)
    obj.attach_struct_ops()
    t_enabled = _wait("enabled", ops)
    print(
        json.dumps(
            {
                "main_ns": t_main,
                "imported_ns": t_imported,
                "enabled_ns": t_enabled,
                "syscall_ns": STATS.total_ns,
                "syscalls": STATS.calls,
                "modules_read": targets.report.modules_read,
                "rss_kib": _rss_kib(),
            }
        ),
        flush=True,
    )
    sys.stdin.read()
    obj.close()
    return 0


def profile_main(config_path: str, out_dir: str) -> int:
    """cProfile of warm switches ss_fifo -> ss_latency (without/with ``.kmod_btfs``) through
    the daemon's own :class:`Switcher` and :class:`KernelBackend`; writes
    ``switch_profile_{c,d}.txt`` (3 switches each, after one warm-up each)."""
    import cProfile
    import io
    import pstats

    from schedswitchd.daemon.config import load_config
    from schedswitchd.daemon.kernel_backend import create_backend
    from schedswitchd.daemon.switcher import Switcher

    config = load_config(config_path)
    switcher = Switcher(create_backend(config), timeout_s=30.0, history_size=16)
    fifo = config.schedulers["fifo"]
    targets = {"c": "lat_nokmod", "d": "lat_kmod"}
    profiles = {k: cProfile.Profile() for k in targets}
    try:
        for rep in range(4):
            for col, name in targets.items():
                switcher.switch_to("fifo", fifo, "bench")
                if rep:
                    profiles[col].enable()
                record = switcher.switch_to(name, config.schedulers[name], "bench")
                profiles[col].disable()
                if record is None or not record.ok:
                    raise RuntimeError(f"profiled switch to {name} failed: {record}")
    finally:
        switcher.switch_to("kernel", None, "bench")
    for col, prof in profiles.items():
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(25)
        # Paths relative to the checkout and the standard library: their absolute places are
        # the machine's, not the result's.
        stdlib = os.path.dirname(os.__file__)
        text = buf.getvalue().replace(f"{REPO}/", "").replace(f"{stdlib}/", "<stdlib>/")
        Path(out_dir, f"switch_profile_{col}.txt").write_text(text)
    return 0


def hint_profile_main(config_path: str, out_dir: str, reps: int) -> int:
    """The standby hit's whole path in one process: the daemon's own ``Server`` and
    ``Reconciler`` over the real backend on an event loop in this thread, a client in
    another. Writes ``switch_profile_e.txt``: per hint (``lat_standby`` held by an intent,
    from ``ss_fifo``) a timeline of marks (entry ``<`` / exit ``>`` of the functions on the
    path, by thread), the median of each mark over ``reps`` unprofiled hints, then cProfile
    of ``reps`` more hints on the event loop's thread until the reply was written, on the
    worker's until the kernel ran the new scheduler, and on the client's."""
    import asyncio
    import cProfile
    import gc
    import io
    import pstats
    import threading

    from schedswitchd.daemon import acceptor as acceptor_mod
    from schedswitchd.daemon import connection as connection_mod
    from schedswitchd.daemon import direct_switch as direct_switch_mod
    from schedswitchd.daemon import launcher_wire
    from schedswitchd.daemon import protocol as proto
    from schedswitchd.daemon import reconcile as reconcile_mod
    from schedswitchd.daemon import server as server_mod
    from schedswitchd.daemon import standby as standby_mod
    from schedswitchd.daemon import switcher as switcher_mod
    from schedswitchd.daemon.client import DaemonClient
    from schedswitchd.daemon.config import load_config
    from schedswitchd.daemon.kernel_attach import Attacher
    from schedswitchd.daemon.kernel_backend import KernelBackend, create_backend
    from schedswitchd.daemon.launcher_wire import LauncherConnection
    from schedswitchd.daemon.service import own_socket, setup_logging
    from schedswitchd.kernel.sched_ext import rcu_expedite

    config = load_config(config_path)
    setup_logging(config)
    marks: list[tuple[str, str, int]] = []

    def mark(label: str) -> None:
        marks.append((label, threading.current_thread().name, time.monotonic_ns()))

    def wrap(owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is None:
            return
        if asyncio.iscoroutinefunction(fn):

            async def awrapped(*a: Any, **k: Any) -> Any:
                mark(label + " <")
                try:
                    return await fn(*a, **k)
                finally:
                    mark(label + " >")

            setattr(owner, attr, awrapped)
        else:

            def wrapped(*a: Any, **k: Any) -> Any:
                mark(label + " <")
                try:
                    return fn(*a, **k)
                finally:
                    mark(label + " >")

            setattr(owner, attr, wrapped)

    Server, Reconciler = server_mod.Server, reconcile_mod.Reconciler
    Acceptor = acceptor_mod.Acceptor
    DirectSwitch = direct_switch_mod.DirectSwitch
    Connection = connection_mod.Connection
    for owner, attr in [
        (Acceptor, "_accept_ready"), (Acceptor, "_accepted"),
        (Server, "dispatch"), (Server, "_hint"), (Server, "_send_bytes"),
        (gc, "collect"),
        (Connection, "connection_made"), (Connection, "data_received"),
        (Connection, "_serve"), (Connection, "_send"),
        (proto, "parse_request"), (proto, "encode"), (proto, "parse_reply"),
        (launcher_wire, "dumps"), (launcher_wire, "check_reply"),
        (Reconciler, "reconcile_once"), (Reconciler, "_enabled"), (Reconciler, "reply_sent"),
        (DirectSwitch, "switch"), (DirectSwitch, "standby_hit"),
        (DirectSwitch, "_done"), (DirectSwitch, "replies_taken"),
        (DirectSwitch, "_release_held"), (Reconciler, "hit_finished"),
        (switcher_mod.Switcher, "begin_standby"), (switcher_mod.PendingSwitch, "finish"),
        (switcher_mod.Switcher, "check_ejected"), (switcher_mod.Switcher, "switch_to"),
        (switcher_mod.Switcher, "_settle_in"), (switcher_mod.Switcher, "_record"),
        (standby_mod.StandbyPool, "take"), (KernelBackend, "fresh"),
        (KernelBackend, "detach"), (KernelBackend, "attach"),
        (Attacher, "_confirm_enabled"), (Attacher, "_confirmed_by_exit_record"),
        (KernelBackend, "pin"),
        (KernelBackend, "discard"), (KernelBackend, "kernel_state"),
        (rcu_expedite.RcuExpediter, "_read"), (rcu_expedite.RcuExpediter, "_write"),
    ]:  # fmt: skip
        wrap(owner, attr, f"{getattr(owner, '__name__', '?')}.{attr}")
    profiles = {k: cProfile.Profile() for k in ("loop", "worker", "client")}
    profiling = threading.Event()
    orig_on_enabled = Reconciler._on_enabled
    orig_reply_sent = Reconciler.reply_sent

    def on_enabled(self: Any, record: Any) -> None:
        if profiling.is_set():
            profiles["worker"].disable()
        orig_on_enabled(self, record)

    def reply_sent(self: Any) -> None:
        if profiling.is_set():
            profiles["loop"].disable()
        orig_reply_sent(self)

    Reconciler._on_enabled = on_enabled  # type: ignore[method-assign]
    Reconciler.reply_sent = reply_sent  # type: ignore[method-assign]
    sock_path = str(SCRATCH / "profile.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)
    timelines: list[list[tuple[str, str, float]]] = []
    totals: list[float] = []

    async def _enable_on_loop() -> None:
        profiles["loop"].enable()  # stays on for this thread after the task ends

    async def run() -> None:
        loop = asyncio.get_running_loop()
        reconciler = Reconciler(config, create_backend(config))
        server = Server(reconciler)
        await server.start(own_socket(sock_path, 0o600, None))

        def client() -> None:
            _wait("enabled", BASE_OPS, timeout_s=300)
            for rep in range(2 * reps + 1):  # one warm-up, reps timed, reps profiled
                with DaemonClient(sock_path, timeout_s=120) as c:
                    c.request(proto.PrepareRequest(workload=HINTS["e"], ttl_s=3600))
                # As the timed hints do (Daemon.wait_idle): until the pool holds it and
                # the daemon is idle, the round that refilled it over.
                with DaemonClient(sock_path, timeout_s=120) as poll:
                    while True:
                        st = getattr(poll.request(proto.StatusRequest()), "status")  # noqa: B009
                        if st.idle and any(e.scheduler == "lat_standby" for e in st.standby):
                            break
                        time.sleep(0.2)
                profiled = rep > reps
                if profiled:
                    profiling.set()
                    reconciler.worker.submit(profiles["worker"].enable).result()
                    on_loop = asyncio.run_coroutine_threadsafe(_enable_on_loop(), loop)
                    on_loop.result()
                    profiles["client"].enable()
                launcher = LauncherConnection(sock_path, timeout_s=120)  # as the timed hints
                marks.clear()
                t0 = time.monotonic_ns()
                mark("client.request <")
                _, line = launcher.exchange_line({"op": "hint", "workload": HINTS["e"]})
                mark("client.request >")
                t1 = time.monotonic_ns()
                if profiled:
                    profiles["client"].disable()
                time.sleep(2.0)  # the work after the reply, still marked
                profiling.clear()
                reply = proto.parse_reply(line)
                record = getattr(reply, "switch", None)
                if record is None or not record.standby:
                    raise RuntimeError(f"profiled hint was no standby hit: {reply!r}")
                if 0 < rep <= reps:
                    timelines.append([(lab, th, (t - t0) / 1e6) for lab, th, t in marks])
                    totals.append((t1 - t0) / 1e6)
                launcher.close()
                _wait("enabled", BASE_OPS, timeout_s=300)

        try:
            await asyncio.to_thread(client)
        finally:
            await server.close()

    asyncio.run(run())
    lines = [
        f"Standby hit ss_fifo -> ss_latency, {reps} hints timed, {reps} profiled; "
        f"hint to reply (client) median {statistics.median(totals):.1f} ms "
        f"({', '.join(f'{t:.1f}' for t in totals)})",
        "Each hint sent once status said `idle` with lat_standby held (as the timed ones).",
        "",
        "Median offset of each mark from the client's send, ms (first occurrence per hint):",
    ]
    firsts: dict[tuple[str, str], list[float]] = {}
    order: list[tuple[str, str]] = []
    for tl in timelines:
        seen: set[tuple[str, str]] = set()
        for lab, th, ms in tl:
            if (lab, th) in seen:
                continue
            seen.add((lab, th))
            if (lab, th) not in firsts:
                order.append((lab, th))
            firsts.setdefault((lab, th), []).append(ms)
    order.sort(key=lambda k: statistics.median(firsts[k]))
    for key in order:
        lines.append(f"  {statistics.median(firsts[key]):9.1f}  {key[0]:<36} [{key[1]}]")
    lines += ["", "Every mark of the last timed hint, ms:"]
    lines += [f"  {ms:9.1f}  {lab:<36} [{th}]" for lab, th, ms in timelines[-1]]
    stdlib = os.path.dirname(os.__file__)
    for name, prof in profiles.items():
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(30)
        text = buf.getvalue().replace(f"{REPO}/", "").replace(f"{stdlib}/", "<stdlib>/")
        lines += ["", f"=== cProfile, {name} thread ===", text]
    Path(out_dir, "switch_profile_e.txt").write_text("\n".join(lines) + "\n")
    return 0


# --- the driver inside the VM ----------------------------------------------------------------


def _insmod_until(
    modules: list[tuple[str, str]], target: int, log: IO[str], until: str | None = None
) -> None:
    """insmod from ``modules`` (name, path; dependency order) until ``target`` module BTFs
    are present (or module ``until`` is loaded) or the list runs out."""

    def more() -> bool:
        if until is not None:
            return not (Path("/sys/module") / until).exists()
        return _module_count() < target

    while more() and modules:
        name, path = modules.pop(0)
        if (Path("/sys/module") / name).exists():
            continue
        proc = subprocess.run(["insmod", path], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            log.write(f"insmod failed: {name}: {proc.stderr.strip()}\n")


DAEMON_CONFIG = """
default = "fifo"
[socket]
path = "{sock}"
[logging]
level = "warning"
journal = "no"
[btf_cache]
max_entries = 16
max_bytes = 67108864
[schedulers.fifo]
object = "{sched}/fifo.bpf.o"
[schedulers.lat_nokmod]
object = "{sched}/latency.nokmod.bpf.o"
[schedulers.lat_kmod]
object = "{sched}/latency.bpf.o"
[schedulers.lat_standby]
object = "{sched}/latency.bpf.o"
[standby]
max = 1
recent = false
[hints.bench-c]
scheduler = "lat_nokmod"
priority = 50
[hints.bench-d]
scheduler = "lat_kmod"
priority = 50
[hints.bench-e]
scheduler = "lat_standby"
priority = 50
"""
HINTS = {"c": "bench-c", "d": "bench-d", "e": "bench-e"}


class Daemon:
    """The real daemon (``schedswitchd``), started with a bench configuration: ss_fifo is
    the default; hint ``bench-c``/``bench-d`` wants ss_latency without/with ``.kmod_btfs``.
    ``park()`` makes it run nothing (admin ``stop``) so bpftool and the cold loader can
    attach; ``hint(col)`` times one hint from send to reply (the daemon replies once the
    kernel reads ``enabled``), then ends the lease (back to ss_fifo)."""

    def __init__(self, work: Path, profile: Path | None = None) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.sock = str(work / "sock")
        cfg = work / "config.toml"
        cfg.write_text(DAEMON_CONFIG.format(sock=self.sock, sched=SCHED_DIR))
        argv = [sys.executable]
        if profile is not None:
            argv += ["-m", "cProfile", "-o", str(profile)]
        argv += ["-m", "schedswitchd.daemon.service", "--config", str(cfg)]
        self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while not Path(self.sock).exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not start (status {self.proc.poll()})")
            time.sleep(0.05)
        from schedswitchd.daemon import protocol as proto
        from schedswitchd.daemon.client import DaemonClient
        from schedswitchd.daemon.launcher_wire import LauncherConnection

        self.proto = proto
        self.client_cls = DaemonClient  # set-up, status and the final record: not timed
        self.launcher_cls = LauncherConnection  # the timed hints
        self.unpark()

    def _admin(self, request: Any) -> Any:
        # A connection per request: the daemon closes idle ones (idle_timeout_s), and
        # inserting 200 modules under TCG takes longer than that.
        with self.client_cls(self.sock, timeout_s=120) as client:
            return client.request(request)

    def _status(self) -> Any:
        return self._admin(self.proto.StatusRequest()).status

    def park(self) -> None:
        self._admin(self.proto.StopRequest())
        _wait("disabled")

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        """The daemon's process stopped (``SIGSTOP``) inside the block, once it is idle
        (:meth:`wait_idle`: no switch's tail, such as its RCU window, left open): no thread
        of it runs (the sysfs check of its watch, its uevent listener), as if it were not
        there. Continued, it is given :data:`SETTLE_S` and then waited for until idle
        again."""
        self.wait_idle()
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)
        # Then the daemon reads what it missed (the uevents of the block's switches: a
        # pass), and the kernel frees what those switches left (struct_ops maps after an
        # RCU-tasks grace period), before the next sample.
        time.sleep(SETTLE_S)
        self.wait_idle()

    def unpark(self) -> None:
        self._admin(self.proto.SwitchRequest(scheduler="auto"))
        _wait("enabled", BASE_OPS, timeout_s=300)

    def rss_kib(self) -> dict[str, int]:
        """The daemon's ``VmRSS`` and its parts in KiB (:func:`vm_bench.rss_kib`)."""
        return rss_kib(self.proc.pid)

    def hold_standby(self) -> Any:
        """(e)'s set-up, not timed: the intent (``prepare``) for ``bench-e``, then until the
        daemon's worker holds ``lat_standby`` prepared again (it refills the pool after a
        release, in the background) and the daemon is idle; returns that status."""
        self._admin(self.proto.PrepareRequest(workload=HINTS["e"], ttl_s=3600))
        return self.wait_idle(standby="lat_standby")

    def wait_idle(self, standby: str | None = None, timeout_s: float = 300.0) -> Any:
        """Until status says the daemon is ``idle`` (no reconcile pass, nor its standby
        refill, running or kicked, no direct switch, nothing queued on its worker) and its
        pool holds the scheduler ``standby`` names, if given: a launcher's hint meets the daemon
        at rest, not in the tail of the round that refilled the pool (its pin, its log
        line, its heap trim), and no sample shares the emulated CPUs with the work the one
        before left behind. Polled every 0.2 s on one connection (each ``status`` costs the
        daemon CPU time under TCG too), closed before this returns the idle
        status (its counters are the sample's "before": no request between it and the
        hint)."""
        deadline = time.monotonic() + timeout_s
        with self.client_cls(self.sock, timeout_s=120) as client:
            while True:
                st: Any = getattr(client.request(self.proto.StatusRequest()), "status")  # noqa: B009
                held = standby is None or any(e.scheduler == standby for e in st.standby)
                if st.idle and held:
                    return st
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"daemon not idle with {standby or 'nothing'} held in {timeout_s} s "
                        f"(idle {st.idle}, standby {[e.scheduler for e in st.standby]})"
                    )
                time.sleep(0.2)

    def hint(self, col: str) -> dict[str, Any]:
        before = (self.hold_standby() if col == "e" else self.wait_idle()).counters
        # At rest, as the lane's server is before its hint (bench/hit_floor.py): not right
        # after answering the status that found it idle.
        time.sleep(REST_S)
        # Timed as a launcher hints (schedswitch-run: launcher_wire, no pydantic; see
        # HINT_CLIENT); the same reply line is then validated whole, untimed.
        client = self.launcher_cls(self.sock, timeout_s=120)
        t0_wall = time.time()
        t0 = _now_ns()
        _, line = client.exchange_line({"op": "hint", "workload": HINTS[col]})
        t1 = _now_ns()
        reply = self.proto.parse_reply(line)
        if not isinstance(reply, self.proto.HintReply):
            raise RuntimeError(f"hint {HINTS[col]}: not a hint reply: {line!r}")
        st, ops = _scx()
        told = getattr(reply, "switch", None)
        # The reply is sent once the kernel runs the scheduler; the daemon then pins it and
        # frees the old one: the record's final form (and "total") is in status after that.
        # Status from here on over the hint's own connection (it holds the lease): no
        # connection accepted after the hint's, so the accept counters' change is its own.
        sw = self._final_record(told.seq, client) if told is not None else None
        after = self._status_via(client).counters
        rss = self.rss_kib()
        client.close()  # ends the lease: back to ss_fifo (not timed)
        if (st, ops) != ("enabled", NEW_OPS) or sw is None or sw.result != "ok":
            raise RuntimeError(f"hint {HINTS[col]}: kernel {st} {ops}, reply {reply!r}, {sw!r}")
        if sw.standby != (col == "e"):
            raise RuntimeError(f"hint {HINTS[col]}: standby {sw.standby} in {reply!r}")
        _wait("enabled", BASE_OPS, timeout_s=300)
        if col == "e":
            # lat_standby prepared again before the next sample, of any column, begins.
            self.wait_idle(standby="lat_standby")
        ph = sw.phases_ns
        return {
            "total_ns": t1 - t0,
            "daemon_total_ns": ph.get("total", 0),
            # the reply's record was live: sent before the switch's pin phase
            "replied_before_finish": told is not None and not told.finished,
            "phases_ns": dict(ph),
            "gap_ns": sw.gap_ns or 0,
            "expedited": sw.expedited,  # RCU expedited for the switch ([switch] expedite_rcu)
            # the gap's kernel parts: BPF_LINK_DETACH (close on old kernels), BPF_LINK_CREATE
            "gap_disable_ns": ph.get("detach.link_detach", ph.get("detach.link_close", 0)),
            "gap_enable_ns": ph.get("attach.link", 0),
            "syscall_ns": after.get("bpf_syscall_ns", 0) - before.get("bpf_syscall_ns", 0),
            "modules_read": after.get("module_btfs_read", 0) - before.get("module_btfs_read", 0),
            "module_set_check_ns": after.get("module_set_check_ns", 0)
            - before.get("module_set_check_ns", 0),
            # from the send to the switch's record (its wall-clock start, after the pool's
            # take): the request's way in; the rest of "outside" is the reply's way out
            "before_switch_ns": int((sw.time - t0_wall) * 1e9),
            # 1: the hint's line was there when the daemon accepted the connection (read
            # and answered in the accept's loop step); 0: read by the transport later
            "first_read_at_accept": after.get("first_read_at_accept", 0)
            - before.get("first_read_at_accept", 0),
            **rss,
        }

    def _status_via(self, conn: Any) -> Any:
        """``status`` over ``conn`` (a :class:`LauncherConnection`), as the model."""
        _, line = conn.exchange_line({"op": "status"})
        reply: Any = self.proto.parse_reply(line)
        return reply.status

    def _final_record(self, seq: int, conn: Any, timeout_s: float = 120.0) -> Any:
        """Switch record ``seq`` once the daemon finished it (status' ``last_switch``, asked
        over ``conn``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            last = self._status_via(conn).last_switch
            if last is not None and last.seq == seq and last.finished:
                return last
            if (last is not None and last.seq > seq) or time.monotonic() > deadline:
                raise RuntimeError(f"switch {seq} not finished; last {last!r}")
            time.sleep(0.05)

    def close(self) -> None:
        """Back to the kernel's scheduler (the daemon leaves a pinned scheduler running
        across its own restarts), then stop the daemon."""
        try:
            self.park()
        finally:
            self.proc.terminate()
        self.proc.wait(timeout=120)
        _wait("disabled", timeout_s=60)


def measure_a() -> dict[str, Any]:
    t0 = _now_ns()
    proc = subprocess.run(
        ["bpftool", "struct_ops", "register", str(SCHED_DIR / OBJECTS["a"])],
        capture_output=True,
        text=True,
        check=False,
    )
    t1 = _now_ns()
    state, ops = _scx()
    if proc.returncode != 0 or (state, ops) != ("enabled", NEW_OPS):
        raise RuntimeError(f"bpftool register: {proc.returncode} {state} {ops} {proc.stderr}")
    # By id ("Registered sched_ext_ops ss_latency id N"), not by name: the daemon's standby
    # of (e) holds another, unregistered struct_ops map of that name, and bpftool refuses a
    # name that matches several.
    words = (proc.stdout + proc.stderr).split()  # bpftool 7.1 says it on stderr
    if "id" not in words:
        raise RuntimeError(f"bpftool register printed no id: {proc.stderr!r}")
    map_id = words[words.index("id") + 1]
    subprocess.run(
        ["bpftool", "struct_ops", "unregister", "id", map_id], capture_output=True, check=True
    )
    _wait("disabled")
    return {"total_ns": t1 - t0, "gap_ns": t1 - t0}


def measure_b(py: str) -> dict[str, Any]:
    t0 = _now_ns()
    proc = subprocess.Popen(
        [py, __file__, "_cold", str(SCHED_DIR / OBJECTS["b"]), NEW_OPS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    proc.stdin.close()
    if proc.wait(timeout=60) != 0 or not line:
        raise RuntimeError(f"cold load failed (status {proc.returncode})")
    got = json.loads(line)
    _wait("disabled")
    total = got["enabled_ns"] - t0
    return {
        "total_ns": total,
        "gap_ns": total,
        "startup_ns": got["imported_ns"] - t0,
        "syscall_ns": got["syscall_ns"],
        "modules_read": got["modules_read"],
        "rss_kib": got["rss_kib"],
    }


def measured(col: str, rep: int, *, reps: int, cold_reps: int, hit_reps: int) -> bool:
    """Whether column ``col`` (``a``-``f``) is measured in repetition ``rep`` (from 0) of a
    step: (b) in its first ``cold_reps``, (e) and (f) in their first ``hit_reps`` (at least
    ``reps``), the others in their first ``reps``."""
    if col == "b":
        return rep < cold_reps
    if col in "ef":
        return rep < max(reps, hit_reps)
    return rep < reps


def hit_reps_at(target: int, counts: list[int], reps: int, hit_reps: int) -> int:
    """How many hits of (e) and of the lane (f) the step of ``target`` modules takes: more
    than ``reps`` only at the largest of ``counts``, where the target is judged, and none
    past ``reps`` in a profiling run (``reps`` 0)."""
    if reps and target == max(counts):
        return max(reps, hit_reps)
    return reps


def deal_lane(hits: list[dict[str, Any]], steps: list[dict[str, Any]]) -> None:
    """Give each step its ``lane``: the next ``hit_reps`` of the lane's ``hits``, in the
    order its server kept them (all steps' in one list, the first step's first)."""
    for step in steps:
        step["lane"], hits = hits[: step["hit_reps"]], hits[step["hit_reps"] :]


def vm_main(args: argparse.Namespace) -> int:
    """Inside the VM: insmod step by step, measure a-d at each step, write JSON results."""
    py = sys.executable
    out_dir = Path(args.results)
    log = (out_dir / "switch_latency.log").open("w", buffering=1)
    lines = Path(args.modules).read_text().splitlines()
    modules_left = [(n, p) for n, p in (line.split(maxsplit=1) for line in lines)]
    results: dict[str, Any] = {"steps": [], "cpus": os.cpu_count()}
    # uinput first (it heads the list): every step needs the declared module.
    _insmod_until(modules_left, 0, log, until=DECLARED_MODULE)
    t_start = time.monotonic()
    daemon = Daemon(SCRATCH)
    log.write(f"daemon up in {time.monotonic() - t_start:.1f}s\n")
    parked = False
    # (e)'s reference (bench/hit_floor.py): the bare lane, a sixth column of the rotation,
    # measured with the daemon parked and stopped.
    import hit_floor

    try:
        with hit_floor.Lane(SCHED_DIR) as lane:
            for target in args.counts:
                hit_reps = hit_reps_at(target, args.counts, args.reps, args.hit_reps)
                t_ins = time.monotonic()
                _insmod_until(modules_left, target, log)
                count = _module_count()
                log.write(f"step {target}: {count} module BTFs ({time.monotonic() - t_ins:.1f}s)\n")
                if not (Path("/sys/module") / DECLARED_MODULE).exists():
                    raise RuntimeError(f"{DECLARED_MODULE} is not loaded")
                if parked:
                    daemon.unpark()
                    parked = False
                for col in "cde":  # warm-up (not recorded): the daemon meets the new module set
                    daemon.hint(col)
                samples: dict[str, list[dict[str, Any]]] = {k: [] for k in OBJECTS}
                # Past --reps, only (e) and (f) go on (--hit-reps): the target compares
                # their medians, and their difference needs more hits than the other
                # columns' figures to settle (docs/performance.md, "Standby hit").
                for rep in range(max(args.reps, args.cold_reps, hit_reps)):
                    order = ROTATION[rep % len(ROTATION) :] + ROTATION[: rep % len(ROTATION)]
                    for col in order:
                        runs = measured(
                            col, rep, reps=args.reps, cold_reps=args.cold_reps, hit_reps=hit_reps
                        )
                        if not runs and rep >= args.reps:
                            continue  # past --reps, no park or unpark for a column not run
                        if col in "abf" and not parked:
                            daemon.park()
                            parked = True
                        elif col in "cde" and parked:
                            daemon.unpark()
                            parked = False
                        if not runs:
                            continue
                        if col == "a":
                            samples["a"].append(measure_a())
                        elif col == "b":
                            samples["b"].append(measure_b(py))
                        elif col in "cde":
                            samples[col].append(daemon.hint(col))
                        else:
                            with daemon.stopped():
                                lane.hit()
                    log.write(f"step {target} rep {rep} done ({time.monotonic() - t_ins:.0f}s)\n")
                results["steps"].append(
                    {"target": target, "modules": count, "samples": samples, "hit_reps": hit_reps}
                )
                (out_dir / "switch_latency.raw.json").write_text(json.dumps(results))
            deal_lane(lane.results(), results["steps"])
            (out_dir / "switch_latency.raw.json").write_text(json.dumps(results))
    finally:
        daemon.close()
    if args.reps:
        # (e)'s reference in this boot: what the bare exchange costs (bench/socket_floor.py)
        import socket_floor

        t_floor = time.monotonic()
        results["floor_ns"] = socket_floor.measure(args.reps)
        (out_dir / "switch_latency.raw.json").write_text(json.dumps(results))
        log.write(f"socket floor done ({time.monotonic() - t_floor:.0f}s)\n")
    if args.profile:
        # The warm switch path under cProfile, in-process (the daemon runs switches in a
        # worker thread, which a whole-process profile does not see): the daemon's
        # Switcher + KernelBackend with the same configuration, at the largest count.
        t_prof = time.monotonic()
        subprocess.run(
            [py, __file__, "_profile", str(SCRATCH / "config.toml"), str(out_dir)], check=True
        )
        log.write(f"profile done ({time.monotonic() - t_prof:.0f}s)\n")
    if args.hint_profile:
        # The standby hit's whole path (request handling, the reconcile pass or the direct
        # path, the switch, the reply), in-process with the event loop's thread profiled.
        t_prof = time.monotonic()
        proc = subprocess.run(
            [py, __file__, "_hint_profile", str(SCRATCH / "config.toml"), str(out_dir),
             str(args.hint_profile)],
            check=False,
        )  # fmt: skip
        log.write(f"hint profile: status {proc.returncode} ({time.monotonic() - t_prof:.0f}s)\n")
    return 0


# --- the host side ---------------------------------------------------------------------------


def _ms(ns: float) -> float:
    return ns / 1e6


def summarize(samples: list[dict[str, Any]], key: str = "total_ns") -> dict[str, float]:
    """Median, quartiles, min and max of ``key`` over ``samples`` in ms."""
    vals = sorted(_ms(s[key]) for s in samples)
    q = statistics.quantiles(vals, n=4) if len(vals) > 1 else [vals[0]] * 3
    return {"median": statistics.median(vals), "p25": q[0], "p75": q[2], "min": vals[0],
            "max": vals[-1]}  # fmt: skip


def _share(samples: list[dict[str, Any]]) -> float | None:
    if not samples or "syscall_ns" not in samples[0]:
        return None
    return float(statistics.median(s["syscall_ns"] / s["total_ns"] for s in samples))


def _startup_share(raw: dict[str, Any]) -> str:
    vals = [x["startup_ns"] / x["total_ns"] for st in raw["steps"] for x in st["samples"]["b"]]
    return f"{statistics.median(vals) * 100:.0f}%" if vals else "-"


def _counts_note(meta: dict[str, str]) -> str:
    if "ramroot" not in meta:  # runs before the ramroot mode (their JSON, --from-json)
        return (
            "Module counts are module BTFs present (`/sys/kernel/btf` minus vmlinux), "
            "including the VM's four 9p modules."
        )
    return (
        "Module counts are module BTFs present (`/sys/kernel/btf` minus vmlinux); the VM runs "
        f"the bench from a tmpfs root with no 9p module loaded ({meta['ramroot']}), so the "
        "smallest step is `uinput` alone."
    )


def _rss_parts(parts: dict[str, float | None] | None) -> str:
    """`` (anon / file)`` in MiB; file includes shmem (tmpfs-backed files); ``""`` when the
    run did not record them."""
    if not parts or parts.get("anon") is None:
        return ""
    file = (parts.get("file") or 0.0) + (parts.get("shmem") or 0.0)
    return f" ({parts['anon']:.1f} / {file:.1f})"


def gap_composition(raw: dict[str, Any]) -> list[str]:
    """Markdown lines: per step, the median gap of (c)/(d) split into the kernel's disable
    (``BPF_LINK_DETACH``), the kernel's enable (``BPF_LINK_CREATE``) and ours (the rest),
    from the daemon's phase timings; nothing for runs recorded before they existed."""
    rows = []
    for step in raw["steps"]:
        cells = []
        for k in "cd":
            s = [x for x in step["samples"][k] if x.get("gap_enable_ns")]
            if not s:
                return []
            gap, dis, ena = (statistics.median(_ms(x[f]) for x in s)
                             for f in ("gap_ns", "gap_disable_ns", "gap_enable_ns"))  # fmt: skip
            ours = statistics.median(
                _ms(x["gap_ns"] - x["gap_disable_ns"] - x["gap_enable_ns"]) for x in s
            )
            cells.append((gap, dis, ena, ours))
        rows.append(
            f"| {step['modules']} | "
            + " | ".join(" / ".join(f"{c[i]:.0f}" for c in cells) for i in range(4))
            + " |"
        )
    return [
        "",
        "Gap composition, (c) / (d), median ms: the kernel disabling the old scheduler "
        "(`BPF_LINK_DETACH`), enabling the new one (`BPF_LINK_CREATE`, whose return ends the "
        "gap; the daemon confirms `state`/`root/ops` right after), and ours (the rest: "
        "Python between the two).",
        "",
        "| modules | gap | kernel disable | kernel enable | ours |",
        "|---:|---:|---:|---:|---:|",
        *rows,
    ]


def standby_composition(raw: dict[str, Any]) -> list[str]:
    """Markdown lines: per step, where the median (e) standby hit goes, from the daemon's
    phase timings: the pool's take (the freshness check), the gap, its detach and attach,
    the daemon's switch until the kernel ran the new scheduler (``until_enabled``: what
    the reply waits for), the rest of the hint-to-reply time outside the switch (client,
    socket, request handling, the direct path's ejection check up to the switch -- the
    reconcile pass before 2026-12-01 20:00 UTC --, the reply), and the
    daemon's work after the reply (pins, freeing the old scheduler, the RCU window's end);
    nothing for runs without (e). Runs from before the early reply (no ``until_enabled``)
    count the whole switch record as before the reply."""
    rows = []
    for step in raw["steps"]:
        s = step["samples"].get("e") or []
        if not s:
            return []

        def med(f: Any, s: list[dict[str, Any]] = s) -> float:
            return float(statistics.median(_ms(f(x)) for x in s))

        def until(x: dict[str, Any]) -> int:
            return int(x["phases_ns"].get("until_enabled", x["daemon_total_ns"]))

        take = med(lambda x: x["phases_ns"].get("standby", 0))
        gap = med(lambda x: x["gap_ns"])
        detach = med(lambda x: x["phases_ns"].get("detach", 0))
        attach = med(lambda x: x["phases_ns"].get("attach", 0))
        enabled = med(until)
        outside = med(lambda x: x["total_ns"] - until(x))
        after = med(lambda x: x["daemon_total_ns"] - until(x))
        total = med(lambda x: x["total_ns"])
        rows.append(
            f"| {step['modules']} | {total:.0f} | {take:.1f} | {gap:.0f} | {detach:.0f} "
            f"| {attach:.0f} | {enabled:.0f} | {outside:.0f} | {after:.0f} |"
        )
    return [
        "",
        "(e) composition, median ms: hint to reply; the pool's take (freshness check); the gap; "
        "the detach and attach phases (attach = `BPF_LINK_CREATE` + the one confirmation); "
        "the daemon's switch until the kernel ran the new scheduler (the reply is sent "
        "then); outside the switch (client, socket, request handling, the standby hit's "
        "direct path up to the switch: the ejection check, the reply); after the reply, "
        "not in the hint's time (pins, "
        "freeing the old scheduler, the RCU window's end).",
        "",
        "| modules | hint to reply | take | gap | detach | attach | switch until enabled "
        "| outside | daemon after the reply |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        *outside_split(raw),
        *floor_lines(raw),
        *hit_floor_lines(raw),
    ]


def floor_lines(raw: dict[str, Any]) -> list[str]:
    """Markdown lines: the socket floor of this boot (``floor_ns``, bench/socket_floor.py)
    beside what (e) costs over its gap at each step. Nothing for runs without the floor
    (before 2026-12-03 16:00 UTC)."""
    floor = raw.get("floor_ns")
    if not floor:
        return []
    lines = [
        "",
        f"Reference, same boot: a bare event-loop server's reply to the same client "
        f"(`bench/socket_floor.py`: its reader on the listening socket, accept, read, a canned "
        f"hint reply; no parse, policy, lease or switch), {len(floor)} exchanges: median "
        f"{_ms(statistics.median(floor)):.2f} ms (min {_ms(min(floor)):.2f}).",
        "",
    ]
    for step in raw["steps"]:
        e = step["samples"].get("e") or []
        if not e:
            continue
        over = statistics.median(_ms(x["total_ns"] - x["gap_ns"]) for x in e)
        lines.append(
            f"- {step['modules']} module{'s' if step['modules'] != 1 else ''}: (e) over "
            f"its gap {over:.1f} ms (median per hint), the floor "
            f"{_ms(statistics.median(floor)):.1f} of it."
        )
    return lines


#: The bare lane's parts (bench/hit_floor.py's names), as the page names them.
HIT_FLOOR_PARTS = {
    "in_ns": "send to its read",
    "checks_ns": "read, SO_PEERCRED, the take's check",
    "window_ns": "the window's opening (RCU)",
    "detach_ns": "detach",
    "link_ns": "BPF_LINK_CREATE",
    "confirm_ns": "confirmation",
    "send_ns": "the reply's send",
    "out_ns": "to the client's checked reply",
}


def lane_samples(raw: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """The bare lane's hits (bench/hit_floor.py) at the largest count and whether they were
    measured among (e)'s samples (the rotation's column (f): the step's ``lane``) or after
    the steps (``hit_floor``: runs before 2026-12-05 17:00 UTC). No hits for runs without
    a lane (before 2026-12-03 19:00 UTC)."""
    steps = raw.get("steps") or []
    lane = steps[-1].get("lane") if steps else None
    if lane:
        return lane, True
    return raw.get("hit_floor") or [], False


def hit_floor_lines(raw: dict[str, Any]) -> list[str]:
    """Markdown lines: the bare lane of this boot (:func:`lane_samples`) -- what a standby
    hit costs with nothing but the socket, the checks a hit must make, the window, detach,
    attach and a canned reply -- against its own gap, beside (e)'s at the largest step.
    Nothing for runs without it."""
    lane, among = lane_samples(raw)
    if not lane:
        return []
    total = statistics.median(_ms(x["total_ns"]) for x in lane)
    gaps = [_ms(x["gap_ns"]) for x in lane]
    gap = statistics.median(gaps)
    q1, _, q3 = statistics.quantiles(gaps, n=4) if len(gaps) > 1 else (gap, gap, gap)
    ratio = statistics.median(x["total_ns"] / x["gap_ns"] for x in lane)
    over = statistics.median(_ms(x["total_ns"] - x["gap_ns"]) for x in lane)
    parts = ", ".join(
        f"{name} {statistics.median(_ms(x[key]) for x in lane):.1f}"
        for key, name in HIT_FLOOR_PARTS.items()
    )
    when = (
        ", among (e)'s samples (column (f) of each repetition, the daemon stopped meanwhile)"
        if among
        else ", after the steps"
    )
    lines = [
        "",
        f"Reference, same boot{when}: the bare lane (`bench/hit_floor.py`: the same client; "
        f"a server with only what a standby hit must do -- read, `SO_PEERCRED`, the take's "
        f"freshness check, the switch window, `BPF_LINK_DETACH`, `BPF_LINK_CREATE` with its "
        f"confirmation, a canned reply -- around the real kernel backend, ss_fifo -> "
        f"ss_latency; no parse, policy, lease, record or reply model), {len(lane)} hits: "
        f"median {total:.1f} ms, gap {gap:.1f} ms (quartiles {q1:.1f}-{q3:.1f}), "
        f"**{ratio:.2f}x its gap** (median per hit), {over:.1f} ms over it. Its parts, "
        f"median ms: {parts}.",
    ]
    if all("at_accept" in x for x in lane):  # older runs' lanes did not record it
        lines[-1] += (
            f" Its line was there at the accept's read for {sum(x['at_accept'] for x in lane)} "
            f"of {len(lane)} hits (the others waited for a second wake-up)."
        )
    e = raw["steps"][-1]["samples"].get("e") if raw.get("steps") else None
    if e:
        e_ratio = statistics.median(x["total_ns"] / x["gap_ns"] for x in e)
        e_over = statistics.median(_ms(x["total_ns"] - x["gap_ns"]) for x in e)
        e_gap = statistics.median(_ms(x["gap_ns"]) for x in e)
        lines.append(
            f"- (e) at {raw['steps'][-1]['modules']} modules, the same statistics: "
            f"{e_ratio:.2f}x its gap (median per hit; gap {e_gap:.1f} ms), {e_over:.1f} ms "
            f"over it: the daemon adds {e_over - over:.1f} ms to the bare lane (target <= "
            f"{STANDBY_OVER_LANE_MS:g} ms)."
        )
        ci = lane_excess_interval(raw)
        if ci is not None:
            lines.append(
                f"- That difference of medians over {len(e)} and {len(lane)} hits: "
                f"{EXCESS_CONFIDENCE:.0%} bootstrap interval {ci[0]:+.2f} to {ci[1]:+.2f} ms "
                "(the hits of each side resampled, `scipy.stats.bootstrap`, percentile)."
            )
        rotation = len(raw["steps"][-1]["samples"].get("c") or [])
        if among and 0 < rotation < min(len(e), len(lane)):
            # Past the rotation (e) and the lane alternate alone: say both parts' figures,
            # so that a change of conditions between them shows.
            first, later = (
                statistics.median(_overs(e[:rotation]))
                - statistics.median(_overs(lane[:rotation])),
                statistics.median(_overs(e[rotation:]))
                - statistics.median(_overs(lane[rotation:])),
            )
            lines.append(
                f"- Over the first {rotation} hits of each, taken among the other columns: "
                f"{first:+.2f} ms; over the {len(e) - rotation} of (e) and "
                f"{len(lane) - rotation} of the lane after them, taken alone: {later:+.2f} ms."
            )
        split = lane_excess_parts(raw)
        if split is not None:
            way_in, switch, way_out, n_e, n_lane = split
            lines.append(
                f"- Where the daemon adds it, over the hits whose line was there at the "
                f"accept ({n_e} of (e), {n_lane} of the lane), differences of medians: the "
                f"way in (the client's send to the pool's take) {way_in:+.2f} ms, the switch "
                f"beyond its gap (from the take, the same on both sides, to the kernel "
                f"running the new scheduler) {switch:+.2f} ms, the way out (to the client's "
                f"checked reply) {way_out:+.2f} ms (medians: the parts need not add up to the "
                f"difference; the lane's check taken as long as (e)'s take)."
            )
    return lines


#: The confidence of :func:`lane_excess_interval`'s interval, a fraction (0.9: 90%).
EXCESS_CONFIDENCE = 0.9


def _overs(samples: list[dict[str, Any]]) -> list[float]:
    """Each hit's time beyond its own gap, ms."""
    return [_ms(x["total_ns"] - x["gap_ns"]) for x in samples]


def lane_excess_interval(raw: dict[str, Any]) -> tuple[float, float] | None:
    """The :data:`EXCESS_CONFIDENCE` interval of :func:`lane_excess_ms` (ms, low and high):
    the difference of the two medians, (e)'s hits and the lane's resampled independently
    (a percentile bootstrap, ``scipy.stats.bootstrap``, a fixed seed so that the same
    samples always give the same page): how far the verdict could move with another
    sample of hits like this boot's, since a boot's hits are a sample of what the daemon
    and the lane cost. ``None`` without a lane or (e) samples, or with fewer than two of
    either."""
    import numpy as np
    from scipy import stats

    lane, _ = lane_samples(raw)
    e = raw["steps"][-1]["samples"].get("e") if raw.get("steps") else None
    if not lane or not e or len(lane) < 2 or len(e) < 2:
        return None

    def excess(a: Any, b: Any, axis: int = -1) -> Any:
        return np.median(a, axis=axis) - np.median(b, axis=axis)

    res = stats.bootstrap(
        (np.array(_overs(e)), np.array(_overs(lane))),
        excess,
        vectorized=True,
        paired=False,
        confidence_level=EXCESS_CONFIDENCE,
        n_resamples=9999,
        method="percentile",
        random_state=np.random.default_rng(0),
    )
    ci = res.confidence_interval
    return float(ci.low), float(ci.high)


def lane_excess_parts(raw: dict[str, Any]) -> tuple[float, float, float, int, int] | None:
    """Where (e) at the largest count spends its time beyond the lane's, ms, over the hits
    of both whose line was there at the accept's read (the like with the like: a line
    that came later costs a second wake-up on either side): ``(way_in, switch, way_out,
    e_hits, lane_hits)``, each a difference of medians per hit. The way in runs from the
    client's send to the pool's take's start on (e)'s side (``before_switch_ns`` less the
    take) and to the lane's window on the lane's (``in_ns`` + ``checks_ns`` less the
    lane's take, taken as long as (e)'s, which also takes the pool's entry and starts the
    switch's record: what that costs beyond the lane's check counts in the way in); the
    switch from there to the kernel running the new scheduler, less the gap; the way out
    from there to the client's checked reply. Each side's three parts add up to its time
    beyond its gap hit by hit; their medians need not add up to the median's difference
    (:func:`lane_excess_ms`, over all hits). ``None`` without a lane that recorded its
    parts and ``at_accept``, or without such hits."""
    lane, _ = lane_samples(raw)
    steps = raw.get("steps") or []
    e = steps[-1]["samples"].get("e") if steps else None
    if not lane or not e or not all("at_accept" in x and "in_ns" in x for x in lane):
        return None
    e = [x for x in e if x.get("first_read_at_accept") and "before_switch_ns" in x]
    lane = [x for x in lane if x["at_accept"]]
    if not e or not lane:
        return None
    med = statistics.median
    take = med(x["phases_ns"].get("standby", 0) for x in e)
    e_in = med(x["before_switch_ns"] - x["phases_ns"].get("standby", 0) for x in e)
    e_switch = med(
        x["phases_ns"].get("until_enabled", x["daemon_total_ns"]) - x["gap_ns"] for x in e
    )
    e_out = med(
        x["total_ns"]
        - x["before_switch_ns"]
        - x["phases_ns"].get("until_enabled", x["daemon_total_ns"])
        + x["phases_ns"].get("standby", 0)
        for x in e
    )
    l_in = med(x["in_ns"] + x["checks_ns"] for x in lane) - take
    l_switch = (
        med(x["window_ns"] + x["detach_ns"] + x["link_ns"] + x["confirm_ns"] - x["gap_ns"]
            for x in lane)
        + take
    )  # fmt: skip
    l_out = med(x["send_ns"] + x["out_ns"] for x in lane)
    return (
        _ms(e_in - l_in),
        _ms(e_switch - l_switch),
        _ms(e_out - l_out),
        len(e),
        len(lane),
    )


def lane_excess_ms(raw: dict[str, Any]) -> float | None:
    """What (e) at the largest count costs beyond its gap minus what the bare lane costs
    beyond its own (ms; medians per hit over the samples of one boot): the daemon's own
    time on a standby hit above the least any implementation pays. ``None`` without a lane
    or (e) samples. The gaps are the kernel's (detach and attach), left out on both sides."""
    lane, _ = lane_samples(raw)
    e = raw["steps"][-1]["samples"].get("e") if raw.get("steps") else None
    if not lane or not e:
        return None
    return float(statistics.median(_overs(e)) - statistics.median(_overs(lane)))


def outside_split(raw: dict[str, Any]) -> list[str]:
    """Markdown lines: per step, (e)'s time outside the switch (its "outside") split at the
    switch's start: from the client's send to it (the request's way in: client, accept,
    read, parse, dispatch, the hit's checks; the record's wall-clock time, taken after the
    pool's take, minus the take) and from the kernel running the new scheduler to the
    client's reply (the way out); with how many hints' lines were there at the accept
    (answered in its loop step). Nothing for runs that did not record it (before
    2026-12-03)."""
    rows = []
    for step in raw["steps"]:
        s = [x for x in step["samples"].get("e") or [] if "before_switch_ns" in x]
        if not s:
            return []
        before = statistics.median(
            _ms(x["before_switch_ns"] - x["phases_ns"].get("standby", 0)) for x in s
        )
        after = statistics.median(
            _ms(
                x["total_ns"]
                - x["before_switch_ns"]
                - x["phases_ns"].get("until_enabled", x["daemon_total_ns"])
                + x["phases_ns"].get("standby", 0)
            )
            for x in s
        )
        at_accept = sum(1 for x in s if x.get("first_read_at_accept"))
        rows.append(f"| {step['modules']} | {before:.1f} | {after:.1f} | {at_accept} of {len(s)} |")
    return [
        "",
        "(e) outside the switch, median ms: from the client's send to the switch's start "
        "(the request's way in), and from the kernel running the new scheduler to the "
        "client's reply (the way out); hints whose line was there at the daemon's accept "
        "(read and answered in its loop step).",
        "",
        "| modules | send to the switch | enabled to the reply | line there at the accept |",
        "|---:|---:|---:|---:|",
        *rows,
    ]


def build_report(raw: dict[str, Any], meta: dict[str, str]) -> tuple[str, dict[str, Any], int]:
    """The markdown table, the summary and the exit status (0 all targets met, 2 not)."""
    summary: dict[str, Any] = {"meta": meta, "steps": []}
    for step in raw["steps"]:
        s = step["samples"]
        cols = {k: summarize(v) for k, v in s.items() if v}
        warm = [k for k in "cde" if s.get(k)]  # (e): runs from 2026-12 on
        gaps = {k: summarize(s[k], "gap_ns") for k in warm}
        shares = {k: _share(s[k]) for k in "bcd"}
        top = max((x for k in warm for x in s[k]), key=lambda x: x["rss_kib"])
        rss = top["rss_kib"] / 1024
        # Its parts in that sample (runs before RssAnon/RssFile were recorded: None).
        parts = {p: top[f"rss_{p}_kib"] / 1024 if f"rss_{p}_kib" in top else None
                 for p in ("anon", "file", "shmem")}  # fmt: skip
        reads = {k: statistics.median(x["modules_read"] for x in s[k]) for k in "bcd"}
        summary["steps"].append({"target": step["target"], "modules": step["modules"],
                                 "cols": cols, "gaps": gaps, "syscall_share": shares,
                                 "warm_rss_mib": rss, "warm_rss_parts_mib": parts,
                                 "modules_read": reads})  # fmt: skip
    has_e = all("e" in st["cols"] for st in summary["steps"])
    lines = [
        "| modules | (a) libbpf ms | (b) ours cold ms | (c) warm, no .kmod_btfs ms "
        "| (d) warm, .kmod_btfs ms | b/a | c/a | d/a | gap c / d ms | bpf() share b / c / d "
        "| warm RSS MiB (anon / file) |"
        + (" (e) standby hit ms | e/a | gap e ms | e / gap e |" if has_e else ""),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        + ("---:|---:|---:|---:|" if has_e else ""),
    ]
    for st in summary["steps"]:
        c, g, sh = st["cols"], st["gaps"], st["syscall_share"]
        a = c["a"]["median"]

        def cell(k: str, c: dict[str, dict[str, float]] = c) -> str:
            x = c[k]
            iqr = (x["p75"] - x["p25"]) / x["median"] * 100
            return f"{x['median']:.0f} ±{iqr / 2:.0f}%"

        share_txt = " / ".join(f"{sh[k] * 100:.0f}%" if sh[k] is not None else "-" for k in "bcd")
        lines.append(
            f"| {st['modules']} | {cell('a')} | {cell('b')} | {cell('c')} | {cell('d')} "
            f"| {c['b']['median'] / a:.2f} | {c['c']['median'] / a:.2f} "
            f"| {c['d']['median'] / a:.2f} "
            f"| {g['c']['median']:.0f} / {g['d']['median']:.0f} | {share_txt} "
            f"| {st['warm_rss_mib']:.1f}{_rss_parts(st.get('warm_rss_parts_mib'))} |"
            + (
                f" {cell('e')} | {c['e']['median'] / a:.2f} | {g['e']['median']:.0f} "
                f"| {c['e']['median'] / g['e']['median']:.2f} |"
                if has_e
                else ""
            )
        )
    lines += gap_composition(raw)
    lines += standby_composition(raw)
    first, last = summary["steps"][0], summary["steps"][-1]
    checks = []

    def flat(k: str) -> float:
        return float(last["cols"][k]["median"] / first["cols"][k]["median"] - 1)

    for k in "cd":
        f = flat(k)
        checks.append((f"({k}) flat within 5% from {first['modules']} to {last['modules']} "
                       f"modules: {f * 100:+.1f}%", abs(f) <= FLAT_TARGET))  # fmt: skip
    half = last["cols"]["d"]["median"] / last["cols"]["a"]["median"]
    checks.append((f"(d) at {last['modules']} = {half:.2f} x (a) (target <= 0.50)",
                   half <= HALF_TARGET))  # fmt: skip
    for k in "cd":
        worst = max(st["gaps"][k]["median"] / st["cols"][k]["median"] for st in summary["steps"])
        vs_a = max(st["gaps"][k]["median"] / st["cols"]["a"]["median"] for st in summary["steps"])
        checks.append((f"gap ({k}) at most {worst:.2f} of its own switch (target <= 0.20; "
                       f"at most {vs_a:.2f} of libbpf's switch (a))",
                       worst <= GAP_TARGET))  # fmt: skip
    if has_e:
        adds = lane_excess_ms(raw)
        if adds is not None:
            checks.append((f"(e) at {last['modules']} adds {adds:.1f} ms to the bare lane "
                           f"beyond the gaps (target <= {STANDBY_OVER_LANE_MS:g} ms)",
                           adds <= STANDBY_OVER_LANE_MS))  # fmt: skip
        e_a = last["cols"]["e"]["median"] / last["cols"]["a"]["median"]
        checks.append((f"(e) at {last['modules']} = {e_a:.2f} x (a) (target <= "
                       f"{STANDBY_VS_LIBBPF_TARGET:.2f})",
                       e_a <= STANDBY_VS_LIBBPF_TARGET))  # fmt: skip
    rss = max(st["warm_rss_mib"] for st in summary["steps"])
    checks.append((f"warm RSS max {rss:.1f} MiB (target <= 48; with (e), one standby held)",
                   rss <= RSS_TARGET_MIB))  # fmt: skip
    summary["checks"] = [{"what": w, "met": ok} for w, ok in checks]
    notes = [
        "",
        f"Medians of {meta['reps']} switches (± half the interquartile range, % of the median)"
        + (
            f"; of {meta['hit_reps']} for (e) and the lane at the largest count, the later "
            "ones without (a)-(d). "
            if meta.get("hit_reps", meta["reps"]) != meta["reps"]
            else ". "
        )
        + f"{meta['machine']}; {meta['date']}; host load average at start {meta['load']}.",
        _counts_note(meta),
        "(c)/(d): the daemon (`schedswitchd`, real kernel backend, ss_fifo running), from "
        "sending the hint on its socket to its reply, which it sends once the kernel reads "
        "`enabled`. Gap: the daemon's own record, from the old scheduler's detach starting to "
        "the return of `BPF_LINK_CREATE` for the new one (confirmed `enabled` right after; "
        "a/b cannot prepare while a scheduler runs: their gap is the whole switch). "
        "bpf() share: time inside our `bpf()` wrapper / whole switch. "
        f"(b): {meta['cold_reps']} runs per step; interpreter start-up and imports are "
        f"{meta['cold_startup_share']} of it."
        + (f" {IDLE_NOTE}" if meta.get("hint_when") == "idle" else "")
        + (f" {HINT_CLIENT_NOTE}" if meta.get("hint_client") == "launcher_wire" else ""),
        "",
        *(f"- {'met' if ok else 'MISSED'}: {w}" for w, ok in checks),
    ]
    return "\n".join(lines + notes) + "\n", summary, 0 if all(ok for _, ok in checks) else 2


def plot(summary: dict[str, Any], path: Path) -> None:
    """PNG at ``path``: left, median latency (quartile bars) of (a), (c), (d) and the
    daemon's no-scheduler gaps against module count; right, all four columns on a log
    scale (the cold process (b) is two orders of magnitude slower under TCG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = summary["steps"]
    xs = [st["modules"] for st in steps]
    fig, (ax, axl) = plt.subplots(
        1, 2, figsize=(11, 5), dpi=120, gridspec_kw={"width_ratios": [3, 2]}
    )
    styles = {"a": ("tab:red", "o"), "b": ("tab:gray", "s"), "c": ("tab:orange", "^"),
              "d": ("tab:green", "D"), "e": ("tab:blue", "v")}  # fmt: skip
    warm = "cde" if all("e" in st["cols"] for st in steps) else "cd"

    def series(axis: Any, k: str) -> None:
        med = [st["cols"][k]["median"] for st in steps]
        lo = [m - st["cols"][k]["p25"] for m, st in zip(med, steps, strict=True)]
        hi = [st["cols"][k]["p75"] - m for m, st in zip(med, steps, strict=True)]
        color, marker = styles[k]
        axis.errorbar(xs, med, yerr=[lo, hi], label=f"({k}) {COLUMNS[k]}", color=color,
                      marker=marker, capsize=3)  # fmt: skip

    for k in "a" + warm:
        series(ax, k)
    for k in warm:
        gap = [st["gaps"][k]["median"] for st in steps]
        ax.plot(xs, gap, linestyle=":", color=styles[k][0], marker=styles[k][1],
                label=f"({k}) no-scheduler gap")  # fmt: skip
    for k in "ab" + warm:
        series(axl, k)
    for axis in (ax, axl):
        axis.set_xscale("log")
        axis.minorticks_off()
        axis.set_xticks(xs)
        axis.set_xticklabels([str(x) for x in xs])
        axis.set_xlabel("module BTFs loaded")
        axis.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("ms (median, quartile bars)")
    ax.set_title("libbpf vs the warm daemon")
    ax.legend(fontsize=8, loc="best")
    axl.set_yscale("log")
    axl.set_title("all columns, log scale")
    axl.legend(fontsize=7, loc="center right")
    fig.suptitle(
        f"Switch to ss_latency (needs uinput's BTF), sched_ext VM "
        f"({summary['meta']['accel']}), {summary['meta']['date']}"
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_outputs(raw: dict[str, Any], meta: dict[str, str], out: Path) -> int:
    """Table, JSON and plot under ``out`` from the VM's raw samples; returns the status."""
    table, summary, status = build_report(raw, meta)
    (out / "switch_latency.md").write_text(table)
    (out / "switch_latency.json").write_text(json.dumps({"summary": summary, "raw": raw}, indent=1))
    plot(summary, out / "switch_latency.png")
    print(table)
    return status


def host_main(args: argparse.Namespace) -> int:
    if args.from_json:  # redo table and plot from an earlier run's samples
        saved = json.loads(Path(args.from_json).read_text())
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        return write_outputs(saved["raw"], saved["summary"]["meta"], out)
    from tools import vm
    from tools.ramroot import RamRootSpec

    kernel = host_prepare()
    if kernel is None:
        return 1
    counts = sorted({int(c) for c in args.counts.split(",")})
    order = vm.module_load_order(
        kernel, [DECLARED_MODULE, *vm.sample_modules(kernel, max(counts) + 60)]
    )
    paths = kernel.decompressed_paths()
    modules = "".join(f"{n} {paths[n]}\n" for n in order)
    load = load_text()
    t0 = time.monotonic()
    script = (
        f'"$PY" "$REPO/bench/switch_latency.py" _vm --counts {",".join(map(str, counts))} '
        f"--reps {args.reps} --cold-reps {args.cold_reps} --hit-reps {args.hit_reps} "
        f"{'' if args.no_profile else '--profile '}"
        f"--hint-profile {args.hint_profile} "
        '--modules "$RESULTS/modules.txt" --results "$RESULTS"\n'
    )
    result = vm.run_in_vm(
        script,
        kernel=kernel,
        timeout=args.timeout,
        inputs={"modules.txt": modules},
        memory_mib=2048,
        cpus=2,
        keep=args.keep,
        # A tmpfs root without 9p: no module BTF but the ones inserted, no exec over 9p.
        ramroot=RamRootSpec(extra_files=tuple(paths[n] for n in order)),
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = ["switch_latency.log", "switch_profile_c.txt", "switch_profile_d.txt"]
    for name in [*names, "switch_profile_e.txt"]:
        if name in result.files:
            (out / name).write_bytes(result.files[name])
    if result.returncode != 0 or "switch_latency.raw.json" not in result.files:
        print(f"VM run failed\n{result.tail(60)}", file=sys.stderr)
        return 1
    if args.reps == 0:  # a profiling run: no samples to report
        print(f"(VM run {time.monotonic() - t0:.0f} s; profiles in {out})")
        return 0
    raw = json.loads(result.text("switch_latency.raw.json"))
    rr = result.ramroot or {}
    meta = {
        "date": utc_now(),
        "machine": machine(result, kernel),
        "ramroot": f"{rr.get('tmpfs_kib', 0) / 1024:.0f} MiB tmpfs root, unpacked in "
        f"{rr.get('unpack_s', 0):.1f} s, {rr.get('mem_available_kib', 0) / 1024:.0f} MiB "
        "available after",
        "load": load,
        "reps": str(args.reps),
        "accel": result.accel,
        "cold_reps": str(args.cold_reps),
        "hit_reps": str(max(args.reps, args.hit_reps)),
        "cold_startup_share": _startup_share(raw),
        "vm_wall_s": f"{time.monotonic() - t0:.0f}",
        "hint_when": "idle",  # Daemon.wait_idle before every hint
        "hint_client": "launcher_wire",  # Daemon.hint times LauncherConnection.exchange_line
    }
    status = write_outputs(raw, meta, out)
    print(f"(VM run {meta['vm_wall_s']} s; results in {out})")
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    vmp = sub.add_parser("_vm")
    vmp.add_argument("--counts", type=lambda s: [int(x) for x in s.split(",")], required=True)
    vmp.add_argument("--reps", type=int, required=True)
    vmp.add_argument("--modules", required=True)
    vmp.add_argument("--results", required=True)
    vmp.add_argument("--cold-reps", type=int, required=True)
    vmp.add_argument("--hit-reps", type=int, default=0)
    vmp.add_argument("--profile", action="store_true")
    vmp.add_argument("--hint-profile", type=int, default=0)
    hp = sub.add_parser("_hint_profile")
    hp.add_argument("config")
    hp.add_argument("out")
    hp.add_argument("reps", type=int)
    pp = sub.add_parser("_profile")
    pp.add_argument("config")
    pp.add_argument("out")
    cp = sub.add_parser("_cold")
    cp.add_argument("object")
    cp.add_argument("ops")
    # 21, not the targets' minimum of 7: single-threaded TCG spreads one cell by +-10%, and
    # with 7 samples two cells doing identical work differed by 10% in their medians.
    ap.add_argument("--reps", type=int, default=21, help="repetitions of (a), (c)-(f)")
    ap.add_argument(
        "--cold-reps", type=int, default=3, help="repetitions of (b) (~30 s each under TCG)"
    )
    ap.add_argument(
        "--hit-reps",
        type=int,
        default=0,
        metavar="N",
        help="repetitions of (e) and (f), the standby hit and its lane, at the largest count "
        "when more than --reps: the later ones run without (a)-(d)",
    )
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile'd daemon run")
    ap.add_argument(
        "--hint-profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile the standby hit's whole path, N hints timed and N profiled "
        "(switch_profile_e.txt); with --reps 0, only the profiles",
    )
    ap.add_argument("--counts", default="1,10,100,300")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--keep", action="store_true", help="keep the VM work directory")
    ap.add_argument("--from-json", help="only redo table and plot from a switch_latency.json")
    args = ap.parse_args(argv)
    if args.cmd == "_vm":
        return vm_main(args)
    if args.cmd == "_hint_profile":
        return hint_profile_main(args.config, args.out, args.reps)
    if args.cmd == "_profile":
        return profile_main(args.config, args.out)
    if args.cmd == "_cold":
        return cold_main(args.object, args.ops)
    return host_main(args)


if __name__ == "__main__":
    sys.exit(main())
