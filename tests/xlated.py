"""Comparing programs' xlated instructions (``bpf_prog_info.xlated_prog_insns``) loaded by
two loaders: equal except for what the kernel makes different per load.

Per load the kernel puts (a) map ids into ld_imm64 map references (``src_reg``
``BPF_PSEUDO_MAP_FD``/``BPF_PSEUDO_MAP_VALUE``; ``kernel/bpf/syscall.c``
``bpf_insn_prepare_dump``) and (b) for kfuncs taking an implicit ``prog->aux`` argument (newer
sched_ext kfuncs), an ld_imm64 of that per-program kernel pointer (``src_reg`` 0). Both are
ignored: (a) by zeroing the map id, (b) by accepting two kernel addresses (top byte 0xff)
in the same ld_imm64 slot.
"""

from __future__ import annotations

from schedswitchd.bpf import insn

_MAP_SRCS = (
    insn.PSEUDO_MAP_FD,
    insn.PSEUDO_MAP_VALUE,
    insn.PSEUDO_MAP_IDX,
    insn.PSEUDO_MAP_IDX_VALUE,
)


def _imm64(buf: bytes, i: int) -> int:
    lo = insn.decode(buf, i).imm & 0xFFFFFFFF
    hi = insn.decode(buf, i + 1).imm & 0xFFFFFFFF
    return (hi << 32) | lo


def _kernel_address(v: int) -> bool:
    # the kernel half on x86-64: top byte 0xff with 5-level paging (LA57, as qemu's
    # ``-cpu max`` enables), 0xffff8... with 4-level
    return v >> 56 == 0xFF


def differences(ours: bytes, theirs: bytes, limit: int = 12) -> list[str]:
    """Slot-by-slot differences that are not per-load values (empty when equivalent)."""
    out: list[str] = []
    if len(ours) != len(theirs):
        out.append(f"lengths differ: ours {len(ours) // 8} slots, theirs {len(theirs) // 8}")
    n = min(insn.count(ours), insn.count(theirs))
    i = 0
    while i < n and len(out) < limit:
        a, b = insn.decode(ours, i), insn.decode(theirs, i)
        if a.is_ld_imm64 and b.is_ld_imm64 and i + 1 < n:
            same_shape = (a.dst, a.src, a.off) == (b.dst, b.src, b.off)
            if same_shape and a.src in _MAP_SRCS:
                hi_ours, hi_theirs = insn.decode(ours, i + 1), insn.decode(theirs, i + 1)
                if hi_ours != hi_theirs:  # the value offset
                    out.append(f"{i + 1}: ours {hi_ours} theirs {hi_theirs}")
            elif same_shape and a.src == 0:
                va, vb = _imm64(ours, i), _imm64(theirs, i)
                if va != vb and not (_kernel_address(va) and _kernel_address(vb)):
                    out.append(f"{i}: ours {va:#x} theirs {vb:#x}")
            elif a != b or insn.decode(ours, i + 1) != insn.decode(theirs, i + 1):
                out.append(f"{i}: ours {a} theirs {b}")
            i += 2
            continue
        if a != b:
            out.append(f"{i}: ours {a} theirs {b}")
        i += 1
    return out
