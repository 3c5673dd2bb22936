"""``schedswitchctl profile ...``.

- ``profile list``: every profile found (installed, then shipped), with its modes;
- ``profile show NAME|PATH [--mode M] [--sysfs ROOT] [--vmlinux BTF] [--json]``: the
  profile's values resolved for this machine (or the sysfs tree at ``ROOT``), each step
  expanded per iteration -- what would be written, run and attached;
- ``profile topology [--sysfs ROOT] [--json]``: the topology model itself;
- ``profile check PROFILE [--object OBJ] [--mode M ...] [--sysfs ROOT] [--no-bundled]
  [--vmlinux BTF] [--json]``: every mode resolved (and, with the object, applied) on this
  machine and the bundled sysfs trees; every problem printed; exit 1 when there is one;
- ``profile capture DIR [--sysfs ROOT]``: copy the sysfs files the topology is read from
  into ``DIR``, for ``--sysfs DIR`` on another machine;

Reads files only; needs no privileges.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from schedswitchd.errors import SchedSwitchError
from schedswitchd.profile.model import find_profile, load_profile, shipped_profiles
from schedswitchd.profile.resolve import NO_KERNEL, KernelFacts, resolve_profile
from schedswitchd.profile.topology import read_topology

DEFAULT_VMLINUX = "/sys/kernel/btf/vmlinux"


def kernel_facts(vmlinux: str | None) -> KernelFacts:
    """Enumerators of the BTF file ``vmlinux`` (read lazily, on the first question), or
    :data:`NO_KERNEL` for ``None``/``""``."""
    if not vmlinux:
        return NO_KERNEL
    table: dict[str, int] | None = None

    def lookup(name: str) -> int | None:
        nonlocal table
        if table is None:
            from schedswitchd.bpf.btf.reader import Btf
            from schedswitchd.profile.kernel_enums import enum_table

            table = enum_table([Btf.from_file(vmlinux)])
        return table.get(name)

    return KernelFacts(lookup, vmlinux)


def _btf_and_json(p: argparse.ArgumentParser, vmlinux_help: str) -> None:
    p.add_argument("--vmlinux", default=DEFAULT_VMLINUX, help=vmlinux_help)
    p.add_argument("--json", action="store_true", help="print one JSON document")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``profile`` command family to a parser."""
    about = "scheduler profiles: list, show resolved values, check, capture, topology"
    description = about[0].upper() + about[1:] + "."
    p = sub.add_parser("profile", help=about, description=description)
    psub = p.add_subparsers(dest="profile_command", metavar="SUBCOMMAND", required=True)
    lst = psub.add_parser("list", help="profiles found (installed, then shipped)")
    lst.set_defaults(handler=_list)
    show = psub.add_parser("show", help="a profile's values resolved for this machine")
    show.add_argument("profile", metavar="PROFILE", help="a profile name or a .toml path")
    show.add_argument("--mode", default=None, help="merge this mode into the base")
    show.add_argument("--sysfs", default="/sys", help="sysfs root to read the topology from")
    _btf_and_json(show, "BTF to look kernel_enum() names up in ('' for none)")
    show.set_defaults(handler=_show)
    check = psub.add_parser(
        "check",
        help="check every mode on this machine and the bundled ones",
        description="Resolve the profile in the base and every mode (or those given) for "
        "this machine's sysfs tree (or --sysfs's) and every bundled tree (SMT, hybrid, NUMA "
        "with a CPU-less node, AMD preferred cores, 1 CPU); with --object also apply it to "
        "the object and check every step's program, map and members, also steps no machine "
        "runs. Prints every problem; exit status 1 when there is one.",
    )
    check.add_argument("profile", metavar="PROFILE", help="a profile name or a .toml path")
    check.add_argument("--object", metavar="OBJ", help="the .bpf.o (or executable) it is for")
    check.add_argument(
        "--mode", action="append", default=None, help="only this mode ('' for the base); repeatable"
    )
    check.add_argument("--sysfs", default="/sys", help="this machine's sysfs root")
    check.add_argument(
        "--no-bundled", action="store_true", help="only --sysfs's tree, not the bundled ones"
    )
    _btf_and_json(
        check,
        "the target kernel's BTF for flags and kernel_enum() (e.g. build/sid/vmlinux.btf; "
        "'' for none)",
    )
    check.set_defaults(handler=_check)
    cap = psub.add_parser(
        "capture",
        help="copy this machine's topology files for --sysfs",
        description="Copy the sysfs files the topology model reads (CPU lists, topology, "
        "caches, capacity sources, NUMA nodes) into DIR, keeping their paths, so that "
        "'profile show|check --sysfs DIR' and 'schedswitchd --check-config --sysfs DIR' "
        "resolve profiles for this machine elsewhere.",
    )
    cap.add_argument("dir", metavar="DIR", help="where to write the tree (created)")
    cap.add_argument("--sysfs", default="/sys", help="the sysfs root to copy from")
    cap.set_defaults(handler=_capture)
    topo = psub.add_parser("topology", help="the topology model read from sysfs")
    topo.add_argument("--sysfs", default="/sys", help="sysfs root")
    topo.add_argument("--json", action="store_true", help="print one JSON document")
    topo.set_defaults(handler=_topology)


