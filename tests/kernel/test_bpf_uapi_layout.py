"""The hand-written ctypes layouts of ``kernel/bpf_uapi.py`` against the running kernel's BTF.

``union bpf_attr`` and the ``bpf_*_info`` records are described in ``/sys/kernel/btf/vmlinux``
(the kernel's own types, so the layout the kernel reads, not one printed from a header
once). Every member a ctypes class declares is looked up by name with the project's BTF
reader (``schedswitchd.bpf.btf``; anonymous structs/unions of the header are searched
through, as C does) and must sit at the same byte offset with the same size and
signedness; a bitfield must lie inside the ctypes member that carries it. Nested ctypes
structures/unions must match the header's composite size; a top-level class may be a prefix
of the kernel's (members newer than ours are zero to the kernel), but the record arrays
whose size is passed as ``*_rec_size`` must match exactly. Needs only a readable
``/sys/kernel/btf/vmlinux`` (no root).
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

import pytest

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Composite, Int, Kind, Member
from schedswitchd.kernel import bpf_uapi

VMLINUX = "/sys/kernel/btf/vmlinux"

#: Each class and its counterpart: ("union", bpf_attr member name, "" for the anonymous
#: struct that holds the class's first member) or ("struct", struct name).
COUNTERPARTS: dict[type[ctypes.Structure], tuple[str, str]] = {
    bpf_uapi.MapCreateAttr: ("union", ""),
    bpf_uapi.MapElemAttr: ("union", ""),
    bpf_uapi.ProgLoadAttr: ("union", ""),
    bpf_uapi.ObjAttr: ("union", ""),
    bpf_uapi.TestRunAttr: ("union", "test"),
    bpf_uapi.GetIdAttr: ("union", ""),
    bpf_uapi.InfoAttr: ("union", "info"),
    bpf_uapi.BtfLoadAttr: ("union", ""),
    bpf_uapi.LinkCreateAttr: ("union", "link_create"),
    bpf_uapi.RawTracepointOpenAttr: ("union", "raw_tracepoint"),
    bpf_uapi.IterCreateAttr: ("union", "iter_create"),
    bpf_uapi.LinkDetachAttr: ("union", "link_detach"),
    bpf_uapi.ProgBindMapAttr: ("union", "prog_bind_map"),
    bpf_uapi.BpfProgInfo: ("struct", "bpf_prog_info"),
    bpf_uapi.BpfMapInfo: ("struct", "bpf_map_info"),
    bpf_uapi.BpfBtfInfo: ("struct", "bpf_btf_info"),
    bpf_uapi.BpfLinkInfo: ("struct", "bpf_link_info"),
    bpf_uapi.BpfFuncInfo: ("struct", "bpf_func_info"),
    bpf_uapi.BpfLineInfo: ("struct", "bpf_line_info"),
}

#: Records the loader passes as arrays with ``sizeof`` as the record size.
EXACT_SIZE = {bpf_uapi.BpfFuncInfo, bpf_uapi.BpfLineInfo}

#: ctypes members named other than in the header: (class name, member) -> header path
#: (names walked with find_member), or None for an anonymous header member (the one at the
#: same offset that holds the nested class's first member).
RENAMED: dict[tuple[str, str], tuple[str, ...] | None] = {
    ("LinkCreateAttr", "tail"): None,
    ("_LinkCreateTail", "iter"): None,
    ("_LinkCreateTail", "perf_event_cookie"): ("perf_event", "bpf_cookie"),
    ("BpfLinkInfo", "tail"): None,
}

_SIGNED = {
    ctypes.c_int8,
    ctypes.c_int16,
    ctypes.c_int32,
    ctypes.c_int64,
    ctypes.c_byte,
    ctypes.c_char,
}


@functools.cache
def _vmlinux() -> Btf:
    if not os.access(VMLINUX, os.R_OK):
        pytest.skip(f"{VMLINUX} is not readable: the kernel has no BTF")
    return Btf.from_file(VMLINUX)


def _composite(btf: Btf, type_id: int) -> Composite:
    comp = btf.type(btf.skip_mods_and_typedefs(type_id))
    assert isinstance(comp, Composite), f"type {type_id} is not a struct/union"
    return comp


def _holder(btf: Btf, comp_id: int, bit_off: int, first: str) -> Member:
    """The anonymous member of ``comp_id`` at ``bit_off`` that holds member ``first``."""
    hits = [
        m
        for m in _composite(btf, comp_id).members
        if not m.name
        and m.bit_offset == bit_off
        and btf.kind(btf.skip_mods_and_typedefs(m.type)) in (Kind.STRUCT, Kind.UNION)
        and btf.find_member(m.type, first) is not None
    ]
    assert len(hits) == 1, f"{len(hits)} anonymous members at bit {bit_off} hold {first!r}"
    return hits[0]


def _counterpart_id(btf: Btf, cls: type[ctypes.Structure]) -> int:
    kind, name = COUNTERPARTS[cls]
    if kind == "struct":
        tid = btf.find(name, Kind.STRUCT)
        assert tid is not None, f"struct {name} not in {VMLINUX}"
        return tid
    attr = btf.find("bpf_attr", Kind.UNION)
    assert attr is not None, f"union bpf_attr not in {VMLINUX}"
    if name:
        hit = btf.find_member(attr, name)
        assert hit is not None, f"bpf_attr has no member {name!r}"
        return hit[1].type
    return _holder(btf, attr, 0, cls._fields_[0][0]).type


def _leaf_problems(
    btf: Btf, where: str, field: Any, ctype: Any, member: Member, bit: int
) -> list[str]:
    size = btf.size_of(member.type)
    start, end = field.offset * 8, (field.offset + field.size) * 8
    out = []
    if member.bitfield_size:
        if not (start <= bit and bit + member.bitfield_size <= end):
            out.append(f"{where}: bitfield at bit {bit} outside bytes {field.offset}+{field.size}")
        if size != field.size:
            out.append(f"{where}: bitfield's storage is {size} bytes, ctypes {field.size}")
        return out
    if bit != start:
        out.append(f"{where}: offset {field.offset}, kernel {bit / 8:g}")
    if size != field.size:
        out.append(f"{where}: size {field.size}, kernel {size}")
    target = btf.type(btf.skip_mods_and_typedefs(member.type))
    if isinstance(target, Int) and target.signed != (ctype in _SIGNED):
        out.append(f"{where}: signed={ctype in _SIGNED}, kernel signed={target.signed}")
    return out


def _problems(btf: Btf, cls: Any, comp_id: int) -> list[str]:
    """Every mismatch between ctypes class ``cls`` and BTF composite ``comp_id`` (offsets
    of both relative to their own start)."""
    out: list[str] = []
    for name, ctype, *_ in cls._fields_:
        if name.startswith("_"):
            continue  # padding / a member that only sizes a union
        where = f"{cls.__name__}.{name}"
        field = getattr(cls, name)
        path = RENAMED.get((cls.__name__, name), (name,))
        if path is None:
            member = _holder(btf, comp_id, field.offset * 8, ctype._fields_[0][0])
            bit = member.bit_offset
        else:
            bit, cur = 0, comp_id
            hit = None
            for step in path:
                hit = btf.find_member(cur, step)
                if hit is None:
                    break
                bit += hit[0]
                cur = hit[1].type
            if hit is None:
                out.append(f"{where}: no member {'.'.join(path)} in the kernel's type")
                continue
            member = hit[1]
        if isinstance(ctype, type) and issubclass(ctype, (ctypes.Structure, ctypes.Union)):
            if bit != field.offset * 8:
                out.append(f"{where}: offset {field.offset}, kernel {bit / 8:g}")
            size = btf.size_of(member.type)
            if ctypes.sizeof(ctype) != size:
                out.append(f"{where}: size {ctypes.sizeof(ctype)}, kernel {size}")
            out += _problems(btf, ctype, member.type)
        else:
            out += _leaf_problems(btf, where, field, ctype, member, bit)
    return out


@pytest.mark.parametrize("cls", list(COUNTERPARTS), ids=lambda c: c.__name__)
def test_layout_matches_kernel_btf(cls: type[ctypes.Structure]) -> None:
    btf = _vmlinux()
    tid = _counterpart_id(btf, cls)
    problems = _problems(btf, cls, tid)
    kernel_size = btf.size_of(tid)
    size = ctypes.sizeof(cls)
    if cls in EXACT_SIZE and size != kernel_size:
        problems.append(f"sizeof {size}, kernel {kernel_size}")
    if size > kernel_size:
        problems.append(f"sizeof {size} is larger than the kernel's {kernel_size}")
    assert not problems, "\n".join(problems)


def test_every_layout_is_checked() -> None:
    """A new attr/info class in bpf_uapi must get a counterpart here."""
    classes = {
        obj
        for name, obj in vars(bpf_uapi).items()
        if not name.startswith("_")
        and isinstance(obj, type)
        and issubclass(obj, ctypes.Structure)
        and obj.__module__ == bpf_uapi.__name__
    }
    assert classes == set(COUNTERPARTS)
