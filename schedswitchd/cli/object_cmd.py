"""``schedswitchctl object inspect OBJ [--json]``: what a BPF object holds and needs.

Programs (section, type, instruction count), maps, variables, externs, struct_ops members,
declared kernel modules (``.kmod_btfs``), and CO-RE relocations resolved against the
running kernel's vmlinux BTF (``--vmlinux`` to use another file, ``--no-core`` to skip).
Only reads files; needs no privileges beyond reading ``/sys/kernel/btf/vmlinux``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from schedswitchd.bpf import spec as S
from schedswitchd.bpf.btf import Btf
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.errors import BtfError, ObjectError

DEFAULT_VMLINUX = "/sys/kernel/btf/vmlinux"

PROG_TYPES = {
    0: "unspec", 1: "socket_filter", 2: "kprobe", 3: "sched_cls", 5: "tracepoint", 6: "xdp",
    7: "perf_event", 17: "raw_tracepoint", 26: "tracing", 27: "struct_ops", 28: "ext",
    29: "lsm", 31: "syscall",
}  # fmt: skip
MAP_TYPES = {
    1: "hash", 2: "array", 3: "prog_array", 4: "perf_event_array", 5: "percpu_hash",
    6: "percpu_array", 7: "stack_trace", 9: "lru_hash", 10: "lru_percpu_hash", 11: "lpm_trie",
    12: "array_of_maps", 13: "hash_of_maps", 22: "queue", 23: "stack", 24: "sk_storage",
    26: "struct_ops", 27: "ringbuf", 28: "inode_storage", 29: "task_storage",
    30: "bloom_filter", 31: "user_ringbuf", 32: "cgrp_storage", 33: "arena",
}  # fmt: skip


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``object`` command family."""
    obj = sub.add_parser("object", help="inspect BPF objects")
    osub = obj.add_subparsers(dest="object_command", metavar="SUBCOMMAND", required=True)
    ins = osub.add_parser("inspect", help="show what a BPF object holds and needs")
    ins.add_argument("path", metavar="OBJ", help="a compiled BPF object (*.bpf.o)")
    ins.add_argument("--json", action="store_true", help="print one JSON document")
    ins.add_argument("--vmlinux", default=DEFAULT_VMLINUX, help="target BTF for CO-RE")
    ins.add_argument("--no-core", action="store_true", help="do not resolve CO-RE relocations")
    ins.set_defaults(handler=_inspect)


def describe(spec: ObjectSpec, vmlinux: Btf | None) -> dict[str, Any]:
    """A JSON-ready description of ``spec``; CO-RE results when ``vmlinux`` is given.

    Raises ``CoreError`` if a relocation cannot be resolved consistently.
    """
    btf = spec.btf

    def tname(tid: int) -> str:
        if btf is None or tid == 0:
            return ""
        try:
            return btf.type_name(tid) or f"{btf.kind(tid).name.lower()} #{tid}"
        except BtfError:
            return f"#{tid}"

    programs = []
    core: list[dict[str, Any]] = []
    cache = None
    if vmlinux is not None and btf is not None:
        from schedswitchd.bpf.core import CandidateCache, relocate

        cache = CandidateCache()
    for p in spec.programs:
        programs.append(
            {
                "name": p.name,
                "section": p.section,
                "type": PROG_TYPES.get(p.prog_type, str(p.prog_type)),
                "attach_to": p.attach_to,
                "sleepable": p.sleepable,
                "autoload": p.autoload,
                "insns": p.insn_count,
                "subprograms": list(p.subprograms),
                "fixups": len(p.fixups),
                "core_relos": len(p.core_relos),
            }
        )
        if cache is not None and btf is not None and vmlinux is not None and p.core_relos:
            res = relocate(btf, p.insns, p.core_relos, [vmlinux], cache)
            for r in res.results:
                core.append(
                    {
                        "program": p.name,
                        "insn": r.relo.insn_idx,
                        "kind": r.kind.name,
                        "type": tname(r.relo.type_id),
                        "access": r.relo.access,
                        "local": r.local_value,
                        "target": r.target_value,
                        "found": r.found,
                        "poisoned": r.poisoned,
                        "target_btf": r.target_btf,
                    }
                )
    maps = []
    for m in spec.maps:
        entry: dict[str, Any] = {
            "name": m.name,
            "kernel_name": m.kernel_name,
            "kind": m.kind.value,
            "type": MAP_TYPES.get(m.type, str(m.type)),
            "key_size": m.key_size,
            "value_size": m.value_size,
            "max_entries": m.max_entries,
            "flags": m.flags,
        }
        if m.pinning:
            entry["pinning"] = "by_name"
        if m.inner is not None:
            entry["inner"] = MAP_TYPES.get(m.inner.type, str(m.inner.type))
        if m.init_slots:
            entry["values"] = {str(i): n for i, n in m.init_slots}
        if m.variables:
            entry["variables"] = [
                {
                    "name": v.name,
                    "offset": v.offset,
                    "size": v.size,
                    "type": tname(v.type_id),
                    "static": v.static,
                }
                for v in m.variables
            ]
        if m.struct_ops is not None:
            ops = m.struct_ops
            entry["struct_ops"] = {
                "type": ops.type_name,
                "link": ops.link,
                "programs": {mm.name: mm.program for mm in ops.members if mm.program},
            }
        maps.append(entry)
    externs = [
        {
            "name": e.name,
            "kind": e.kind.value,
            "weak": e.weak,
            "essential_name": e.essential_name,
            **({"offset": e.offset, "size": e.size} if e.kind is S.ExternKind.KCONFIG else {}),
        }
        for e in spec.externs
    ]
    return {
        "name": spec.name,
        "license": spec.license,
        "programs": programs,
        "maps": maps,
        "externs": externs,
        "kmod_btfs": list(spec.kmod_btfs) if spec.kmod_btfs is not None else None,
        "core": core if vmlinux is not None else None,
    }


