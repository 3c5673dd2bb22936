"""BPF instructions as stored in ELF sections and passed to ``BPF_PROG_LOAD``.

Source: kernel doc ``Documentation/bpf/standardization/instruction-set.rst`` and UAPI
``include/uapi/linux/bpf.h`` (``struct bpf_insn``). One instruction is 8 bytes, little
endian on x86: ``code:u8, dst_reg:4 | src_reg:4, off:s16, imm:s32``. ``BPF_LD | BPF_IMM |
BPF_DW`` (``ld_imm64``) takes two slots; the second carries the upper 32 bits in ``imm``.
Instruction *indices* count 8-byte slots.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

INSN_SIZE = 8
_INSN = struct.Struct("<BBhi")

# Instruction classes and fields (instruction-set.rst).
CLASS_LD, CLASS_LDX, CLASS_ST, CLASS_STX = 0x00, 0x01, 0x02, 0x03
CLASS_ALU, CLASS_JMP, CLASS_JMP32, CLASS_ALU64 = 0x04, 0x05, 0x06, 0x07
SIZE_W, SIZE_H, SIZE_B, SIZE_DW = 0x00, 0x08, 0x10, 0x18
MODE_IMM, MODE_ABS, MODE_IND, MODE_MEM, MODE_MEMSX, MODE_ATOMIC = 0x00, 0x20, 0x40, 0x60, 0x80, 0xC0
SRC_K, SRC_X = 0x00, 0x08
OP_MOV = 0xB0
OP_CALL, OP_EXIT = 0x80, 0x90

LD_IMM64 = CLASS_LD | MODE_IMM | SIZE_DW
CALL = CLASS_JMP | OP_CALL

# src_reg values with a special meaning (include/uapi/linux/bpf.h).
PSEUDO_MAP_FD = 1
PSEUDO_MAP_VALUE = 2
PSEUDO_BTF_ID = 3
PSEUDO_FUNC = 4
PSEUDO_MAP_IDX = 5
PSEUDO_MAP_IDX_VALUE = 6
PSEUDO_CALL = 1
PSEUDO_KFUNC_CALL = 2

#: Size in bytes of each ``SIZE_*`` load/store width.
SIZE_BYTES = {SIZE_B: 1, SIZE_H: 2, SIZE_W: 4, SIZE_DW: 8}


@dataclass(frozen=True, slots=True)
class Insn:
    """One decoded 8-byte instruction slot."""

    code: int
    dst: int
    src: int
    off: int
    imm: int

    @property
    def cls(self) -> int:
        """The instruction class, the low 3 bits of ``code`` (``BPF_LD`` .. ``BPF_ALU64``)."""
        return self.code & 0x07

    @property
    def is_ld_imm64(self) -> bool:
        """The first half of a 16-byte ``BPF_LD | BPF_IMM | BPF_DW`` (64-bit immediate load)."""
        return self.code == LD_IMM64

    def encode(self) -> bytes:
        """The 8 little-endian bytes of this slot."""
        return _INSN.pack(self.code, (self.src << 4) | (self.dst & 0x0F), self.off, self.imm)


def decode(buf: bytes | bytearray | memoryview, index: int) -> Insn:
    """Decode slot ``index`` of ``buf``; raises ``IndexError`` past the end (callers that
    take indices from untrusted input check bounds first and raise their own error)."""
    start = index * INSN_SIZE
    if index < 0 or start + INSN_SIZE > len(buf):
        raise IndexError(f"instruction {index} is outside a buffer of {len(buf)} bytes")
    code, regs, off, imm = _INSN.unpack_from(buf, start)
    return Insn(code, regs & 0x0F, regs >> 4, off, imm)


def encode_into(buf: bytearray, index: int, insn: Insn) -> None:
    """Overwrite slot ``index`` of ``buf`` with ``insn``."""
    _INSN.pack_into(
        buf, index * INSN_SIZE, insn.code, (insn.src << 4) | (insn.dst & 0x0F), insn.off, insn.imm
    )


def count(buf: bytes | bytearray | memoryview) -> int:
    """Number of 8-byte slots in ``buf``."""
    return len(buf) // INSN_SIZE
