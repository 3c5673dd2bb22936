"""Property tests: mutated real BTF only ever raises BtfError (never IndexError, RecursionError,
a hang or another exception), whatever lookup is called on it."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
from tests import fuzzing

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


def _every_kind(b: BtfBuilder) -> None:
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
    _every_kind(b)
    out = [b.build()]
    if VMLINUX.exists():
        vb = BtfBuilder()
        reencode(Btf.from_file(VMLINUX), range(1, SLICE), vb)
        out.append(vb.build())
    return tuple(out)


@cache
def split_base() -> Btf:
    b = BtfBuilder()
    _every_kind(b)
    return Btf.from_bytes(b.build(), name="base")


@cache
def split_seed() -> bytes:
    b = BtfBuilder(split_base())
    _every_kind(b)
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


def _mutate(data: bytes, edits: list[tuple[int, int]], words: list[tuple[int, int]]) -> bytes:
    buf = bytearray(data)
    for pos, val in edits:
        buf[pos % len(buf)] = val
    for pos, val in words:  # whole 32-bit words: hits info/vlen/size/type fields at once
        at = (pos % (len(buf) // 4)) * 4
        buf[at : at + 4] = struct.pack("<I", val)
    return bytes(buf)


_word_values = st.one_of(
    st.integers(0, 0xFFFFFFFF),
    st.sampled_from([0, 1, 2, 3, 0xFFFF, 0x80000000, 0xFFFFFFFF, 20 << 24, 0x84000003]),
    st.integers(0, 19).map(lambda k: (k << 24) | 0x0001),
)


@pytest.fixture(scope="module", autouse=True)
def _bounded_memory() -> Iterator[None]:
    with fuzzing.address_space_headroom():
        yield
    fuzzing.flush()


def _parse_and_exercise(test: str, data: bytes, base: Btf | None = None) -> None:
    try:
        btf = Btf.from_bytes(data, base=base)
    except BtfError:
        fuzzing.record(test, "BtfError")
        return
    except BaseException as exc:
        fuzzing.record(test, f"defect:{fuzzing.exception_name(exc)}")
        raise
    try:
        exercise(btf)
    except BaseException as exc:
        fuzzing.record(test, f"defect:{fuzzing.exception_name(exc)}")
        raise
    fuzzing.record(test, "parsed")


@settings(
    max_examples=fuzzing.examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 7),
    edits=st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), max_size=6),
    words=st.lists(st.tuples(st.integers(0, 1 << 30), _word_values), max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 1 << 30)),
)
def test_mutated_btf_raises_only_btf_error(
    seed: int, edits: list[tuple[int, int]], words: list[tuple[int, int]], cut: int | None
) -> None:
    pool = seeds()
    data = _mutate(pool[seed % len(pool)], edits, words)
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    _parse_and_exercise("btf:bytes_and_words", data)


@settings(max_examples=fuzzing.examples(150), deadline=None)
@given(
    edits=st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), max_size=6),
    words=st.lists(st.tuples(st.integers(0, 1 << 30), _word_values), max_size=4),
)
def test_mutated_split_btf_raises_only_btf_error(
    edits: list[tuple[int, int]], words: list[tuple[int, int]]
) -> None:
    data = _mutate(split_seed(), edits, words)
    _parse_and_exercise("btf:split", data, split_base())


@cache
def _size_fields(seed: int) -> tuple[int, ...]:
    """Byte offsets of the size words of seed ``seed``: ARRAY ``nelems``, the ``size`` of
    INT/STRUCT/UNION/ENUM/FLOAT/DATASEC, DATASEC entry offsets and sizes, struct member
    offsets (kernel doc ``Documentation/bpf/btf.rst``)."""
    data = seeds()[seed]
    btf = Btf.from_bytes(data)
    out: list[int] = []
    for tid in btf.own_ids():
        at = btf.type_offset(tid)
        kind = btf.kind(tid)
        (info,) = struct.unpack_from("<I", data, at + 4)
        vlen = info & 0xFFFF
        if kind == Kind.ARRAY:
            out.append(at + 20)
        elif kind in (Kind.INT, Kind.ENUM, Kind.ENUM64, Kind.FLOAT):
            out.append(at + 8)
        elif kind in (Kind.STRUCT, Kind.UNION):
            out.append(at + 8)
            out.extend(at + 12 + 12 * i + 8 for i in range(vlen))
        elif kind == Kind.DATASEC:
            out.append(at + 8)
            for i in range(vlen):
                out.extend((at + 12 + 12 * i + 4, at + 12 + 12 * i + 8))
    return tuple(out)


_size_values = st.one_of(
    st.integers(0, 0xFFFFFFFF),
    st.integers(0, 64),
    st.sampled_from([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFF0, 0xFFFFFFFF, 1 << 24, 0x10000]),
)


@settings(
    max_examples=fuzzing.examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_mutated_size_fields_raise_only_btf_error(data: st.DataObject) -> None:
    """Array lengths, type sizes, DATASEC/VAR sizes and offsets set to boundary values:
    size_of/align_of and every other lookup still raise only BtfError."""
    seed = data.draw(st.integers(0, len(seeds()) - 1))
    buf = bytearray(seeds()[seed])
    fields = _size_fields(seed)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.sampled_from(fields))
        struct.pack_into("<I", buf, at, data.draw(_size_values))
    _parse_and_exercise("btf:size_fields", bytes(buf))


def test_seeds_are_valid_and_reencoding_is_faithful() -> None:
    for data in seeds():
        exercise(Btf.from_bytes(data))
    if VMLINUX.exists():
        src = Btf.from_file(VMLINUX)
        copy = Btf.from_bytes(seeds()[1])
        assert [src.type(i) for i in range(1, SLICE)] == [copy.type(i) for i in range(1, SLICE)]
