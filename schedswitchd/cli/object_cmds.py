"""``schedswitchctl object load|unload``: load a BPF object with our loader, no daemon.

``object load OBJ [--pin DIR] [--set VAR=VALUE ...] [--no-fill-enums] [--json] [--verbose]``
opens the object, applies ``--set`` (a global variable ``VAR``, or ``MAP.MEMBER`` of a
struct_ops variable), loads it (setting its ``__SCX_*`` enum variables from the kernel's
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
import json
import os
import sys
from typing import Any

from schedswitchd.bpf.customize import set_struct_ops_member, set_variable
from schedswitchd.bpf.enum_vars import EnumFillReport
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.errors import CustomizationError, LoadError, SchedSwitchError
from schedswitchd.kernel.btf_registry import KernelBtfRegistry
from schedswitchd.kernel.loader import LoadedObject, load_object
from schedswitchd.kernel.pins import pin_object, unpin_directory


def _object_subparsers(sub: Any) -> Any:
    """The sub-parsers of the ``object`` family (created by ``object_cmd`` for
    ``inspect``; created here if that family is absent)."""
    obj = sub.choices.get("object")
    if obj is None:
        obj = sub.add_parser("object", help="BPF objects")
        return obj.add_subparsers(dest="object_command", metavar="SUBCOMMAND", required=True)
    for action in obj._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return obj.add_subparsers(dest="object_command", metavar="SUBCOMMAND", required=True)


def register(sub: Any) -> None:
    """Add ``object load`` / ``object unload`` to ``schedswitchctl``."""
    osub = _object_subparsers(sub)
    load = osub.add_parser("load", help="load (and attach struct_ops of) a BPF object")
    load.add_argument("object", help="path of a BPF ELF object (.bpf.o)")
    load.add_argument("--pin", metavar="DIR", help="pin links/programs/maps here and keep them")
    load.add_argument(
        "--set",
        metavar="VAR=VALUE",
        action="append",
        default=[],
        help="set a global variable or a struct_ops member (MAP.MEMBER=VALUE) before load",
    )
    load.add_argument(
        "--no-fill-enums",
        dest="fill_enums",
        action="store_false",
        help="leave the object's __SCX_* enum variables as compiled (default: set each from "
        "the kernel BTF's enumerator of that name without the leading __)",
    )
    load.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (on a program-load failure: the error and verifier log)",
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
    unload.add_argument("dir")
    unload.add_argument("--json", action="store_true", help="print one JSON object")
    unload.set_defaults(handler=_unload)


def parse_value(text: str) -> object:
    """``--set`` values: ``true``/``false``, integers (``0x`` hex too), else the string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text, 0)
    except ValueError:
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


def describe(obj: LoadedObject) -> dict[str, Any]:
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
        log = getattr(exc, "verifier_log", None)
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


def _load_and_print(args: argparse.Namespace) -> int:
    spec = apply_sets(open_object(args.object), args.set)
    registry = KernelBtfRegistry()
    targets = registry.targets(spec.kmod_btfs)
    pins: dict[str, str] = {}
    with load_object(
        spec, targets, open_btf_object=registry.open_btf_object, fill_enums=args.fill_enums
    ) as obj:
        if obj.struct_ops_values:
            obj.attach_struct_ops()  # the other programs first, as a skeleton's attach
        else:
            obj.attach_programs()
        info = describe(obj)
        if args.pin:
            pins = pin_object(obj, args.pin)
    info["pinned"] = pins
    if args.json:
        print(json.dumps(info, sort_keys=True))
        return 0
    for p in info["programs"]:
        print(f"prog {p['name']:<24} id {p['id']:<6} {p['insns']} insns")
    for m in info["maps"]:
        print(f"map  {m['name']:<24} id {m['id']:<6} {m['kind']}")
    for link in info["links"]:
        print(f"link {link}")
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
    print(f"pinned under {args.pin}" if args.pin else "unloaded (no --pin)")
    return 0


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
