"""Benchmark: what the no-scheduler gap of a warm switch is made of (in the sched_ext VM).

The gap of a switch is the time from the old scheduler's detach starting to the new one seen
``enabled`` (:class:`schedswitchd.daemon.protocol.SwitchInfo`, ``gap_ns``). It holds two
syscalls whose work is the kernel's -- ``BPF_LINK_DETACH`` of the old struct_ops link
(``bpf_scx_unreg()``: ``scx_disable()`` and the flush of the disable work, which runs
``scx_root_disable()`` on the scheduler's helper kthread) and ``BPF_LINK_CREATE`` of the new
one (``bpf_scx_reg()``: ``scx_root_enable_workfn()`` on the ``scx_enable_helper`` kthread)
-- plus ours: Python between them. The confirmation (one read of ``state`` and one of
``root/ops``) follows ``BPF_LINK_CREATE``'s return, which ends the gap; it is shown beside.

One boot per configuration (``--configs``: ``default`` = the harness's kernel command line,
``expedited`` = ``rcupdate.rcu_expedited=1``, ``smp1`` = 1 vCPU), each running, in one
process inside the VM, the daemon's own :class:`Switcher` and :class:`KernelBackend`
(ss_fifo <-> ss_latency with ``.kmod_btfs``, ``uinput`` loaded):

1. ``--switches`` untraced warm switches: per switch the gap and its composition from the
   record's phases -- kernel disable (``detach.link_detach``), kernel enable
   (``attach.link``), ours (the rest) -- and the confirmation after it
   (``attach.confirm``);
2. the same with the backend's uevent/sysfs watcher running (what the daemon has), to see
   what the uevents sent during the gap cost (interleaved with 1 in pairs of switches);
2b. the same as 1 with the daemon's run-time RCU expediting (``[switch] expedite_rcu``:
   ``/sys/kernel/rcu_expedited`` set for the detach/attach pair), interleaved with 1 and 2,
   so that the two are compared in one boot (1 and 2 run with it off);
3. (``default`` only, unless ``--trace-all``) traced switches with tracefs
   ``function_graph``: (a) ``set_ftrace_filter`` on a list of suspects (the reg/unreg entry
   points, the enable/disable bodies, RCU grace-period waits, percpu rwsem writes, static
   key flips and text patching, kthread work flushes, the per-task loops), which traces only
   those and keeps the durations close to untraced ones; (b) ``set_graph_function`` on the
   enable/disable bodies with ``max_graph_depth`` 3: every child and grandchild, which slows
   the whole kernel (every function goes through the graph tracer under TCG), so only its
   shares are read; (a') (a) again with the run-time RCU expediting of 2b: what is left of
   the gap when the grace periods are expedited.

Durations include time spent asleep (``sleep-time`` on): a grace-period wait shows as time
in ``synchronize_rcu``. Writes ``gap_profile.txt`` (the breakdown, how it was produced, date,
kernel) and ``gap_profile.json`` under ``--out`` (default ``bench/results``).

Usage: ``python bench/gap_profile.py [--switches 16] [--configs default,smp1]``. In the
``expedited`` configuration the kernel's value is already 1, so 2b cannot expedite anything
and its series is the same as 1 (the run says so instead of failing).
Internal sub-command (inside the VM): ``_vm``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vm_bench import (
    REPO,
    SCHED_DIR,
    argv_without_out,
    host_prepare,
    interpreter,
    load_text,
    redo_page,
    save_run,
    utc_now,
    vm_run_failed,
)

sys.path.insert(0, str(REPO))

TRACING = Path("/sys/kernel/tracing")
#: Target: the gap with run-time expedited RCU at most this share of the gap without.
RCU_TARGET = 0.4
CONFIGS = {
    "default": ("", 2, "the harness's kernel command line, 2 vCPUs"),
    "expedited": ("rcupdate.rcu_expedited=1", 2, "rcupdate.rcu_expedited=1, 2 vCPUs"),
    "smp1": ("", 1, "the harness's kernel command line, 1 vCPU"),
}
CONFIG = """
default = "kernel"
[logging]
level = "warning"
journal = "no"
[schedulers.fifo]
object = "{sched}/fifo.bpf.o"
[schedulers.lat]
object = "{sched}/latency.bpf.o"
"""
#: Filter mode: these (where the kernel has them) and nothing else are traced.
SUSPECTS = [
    "bpf_scx_reg",
    "bpf_scx_unreg",
    "scx_enable.isra.0",
    "scx_enable",
    "scx_root_enable_workfn",
    "scx_disable",
    "scx_disable_workfn",
    "scx_root_disable",
    "scx_bypass",
    "scx_alloc_and_add_sched",
    "scx_link_sched",
    "scx_unlink_sched",
    "scx_idle_enable",
    "scx_idle_disable",
    "scx_cid_init",
    "scx_cgroup_init",
    "scx_cgroup_exit",
    "__scx_init_task",
    "__scx_enable_task",
    "scx_disable_and_exit_task",
    "scx_sched_sysfs_add",
    "kobject_del",
    "kobject_uevent",
    "kthread_flush_work",
    "kthread_run_worker",
    "kthread_create_worker",
    "percpu_down_write",
    "percpu_up_write",
    "rcu_sync_enter",
    "synchronize_rcu",
    "synchronize_rcu_expedited",
    "synchronize_rcu_normal",
    "cpus_read_lock",
    "static_key_enable",
    "static_key_disable",
    "static_key_enable_cpuslocked",
    "static_key_disable_cpuslocked",
    "arch_jump_label_transform_apply",
    "smp_text_poke_batch_finish",
    "text_poke_finish",
    "text_poke_bp_batch",
    "dl_server_attach_bw",
    "dl_server_detach_bw",
    "free_percpu",
    "irq_work_sync",
    "wait_for_completion",
]
#: The traced series: (key, mode, RCU expedited at run time).
TRACES = (("filter", "filter", False), ("graph", "graph", False), ("filter_rcu", "filter", True))
GRAPH_ROOTS = ["scx_root_enable_workfn", "scx_disable_workfn", "bpf_scx_reg", "bpf_scx_unreg"]
GRAPH_DEPTH = 3


# --- inside the VM ---------------------------------------------------------------------------


def _tw(name: str, value: str) -> None:
    with open(TRACING / name, "w") as f:
        f.write(value)


def _available(names: list[str]) -> list[str]:
    have = {
        line.split()[0] for line in (TRACING / "available_filter_functions").read_text().split("\n")
        if line
    }  # fmt: skip
    return [n for n in names if n in have]


def _trace_start(mode: str) -> list[str]:
    """Arm function_graph in ``mode`` (``filter`` or ``graph``); the functions it traces."""
    _tw("tracing_on", "0")
    _tw("current_tracer", "nop")
    _tw("trace", "")
    _tw("set_ftrace_filter", "")
    _tw("set_graph_function", "")
    for opt, val in (("funcgraph-tail", "1"), ("funcgraph-proc", "1"), ("funcgraph-irqs", "0"),
                     ("sleep-time", "1")):  # fmt: skip
        path = TRACING / "options" / opt
        if path.exists():
            _tw(f"options/{opt}", val)
    _tw("buffer_size_kb", "16384")
    if mode == "filter":
        names = _available(SUSPECTS)
        _tw("set_ftrace_filter", " ".join(names))
        _tw("max_graph_depth", "0")
    else:
        names = _available(GRAPH_ROOTS)
        _tw("set_graph_function", " ".join(names))
        _tw("max_graph_depth", str(GRAPH_DEPTH))
    _tw("current_tracer", "function_graph")
    _tw("tracing_on", "1")
    return names


def _trace_stop() -> str:
    _tw("tracing_on", "0")
    text = (TRACING / "trace").read_text(errors="replace")
    _tw("current_tracer", "nop")
    _tw("set_ftrace_filter", "")
    _tw("set_graph_function", "")
    return text


_DUR = re.compile(r"([\d.]+)\s*us")


def parse_graph(text: str) -> list[tuple[str, int, str, float]]:
    """function_graph output (``funcgraph-proc`` and ``funcgraph-tail`` on) as (task, depth,
    function, microseconds) per finished call: leaf lines ``f();`` and closing lines
    ``} /* f */``. Depth 0 is the outermost traced call of that task."""
    out: list[tuple[str, int, str, float]] = []
    for line in text.splitlines():
        if line.startswith("#") or "|" not in line or "=>" in line:
            continue
        parts = line.split("|", 2)
        if len(parts) != 3:
            continue
        head, dur, body = parts
        m = _DUR.search(dur)
        if m is None:
            continue
        task = head.split(")", 1)[-1].strip()
        stripped = body.lstrip(" ")
        depth = max(0, (len(body) - len(stripped) - 2) // 2)
        stripped = stripped.rstrip()
        if stripped.endswith("();"):
            name = stripped[:-3]
        elif stripped.startswith("}") and "/*" in stripped:
            name = stripped.split("/*", 1)[1].split("*/", 1)[0].strip()
        else:
            continue
        out.append((task, depth, name, float(m.group(1))))
    return out


def _record(rec: Any) -> dict[str, Any]:
    p = rec.phases_ns
    gap = rec.gap_ns or 0
    disable = p.get("detach.link_detach", p.get("detach.link_close", 0))
    enable = p.get("attach.link", 0)
    return {
        "target": rec.target,
        "gap_ns": gap,
        "disable_ns": disable,
        "enable_ns": enable,
        "confirm_ns": p.get("attach.confirm", 0),
        "ours_ns": gap - disable - enable,
        "total_ns": p.get("total", 0),
        "phases_ns": dict(p),
    }


def vm_main(args: argparse.Namespace) -> int:
    from schedswitchd.daemon.config import load_config
    from schedswitchd.daemon.kernel_backend import create_backend
    from schedswitchd.daemon.switcher import Switcher

    out = Path(args.results)
    cfg_path = Path(tempfile.gettempdir()) / "gap-profile.toml"
    cfg_path.write_text(CONFIG.format(sched=SCHED_DIR))
    config = load_config(cfg_path)
    backend = create_backend(config)
    rcu = backend.rcu
    if rcu is None or not rcu.available():
        raise RuntimeError("/sys/kernel/rcu_expedited is not writable in the VM")
    rcu.enabled = False  # series 1 and 2; series 2b turns it on
    switcher = Switcher(backend, timeout_s=30.0, history_size=256)
    targets = ["lat", "fifo"]

    def switches(n: int) -> list[dict[str, Any]]:
        got = []
        for _ in range(n):
            name = targets[1] if switcher.active == targets[0] else targets[0]
            rec = switcher.switch_to(name, config.schedulers[name], "bench")
            if rec is None or not rec.ok:
                raise RuntimeError(f"switch to {name} failed: {rec}")
            got.append(_record(rec))
        return got

    result: dict[str, Any] = {"cpus": os.cpu_count(), "cmdline": Path("/proc/cmdline").read_text()}
    try:
        for name in ("fifo", "lat", "fifo"):  # warm-up: specs cached, helper kthreads made
            switcher.switch_to(name, config.schedulers[name], "warm-up")
        # Interleaved in pairs, so that noise on the host (other VMs) hits both alike.
        result["plain"], result["watch"], result["rcu"] = [], [], []
        # rcupdate.rcu_expedited=1 on the command line: the value is the boot's, which the
        # daemon leaves alone, so series 2b runs as 1 does (the page says so)
        result["boot_expedited"] = rcu.path.read_text().strip() != "0"
        for _ in range((args.switches + 1) // 2):
            result["plain"] += switches(2)
            rcu.enabled = True
            try:
                recs = switches(2)
            finally:
                rcu.enabled = False
            ran = all(switcher.history[-i].expedited for i in (1, 2))
            if not ran and not result["boot_expedited"]:
                raise RuntimeError("a switch of the expedited series did not run expedited")
            result["rcu"] += recs
            stop = backend.watch(lambda: None)
            try:
                time.sleep(0.3)
                result["watch"] += switches(2)
            finally:
                stop()
        if args.trace:
            result["trace"] = {}
            for key, mode, expedite in TRACES:
                t0 = time.monotonic()
                names = _trace_start(mode)
                armed = time.monotonic() - t0
                rcu.enabled = expedite
                try:
                    recs = switches(args.trace_switches)
                finally:
                    rcu.enabled = False
                text = _trace_stop()
                (out / f"trace-{key}.txt").write_text(text)
                result["trace"][key] = {
                    "functions": names,
                    "arm_s": armed,
                    "switches": recs,
                    "calls": parse_graph(text),
                }
    finally:
        switcher.switch_to("kernel", None, "bench end")
    (out / "gap.json").write_text(json.dumps(result))
    return 0


# --- the host side ---------------------------------------------------------------------------


def _ms(ns: float) -> float:
    return ns / 1e6


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def composition(recs: list[dict[str, Any]]) -> dict[str, float]:
    """Medians in ms of the gap and its parts over switch records (``_record`` shape)."""
    keys = ("gap_ns", "disable_ns", "enable_ns", "confirm_ns", "ours_ns", "total_ns")
    return {k[:-3]: _med([_ms(r[k]) for r in recs]) for k in keys}


def nest(calls: list[list[Any]]) -> list[dict[str, Any]]:
    """Finished calls (``parse_graph`` order: a call after all its descendants) as a list of
    ``{"name", "us", "task", "kids": [...]}`` trees: per task, a call adopts the calls of
    that task which finished before it at a greater depth and were not adopted yet."""
    pending: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    roots: list[dict[str, Any]] = []
    for task, depth, name, us in calls:
        node: dict[str, Any] = {"name": name, "us": us, "task": task, "kids": []}
        stack = pending[task]
        while stack and stack[-1][0] > depth:
            node["kids"].insert(0, stack.pop()[1])
        stack.append((depth, node))
        if depth == 0:
            roots.append(node)
    return roots


def _walk(nodes: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    found = []
    for n in nodes:
        if n["name"] == name:
            found.append(n)
        else:
            found += _walk(n["kids"], name)
    return found


def _inside(node: dict[str, Any], names: tuple[str, ...]) -> float:
    """us spent in the outermost calls named ``names`` below ``node``."""
    total = 0.0
    for k in node["kids"]:
        total += k["us"] if k["name"] in names else _inside(k, names)
    return total


#: What the kernel's time inside the enable/disable bodies goes to (outermost calls).
CATEGORIES = {
    "RCU grace periods (synchronize_rcu, also in percpu_down_write/rcu_sync_enter)": (
        "synchronize_rcu",
        "synchronize_rcu_expedited",
    ),
    "static key flips (code patching)": (
        "static_key_enable",
        "static_key_disable",
        "static_key_enable_cpuslocked",
        "static_key_disable_cpuslocked",
    ),
    "per-task loops (traced parts)": (
        "__scx_init_task",
        "__scx_enable_task",
        "scx_disable_and_exit_task",
    ),
    "scheduler instance alloc/free": ("scx_alloc_and_add_sched", "free_percpu"),
    "bypass on/off": ("scx_bypass",),
}


def breakdown(calls: list[list[Any]], switches: int) -> list[str]:
    """Per switch: the syscall entry points, the kthread bodies they wait for, and what the
    bodies' time goes to (CATEGORIES, the rest untraced), from filter-mode calls."""
    roots = nest(calls)
    lines = []
    for entry, body in (("bpf_scx_unreg", "scx_root_disable"),
                        ("bpf_scx_reg", "scx_root_enable_workfn")):  # fmt: skip
        e = _walk(roots, entry)
        b = _walk(roots, body)
        if not e or not b:
            continue
        e_ms = sum(n["us"] for n in e) / 1000 / switches
        b_ms = sum(n["us"] for n in b) / 1000 / switches
        lines.append(f"  {entry}: {e_ms:.1f} ms per switch; its kthread body {body}: {b_ms:.1f}")
        rest = b_ms
        for label, names in CATEGORIES.items():
            ms = sum(_inside(n, names) for n in b) / 1000 / switches
            if ms >= 0.05:
                lines.append(f"    {ms:6.1f} ms  {label}")
                rest -= ms
        lines.append(f"    {rest:6.1f} ms  everything else in {body} (untraced)")
    return lines


