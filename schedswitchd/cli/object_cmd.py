"""``schedswitchctl object inspect|load|unload``: BPF objects, read or loaded with our loader.

``object inspect OBJ [--json]``: what a BPF object holds and needs. Programs (section,
type, instruction count), maps, variables, externs, struct_ops members, declared kernel
modules (``.kmod_btfs``), and CO-RE relocations resolved against the running kernel's
vmlinux BTF (``--vmlinux`` to use another file, ``--no-core`` to skip). Only reads files;
needs no privileges beyond reading ``/sys/kernel/btf/vmlinux``.

``object load OBJ [--profile NAME [--mode M] [--sysfs ROOT]] [--pin DIR] [--set VAR=VALUE ...]
[--ops-flag|--require-ops-flag SCX_OPS_NAME ...] [--no-fill-enums] [--json] [--verbose]``
opens the object (OBJ may also be an executable
embedding it: the note says which embedded object was used), applies the profile (its
values for this machine; after load its variable writes, map updates and syscall-program
runs, the link created from its attach CPU and its after-attach runs; ``docs/profiles.md``),
then the ``sched_ext_ops.flags`` named (``SCX_OPS_*``, resolved from the kernel's BTF by
:mod:`schedswitchd.bpf.ops_flags`, replacing the object's or profile's flags: a name the
kernel lacks is dropped with a note, or refused when required; ``ops_flags`` in JSON),
then ``--set`` (a global variable ``VAR``, or ``MAP.MEMBER`` of a struct_ops variable), loads
it (setting its ``__SCX_*`` enum variables from the kernel's
BTF unless ``--no-fill-enums``; ``--set`` values win) and attaches its programs
(those a libbpf skeleton attaches: tracing, iterators, raw and perf tracepoints), then its
struct_ops maps; skipped optional (``?``) programs are printed as notes.
Without ``--pin`` everything is detached and unloaded before exiting (a dry run against the
real kernel); with ``--pin`` links, programs and maps are pinned under DIR (bpffs) and stay
live. ``object unload DIR`` removes them. Output: programs and maps with kernel ids, the
enum variables set / missing in the kernel (``enum_fill`` in JSON) and the load's phase
timings (ns in JSON). When the kernel refuses a program, ``--verbose`` prints its full
verifier log to stderr and ``--json`` prints
``{"error": {"code", "message", "verifier_log"}}`` (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.core.relo import CoreReloKind
from schedswitchd.bpf.customize import set_struct_ops_member, set_variable
from schedswitchd.bpf.enum_vars import EnumFillReport
from schedswitchd.bpf.object import open_object_noted
from schedswitchd.bpf.ops_flags import OpsFlag, OpsFlags, ops_flags_table, set_ops_flags
from schedswitchd.bpf.scheduler import ops_name_of, sched_ext_map
from schedswitchd.bpf.spec import ExternKind, ObjectSpec, StructOpsSpec
from schedswitchd.errors import (
    BtfError,
    CustomizationError,
    LoadError,
    ObjectError,
    SchedSwitchError,
)
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import LoadedObject, load_object
from schedswitchd.kernel.pins import pin_object, unpin_directory
from schedswitchd.kernel.sched_ext import sysfs
from schedswitchd.kernel.sched_ext.exit_info import uei_layout
from schedswitchd.kernel.sched_ext.profile_steps import (
    attach_from_cpu,
    read_stats,
    run_after_attach,
    run_before_attach,
)
from schedswitchd.profile.apply import ProfiledSpec, profile_spec
from schedswitchd.profile.model import find_profile, load_profile
from schedswitchd.profile.topology import read_topology

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
    about = "inspect, load and unload BPF objects"
    obj = sub.add_parser("object", help=about, description=about[0].upper() + about[1:] + ".")
    osub = obj.add_subparsers(dest="object_command", metavar="SUBCOMMAND", required=True)
    ins = osub.add_parser("inspect", help="show what a BPF object holds and needs")
    ins.add_argument(
        "path", metavar="OBJ", help="a compiled BPF object (*.bpf.o) or an executable embedding one"
    )
    ins.add_argument("--json", action="store_true", help="print one JSON document")
    ins.add_argument(
        "--vmlinux",
        default=DEFAULT_VMLINUX,
        help="target BTF for CO-RE and for naming sched_ext_ops flags",
    )
    ins.add_argument("--no-core", action="store_true", help="do not resolve CO-RE relocations")
    ins.set_defaults(handler=_inspect)
    load = osub.add_parser("load", help="load (and attach struct_ops of) a BPF object")
    load.add_argument(
        "object", help="path of a BPF ELF object (.bpf.o) or of an executable embedding one"
    )
    load.add_argument(
        "--profile",
        metavar="NAME",
        help="apply a scheduler profile (a shipped or installed name, or a .toml path)",
    )
    load.add_argument("--mode", metavar="M", help="the profile's mode to apply")
    load.add_argument(
        "--sysfs", default="/sys", help="sysfs root the profile's topology is read from"
    )
    load.add_argument("--pin", metavar="DIR", help="pin links/programs/maps here and keep them")
    load.add_argument(
        "--set",
        metavar="VAR=VALUE",
        action="append",
        default=[],
        type=_assignment,
        help="set a global variable or a struct_ops member (MAP.MEMBER=VALUE) before load",
    )
    load.add_argument(
        "--ops-flag",
        metavar="SCX_OPS_NAME",
        action="append",
        default=[],
        help="set sched_ext_ops.flags by name, resolved from the kernel's enum scx_ops_flags "
        "(repeat; replaces the object's flags); a name the kernel lacks is dropped with a note",
    )
    load.add_argument(
        "--require-ops-flag",
        metavar="SCX_OPS_NAME",
        action="append",
        default=[],
        help="like --ops-flag, but refuse to load when the kernel lacks the flag",
    )
    load.add_argument(
        "--no-fill-enums",
        dest="fill_enums",
        action="store_false",
        help="leave the object's __SCX_* enum variables as compiled (default: set each from "
        "the kernel BTF's enumerator of that name without the leading __)",
    )
    load.add_argument(
        "--watch",
        metavar="SECONDS",
        type=float,
        default=0.0,
        help="a sched_ext scheduler: keep it attached this long and check that the kernel "
        "did not eject it before unloading or pinning (default: %(default)s, checked once)",
    )
    load.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (on a program-load failure: the error and verifier log; "
        "a sched_ext scheduler: 'sched_ext' holds the kernel's state and exit record)",
    )
    load.add_argument(
        "--verbose",
        "--log",
        action="store_true",
        help="on a program-load failure, print the kernel's full verifier log to stderr",
    )
    load.set_defaults(handler=_load)
    unload = osub.add_parser(
        "unload",
        help="remove the pins `object load --pin DIR` made (only those; DIR must be on bpffs)",
    )
    unload.add_argument(
        "dir", metavar="DIR", help="the directory `object load --pin DIR` pinned to"
    )
    unload.add_argument("--json", action="store_true", help="print one JSON object")
    unload.set_defaults(handler=_unload)


def struct_ops_scalars(
    spec: ObjectSpec, ops: StructOpsSpec, flag_names: dict[str, int] | None = None
) -> dict[str, Any]:
    """The values a struct_ops variable's data holds for its scalar members (integers and
    enums up to 8 bytes, ``char`` arrays as strings; pointers and function pointers
    left out), by member name, from the object's BTF. With ``flag_names`` (``SCX_OPS_*``
    name -> value, :func:`~schedswitchd.bpf.ops_flags.ops_flags_table`) a ``flags``
    member also gets ``flags_names``: the names whose bits are set, then ``0x...`` for
    bits no name covers."""
    from schedswitchd.bpf.btf.types import Array, Enum, Int

    btf = spec.btf
    out: dict[str, Any] = {}
    if btf is None:
        return out
    for mem in ops.members:
        if mem.is_func_ptr:
            continue
        raw = ops.data[mem.offset : mem.offset + mem.size]
        try:
            t = btf.type(btf.skip_mods_and_typedefs(mem.type_id))
            if isinstance(t, Array):
                elem = btf.type(btf.skip_mods_and_typedefs(t.type))
                if isinstance(elem, Int) and elem.size == 1:
                    out[mem.name] = raw.split(b"\0", 1)[0].decode(errors="replace")
                continue
            if not isinstance(t, Int | Enum) or mem.size not in (1, 2, 4, 8):
                continue
        except BtfError:
            continue
        signed = bool(getattr(t, "signed", False))
        out[mem.name] = int.from_bytes(raw, "little", signed=signed)
    flags = out.get("flags")
    if isinstance(flags, int) and flag_names:
        names = [
            n for n, v in sorted(flag_names.items(), key=lambda kv: kv[1]) if v and flags & v == v
        ]
        rest = flags
        for n in names:
            rest &= ~flag_names[n]
        out["flags_names"] = names + ([f"{rest:#x}"] if rest else [])
    return out


def describe(
    spec: ObjectSpec, vmlinux: Btf | None, flag_names: dict[str, int] | None = None
) -> dict[str, Any]:
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
        from schedswitchd.bpf.core.relocate import CandidateCache, relocate

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
                # TYPE_ID_LOCAL is answered by the object's own BTF (the local type id): it
                # needs no target candidate, so it is found, in the "local" BTF
                local_only = r.kind is CoreReloKind.TYPE_ID_LOCAL and not r.poisoned
                core.append(
                    {
                        "program": p.name,
                        "insn": r.relo.insn_idx,
                        "kind": r.kind.name,
                        "type": tname(r.relo.type_id),
                        "access": r.relo.access,
                        "local": r.local_value,
                        "target": r.target_value,
                        "found": r.found or local_only,
                        "poisoned": r.poisoned,
                        "target_btf": "local" if local_only else r.target_btf,
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
                "scalars": struct_ops_scalars(spec, ops, flag_names),
            }
        maps.append(entry)
    externs = [
        {
            "name": e.name,
            "kind": e.kind.value,
            "weak": e.weak,
            "essential_name": e.essential_name,
            **({"offset": e.offset, "size": e.size} if e.kind is ExternKind.KCONFIG else {}),
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
            for member, value in so.get("scalars", {}).items():
                if member == "flags_names":
                    continue
                if member == "flags" and isinstance(value, int):
                    names = so["scalars"].get("flags_names")
                    shown = " | ".join(names) if names else "no names: --vmlinux a sched_ext BTF"
                    out.append(f"        .flags = {value:#x} ({shown if value else 'none'})")
                else:
                    out.append(f"        .{member} = {value!r}")
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


def _flag_names(spec: ObjectSpec, vmlinux: Btf | None, path: str) -> dict[str, int] | None:
    """``SCX_OPS_*`` names for decoding ``flags``: the object's own BTF, else the target
    BTF (read now if CO-RE did not need it); ``None`` when neither has them."""
    if not any(m.struct_ops is not None for m in spec.maps):
        return None
    if spec.btf is not None and (table := ops_flags_table(spec.btf)):
        return table
    if vmlinux is None:
        try:
            vmlinux = Btf.from_file(path, name="vmlinux")
        except (BtfError, OSError):
            return None
    return ops_flags_table(vmlinux) or None


def _inspect(args: argparse.Namespace) -> int:
    spec, note = open_object_noted(args.path)
    spec.link_programs()  # a malformed program is reported as opening's errors are
    vmlinux = None
    if not args.no_core and any(p.core_relos for p in spec.programs):
        try:
            vmlinux = Btf.from_file(args.vmlinux, name="vmlinux")
        except BtfError as exc:
            raise ObjectError(f"cannot read target BTF {args.vmlinux!r}: {exc}") from exc
    d = describe(spec, vmlinux, _flag_names(spec, vmlinux, args.vmlinux))
    if note:
        d["embedded"] = note
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        if note:
            print(note)
        print(_text(d))
    return 0


def parse_value(text: str) -> object:
    """``--set`` values: ``true``/``false``, integers (``0x`` hex too), else the string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text, 0)
    except ValueError:
        return text


