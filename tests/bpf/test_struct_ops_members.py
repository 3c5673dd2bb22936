"""A struct_ops member whose BTF bit offset puts it (partly) past the end of its struct is
refused at open with ``ObjectError``, as the kernel's BTF check refuses it ("Member exceeds
struct_size", ``kernel/bpf/btf.c``): every edit of the struct_ops data (the daemon's
``timeout_ms``) and the value the loader builds slice the data by the member's place.
``sched_ext_ops`` of ``make schedulers``' ``fifo.bpf.o``; layouts: kernel doc
``Documentation/bpf/btf.rst``."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Composite, Kind
from schedswitchd.bpf.elf import read_elf
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.scheduler import apply_tunables, sched_ext_map
from schedswitchd.errors import ObjectError
from tests.build_outputs import missing_build_output

FIFO = Path(__file__).resolve().parents[2] / "build" / "bpf" / "fifo.bpf.o"


def _fifo() -> bytes:
    if not FIFO.is_file():
        missing_build_output(FIFO, "schedulers")
    return FIFO.read_bytes()


def _with_member_bit_offset(data: bytes, member: str, bit_offset: int) -> tuple[bytes, int]:
    """``data`` with ``sched_ext_ops.member``'s ``offset`` word set to ``bit_offset``, and
    the struct's size in bytes."""
    sec = read_elf(data).section_by_name(".BTF")
    assert sec is not None
    btf = Btf.from_bytes(sec.data)
    tid = btf.find("sched_ext_ops", Kind.STRUCT)
    assert tid is not None
    st = btf.type(tid)
    assert isinstance(st, Composite)
    i = next(i for i, m in enumerate(st.members) if m.name == member)
    # btf_type (12 bytes), then btf_member {name_off, type, offset} per member
    at = data.index(sec.data) + btf.type_offset(tid) + 12 + 12 * i + 8
    buf = bytearray(data)
    struct.pack_into("<I", buf, at, bit_offset)
    return bytes(buf), st.size


@pytest.mark.parametrize("past_bits", [16, 32, 8 * 1024])
def test_member_past_the_struct_is_refused_at_open(past_bits: int) -> None:
    # timeout_ms is a u32: 16 bits past the end leaves half of it inside the struct.
    data, size = _with_member_bit_offset(_fifo(), "timeout_ms", 0)
    data, size = _with_member_bit_offset(data, "timeout_ms", 8 * size - 32 + past_bits)
    with pytest.raises(ObjectError, match=r"member 'timeout_ms' .* past the end of its"):
        spec = open_object(data)
        apply_tunables(spec, sched_ext_map(spec), {}, {"timeout_ms": 5000})


def test_last_member_ending_at_the_struct_end_still_sets() -> None:
    # the bound is the struct's end itself: a u32 in its last 4 bytes is inside
    data, size = _with_member_bit_offset(_fifo(), "timeout_ms", 0)
    data, size = _with_member_bit_offset(data, "timeout_ms", 8 * (size - 4))
    spec = open_object(data)
    ops = sched_ext_map(spec)
    spec = apply_tunables(spec, ops, {}, {"timeout_ms": 5000})
    so = spec.map(ops).struct_ops
    assert so is not None
    assert so.data[size - 4 :] == (5000).to_bytes(4, "little")