def trace_section(label: str, trace: dict[str, Any]) -> list[str]:
    """The report's lines on configuration ``label``'s two traces (``vm_main`` shape)."""
    lines: list[str] = []
    lines += ["", f"## Kernel side, {label}: tracefs function_graph", ""]
    filt = trace["filter"]
    n = len(filt["switches"])
    c = composition(filt["switches"])
    lines.append(
        f"(a) set_ftrace_filter on {len(filt['functions'])} suspects, {n} switches (gap "
        f"{c['gap']:.1f} ms, disable {c['disable']:.1f}, enable {c['enable']:.1f} while "
        "traced). Per switch, ms, sleeping included:"
    )
    lines += breakdown(filt["calls"], n)
    graph = trace["graph"]
    ng = len(graph["switches"])
    cg = composition(graph["switches"])
    rcu = trace.get("filter_rcu")
    if rcu is not None:  # runs from 2026-12-01 16:30 UTC on
        nr = len(rcu["switches"])
        cr = composition(rcu["switches"])
        lines += [
            "",
            f"(a') the same as (a) with RCU expedited at run time ([switch] expedite_rcu), {nr} "
            f"switches (gap {cr['gap']:.1f} ms, disable {cr['disable']:.1f}, enable "
            f"{cr['enable']:.1f} while traced; ours {cr['ours']:.1f}). Per switch, ms:",
        ]
        lines += breakdown(rcu["calls"], nr)
    lines += [
        "",
        f"(b) set_graph_function {', '.join(graph['functions'])}, max_graph_depth "
        f"{GRAPH_DEPTH}, {ng} switches (every kernel function slowed by the graph tracer: "
        f"gap {cg['gap']:.1f} ms, disable {cg['disable']:.1f}, enable {cg['enable']:.1f} "
        "while traced; read the shares). Direct children per body, share of the body:",
    ]
    groots = nest(graph["calls"])
    for root in ("scx_root_disable", "scx_root_enable_workfn"):
        found = _walk(groots, root)
        total = sum(x["us"] for x in found)
        if not total:
            continue
        kids: dict[str, float] = defaultdict(float)
        for node in found:
            for k in node["kids"]:
                kids[k["name"]] += k["us"]
        lines.append(f"  {root}: {total / 1000 / ng:.1f} ms per switch")
        for name, us in sorted(kids.items(), key=lambda kv: -kv[1])[:10]:
            lines.append(f"    {us / total * 100:5.1f}%  {name}")
    return lines