def _assignment(text: str) -> str:
    """``--set``'s argument as given, once it has the ``NAME=VALUE`` shape: a malformed one
    is bad usage (exit 2, before anything is opened), as the exit table says."""
    name, sep, _ = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"wants VAR=VALUE or MAP.MEMBER=VALUE, got {text!r}")
    return text


def apply_sets(spec: ObjectSpec, sets: list[str]) -> ObjectSpec:
    """Apply ``VAR=VALUE`` / ``MAP.MEMBER=VALUE`` assignments; :class:`CustomizationError`
    for a malformed one."""
    for item in sets:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise CustomizationError(f"--set wants VAR=VALUE, got {item!r}")
        value = parse_value(raw)
        map_name, dot, member = name.partition(".")
        is_ops = dot and any(m.name == map_name and m.struct_ops for m in spec.maps)
        if is_ops:
            spec = set_struct_ops_member(spec, map_name, member, value)
        else:
            spec = set_variable(spec, name, value)
    return spec


def apply_ops_flags(
    spec: ObjectSpec, kernel: Btf, optional: list[str], required: list[str]
) -> tuple[ObjectSpec, OpsFlags | None]:
    """``--ops-flag`` / ``--require-ops-flag``: ``spec`` with the ``flags`` of its one
    ``sched_ext_ops`` struct_ops map replaced by those names resolved in ``kernel``
    (vmlinux BTF), and the resolution (``None`` when no name was given). Raises
    :class:`CustomizationError` (a required flag the kernel lacks) or :class:`LoadError`
    (no, or several, ``sched_ext_ops`` maps)."""
    if not optional and not required:
        return spec, None
    flags = [OpsFlag(n) for n in optional] + [OpsFlag(n, required=True) for n in required]
    return set_ops_flags(
        spec, sched_ext_map(spec), ops_flags_table(kernel), flags, where="--ops-flag"
    )


