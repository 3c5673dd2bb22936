"""The xlated comparison ignores only per-load values."""

from __future__ import annotations

from schedswitchd.bpf import insn
from tests.xlated import differences


def _s32(v: int) -> int:
    return v - (1 << 32) if v & 0x80000000 else v


def _ld(dst: int, src: int, value: int) -> bytes:
    lo, hi = _s32(value & 0xFFFFFFFF), _s32(value >> 32)
    return insn.Insn(insn.LD_IMM64, dst, src, 0, lo).encode() + insn.Insn(0, 0, 0, 0, hi).encode()


EXIT = insn.Insn(insn.CLASS_JMP | insn.OP_EXIT, 0, 0, 0, 0).encode()


def test_map_ids_and_kernel_pointers_are_ignored() -> None:
    a = _ld(1, insn.PSEUDO_MAP_VALUE, 7) + _ld(5, 0, 0xFFFF888102030000) + EXIT
    b = _ld(1, insn.PSEUDO_MAP_VALUE, 9) + _ld(5, 0, 0xFFFF888104050000) + EXIT
    assert differences(a, b) == []
    la57 = _ld(5, 0, 0xFF4A022E42B0F000) + EXIT  # 5-level paging (qemu -cpu max)
    assert differences(la57, _ld(5, 0, 0xFF4A022E42B0E800) + EXIT) == []


def test_real_differences_are_reported() -> None:
    base = _ld(1, 0, 5) + EXIT
    assert differences(base, _ld(1, 0, 6) + EXIT)  # a constant, not a kernel address
    assert differences(base, _ld(2, 0, 5) + EXIT)  # another register
    assert differences(base, base + EXIT)  # length
    off_a = _ld(1, insn.PSEUDO_MAP_VALUE, 7)[:8] + insn.Insn(0, 0, 0, 0, 16).encode()
    off_b = _ld(1, insn.PSEUDO_MAP_VALUE, 7)[:8] + insn.Insn(0, 0, 0, 0, 24).encode()
    assert differences(off_a + EXIT, off_b + EXIT)  # the value offset matters
