"""Patching one BPF instruction with a CO-RE relocation result.

Follows libbpf ``src/relo_core.c`` (``bpf_core_patch_insn``, ``bpf_core_poison_insn``);
instruction format from kernel doc ``Documentation/bpf/standardization/instruction-set.rst``.
Patchable forms: ``ALU``/``ALU64`` with an immediate operand (``imm``), ``LDX``/``ST``/``STX``
(``off``, and the access size when a FIELD_BYTE_OFFSET's field changed size), and
``ld_imm64`` (both halves' ``imm``). The original value is checked against the local value
first unless the relocation says it is not reliable (bitfields, type ids).

A poisoned instruction becomes ``call 0xbad2310`` (a helper id the verifier rejects as
``invalid func unknown#195896080`` if it is reachable); for ``ld_imm64`` both slots are
poisoned, so the verifier does not trip over a lone second half first.
"""

from __future__ import annotations

from schedswitchd.bpf import insn as bpf
from schedswitchd.bpf.core.calc import U64_MASK, Resolution
from schedswitchd.errors import CoreError

#: ``0xbad2310`` ("bad relo"): the helper id libbpf calls in a poisoned instruction.
POISON_IMM = 0xBAD2310
POISON_INSN = bpf.Insn(code=bpf.CALL, dst=0, src=0, off=0, imm=POISON_IMM)

_SHRT_MAX = 0x7FFF
_BYTES_TO_SIZE = {v: k for k, v in bpf.SIZE_BYTES.items()}


def _s32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _check_bounds(buf: bytearray, idx: int, slots: int) -> None:
    n = bpf.count(buf)
    if idx < 0 or idx + slots > n:
        raise CoreError(f"CO-RE relocation targets instruction #{idx} of a {n}-slot program")


def poison(buf: bytearray, idx: int) -> None:
    """Replace instruction ``idx`` (both slots of an ``ld_imm64``) with ``call 0xbad2310``."""
    _check_bounds(buf, idx, 1)
    if bpf.decode(buf, idx).is_ld_imm64:
        _check_bounds(buf, idx, 2)
        bpf.encode_into(buf, idx + 1, POISON_INSN)
    bpf.encode_into(buf, idx, POISON_INSN)


def patch_insn(buf: bytearray, idx: int, res: Resolution) -> bool:
    """Apply ``res`` to instruction ``idx`` of ``buf`` in place.

    Returns True when the instruction was poisoned (requested by ``res``, or a load/store
    whose size cannot be adjusted safely). ``CoreError`` when the instruction is not of a
    patchable form, its original value differs from the expected local value, the new
    offset does not fit the 16-bit ``off`` field, or the access size is unexpected.
    """
    _check_bounds(buf, idx, 1)
    ins = bpf.decode(buf, idx)
    if res.poison:
        poison(buf, idx)
        return True
    orig, new = res.orig_val & U64_MASK, res.new_val & U64_MASK
    cls = ins.cls
    if cls in (bpf.CLASS_ALU, bpf.CLASS_ALU64):
        if ins.code & bpf.SRC_X:
            raise CoreError(
                f"insn #{idx}: ALU instruction with a register operand is not patchable"
            )
        if res.validate and (ins.imm & U64_MASK) != orig:
            raise CoreError(
                f"insn #{idx}: unexpected ALU imm {ins.imm}, expected {orig} (-> {new})"
            )
        bpf.encode_into(buf, idx, bpf.Insn(ins.code, ins.dst, ins.src, ins.off, _s32(new)))
        return False
    if cls in (bpf.CLASS_LDX, bpf.CLASS_ST, bpf.CLASS_STX):
        if res.validate and (ins.off & U64_MASK) != orig:
            raise CoreError(
                f"insn #{idx}: unexpected load/store offset {ins.off}, expected {orig} (-> {new})"
            )
        if new > _SHRT_MAX:
            raise CoreError(f"insn #{idx}: field offset {new} does not fit a load/store offset")
        if res.fail_memsz_adjust:
            # Resizing the access would misread a signed or non-integer field.
            poison(buf, idx)
            return True
        code = ins.code
        if res.new_sz != res.orig_sz:
            width = bpf.SIZE_BYTES.get(code & 0x18)
            if width != res.orig_sz:
                raise CoreError(
                    f"insn #{idx}: access size {width} bytes, expected {res.orig_sz} bytes"
                )
            new_size = _BYTES_TO_SIZE.get(res.new_sz)
            if new_size is None:
                raise CoreError(f"insn #{idx}: field of {res.new_sz} bytes cannot be accessed")
            code = (code & 0xE0) | new_size | cls
        bpf.encode_into(buf, idx, bpf.Insn(code, ins.dst, ins.src, new, ins.imm))
        return False
    if cls == bpf.CLASS_LD:
        _check_bounds(buf, idx, 2)
        hi = bpf.decode(buf, idx + 1)
        if (
            not ins.is_ld_imm64
            or ins.src != 0
            or ins.off != 0
            or (hi.code, hi.dst, hi.src, hi.off) != (0, 0, 0, 0)
        ):
            raise CoreError(f"insn #{idx}: not a plain ld_imm64, cannot patch")
        imm = (ins.imm & 0xFFFFFFFF) | ((hi.imm & 0xFFFFFFFF) << 32)
        if res.validate and imm != orig:
            raise CoreError(
                f"insn #{idx}: unexpected ld_imm64 value {imm}, expected {orig} (-> {new})"
            )
        bpf.encode_into(buf, idx, bpf.Insn(ins.code, ins.dst, ins.src, ins.off, _s32(new)))
        bpf.encode_into(buf, idx + 1, bpf.Insn(hi.code, hi.dst, hi.src, hi.off, _s32(new >> 32)))
        return False
    raise CoreError(f"insn #{idx}: opcode {ins.code:#04x} is not patchable by CO-RE")