def _list(args: argparse.Namespace) -> int:
    rows: list[tuple[str, str, Path]] = []
    for name, path in shipped_profiles().items():
        try:
            prof = load_profile(path)
        except SchedSwitchError as exc:
            rows.append((name, f"INVALID: {exc}", path))
            continue
        rows.append((name, "modes: " + (", ".join(prof.modes) or "-"), path))
    # Columns as wide as their longest entry: a fixed width let a long mode list (lavd's
    # five) push its path out of line.
    name_w = max((len(n) for n, _, _ in rows), default=0)
    modes_w = max((len(m) for _, m, _ in rows if not m.startswith("INVALID")), default=0)
    for name, modes, path in rows:
        if modes.startswith("INVALID"):
            print(f"{name:{name_w}}  {modes} ({path})")
        else:
            print(f"{name:{name_w}}  {modes:{modes_w}}  {path}")
    return 0


def _fmt(v: Any) -> str:
    if isinstance(v, bytes):
        return "0x" + v.hex() if len(v) <= 32 else f"<{len(v)} bytes> 0x{v[:16].hex()}..."
    if isinstance(v, list) and len(v) > 16:
        return f"[{', '.join(_fmt(x) for x in v[:16])}, ... ({len(v)} elements)]"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_fmt(x)}" for k, x in v.items()) + "}"
    return repr(v)


