"""BTF whose types refer to themselves (an ARRAY naming itself as its element type, a
struct member of its own struct type, a pointer to itself) makes ``open_object`` raise
``ObjectError``/``BtfError`` or open: every walk over BTF types is bounded, as libbpf's are
(``MAX_RESOLVE_DEPTH``, its one-level ``find_kcfg_type``), so no input reaches Python's
recursion limit. Layouts: kernel doc ``Documentation/bpf/btf.rst``."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Array, Kind
from schedswitchd.bpf.elf import read_elf
from schedswitchd.bpf.object import open_object
from schedswitchd.errors import BtfError, ObjectError

Obj = Callable[[str], Path]

# kinds whose size/type word (at +8) names another type
_REFS = frozenset(
    {
        Kind.PTR, Kind.TYPEDEF, Kind.CONST, Kind.VOLATILE, Kind.RESTRICT, Kind.TYPE_TAG,
        Kind.VAR, Kind.FUNC, Kind.DECL_TAG, Kind.FUNC_PROTO,
    }
)  # fmt: skip


def _btf(data: bytes) -> tuple[Btf, int]:
    """The object's ``.BTF`` and its byte offset in the file."""
    sec = read_elf(data).section_by_name(".BTF")
    assert sec is not None
    return Btf.from_bytes(sec.data), data.index(sec.data)


def _type_fields(data: bytes) -> list[tuple[int, int]]:
    """(type id, file offset) of every u32 in ``.BTF`` that names another type: the
    size/type word of references, an ARRAY's element type, member and parameter types."""
    btf, base = _btf(data)
    out: list[tuple[int, int]] = []
    for tid in btf.own_ids():
        kind = btf.kind(tid)
        at = base + btf.type_offset(tid)
        (info,) = struct.unpack_from("<I", data, at + 4)
        vlen = info & 0xFFFF
        if kind in _REFS:
            out.append((tid, at + 8))
        if kind == Kind.ARRAY:
            out.append((tid, at + 12))
        elif kind in (Kind.STRUCT, Kind.UNION):
            out += [(tid, at + 12 + 12 * i + 4) for i in range(vlen)]
        elif kind == Kind.FUNC_PROTO:
            out += [(tid, at + 12 + 8 * i + 4) for i in range(vlen)]
    return out


def _with_u32(data: bytes, at: int, value: int) -> bytes:
    buf = bytearray(data)
    struct.pack_into("<I", buf, at, value)
    return bytes(buf)


def test_kconfig_char_array_naming_itself_is_an_object_error(bpf_object: Obj) -> None:
    # CONFIG_DEFAULT_HOSTNAME is `char [16]`: its ARRAY's element type becomes the ARRAY
    # itself. The kconfig type check recursed into the element without bound.
    data = bpf_object("kconfig").read_bytes()
    btf, base = _btf(data)
    (tid,) = [t for t in btf.own_ids() if isinstance(a := btf.type(t), Array) and a.nelems == 16]
    bad = _with_u32(data, base + btf.type_offset(tid) + 12, tid)
    with pytest.raises(ObjectError, match="'CONFIG_DEFAULT_HOSTNAME' has an unsupported type"):
        open_object(bad)


def test_kconfig_array_of_char_arrays_is_refused(bpf_object: Obj) -> None:
    # libbpf's find_kcfg_type takes one level of array: char[4][16] is not a kconfig type.
    data = bpf_object("kconfig").read_bytes()
    btf, base = _btf(data)
    arrays = {t: a for t in btf.own_ids() if isinstance(a := btf.type(t), Array)}
    outer = next(t for t, a in arrays.items() if a.nelems == 16)
    inner = next(t for t in arrays if t != outer)  # LICENSE's char[4]
    bad = _with_u32(data, base + btf.type_offset(outer) + 12, inner)
    with pytest.raises(ObjectError, match="'CONFIG_DEFAULT_HOSTNAME' has an unsupported type"):
        open_object(bad)


@pytest.mark.parametrize("name", ["kconfig", "globals", "struct_ops", "maps"])
def test_every_type_reference_pointing_back(bpf_object: Obj, name: str) -> None:
    """Each type reference in turn names its own type, or the type before it (a cycle of
    two through a neighbour): the object opens and links, or a typed error says why."""
    data = bpf_object(name).read_bytes()
    fields = _type_fields(data)
    assert len(fields) > 10
    defects: list[str] = []
    for tid, at in fields:
        for target in {tid, max(1, tid - 1)}:
            try:
                open_object(_with_u32(data, at, target), name="cyclic").link_programs()
            except (ObjectError, BtfError):
                pass
            except Exception as exc:  # anything untyped is the defect
                defects.append(f"type {tid} -> {target}: {type(exc).__name__}")
    assert not defects, defects
