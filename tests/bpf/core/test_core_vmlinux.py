"""CO-RE engine against the host's real ``/sys/kernel/btf/vmlinux``.

Local types are built with BtfBuilder the way clang would describe a BPF program's view of
kernel structs (``___flavour`` names, a subset of the fields, different offsets);
expectations come from bpftool's JSON dump of the same vmlinux (``tests/bpf/core/core_expect.py``),
not from our BTF reader.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedswitchd.bpf import insn as bpf
from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.core.patch import POISON_IMM
from schedswitchd.bpf.core.relo import CoreRelo, CoreReloKind
from schedswitchd.bpf.core.relocate import CoreResult, relocate
from tests.bpf.core.core_expect import JsonBtf, bitfield_window

VMLINUX = Path("/sys/kernel/btf/vmlinux")
pytestmark = [
    pytest.mark.skipif(not VMLINUX.exists(), reason="no kernel BTF on this host"),
    pytest.mark.slow,  # the whole vmlinux BTF, ours and bpftool's
]

LDX_W = bpf.CLASS_LDX | bpf.MODE_MEM | bpf.SIZE_W
LDX_DW = bpf.CLASS_LDX | bpf.MODE_MEM | bpf.SIZE_DW
MOV64_K = bpf.CLASS_ALU64 | bpf.OP_MOV | bpf.SRC_K


class Local:
    """The object's BTF: types as a BPF program would declare them."""

    def __init__(self) -> None:
        b = BtfBuilder()
        i32 = b.add_int("int", 4, signed=True)
        u32 = b.add_int("unsigned int", 4)
        char = b.add_int("char", 1)
        u64 = b.add_int("long long unsigned int", 8)
        se = b.add_struct("sched_entity___l", 8, [("vruntime", u64, 0, 0)])
        comm = b.add_array(char, i32, 16)
        self.task = b.add_struct(
            "task_struct___l",
            56,
            [
                ("pid", i32, 0, 0),  # 0: byte 0
                ("tgid", i32, 32, 0),  # 1: byte 4
                ("flags", u32, 64, 0),  # 2: byte 8
                ("prio", i32, 96, 0),  # 3: byte 12
                ("comm", comm, 128, 0),  # 4: byte 16
                ("se", se, 256, 0),  # 5: byte 32
                ("sched_reset_on_fork", u32, 384, 1),  # 6: byte 48 bit 0
                ("init_private_fork_class", u32, 385, 4),  # 7: byte 48 bit 1
                ("no_such_field", i32, 416, 0),  # 8: byte 52
            ],
        )
        lh_fwd = b.add_fwd("list_head")
        lh_ptr = b.add_ptr(lh_fwd)
        self.list_head = b.add_struct(
            "list_head___l", 16, [("next", lh_ptr, 0, 0), ("prev", lh_ptr, 64, 0)]
        )
        self.list_head_bad = b.add_struct("list_head___bad", 4, [("next", i32, 0, 0)])
        self.pid_type = b.add_enum64("pid_type___l", 8, [("PIDTYPE_SID", 30), ("PIDTYPE_NOPE", 31)])
        skb_ptr = b.add_ptr(b.add_fwd("sk_buff"))
        self.skb = b.add_struct("sk_buff___l", 8, [("next", skb_ptr, 0, 0)])
        self.nothing = b.add_struct("no_such_struct_in_the_kernel", 4, [("x", i32, 0, 0)])
        self.btf = Btf.from_bytes(b.build(), name="obj")


def mov(imm: int) -> bpf.Insn:
    return bpf.Insn(MOV64_K, 0, 0, 0, imm)


def run(vmlinux: Btf, items: list[tuple[bpf.Insn, int, str, CoreReloKind]]) -> CoreResult:
    """One instruction per relocation, in order; then ``exit``."""
    local = LOCAL
    prog = bytearray()
    relos = []
    for i, (ins, type_id, access, kind) in enumerate(items):
        prog += ins.encode()
        relos.append(CoreRelo(i, type_id, access, kind))
    prog += bpf.Insn(bpf.CLASS_JMP | bpf.OP_EXIT, 0, 0, 0, 0).encode()
    return relocate(local.btf, prog, relos, [vmlinux])


LOCAL = Local()


