"""BTF as JSON in the shape of ``bpftool btf dump file PATH [-B BASE] format raw -j``.

The shape follows bpftool's ``dump_btf_type`` (bpftool ``src/btf.c``): one object per type with
``id``, ``kind`` (``BTF_KIND_*`` name), ``name`` (``"(anon)"`` when empty) and kind-specific
fields. Quirk kept on purpose so the two diff clean: bpftool prints the values of an
*unsigned* ENUM (32-bit) by widening the stored ``__s32`` to ``u64``, so ``0xffffffff`` comes
out as ``18446744073709551615``. Split BTF dumps only its own types (ids from ``start_id``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import (
    Array,
    BtfType,
    Composite,
    Datasec,
    DeclTag,
    Enum,
    Float,
    Func,
    FuncProto,
    Fwd,
    Int,
    Kind,
    Ref,
    Var,
)
from schedswitchd.errors import BtfError

__all__ = ["btf_to_json", "main", "type_to_json"]

_INT_ENCODING = {0: "(none)", 1: "SIGNED", 2: "CHAR", 4: "BOOL"}
_LINKAGE = {0: "static", 1: "global", 2: "extern"}


def _n(name: str) -> str:
    return name or "(anon)"


def _enum32_val(value: int, signed: bool) -> int:
    if signed:
        return value
    return value | 0xFFFFFFFF00000000 if value & 0x80000000 else value


def type_to_json(t: BtfType) -> dict[str, Any]:
    """One decoded type as bpftool's JSON object (key order as bpftool prints it)."""
    out: dict[str, Any] = {"id": t.id, "kind": t.kind.name, "name": _n(t.name)}
    if isinstance(t, Int):
        out["size"] = t.size
        out["bits_offset"] = t.offset
        out["nr_bits"] = t.bits
        out["encoding"] = _INT_ENCODING.get(t.encoding, "UNKN")
    elif isinstance(t, Ref):
        out["type_id"] = t.type
    elif isinstance(t, Array):
        out["type_id"] = t.type
        out["index_type_id"] = t.index_type
        out["nr_elems"] = t.nelems
    elif isinstance(t, Composite):
        out["size"] = t.size
        out["vlen"] = len(t.members)
        members = []
        for m in t.members:
            mj: dict[str, Any] = {
                "name": _n(m.name),
                "type_id": m.type,
                "bits_offset": m.bit_offset,
            }
            if m.bitfield_size:
                mj["bitfield_size"] = m.bitfield_size
            members.append(mj)
        out["members"] = members
    elif isinstance(t, Enum):
        out["encoding"] = "SIGNED" if t.signed else "UNSIGNED"
        out["size"] = t.size
        out["vlen"] = len(t.values)
        if t.kind == Kind.ENUM:
            out["values"] = [
                {"name": _n(v.name), "val": _enum32_val(v.value, t.signed)} for v in t.values
            ]
        else:
            out["values"] = [{"name": _n(v.name), "val": v.value} for v in t.values]
    elif isinstance(t, Fwd):
        out["fwd_kind"] = "union" if t.is_union else "struct"
    elif isinstance(t, Func):
        out["type_id"] = t.type
        out["linkage"] = _LINKAGE.get(t.linkage, "(unknown)")
    elif isinstance(t, FuncProto):
        out["ret_type_id"] = t.return_type
        out["vlen"] = len(t.params)
        out["params"] = [{"name": _n(p.name), "type_id": p.type} for p in t.params]
    elif isinstance(t, Var):
        out["type_id"] = t.type
        out["linkage"] = _LINKAGE.get(t.linkage, "(unknown)")
    elif isinstance(t, Datasec):
        out["size"] = t.size
        out["vlen"] = len(t.vars)
        out["vars"] = [{"type_id": v.type, "offset": v.offset, "size": v.size} for v in t.vars]
    elif isinstance(t, Float):
        out["size"] = t.size
    elif isinstance(t, DeclTag):
        out["type_id"] = t.type
        out["component_idx"] = t.component_idx
    return out


def btf_to_json(btf: Btf) -> dict[str, Any]:
    """``{"types": [...]}`` for this BTF's own types, as bpftool's raw JSON dump."""
    return {"types": [type_to_json(btf.type(i)) for i in btf.own_ids()]}


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: print the JSON of ``PATH`` (split on ``--base``); exit 1 with a message on
    ``BtfError``."""
    ap = argparse.ArgumentParser(
        prog="python -m schedswitchd.bpf.btf",
        description="Dump BTF as JSON shaped like `bpftool btf dump file PATH format raw -j`.",
    )
    ap.add_argument("path", help="raw BTF file or ELF file with a .BTF section")
    ap.add_argument("--base", "-B", help="base BTF for split BTF (e.g. /sys/kernel/btf/vmlinux)")
    args = ap.parse_args(argv)
    try:
        base = Btf.from_file(args.base) if args.base else None
        btf = Btf.from_file(args.path, base=base)
        doc = btf_to_json(btf)
    except BtfError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = sys.stdout
    out.write('{"types":[')
    for i, t in enumerate(doc["types"]):
        if i:
            out.write(",")
        out.write(json.dumps(t, separators=(",", ":"), ensure_ascii=False))
    out.write("]}\n")
    return 0
