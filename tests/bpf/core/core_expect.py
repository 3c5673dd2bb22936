"""Expected CO-RE values computed from bpftool's JSON dump of a BTF, independently of the
engine and of our BTF reader: ``bpftool btf dump file PATH -j``.

Only what the CO-RE tests need: struct lookup by name, member offsets (searching anonymous
members depth first, as C name lookup does), type sizes, enum values, and the bitfield
load window (smallest naturally aligned load of at least the declared type's size).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ANON = "(anon)"


def bpftool_types(path: Path, base: Path | None = None) -> dict[int, dict[str, Any]]:
    """bpftool's JSON types of ``path`` (split BTF on ``base`` if given) by id."""
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    cmd = [bpftool, "btf", "dump", "file", str(path)]
    if base is not None:
        cmd += ["-B", str(base)]
    out = subprocess.run([*cmd, "-j"], check=True, capture_output=True).stdout
    return {t["id"]: t for t in json.loads(out)["types"]}


@dataclass(frozen=True)
class FieldInfo:
    """A member found by name: absolute ``bit_offset``, ``bitfield_size`` (0 if none),
    its type id and the size in bytes of that type (through typedefs/modifiers)."""

    bit_offset: int
    bitfield_size: int
    type_id: int
    size: int


class JsonBtf:
    """Lookups over bpftool's JSON types."""

    def __init__(self, types: dict[int, dict[str, Any]]) -> None:
        self.types = types

    def find(self, name: str, kind: str) -> dict[str, Any]:
        hits = [t for t in self.types.values() if t.get("name") == name and t["kind"] == kind]
        assert len(hits) == 1, f"{kind} {name}: {len(hits)} hits"
        return hits[0]

    def resolve(self, type_id: int) -> dict[str, Any]:
        t = self.types[type_id]
        while t["kind"] in ("TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"):
            t = self.types[t["type_id"]]
        return t

    def size(self, type_id: int) -> int:
        t = self.resolve(type_id)
        if t["kind"] == "ARRAY":
            return int(t["nr_elems"]) * self.size(t["type_id"])
        if t["kind"] == "PTR":
            return 8
        return int(t["size"])

    def member(self, struct: dict[str, Any], name: str, base: int = 0) -> FieldInfo | None:
        for m in struct["members"]:
            off = base + int(m["bits_offset"])
            if m["name"] == ANON:
                inner = self.member(self.resolve(m["type_id"]), name, off)
                if inner is not None:
                    return inner
            elif m["name"] == name:
                bits = int(m.get("bitfield_size", 0))
                return FieldInfo(off, bits, m["type_id"], self.size(m["type_id"]))
        return None

    def enum_value(self, enum_name: str, value_name: str) -> int:
        for kind in ("ENUM", "ENUM64"):
            hits = [
                t for t in self.types.values() if t.get("name") == enum_name and t["kind"] == kind
            ]
            for t in hits:
                for v in t["values"]:
                    if v["name"] == value_name:
                        return int(v["val"])
        raise KeyError(f"{enum_name}::{value_name}")


def bitfield_window(f: FieldInfo) -> tuple[int, int, int, int]:
    """``(byte_offset, byte_size, lshift, rshift)`` for reading bitfield ``f`` with one
    load into a u64 on a little-endian machine: ``(x << lshift) >> rshift``."""
    size = f.size
    while True:
        start = f.bit_offset // 8 // size * size
        if f.bit_offset + f.bitfield_size <= (start + size) * 8:
            break
        size *= 2
    used = f.bit_offset + f.bitfield_size - start * 8
    return start, size, 64 - used, 64 - f.bitfield_size
