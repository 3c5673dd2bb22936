"""The BTF fuzzing seeds and the lookup sweep, shared by the property tests
(:mod:`tests.bpf.btf.test_btf_fuzz`) and the long-running fuzzer's BTF surface
(:mod:`tools.fuzz_targets`): a module of its own so tools/ never imports a test module."""

from __future__ import annotations

import contextlib
from functools import cache
from pathlib import Path

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.json_dump import btf_to_json
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

VMLINUX = Path("/sys/kernel/btf/vmlinux")
SLICE = 400  # types re-encoded from the host's vmlinux BTF


def reencode(src: Btf, ids: range, b: BtfBuilder) -> None:
    """Append ``src``'s types ``ids`` to ``b`` unchanged (ids are kept when ``ids`` starts at
    ``b.next_id``); references past the slice stay dangling on purpose."""
    for tid in ids:
        t: BtfType = src.type(tid)
        if isinstance(t, Int):
            b.add_int(t.name, t.size, encoding=t.encoding, bits=t.bits, offset=t.offset)
        elif isinstance(t, Ref):
            b.add_raw(t.kind, t.name, 0, False, t.type)
        elif isinstance(t, Array):
            b.add_array(t.type, t.index_type, t.nelems)
        elif isinstance(t, Composite):
            members = [(m.name, m.type, m.bit_offset, m.bitfield_size) for m in t.members]
            if t.kind == Kind.STRUCT:
                b.add_struct(t.name, t.size, members)
            else:
                b.add_union(t.name, t.size, members)
        elif isinstance(t, Enum):
            values = [(v.name, v.value) for v in t.values]
            if t.kind == Kind.ENUM:
                b.add_enum(t.name, t.size, values, t.signed)
            else:
                b.add_enum64(t.name, t.size, values, t.signed)
        elif isinstance(t, Fwd):
            b.add_fwd(t.name, t.is_union)
        elif isinstance(t, Func):
            b.add_func(t.name, t.type, t.linkage)
        elif isinstance(t, FuncProto):
            b.add_func_proto(t.return_type, [(p.name, p.type) for p in t.params])
        elif isinstance(t, Var):
            b.add_var(t.name, t.type, t.linkage)
        elif isinstance(t, Datasec):
            b.add_datasec(t.name, t.size, [(v.type, v.offset, v.size) for v in t.vars])
        elif isinstance(t, Float):
            b.add_float(t.name, t.size)
        elif isinstance(t, DeclTag):
            b.add_decl_tag(t.name, t.type, t.component_idx)
        else:  # pragma: no cover
            raise AssertionError(t)


def every_kind(b: BtfBuilder) -> None:
    """Append one type of every BTF kind (and the flavours a lookup treats specially) to ``b``."""
    i = b.add_int("int", 4, signed=True)
    s = b.add_struct("s___flav", 8, [("a", i, 0, 3), ("", i, 32, 0)])
    b.add_union("u", 4, [("x", i, 0, 0)])
    b.add_enum("e", 4, [("NEG", -1)], signed=True)
    b.add_enum64("e64", 8, [("H", (1 << 64) - 1)])
    b.add_fwd("fu", is_union=True)
    b.add_type_tag("tt", b.add_ptr(s))
    proto = b.add_func_proto(i, [("a", i), ("", 0)])
    b.add_func("fn", proto)
    v = b.add_var("v", s)
    b.add_datasec(".data", 8, [(v, 0, 8)])
    b.add_float("double", 8)
    b.add_decl_tag("t", s, 0)
    b.add_restrict(b.add_volatile(b.add_const(b.add_typedef("s_t", s))))
    b.add_array(s, i, 3)


@cache
def seeds() -> tuple[bytes, ...]:
    """Valid BTF blobs to mutate: every kind from the builder, and a slice of vmlinux."""
    b = BtfBuilder()
    every_kind(b)
    out = [b.build()]
    if VMLINUX.exists():
        vb = BtfBuilder()
        reencode(Btf.from_file(VMLINUX), range(1, SLICE), vb)
        out.append(vb.build())
    return tuple(out)


@cache
def split_base() -> Btf:
    """The base BTF (every kind) that :func:`split_seed` is split against."""
    b = BtfBuilder()
    every_kind(b)
    return Btf.from_bytes(b.build(), name="base")


@cache
def split_seed() -> bytes:
    """A split BTF blob (every kind again) on top of :func:`split_base`."""
    b = BtfBuilder(split_base())
    every_kind(b)
    return b.build()


def exercise(btf: Btf) -> None:
    """Call every lookup on every type; only BtfError may come out of each call."""
    names: set[str] = {"", "s", "int", "nope"}
    ids = [0, -1, btf.start_id - 1, btf.end_id, btf.end_id + 7, *btf.own_ids()]
    calls = (
        btf.type,
        btf.kind,
        btf.type_name,
        btf.skip_modifiers,
        btf.skip_mods_and_typedefs,
        btf.size_of,
        btf.align_of,
        btf.type_offset,
    )
    for tid in ids:
        for call in calls:
            with contextlib.suppress(BtfError):
                call(tid)
        try:
            t = btf.type(tid)
            names.add(t.name)
            if isinstance(t, Composite):
                for m in (*t.members[:4], None):
                    btf.find_member(tid, m.name if m else "absent")
        except BtfError:
            pass
    for name in sorted(names)[:50]:
        for kind in Kind:
            for call2 in (btf.find_ids, btf.find, btf.find_by_essential_name):
                with contextlib.suppress(BtfError):
                    call2(name, kind)
    for off in (0, 1, btf.start_str_off + 3, 1 << 31, -1):
        with contextlib.suppress(BtfError):
            btf.string(off)
    with contextlib.suppress(BtfError):
        btf_to_json(btf)