def _show(args: argparse.Namespace) -> int:
    prof = load_profile(find_profile(args.profile))
    topo = read_topology(args.sysfs)
    res = resolve_profile(prof, topo, mode=args.mode, kernel=kernel_facts(args.vmlinux))
    if args.json:
        print(json.dumps({"topology": topo.describe(), **res.as_dict()}, indent=2))
        return 0
    print(f"profile {res.name}{' mode ' + res.mode if res.mode else ''} ({res.path})")
    print(f"machine: {topo.describe()}")
    if not prof.profile.runnable:
        print(f"REFUSED: user space does periodic work: {prof.profile.userspace}")
    if prof.modes:
        print(f"modes: {', '.join(prof.modes)}")
    for title, table in (
        ("let", res.let),
        ("variables (before load)", res.variables),
        ("struct_ops", res.struct_ops),
        ("after_load", res.after_load),
    ):
        if table:
            print(f"{title}:")
            for k, v in table.items():
                print(f"  {k} = {_fmt(v)}")
    if res.resize:
        print("resize:")
        for k, n in res.resize.items():
            print(f"  {k} = {n} elements")
    flags = res.flags
    if flags is not None or res.add_flags or res.remove_flags:
        print(
            f"flags: {'(object default)' if flags is None else flags}"
            + (f" +{res.add_flags}" if res.add_flags else "")
            + (f" -{res.remove_flags}" if res.remove_flags else "")
            + (f" required {res.required_flags}" if res.required_flags else "")
        )
    for u in res.map_updates:
        print(f"map update [{u.when}] {u.label}: key {_fmt(u.key)} -> {_fmt(u.value)}")
    for r in res.runs:
        on = f" on cpu {r.cpu}" if r.cpu is not None else ""
        print(f"run [{r.when}] {r.label}{on}: {_fmt(r.args)}")
    for e in res.perf_events:
        skip = " (skip on error)" if e.on_error == "skip" else ""
        print(
            f"perf event {e.label}: type {e.type} config {e.config:#x} on cpu {e.cpu} "
            f"-> key {_fmt(e.key)}{skip}"
        )
    if res.attach_cpu is not None:
        print(f"attach from cpu {res.attach_cpu}")
    skipped = [step for step, n in res.iterations.items() if n == 0]
    if skipped:
        print("steps with zero iterations on this machine (not run here):")
        for step in skipped:
            print(f"  {step}: 0 iterations")
    for s in res.stats:
        src = s.variable or f"{s.map}[{_fmt(res.stat_keys.get(s.name))}]" + (
            f".{s.field}" if s.field else ""
        )
        print(f"stat {s.name}: {src}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from schedswitchd.profile.check import check_profile, machines

    path = find_profile(args.profile)
    prof = load_profile(path)
    spec = None
    if args.object:
        from schedswitchd.bpf.object import open_object

        spec = open_object(args.object)
    vmlinux = None
    if args.vmlinux:
        from schedswitchd.bpf.btf.reader import Btf

        vmlinux = Btf.from_file(args.vmlinux, name="vmlinux")
    topos, problems = machines(args.sysfs, bundled=not args.no_bundled)
    modes = None if args.mode is None else [m or None for m in args.mode]
    result = check_profile(
        prof,
        topos,
        spec=spec,
        vmlinux=vmlinux,
        kernel=kernel_facts(args.vmlinux),
        modes=modes,
    )
    result.problems[:0] = problems
    if args.json:
        doc = {
            "profile": prof.name,
            "path": str(path),
            "object": args.object,
            "vmlinux": args.vmlinux or None,
            "machines": [name for name, _ in topos],
            "checked": result.checked,
            "ok": result.ok,
            "problems": result.problems,
            "notes": result.notes,
        }
        print(json.dumps(doc, indent=2))
    else:
        what = "resolved and applied to " + args.object if args.object else "resolved"
        print(
            f"profile {prof.name} ({path}): {result.checked} mode x machine checks, {what}, "
            f"on {', '.join(n for n, _ in topos)}; kernel BTF: {args.vmlinux or '(none)'}"
        )
        for p in result.problems:
            print(f"  problem: {p}")
        for n in result.notes:
            print(f"  note: {n}")
        print("ok" if result.ok else f"FAILED: {len(result.problems)} problems")
    return 0 if result.ok else 1


def _capture(args: argparse.Namespace) -> int:
    from schedswitchd.profile.topology import capture_sysfs

    written = capture_sysfs(args.dir, args.sysfs)
    topo = read_topology(args.dir)
    print(f"{len(written)} files from {args.sysfs} into {args.dir}: {topo.describe()}")
    return 0


def _topology(args: argparse.Namespace) -> int:
    topo = read_topology(args.sysfs)
    if args.json:

        def js(v: Any) -> Any:
            if isinstance(v, bytes):
                return v.hex()
            if isinstance(v, dict):
                return {k: js(x) for k, x in v.items()}
            if isinstance(v, list | tuple):
                return [js(x) for x in v]
            return v

        print(json.dumps(js(asdict(topo)), indent=2))
        return 0
    print(topo.describe())
    print(
        f"  capacity from {topo.capacity_source or '(no source: all 1024)'}; "
        f"nr_node_ids {topo.nr_node_ids}"
    )
    for c in topo.cpus:
        if not c.possible:
            print(f"  cpu {c.id}: not possible")
            continue
        print(
            f"  cpu {c.id}: {'online' if c.online else 'offline'} core {c.core_id} "
            f"pkg {c.package_id} llc {c.llc_id} node {c.node_id} siblings {list(c.siblings)} "
            f"capacity {c.capacity} (raw {c.raw_capacity}) {c.core_type} "
            f"max {c.max_freq_khz} kHz"
        )
    for title, groups in (("core", topo.cores), ("llc", topo.llcs), ("node", topo.nodes)):
        for g in groups:
            print(f"  {title} {g.id}: cpus {list(g.cpus)} mask 0x{g.mask.hex()}")
    return 0


__all__ = ["kernel_facts", "register"]