def report(runs: dict[str, dict[str, Any]], meta: dict[str, str]) -> str:
    lines = [
        "No-scheduler gap of a warm switch (ss_fifo <-> ss_latency, .kmod_btfs build)",
        "",
        f"Produced by: python bench/gap_profile.py {meta['argv']}",
        f"Date: {meta['date']}; kernel {meta['kernel']}; qemu {meta['accel']} (single-threaded "
        f"TCG, -cpu max, 2 GiB); host {meta['host']}, load average at start {meta['load']}; "
        f"{meta.get('interpreter', 'interpreter not recorded')}.",
        "In one process in the VM: the daemon's Switcher + KernelBackend (no socket); medians.",
        "gap = detach start -> BPF_LINK_CREATE returned (the new scheduler enabled, as the",
        "confirmation after it shows); kernel disable = BPF_LINK_DETACH (bpf_scx_unreg); kernel",
        "enable = BPF_LINK_CREATE (bpf_scx_reg); ours = the rest of the gap (Python between the",
        "syscalls); confirm = one read of state and one of root/ops, after the gap.",
        "",
        "| configuration | watcher | gap ms | kernel disable ms | kernel enable ms "
        "| ours ms | confirm ms (after) | full switch ms | gap / switch |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    kinds = (
        ("plain", "no"),
        ("watch", "uevents + sysfs poll"),
        ("rcu", "no; RCU expedited at run time"),
    )
    for label, run in runs.items():
        for kind, title in kinds:
            if not run.get(kind):
                continue  # a run saved before that series existed
            c = composition(run[kind])
            lines.append(
                f"| {label} ({CONFIGS[label][2]}) | {title} | {c['gap']:.1f} | {c['disable']:.1f} "
                f"| {c['enable']:.1f} | {c['ours']:.1f} | {c['confirm']:.1f} | {c['total']:.0f} "
                f"| {c['gap'] / c['total']:.2f} |"
            )
    lines.append(f"({meta['switches']} switches per row.)")
    for label, run in runs.items():
        if run.get("boot_expedited"):
            lines.append(
                f"{label}: rcu_expedited is 1 from the boot, which the daemon leaves alone: "
                "both series run expedited"
            )
        elif run.get("rcu") and run.get("plain"):
            with_ = composition(run["rcu"])["gap"]
            without = composition(run["plain"])["gap"]
            lines.append(
                f"{label}: gap with run-time expedited RCU / without, same boot: "
                f"{with_:.1f} / {without:.1f} ms = {with_ / without:.3f} (target <= 0.4: "
                f"{'met' if with_ / without <= RCU_TARGET else 'MISSED'})"
            )
    for label, run in runs.items():
        trace = run.get("trace")
        if trace:
            # a saved run keeps the section instead of the (large) parsed calls
            lines += trace.get("section") or trace_section(label, trace)
    return "\n".join(lines) + "\n"


