"""Hand assembly of the few instructions the kernel tests use (instruction-set.rst)."""

from __future__ import annotations

from schedswitchd.bpf import insn

ALU_ADD = 0x00
JMP_JEQ = 0x10
HELPER_MAP_LOOKUP_ELEM = 1


def mov64_imm(dst: int, imm: int) -> bytes:
    return insn.Insn(insn.CLASS_ALU64 | insn.OP_MOV | insn.SRC_K, dst, 0, 0, imm).encode()


def mov64_reg(dst: int, src: int) -> bytes:
    return insn.Insn(insn.CLASS_ALU64 | insn.OP_MOV | insn.SRC_X, dst, src, 0, 0).encode()


def add64_imm(dst: int, imm: int) -> bytes:
    return insn.Insn(insn.CLASS_ALU64 | ALU_ADD | insn.SRC_K, dst, 0, 0, imm).encode()


def ld_map_fd(dst: int, fd: int) -> bytes:
    return (
        insn.Insn(insn.LD_IMM64, dst, insn.PSEUDO_MAP_FD, 0, fd).encode()
        + insn.Insn(0, 0, 0, 0, 0).encode()
    )


def st_w(dst: int, off: int, imm: int) -> bytes:
    return insn.Insn(insn.CLASS_ST | insn.MODE_MEM | insn.SIZE_W, dst, 0, off, imm).encode()


def ldx_dw(dst: int, src: int, off: int) -> bytes:
    return insn.Insn(insn.CLASS_LDX | insn.MODE_MEM | insn.SIZE_DW, dst, src, off, 0).encode()


def stx_dw(dst: int, src: int, off: int) -> bytes:
    return insn.Insn(insn.CLASS_STX | insn.MODE_MEM | insn.SIZE_DW, dst, src, off, 0).encode()


def jeq_imm(dst: int, imm: int, off: int) -> bytes:
    return insn.Insn(insn.CLASS_JMP | JMP_JEQ | insn.SRC_K, dst, 0, off, imm).encode()


def call(helper: int) -> bytes:
    return insn.Insn(insn.CALL, 0, 0, 0, helper).encode()


def exit_() -> bytes:
    return insn.Insn(insn.CLASS_JMP | insn.OP_EXIT, 0, 0, 0, 0).encode()


def ret(value: int) -> bytes:
    """``r0 = value; exit``."""
    return mov64_imm(0, value) + exit_()


def count_in_map(map_fd: int, value: int) -> bytes:
    """``v = map[0]; if v: *v += 1; return value`` (array map, u32 key, u64 value)."""
    return b"".join(
        (
            st_w(10, -4, 0),  # key = 0 on the stack
            mov64_reg(2, 10),
            add64_imm(2, -4),
            ld_map_fd(1, map_fd),
            call(HELPER_MAP_LOOKUP_ELEM),
            jeq_imm(0, 0, 3),
            ldx_dw(1, 0, 0),
            add64_imm(1, 1),
            stx_dw(0, 1, 0),
            ret(value),
        )
    )


def ldx_w(dst: int, src: int, off: int) -> bytes:
    return insn.Insn(insn.CLASS_LDX | insn.MODE_MEM | insn.SIZE_W, dst, src, off, 0).encode()


def ld_imm64(dst: int, src: int = 0, lo: int = 0, hi: int = 0) -> bytes:
    """A raw ld_imm64 as the compiler leaves it for the loader to patch."""
    return insn.Insn(insn.LD_IMM64, dst, src, 0, lo).encode() + insn.Insn(0, 0, 0, 0, hi).encode()


def kfunc_call() -> bytes:
    """A kfunc call as clang emits it (``src_reg = BPF_PSEUDO_KFUNC_CALL``, imm -1)."""
    return insn.Insn(insn.CALL, 0, insn.PSEUDO_KFUNC_CALL, 0, -1).encode()