def describe_loaded(obj: LoadedObject) -> dict[str, Any]:
    """The JSON shape of a loaded object: programs, maps, struct_ops links, program links,
    skipped optional programs (name -> reason) and notes, timings (ns)."""
    return {
        "object": obj.spec.name,
        "programs": [
            {"name": p.name, "id": p.id, "type": p.spec.prog_type, "insns": len(p.insns) // 8}
            for p in obj.programs.values()
        ],
        "maps": [
            {"name": m.name, "id": m.id, "type": m.spec.type, "kind": m.spec.kind.value}
            for m in obj.maps.values()
        ],
        "links": sorted(obj.links),
        "program_links": sorted(obj.program_links),
        "skipped": dict(obj.skipped),
        "notes": list(obj.notes),
        "timings_ns": dict(obj.timings_ns),
        "enum_fill": obj.enum_fill.as_dict(),
    }


def _load(args: argparse.Namespace) -> int:
    try:
        return _load_and_print(args)
    except SchedSwitchError as exc:
        log = exc.verifier_log
        if not log:
            raise
        if args.json:
            error = {"code": exc.code, "message": str(exc), "verifier_log": log}
            print(json.dumps({"error": error}, sort_keys=True))
            return 1
        if args.verbose:
            sys.stderr.write(log if log.endswith("\n") else log + "\n")
            raise
        raise LoadError(f"{exc} (--verbose prints the full verifier log)") from exc


@contextlib.contextmanager
def _sched_ext_note(spec: ObjectSpec) -> Iterator[None]:
    """A :class:`LoadError` of a sched_ext scheduler on a kernel without sched_ext (its
    kfuncs and ``sched_ext_ops`` are absent from vmlinux) says so, as the daemon does,
    rather than leaving the user to infer it from a missing kfunc."""
    try:
        yield
    except LoadError as exc:
        is_scheduler = any(
            m.struct_ops is not None and m.struct_ops.type_name == "sched_ext_ops"
            for m in spec.struct_ops_maps
        )
        if not is_scheduler or sysfs.available() or exc.verifier_log:
            raise
        raise LoadError(
            f"{exc} (this kernel has no sched_ext: {sysfs.SCHED_EXT_ROOT} is missing, "
            "CONFIG_SCHED_CLASS_EXT is not set; `object inspect` works without it)"
        ) from exc


#: ``sched_ext`` verdicts of ``object load`` (its exit status is 1 for all but the first).
ENABLED, EJECTED, NEVER_ENABLED = "enabled", "ejected", "never enabled"


def _exit_record(obj: LoadedObject, spec: ObjectSpec) -> dict[str, Any] | None:
    """The scheduler's own exit record (``uei``: ``kernel/sched/ext.c`` writes it through
    ``ops.exit``), read from its data map now; ``None`` when it keeps none or none yet."""
    layout = uei_layout(spec)
    m = obj.maps.get(layout.map_name) if layout is not None else None
    if layout is None or m is None:
        return None
    try:
        raw = syscall.map_lookup_elem(m.fd, bytes(4), m.spec.value_size)
        rec = layout.decode(raw) if raw is not None else None
    except (SchedSwitchError, ValueError):
        return None
    return dataclasses.asdict(rec) if rec is not None else None  # kind, exit_code, reason, message


def _sched_ext_verdict(
    obj: LoadedObject, spec: ObjectSpec, ops_name: str, *, enabled_once: bool
) -> dict[str, Any]:
    """What the kernel says of scheduler ``ops_name`` now: ``state`` and ``ops`` from
    ``/sys/kernel/sched_ext``, the exit record, and a ``verdict``: ``enabled`` (its ops
    runs and it recorded no exit), ``ejected`` (it was enabled, then the kernel disabled
    it or it recorded an exit) or ``never enabled``."""
    try:
        state: str | None = str(sysfs.read_state())
        ops = sysfs.read_ops()
    except SchedSwitchError:
        state, ops = None, None
    record = _exit_record(obj, spec)
    running = state == ENABLED and ops == ops_name and record is None
    verdict = ENABLED if running else (EJECTED if enabled_once else NEVER_ENABLED)
    return {"state": state, "ops": ops, "expected_ops": ops_name, "exit": record,
            "verdict": verdict}  # fmt: skip


#: How long an ejection seen as ``disabling`` may take to reach ``disabled`` (seconds).
EJECTION_SETTLE_S = 10.0


def _settled_ejection(
    obj: LoadedObject, spec: ObjectSpec, ops_name: str, scx: dict[str, Any]
) -> dict[str, Any]:
    """``scx`` (a verdict of :func:`_sched_ext_verdict` that is not ``enabled``) once the
    kernel has finished disabling: the state reads ``disabling`` from the ejection on, and the
    kernel calls ``ops.exit``, which writes the exit record, before it reads ``disabled``
    (``scx_disable_workfn``). Read any earlier and the record may still be empty. Waits at
    most :data:`EJECTION_SETTLE_S`; returns the last verdict read."""
    settle = time.monotonic() + EJECTION_SETTLE_S
    while scx["exit"] is None and scx["state"] == "disabling" and time.monotonic() < settle:
        time.sleep(0.05)
        scx = _sched_ext_verdict(obj, spec, ops_name, enabled_once=True)
    return scx


def _load_and_print(args: argparse.Namespace) -> int:
    spec, note = open_object_noted(args.object)
    spec.link_programs()  # a malformed program is reported before anything is loaded
    registry = KernelBtfRegistry()
    profiled: ProfiledSpec | None = None
    if args.profile:
        profile = load_profile(find_profile(args.profile, base=Path.cwd()))
        profiled = profile_spec(
            spec,
            profile,
            read_topology(args.sysfs),
            mode=args.mode,
            kernel_btf=registry.vmlinux,
        )
        spec = profiled.spec
    elif args.mode:
        raise CustomizationError("--mode needs --profile")
    spec, ops_flags = apply_ops_flags(spec, registry.vmlinux, args.ops_flag, args.require_ops_flag)
    spec = apply_sets(spec, args.set)  # --set wins over the profile and --ops-flag
    targets = registry.targets(spec.kmod_btfs)
    pins: dict[str, str] = {}
    stats: dict[str, int] = {}
    scx_map = next(
        (
            m.name
            for m in spec.struct_ops_maps
            if m.struct_ops is not None and m.struct_ops.type_name == "sched_ext_ops"
        ),
        None,
    )
    scx_ops = ops_name_of(spec, scx_map) if scx_map is not None else None
    scx: dict[str, Any] | None = None
    with (
        _sched_ext_note(spec),
        load_object(
            spec, targets, open_btf_object=registry.open_btf_object, fill_enums=args.fill_enums
        ) as obj,
    ):
        if profiled is not None:
            run_before_attach(obj, profiled.plan)
        try:
            if obj.struct_ops_values:
                plan = profiled.plan if profiled is not None else None
                if plan is not None:
                    attach_from_cpu(obj, plan, obj.attach_struct_ops)
                else:
                    obj.attach_struct_ops()  # the other programs first, as a skeleton's
            else:
                obj.attach_programs()
        except SchedSwitchError as exc:
            if scx_ops is None:
                raise
            # The kernel refused to enable it (ops.init failed, another scheduler runs):
            # say what it recorded, the way an ejection is said.
            scx = _sched_ext_verdict(obj, spec, scx_ops, enabled_once=False)
            if args.json:
                error = {"code": exc.code, "message": str(exc)}
                print(json.dumps({"error": error, "sched_ext": scx}, sort_keys=True))
                return 1
            rec = scx["exit"]
            if rec is None:
                raise
            raise LoadError(f"{exc}; the scheduler's exit record: {rec['reason']}: "
                            f"{rec['message']} (exit kind {rec['kind']})") from exc  # fmt: skip
        if scx_ops is not None:
            # The kernel enables a scheduler before BPF_LINK_CREATE returns: not enabled
            # now means never enabled (ops.init failed, or another scheduler runs).
            scx = _sched_ext_verdict(obj, spec, scx_ops, enabled_once=False)
        if profiled is not None and (scx is None or scx["verdict"] == ENABLED):
            run_after_attach(obj, profiled.plan)
            stats = read_stats(obj, profiled.plan)
        if scx is not None and scx["verdict"] == ENABLED:
            deadline = time.monotonic() + max(0.0, args.watch)
            while True:
                scx = _sched_ext_verdict(obj, spec, scx_ops or "", enabled_once=True)
                if scx["verdict"] != ENABLED:
                    scx = _settled_ejection(obj, spec, scx_ops or "", scx)
                    break
                if time.monotonic() >= deadline:
                    break
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        info = describe_loaded(obj)
        if args.pin and scx is not None and scx["verdict"] != ENABLED:
            args.pin = None  # nothing the kernel threw out is kept
        if args.pin:
            pins = pin_object(obj, args.pin)
    info["pinned"] = pins
    if ops_flags is not None:
        info["ops_flags"] = ops_flags.as_dict()
    if note:
        info["embedded"] = note
    if profiled is not None:
        info["profile"] = {
            "name": profiled.resolved.name,
            "mode": profiled.resolved.mode,
            "notes": profiled.plan.notes,
            "stats": stats,
        }
    failed = scx is not None and scx["verdict"] != ENABLED
    if scx is not None:
        info["sched_ext"] = scx
    if args.json:
        print(json.dumps(info, sort_keys=True))
        return 1 if failed else 0
    if note:
        print(note)
    if profiled is not None:
        mode = f" mode {profiled.resolved.mode}" if profiled.resolved.mode else ""
        print(f"profile {profiled.resolved.name}{mode} ({profiled.topology.describe()})")
        for n in profiled.plan.notes:
            print(f"  note: {n}")
        for k, v in stats.items():
            print(f"  stat {k} = {v}")
    for p in info["programs"]:
        print(f"prog {p['name']:<24} id {p['id']:<6} {p['insns']} insns")
    for m in info["maps"]:
        print(f"map  {m['name']:<24} id {m['id']:<6} {m['kind']}")
    for link in info["links"]:
        print(f"link {link}")
    if ops_flags is not None:
        names = ", ".join(n for n, _ in ops_flags.found) or "none"
        print(f"ops flags: {ops_flags.value:#x} ({names})")
        for line in ops_flags.notes:
            print(f"note: {line}")
    if obj.enum_fill != EnumFillReport():
        print(f"enums: {obj.enum_fill.summary()}")
    elif not args.fill_enums:
        print("enums: not filled (--no-fill-enums)")
    for link in info["program_links"]:
        print(f"link {link} (program)")
    for note in info["notes"]:
        print(f"note: {note}")
    timings = " ".join(f"{k} {v / 1e6:.2f}" for k, v in info["timings_ns"].items())
    print(f"timings (ms): {timings}")
    if scx is not None:
        rec = scx["exit"]
        why = f": {rec['reason']}: {rec['message']} (exit kind {rec['kind']})" if rec else ""
        kernel = f"state {scx['state']}, ops {scx['ops'] or '-'}"
        if failed:
            print(f"sched_ext: {scx['verdict'].upper()} ({kernel}){why}", file=sys.stderr)
        else:
            print(f"sched_ext: enabled ({kernel})")
    print(f"pinned under {args.pin}" if args.pin else "unloaded (no --pin)")
    return 1 if failed else 0


def _unload(args: argparse.Namespace) -> int:
    removed = unpin_directory(args.dir)
    left = sorted(os.listdir(args.dir)) if os.path.isdir(args.dir) else []
    if args.json:
        print(json.dumps({"removed": removed, "left": left}))
        return 0
    print(f"removed {len(removed)} pins from {args.dir}")
    if left:
        print(f"kept {args.dir}: it still holds {', '.join(left)} (not made by `object load`)")
    return 0
