"""Property tests: mutated real BTF only ever raises BtfError (never IndexError, RecursionError,
a hang or another exception), whatever lookup is called on it."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Kind
from schedswitchd.errors import BtfError
from tests import fuzzing
from tests.bpf.btf.fuzz_seeds import SLICE, VMLINUX, exercise, seeds, split_base, split_seed


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