def host_main(args: argparse.Namespace) -> int:
    if args.from_json:
        return redo_page(
            args.from_json, Path(args.out), "gap_profile.txt",
            lambda s: report(s["runs"], s["meta"]),
        )  # fmt: skip
    from tools import vm

    kernel = host_prepare()
    if kernel is None:
        return 1
    load = load_text()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {}
    accel = "?"
    for label in args.configs.split(","):
        cmdline, cpus, _ = CONFIGS[label]
        trace = label == "default" or args.trace_all
        script = (
            'modprobe -d "$KMOD_ROOT" uinput\n'
            f'"$PY" "$REPO/bench/gap_profile.py" _vm --switches {args.switches} '
            f"--trace-switches {args.trace_switches} {'--trace ' if trace else ''}"
            '--results "$RESULTS"\n'
        )
        t0 = time.monotonic()
        result = vm.run_in_vm(
            script, kernel=kernel, timeout=args.timeout, cmdline=cmdline, cpus=cpus,
            cwd=str(REPO), memory_mib=2048,
        )  # fmt: skip
        accel = result.accel
        if vm_run_failed(result, "gap.json"):
            print(f"(the {label} configuration)", file=sys.stderr)
            return 1
        runs[label] = json.loads(result.text("gap.json"))
        trace = runs[label].get("trace")
        if trace:
            trace["section"] = trace_section(label, trace)
            for key, _, _ in TRACES:
                trace[key].pop("calls", None)
        for name in (f"trace-{key}.txt" for key, _, _ in TRACES):
            if name in result.files and args.keep_traces:
                (out / f"gap_{label}_{name}").write_bytes(result.files[name])
        print(f"{label}: VM run {time.monotonic() - t0:.0f} s", file=sys.stderr)
    meta = {
        "argv": argv_without_out(sys.argv[1:]),
        "date": utc_now(),
        "kernel": kernel.version,
        "accel": accel,
        "host": f"{os.cpu_count()} cores",
        "load": load,
        "interpreter": interpreter(),
        "switches": str(args.switches),
    }
    save_run(out, "gap_profile.json", {"meta": meta, "runs": runs}, report(runs, meta),
             "gap_profile.txt")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0], allow_abbrev=False)
    sub = ap.add_subparsers(dest="cmd")
    vmp = sub.add_parser("_vm", allow_abbrev=False)
    vmp.add_argument("--switches", type=int, required=True)
    vmp.add_argument("--trace-switches", type=int, required=True)
    vmp.add_argument("--trace", action="store_true")
    vmp.add_argument("--results", required=True)
    # The defaults are what `make bench` runs and bench/results/gap_profile.txt shows.
    ap.add_argument("--switches", type=int, default=16, help="untraced switches per row")
    ap.add_argument("--trace-switches", type=int, default=2, help="switches per trace mode")
    ap.add_argument("--configs", default="default,smp1", help=f"comma list of {', '.join(CONFIGS)}")
    ap.add_argument("--trace-all", action="store_true", help="trace every configuration")
    ap.add_argument("--keep-traces", action="store_true", help="also write the raw traces")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--from-json", help="only redo the text from a gap_profile.json")
    args = ap.parse_args(argv)
    if args.cmd == "_vm":
        return vm_main(args)
    return host_main(args)


if __name__ == "__main__":
    sys.exit(main())