def _text(d: dict[str, Any]) -> str:
    out = [f"object {d['name']} (license {d['license'] or '-'})"]
    out.append(f"programs ({len(d['programs'])}):")
    for p in d["programs"]:
        flags = ("" if p["autoload"] else " autoload-off") + (
            " sleepable" if p["sleepable"] else ""
        )
        subs = f" +{','.join(p['subprograms'])}" if p["subprograms"] else ""
        head = f"  {p['name']:<24} {p['section']:<32} {p['type']:<12}"
        out.append(f"{head} {p['insns']:>6} insns{subs}{flags}")
    out.append(f"maps ({len(d['maps'])}):")
    for m in d["maps"]:
        out.append(
            f"  {m['name']:<20} {m['kernel_name']:<16} {m['kind']:<10} {m['type']:<14} "
            f"key {m['key_size']} value "
            f"{m['value_size']} max {m['max_entries']} flags {m['flags']:#x}"
        )
        for v in m.get("variables", []):
            st = " static" if v["static"] else ""
            out.append(f"      {v['offset']:>6} +{v['size']:<5} {v['name']} ({v['type']}){st}")
        if "struct_ops" in m:
            so = m["struct_ops"]
            out.append(f"      struct {so['type']}{' (link)' if so['link'] else ''}")
            for member, prog in so["programs"].items():
                out.append(f"        .{member} = {prog}")
        if "values" in m:
            out.append(f"      values {m['values']}")
    if d["externs"]:
        out.append(f"externs ({len(d['externs'])}):")
        for e in d["externs"]:
            out.append(f"  {e['name']:<32} {e['kind']:<9}{' weak' if e['weak'] else ''}")
    km = d["kmod_btfs"]
    out.append(
        "kmod_btfs: "
        + ("(none declared: all modules)" if km is None else ", ".join(km) or "(empty: no modules)")
    )
    if d["core"] is not None:
        out.append(f"CO-RE relocations ({len(d['core'])}):")
        for c in d["core"]:
            res = "POISONED" if c["poisoned"] else f"{c['local']} -> {c['target']}"
            where = f" [{c['target_btf']}]" if c["target_btf"] else " [not found]"
            at = f"{c['program']}+{c['insn']}"
            what = f"{c['type']}:{c['access']}"
            out.append(f"  {at:<24} {c['kind']:<18} {what:<36} {res}{where}")
    return "\n".join(out)


def _inspect(args: argparse.Namespace) -> int:
    spec = open_object(args.path)
    vmlinux = None
    if not args.no_core and any(p.core_relos for p in spec.programs):
        try:
            vmlinux = Btf.from_file(args.vmlinux, name="vmlinux")
        except BtfError as exc:
            raise ObjectError(f"cannot read target BTF {args.vmlinux!r}: {exc}") from exc
    d = describe(spec, vmlinux)
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        print(_text(d))
    return 0