def test_task_struct_fields(vmlinux: Btf, js: JsonBtf) -> None:
    task = js.find("task_struct", "STRUCT")
    se = js.resolve(js.member(task, "se").type_id)  # type: ignore[union-attr]

    def off(name: str) -> int:
        f = js.member(task, name)
        assert f is not None and f.bit_offset % 8 == 0
        return f.bit_offset // 8

    t = LOCAL.task
    res = run(
        vmlinux,
        [
            (bpf.Insn(LDX_W, 0, 1, 0, 0), t, "0:0", CoreReloKind.FIELD_BYTE_OFFSET),
            (mov(4), t, "0:1", CoreReloKind.FIELD_BYTE_OFFSET),
            (bpf.Insn(LDX_W, 0, 1, 8, 0), t, "0:2", CoreReloKind.FIELD_BYTE_OFFSET),
            (mov(12), t, "0:3", CoreReloKind.FIELD_BYTE_OFFSET),
            (mov(19), t, "0:4:3", CoreReloKind.FIELD_BYTE_OFFSET),
            (mov(16), t, "0:4", CoreReloKind.FIELD_BYTE_SIZE),
            (bpf.Insn(LDX_DW, 0, 1, 32, 0), t, "0:5:0", CoreReloKind.FIELD_BYTE_OFFSET),
            (mov(1), t, "0:3", CoreReloKind.FIELD_SIGNED),
            (mov(0), t, "0:2", CoreReloKind.FIELD_SIGNED),
            (mov(1), t, "0:0", CoreReloKind.FIELD_EXISTS),
            (mov(1), t, "0:8", CoreReloKind.FIELD_EXISTS),
            (bpf.Insn(LDX_W, 0, 1, 52, 0), t, "0:8", CoreReloKind.FIELD_BYTE_OFFSET),
        ],
    )
    vr = js.member(se, "vruntime")
    assert vr is not None
    se_off = off("se") + vr.bit_offset // 8
    want = [
        off("pid"),
        off("tgid"),
        off("flags"),
        off("prio"),
        off("comm") + 3,
        js.size(js.member(task, "comm").type_id),  # type: ignore[union-attr]
        se_off,
        1,
        0,
        1,
        0,
    ]
    assert [r.target_value for r in res.results[:11]] == want
    assert [bpf.decode(res.insns, i).off for i in (0, 2, 6)] == [want[0], want[2], se_off]
    assert [bpf.decode(res.insns, i).imm for i in (1, 3, 4, 5, 7, 8, 9, 10)] == [
        want[i] for i in (1, 3, 4, 5, 7, 8, 9, 10)
    ]
    assert bpf.decode(res.insns, 11) == bpf.Insn(bpf.CALL, 0, 0, 0, POISON_IMM)
    assert all(r.target_btf == "vmlinux" for r in res.results[:10])
    assert res.results[0].target_type_id == task["id"]
    assert res.consulted == ("vmlinux",)


def test_task_struct_bitfields(vmlinux: Btf, js: JsonBtf) -> None:
    task = js.find("task_struct", "STRUCT")
    kinds = [
        CoreReloKind.FIELD_BYTE_OFFSET,
        CoreReloKind.FIELD_BYTE_SIZE,
        CoreReloKind.FIELD_LSHIFT_U64,
        CoreReloKind.FIELD_RSHIFT_U64,
    ]
    # local windows: bit 384 width 1 -> (48, 4, 63, 63); bit 385 width 4 -> (48, 4, 59, 60)
    local = {"0:6": (48, 4, 63, 63), "0:7": (48, 4, 59, 60)}
    items = [
        (mov(local[acc][k]), LOCAL.task, acc, kind) for acc in local for k, kind in enumerate(kinds)
    ]
    res = run(vmlinux, items)
    got = [r.target_value for r in res.results]
    want: list[int] = []
    for name in ("sched_reset_on_fork", "init_private_fork_class"):
        f = js.member(task, name)
        assert f is not None and f.bitfield_size > 0
        want += bitfield_window(f)
    assert got == want
    assert [bpf.decode(res.insns, i).imm for i in range(8)] == want


def test_type_and_enum_kinds(vmlinux: Btf, js: JsonBtf) -> None:
    task = js.find("task_struct", "STRUCT")
    pid_type = js.find("pid_type", "ENUM")
    tid = LOCAL.task
    res = run(
        vmlinux,
        [
            (mov(tid), tid, "0", CoreReloKind.TYPE_ID_LOCAL),
            (mov(tid), tid, "0", CoreReloKind.TYPE_ID_TARGET),
            (mov(1), tid, "0", CoreReloKind.TYPE_EXISTS),
            (mov(56), tid, "0", CoreReloKind.TYPE_SIZE),
            (mov(1), LOCAL.list_head, "0", CoreReloKind.TYPE_MATCHES),
            (mov(1), LOCAL.list_head_bad, "0", CoreReloKind.TYPE_MATCHES),
            (mov(1), LOCAL.nothing, "0", CoreReloKind.TYPE_EXISTS),
            (mov(30), LOCAL.pid_type, "0", CoreReloKind.ENUMVAL_VALUE),
            (mov(1), LOCAL.pid_type, "0", CoreReloKind.ENUMVAL_EXISTS),
            (mov(1), LOCAL.pid_type, "1", CoreReloKind.ENUMVAL_EXISTS),
        ],
    )
    want = [
        tid,
        task["id"],
        1,
        task["size"],
        1,
        0,
        0,
        js.enum_value("pid_type", "PIDTYPE_SID"),
        1,
        0,
    ]
    assert [r.target_value for r in res.results] == want
    assert [bpf.decode(res.insns, i).imm for i in range(10)] == want
    assert res.results[7].target_type_id == pid_type["id"]


def test_field_found_through_anonymous_members(vmlinux: Btf, js: JsonBtf) -> None:
    skb = js.find("sk_buff", "STRUCT")
    f = js.member(skb, "next")
    assert f is not None
    res = run(vmlinux, [(mov(0), LOCAL.skb, "0:0", CoreReloKind.FIELD_BYTE_OFFSET)])
    assert res.results[0].target_value == f.bit_offset // 8
    # The target path steps through the anonymous union and struct: three levels deep.
    assert res.results[0].target_access.count(":") == 3
