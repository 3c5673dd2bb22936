"""CO-RE engine against small hand-built BTFs, with hand-computed expectations.

Layouts (bit offsets; ``tests/bpf/core/core_btf.py`` builds them):

local ``struct task_struct___local`` (64 bytes)      target ``struct task_struct`` (80 bytes)
  0 pid    int   @0                                    0 state u64  @0
  1 flags  uint  @32                                   1 pid   int  @64
  2 prio   int   @64                                   2 flags u64  @128
  3 <anon> {a int @0, b int @32} @96                   3 prio  long @192
  4 bf2    uint:5 @160                                 4 <anon> {x long, a int @64, b int @96} @256
  5 bf3    uint:6 @165                                 5 bf1   uint:3 @384
  6 arr    int[8] @192                                 6 bf2   uint:5 @387
  7 missing int  @448                                  7 bf3   uint:6 @414
  8 nr     int   @480                                  8 arr   int[4] @448
                                                       9 nr    uint @576
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedswitchd.bpf import insn as bpf
from schedswitchd.bpf.core.patch import POISON_IMM
from schedswitchd.bpf.core.relo import CoreRelo, CoreReloKind
from schedswitchd.bpf.core.relocate import CandidateCache, CoreResult, relocate
from schedswitchd.errors import CoreError
from tests import fuzzing
from tests.bpf.core.core_btf import SpyBtf, TypeBuilder

LDX_W = bpf.CLASS_LDX | bpf.MODE_MEM | bpf.SIZE_W
LDX_DW = bpf.CLASS_LDX | bpf.MODE_MEM | bpf.SIZE_DW
MOV64_K = bpf.CLASS_ALU64 | bpf.OP_MOV | bpf.SRC_K
MOV64_X = bpf.CLASS_ALU64 | bpf.OP_MOV | bpf.SRC_X
ADD_K = bpf.CLASS_ALU | 0x00 | bpf.SRC_K
EXIT = bpf.Insn(bpf.CLASS_JMP | bpf.OP_EXIT, 0, 0, 0, 0)


def ldx(code: int, off: int) -> list[bpf.Insn]:
    return [bpf.Insn(code, 0, 1, off, 0)]


def mov(imm: int) -> list[bpf.Insn]:
    return [bpf.Insn(MOV64_K, 0, 0, 0, imm)]


def ld64(value: int) -> list[bpf.Insn]:
    lo, hi = value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF

    def s32(v: int) -> int:
        return v - (1 << 32) if v & 0x80000000 else v

    return [bpf.Insn(bpf.LD_IMM64, 0, 0, 0, s32(lo)), bpf.Insn(0, 0, 0, 0, s32(hi))]


def program(*parts: list[bpf.Insn]) -> bytes:
    out = bytearray()
    for part in parts:
        for ins in part:
            out += ins.encode()
    return bytes(out + EXIT.encode())


def insn_at(res: CoreResult, idx: int) -> bpf.Insn:
    return bpf.decode(res.insns, idx)


@dataclass
class World:
    local: SpyBtf
    vmlinux: SpyBtf
    ids: dict[str, int]


def build_world() -> World:
    ids: dict[str, int] = {}
    # --- target: "vmlinux" ---
    t = TypeBuilder()
    t_int = t.add_int("int", 4, signed=True)
    t_uint = t.add_int("unsigned int", 4)
    t_u64 = t.add_int("long long unsigned int", 8)
    t_long = t.add_int("long int", 8, signed=True)
    t_anon = t.add_struct("", 16, [("x", t_long, 0, 0), ("a", t_int, 64, 0), ("b", t_int, 96, 0)])
    t_arr = t.add_array(t_int, t_int, 4)
    ids["t_task"] = t.add_struct(
        "task_struct",
        80,
        [
            ("state", t_u64, 0, 0),
            ("pid", t_int, 64, 0),
            ("flags", t_u64, 128, 0),
            ("prio", t_long, 192, 0),
            ("", t_anon, 256, 0),
            ("bf1", t_uint, 384, 3),
            ("bf2", t_uint, 387, 5),
            ("bf3", t_uint, 414, 6),
            ("arr", t_arr, 448, 0),
            ("nr", t_uint, 576, 0),
        ],
    )
    ids["t_pid_type"] = t.add_enum64(
        "pid_type", 8, [("PIDTYPE_PID", 0), ("PIDTYPE_TGID", 1), ("PIDTYPE_BIG", 1 << 40)]
    )
    ids["t_sched_state"] = t.add_enum("sched_state", 4, [("S_NEG", -5), ("S_OK", 7)], signed=True)
    ids["t_fwd_only"] = t.add_fwd("fwd_only")
    vmlinux = t.finish("vmlinux")

    # --- local: the object's BTF ---
    b = TypeBuilder()
    l_int = b.add_int("int", 4, signed=True)
    l_uint = b.add_int("unsigned int", 4)
    l_anon = b.add_struct("", 8, [("a", l_int, 0, 0), ("b", l_int, 32, 0)])
    l_arr = b.add_array(l_int, l_int, 8)
    ids["task"] = b.add_struct(
        "task_struct___local",
        64,
        [
            ("pid", l_int, 0, 0),
            ("flags", l_uint, 32, 0),
            ("prio", l_int, 64, 0),
            ("", l_anon, 96, 0),
            ("bf2", l_uint, 160, 5),
            ("bf3", l_uint, 165, 6),
            ("arr", l_arr, 192, 0),
            ("missing", l_int, 448, 0),
            ("nr", l_int, 480, 0),
        ],
    )
    ids["task_m"] = b.add_struct(
        "task_struct___m",
        16,
        [("pid", l_int, 0, 0), ("flags", b.add_int("long long unsigned int", 8), 64, 0)],
    )
    ids["task_nm"] = b.add_struct("task_struct___nm", 4, [("pid", l_uint, 0, 0)])
    ids["task_badfield"] = b.add_struct(
        "task_struct___bad", 8, [("pid", b.add_struct("pidbox", 4, [("v", l_int, 0, 0)]), 0, 0)]
    )
    ids["nonexistent"] = b.add_struct("nonexistent", 4, [("v", l_int, 0, 0)])
    ids["pid_type"] = b.add_enum(
        "pid_type___local", 4, [("PIDTYPE_TGID", 1), ("PIDTYPE_BIG", 3), ("PIDTYPE_GONE", 9)]
    )
    ids["sched_state"] = b.add_enum(
        "sched_state", 4, [("S_NEG", -5), ("S_OK___old", 6)], signed=True
    )
    ids["fwd_only"] = b.add_fwd("fwd_only")
    ids["anon_root"] = l_anon
    local = b.finish("obj")
    return World(local, vmlinux, ids)


@pytest.fixture
def w() -> World:
    return build_world()


def run(
    w: World,
    prog: bytes | bytearray,
    relos: Sequence[tuple[int, str, str, CoreReloKind]],
    targets: Sequence[SpyBtf] = (),
) -> CoreResult:
    recs = [CoreRelo(idx, w.ids[ty], acc, kind) for idx, ty, acc, kind in relos]
    return relocate(w.local, prog, recs, list(targets) or [w.vmlinux])


# --- field-based kinds ---------------------------------------------------------------------


def test_byte_offset_ldx_and_alu(w: World) -> None:
    prog = program(ldx(LDX_W, 0), mov(0), ldx(LDX_W, 16), mov(32))
    res = run(
        w,
        prog,
        [
            (0, "task", "0:0", CoreReloKind.FIELD_BYTE_OFFSET),  # pid: 0 -> 8
            (1, "task", "0:0", CoreReloKind.FIELD_BYTE_OFFSET),
            (2, "task", "0:3:1", CoreReloKind.FIELD_BYTE_OFFSET),  # anon.b: 16 -> 44
            (3, "task", "0:6:2", CoreReloKind.FIELD_BYTE_OFFSET),  # arr[2]: 32 -> 64
        ],
    )
    assert insn_at(res, 0) == bpf.Insn(LDX_W, 0, 1, 8, 0)
    assert insn_at(res, 1).imm == 8
    assert insn_at(res, 2) == bpf.Insn(LDX_W, 0, 1, 44, 0)
    assert insn_at(res, 3).imm == 64
    r = res.results
    assert [(x.local_value, x.target_value) for x in r] == [(0, 8), (0, 8), (16, 44), (32, 64)]
    assert r[2].target_access == "0:4:2" and r[3].target_access == "0:8:2"
    assert all(x.found and x.target_btf == "vmlinux" for x in r)
    assert r[0].target_type_id == w.ids["t_task"]
    assert res.consulted == ("vmlinux",)
    assert insn_at(res, 4) == EXIT


def test_root_array_index(w: World) -> None:
    # &p[1].pid: local 64 + 0, target 80 + 8.
    res = run(w, program(mov(64)), [(0, "task", "1:0", CoreReloKind.FIELD_BYTE_OFFSET)])
    assert insn_at(res, 0).imm == 88


def test_load_size_adjusted_for_unsigned_int(w: World) -> None:
    # flags: u32 at 4 locally, u64 at 16 in the target: the 4-byte load becomes 8 bytes.
    res = run(w, program(ldx(LDX_W, 4)), [(0, "task", "0:1", CoreReloKind.FIELD_BYTE_OFFSET)])
    assert insn_at(res, 0) == bpf.Insn(LDX_DW, 0, 1, 16, 0)


def test_load_of_resized_signed_int_is_poisoned(w: World) -> None:
    # prio: int locally, long in the target: resizing would lose the sign -> poison the
    # load, but an ALU use of the same offset is still patched.
    res = run(
        w,
        program(ldx(LDX_W, 8), mov(8)),
        [
            (0, "task", "0:2", CoreReloKind.FIELD_BYTE_OFFSET),
            (1, "task", "0:2", CoreReloKind.FIELD_BYTE_OFFSET),
        ],
    )
    assert insn_at(res, 0) == bpf.Insn(bpf.CALL, 0, 0, 0, POISON_IMM)
    assert res.results[0].poisoned and not res.results[1].poisoned
    assert insn_at(res, 1).imm == 24


def test_load_with_wrong_access_size_is_rejected(w: World) -> None:
    with pytest.raises(CoreError, match="access size"):
        run(w, program(ldx(LDX_DW, 4)), [(0, "task", "0:1", CoreReloKind.FIELD_BYTE_OFFSET)])


def test_byte_size_exists_signed(w: World) -> None:
    prog = program(mov(4), mov(1), mov(1), mov(1), mov(1), mov(0), mov(4))
    res = run(
        w,
        prog,
        [
            (0, "task", "0:1", CoreReloKind.FIELD_BYTE_SIZE),  # flags 4 -> 8
            (1, "task", "0:0", CoreReloKind.FIELD_EXISTS),  # pid exists
            (2, "task", "0:7", CoreReloKind.FIELD_EXISTS),  # "missing" is absent from the target
            (3, "task", "0:8", CoreReloKind.FIELD_SIGNED),  # nr: int -> unsigned int
            (4, "task", "0:0", CoreReloKind.FIELD_SIGNED),  # pid: int -> int
            (5, "task", "0:1", CoreReloKind.FIELD_SIGNED),  # flags: unsigned -> unsigned
            (6, "task", "0:6:3", CoreReloKind.FIELD_BYTE_SIZE),  # arr[3]: element size 4 -> 4
        ],
    )
    got = [(x.local_value, x.target_value) for x in res.results]
    assert got == [(4, 8), (1, 1), (1, 0), (1, 0), (1, 1), (0, 0), (4, 4)]
    assert [insn_at(res, i).imm for i in range(7)] == [8, 1, 0, 0, 1, 0, 4]


def test_exists_validates_original_value(w: World) -> None:
    # The compiler always emits 1 for FIELD_EXISTS; libbpf validates it.
    with pytest.raises(CoreError, match="unexpected ALU imm 0"):
        run(w, program(mov(0)), [(0, "task", "0:7", CoreReloKind.FIELD_EXISTS)])


def test_bitfields(w: World) -> None:
    kinds = [
        CoreReloKind.FIELD_BYTE_OFFSET,
        CoreReloKind.FIELD_BYTE_SIZE,
        CoreReloKind.FIELD_LSHIFT_U64,
        CoreReloKind.FIELD_RSHIFT_U64,
    ]
    relos = [
        (i, "task", acc, k)
        for i, (acc, k) in enumerate((a, k) for a in ("0:4", "0:5") for k in kinds)
    ]
    # bitfield values are not validated (the compiler may disagree), so any imm will do,
    # except RSHIFT which is never ambiguous: local 59 (bf2) and 58 (bf3).
    prog = program(mov(0), mov(0), mov(0), mov(59), mov(0), mov(0), mov(0), mov(58))
    res = run(w, prog, relos)
    got = [(x.local_value, x.target_value) for x in res.results]
    assert got == [
        # bf2: local bit 160 width 5; target bit 387 width 5
        (20, 48), (4, 4), (59, 56), (59, 59),
        # bf3: local bit 165 width 6; target bit 414 width 6 straddles a 4-byte unit,
        # so an 8-byte load at 48 is needed: lshift 64 - (414 + 6 - 384) = 28
        (20, 48), (4, 8), (53, 28), (58, 58),
    ]  # fmt: skip
    assert [insn_at(res, i).imm for i in range(8)] == [48, 4, 56, 59, 48, 8, 28, 58]


def test_bitfield_rshift_is_validated(w: World) -> None:
    with pytest.raises(CoreError, match="unexpected ALU imm"):
        run(w, program(mov(0)), [(0, "task", "0:4", CoreReloKind.FIELD_RSHIFT_U64)])


def test_missing_field_poisons(w: World) -> None:
    prog = program(ldx(LDX_W, 56), mov(56), ldx(LDX_W, 48))
    res = run(
        w,
        prog,
        [
            (0, "task", "0:7", CoreReloKind.FIELD_BYTE_OFFSET),  # no "missing" in the target
            (1, "task", "0:7", CoreReloKind.FIELD_BYTE_SIZE),
            (2, "task", "0:6:6", CoreReloKind.FIELD_BYTE_OFFSET),  # arr[6] but target arr has 4
        ],
    )
    poison = bpf.Insn(bpf.CALL, 0, 0, 0, POISON_IMM)
    assert [insn_at(res, i) for i in range(3)] == [poison] * 3
    assert all(x.poisoned and not x.found and x.target_btf is None for x in res.results)
    assert insn_at(res, 3) == EXIT


def test_incompatible_field_type_is_not_a_match(w: World) -> None:
    # local pid is a struct, the target's an int: no candidate matches.
    res = run(w, program(mov(1)), [(0, "task_badfield", "0:0", CoreReloKind.FIELD_EXISTS)])
    assert res.results[0].target_value == 0 and not res.results[0].found


def test_signed_on_array_element_is_an_error(w: World) -> None:
    with pytest.raises(CoreError, match="array access"):
        run(w, program(mov(1)), [(0, "task", "0:6:1", CoreReloKind.FIELD_SIGNED)])


# --- type-based kinds ----------------------------------------------------------------------


def test_type_kinds(w: World) -> None:
    tid = w.ids["task"]
    prog = program(ld64(tid), ld64(tid), mov(1), mov(64), mov(1), mov(1), mov(1), mov(4))
    res = run(
        w,
        prog,
        [
            (0, "task", "0", CoreReloKind.TYPE_ID_LOCAL),
            (2, "task", "0", CoreReloKind.TYPE_ID_TARGET),
            (4, "task", "0", CoreReloKind.TYPE_EXISTS),
            (5, "task", "0", CoreReloKind.TYPE_SIZE),
            (6, "task_m", "0", CoreReloKind.TYPE_MATCHES),
            (7, "task_nm", "0", CoreReloKind.TYPE_MATCHES),  # pid: unsigned int vs int, no match
            (8, "task_nm", "0", CoreReloKind.TYPE_EXISTS),  # ...but structurally compatible
            (9, "nonexistent", "0", CoreReloKind.TYPE_SIZE),
        ],
    )
    got = [(x.kind, x.local_value, x.target_value) for x in res.results]
    assert got == [
        (CoreReloKind.TYPE_ID_LOCAL, tid, tid),
        (CoreReloKind.TYPE_ID_TARGET, tid, w.ids["t_task"]),
        (CoreReloKind.TYPE_EXISTS, 1, 1),
        (CoreReloKind.TYPE_SIZE, 64, 80),
        (CoreReloKind.TYPE_MATCHES, 1, 1),
        (CoreReloKind.TYPE_MATCHES, 1, 0),
        (CoreReloKind.TYPE_EXISTS, 1, 1),
        (CoreReloKind.TYPE_SIZE, 4, 0),
    ]
    assert bpf.decode(res.insns, 0).imm == tid and bpf.decode(res.insns, 1).imm == 0
    assert bpf.decode(res.insns, 2).imm == w.ids["t_task"]
    assert [bpf.decode(res.insns, i).imm for i in range(4, 10)] == [1, 80, 1, 0, 1, 0]
    assert res.results[0].target_btf is None  # TYPE_ID_LOCAL needs no candidate


def test_missing_type_gives_zero(w: World) -> None:
    prog = program(ld64(w.ids["nonexistent"]), mov(1), mov(1))
    res = run(
        w,
        prog,
        [
            (0, "nonexistent", "0", CoreReloKind.TYPE_ID_TARGET),
            (2, "nonexistent", "0", CoreReloKind.TYPE_EXISTS),
            (3, "nonexistent", "0", CoreReloKind.TYPE_MATCHES),
        ],
    )
    assert [x.target_value for x in res.results] == [0, 0, 0]
    assert not any(x.poisoned for x in res.results)
    assert insn_at(res, 0).imm == 0 and insn_at(res, 1) == bpf.Insn(0, 0, 0, 0, 0)


def test_fwd_candidates_are_fwds(w: World) -> None:
    res = run(w, program(mov(1)), [(0, "fwd_only", "0", CoreReloKind.TYPE_EXISTS)])
    assert res.results[0].target_type_id == w.ids["t_fwd_only"]


def test_type_based_access_must_be_zero(w: World) -> None:
    with pytest.raises(CoreError, match="access string '0'"):
        run(w, program(mov(1)), [(0, "task", "1", CoreReloKind.TYPE_EXISTS)])


# --- enum-value kinds ----------------------------------------------------------------------


def test_enum_values(w: World) -> None:
    prog = program(ld64(3), mov(1), mov(1), mov(-5), mov(6), mov(1))
    res = run(
        w,
        prog,
        [
            (0, "pid_type", "1", CoreReloKind.ENUMVAL_VALUE),  # ENUM 3 -> ENUM64 1 << 40
            (2, "pid_type", "0", CoreReloKind.ENUMVAL_VALUE),  # 1 -> 1
            (3, "pid_type", "0", CoreReloKind.ENUMVAL_EXISTS),
            (4, "sched_state", "0", CoreReloKind.ENUMVAL_VALUE),  # signed -5 -> -5
            (5, "sched_state", "1", CoreReloKind.ENUMVAL_VALUE),  # S_OK___old 6 -> S_OK 7
            (6, "pid_type", "2", CoreReloKind.ENUMVAL_EXISTS),  # PIDTYPE_GONE: absent
        ],
    )
    u64 = (1 << 64) - 1
    got = [(x.local_value, x.target_value) for x in res.results]
    assert got == [(3, 1 << 40), (1, 1), (1, 1), (-5 & u64, -5 & u64), (6, 7), (1, 0)]
    assert insn_at(res, 0).imm == 0 and insn_at(res, 1).imm == 1 << 8
    assert [insn_at(res, i).imm for i in range(2, 7)] == [1, 1, -5, 7, 0]
    assert res.results[0].target_type_id == w.ids["t_pid_type"]
    assert res.results[4].target_access == "1"


def test_missing_enum_value_poisons_both_ld_imm64_slots(w: World) -> None:
    res = run(w, program(ld64(9)), [(0, "pid_type", "2", CoreReloKind.ENUMVAL_VALUE)])
    poison = bpf.Insn(bpf.CALL, 0, 0, 0, POISON_IMM)
    assert insn_at(res, 0) == poison and insn_at(res, 1) == poison
    assert res.results[0].poisoned


def test_enum_access_must_name_an_enumerator(w: World) -> None:
    with pytest.raises(CoreError, match="enumerator"):
        run(w, program(mov(1)), [(0, "pid_type", "3", CoreReloKind.ENUMVAL_EXISTS)])


# --- candidates: flavours, ambiguity, modules, cache ----------------------------------------


def _flavoured_target(
    name: str, layouts: Sequence[tuple[str, Sequence[tuple[str, str, int]]]]
) -> tuple[SpyBtf, dict[str, int]]:
    t = TypeBuilder()
    i32 = t.add_int("int", 4, signed=True)
    i64 = t.add_int("long", 8, signed=True)
    ints = {"int": i32, "long": i64}
    ids: dict[str, int] = {}
    for sname, members in layouts:
        ms = [(m, ints[ty], off, 0) for m, ty, off in members]
        ids[sname] = t.add_struct(sname, 16, ms)
    return t.finish(name), ids


def _local_struct(w: World, name: str, members: Sequence[str]) -> int:
    b = TypeBuilder()
    i32 = b.add_int("int", 4, signed=True)
    sid = b.add_struct(name, 4 * len(members), [(m, i32, 32 * k, 0) for k, m in enumerate(members)])
    w.local = b.finish("obj2")
    w.ids[name] = sid
    return sid


def test_agreeing_flavours_are_fine(w: World) -> None:
    tgt, _ = _flavoured_target(
        "vmlinux", [("same", [("x", "int", 32)]), ("same___2", [("y", "int", 0), ("x", "int", 32)])]
    )
    _local_struct(w, "same___mine", ["q", "x"])
    res = run(
        w, program(mov(4)), [(0, "same___mine", "0:1", CoreReloKind.FIELD_BYTE_OFFSET)], [tgt]
    )
    assert res.results[0].target_value == 4 and res.results[0].candidates == 2


def test_offset_ambiguity(w: World) -> None:
    tgt, _ = _flavoured_target(
        "vmlinux", [("amb", [("x", "int", 0)]), ("amb___v2", [("y", "int", 0), ("x", "int", 32)])]
    )
    _local_struct(w, "amb", ["x"])
    with pytest.raises(CoreError, match="field offset ambiguity"):
        run(w, program(mov(0)), [(0, "amb", "0:0", CoreReloKind.FIELD_BYTE_OFFSET)], [tgt])


def test_decision_ambiguity(w: World) -> None:
    tgt, _ = _flavoured_target(
        "vmlinux", [("amb", [("x", "int", 0)]), ("amb___v2", [("x", "long", 0)])]
    )
    _local_struct(w, "amb", ["x"])
    with pytest.raises(CoreError, match="decision ambiguity"):
        run(w, program(mov(4)), [(0, "amb", "0:0", CoreReloKind.FIELD_BYTE_SIZE)], [tgt])


def test_candidates_pruned_after_a_match(w: World) -> None:
    tgt, ids = _flavoured_target(
        "vmlinux", [("prn", [("x", "int", 0)]), ("prn___b", [("x", "int", 0), ("y", "int", 32)])]
    )
    _local_struct(w, "prn", ["x", "y"])
    res = run(
        w,
        program(mov(4), mov(0)),
        [
            (0, "prn", "0:1", CoreReloKind.FIELD_BYTE_OFFSET),
            (1, "prn", "0:0", CoreReloKind.FIELD_BYTE_OFFSET),
        ],
        [tgt],
    )
    # The first relocation only matches prn___b, so the second sees only that candidate.
    assert [(x.candidates, x.target_type_id) for x in res.results] == [
        (1, ids["prn___b"]),
        (1, ids["prn___b"]),
    ]


def _module_world() -> tuple[SpyBtf, SpyBtf, SpyBtf, SpyBtf, dict[str, int]]:
    v = TypeBuilder()
    v_int = v.add_int("int", 4, signed=True)
    ids = {"v_task": v.add_struct("task_struct", 8, [("x", v_int, 0, 0), ("pid", v_int, 32, 0)])}
    vmlinux = v.finish("vmlinux")
    m = TypeBuilder(base=vmlinux)
    ids["m_task"] = m.add_struct("task_struct", 4, [("pid", v_int, 0, 0)])
    ids["m_only"] = m.add_struct("mod_only", 8, [("y", v_int, 0, 0), ("z", v_int, 32, 0)])
    mod = m.finish("mymod")
    o = TypeBuilder(base=vmlinux)
    o.add_struct("unrelated", 4, [("q", v_int, 0, 0)])
    other = o.finish("othermod")
    b = TypeBuilder()
    i32 = b.add_int("int", 4, signed=True)
    ids["task"] = b.add_struct("task_struct", 4, [("pid", i32, 0, 0)])
    ids["mod_only"] = b.add_struct("mod_only___x", 8, [("y", i32, 0, 0), ("z", i32, 32, 0)])
    return b.finish("obj"), vmlinux, mod, other, ids


def test_modules_only_when_vmlinux_has_no_candidate() -> None:
    local, vmlinux, mod, other, ids = _module_world()
    relos = [CoreRelo(0, ids["task"], "0:0", CoreReloKind.FIELD_BYTE_OFFSET)]
    res = relocate(local, program(mov(0)), relos, [vmlinux, other, mod])
    # vmlinux has task_struct: its layout wins even though mymod has one too.
    assert res.results[0].target_value == 4 and res.results[0].target_btf == "vmlinux"
    assert res.consulted == ("vmlinux",)
    assert mod.essential_lookups == [] and other.essential_lookups == []

    relos = [CoreRelo(0, ids["mod_only"], "0:1", CoreReloKind.FIELD_BYTE_OFFSET)]
    res = relocate(local, program(mov(4)), relos, [vmlinux, other, mod])
    r = res.results[0]
    assert (r.target_btf, r.target_type_id, r.target_value) == ("mymod", ids["m_only"], 4)
    assert ids["m_only"] >= vmlinux.end_id
    assert res.consulted == ("vmlinux", "othermod", "mymod")

    # Without the module, the field is missing: the instruction is poisoned.
    res = relocate(local, program(mov(4)), relos, [vmlinux])
    assert res.results[0].poisoned and res.consulted == ("vmlinux",)


def test_cache_is_per_type_and_target_list() -> None:
    local, vmlinux, mod, _other, ids = _module_world()
    cache = CandidateCache()
    relos = [
        CoreRelo(0, ids["task"], "0:0", CoreReloKind.FIELD_BYTE_OFFSET),
        CoreRelo(1, ids["task"], "0:0", CoreReloKind.FIELD_EXISTS),
    ]
    relocate(local, program(mov(0), mov(1)), relos, [vmlinux, mod], cache)
    relocate(local, program(mov(0), mov(1)), relos, [vmlinux, mod], cache)
    assert (cache.misses, cache.hits, len(cache)) == (1, 3, 1)
    assert len(vmlinux.essential_lookups) == 1
    # A cached search still reports the BTFs it consulted.
    res = relocate(local, program(mov(0)), relos[:1], [vmlinux, mod], cache)
    assert res.consulted == ("vmlinux",)
    relocate(local, program(mov(0)), relos[:1], [vmlinux], cache)
    assert (cache.misses, len(cache)) == (2, 2)


def test_no_targets_at_all(w: World) -> None:
    recs = [CoreRelo(0, w.ids["task"], "0", CoreReloKind.TYPE_EXISTS)]
    res = relocate(w.local, program(mov(1)), recs, [])
    assert res.results[0].target_value == 0 and res.consulted == ()


# --- malformed input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "access", ["", ":0", "0:", "a", "0:-1", "0:99", "0:1:0", "0::1", "0:" * 70 + "0"]
)
def test_bad_access_strings(w: World, access: str) -> None:
    with pytest.raises(CoreError):
        run(w, program(mov(0)), [(0, "task", access, CoreReloKind.FIELD_BYTE_OFFSET)])


def test_anonymous_local_type_is_rejected(w: World) -> None:
    with pytest.raises(CoreError, match="anonymous"):
        run(w, program(mov(0)), [(0, "anon_root", "0:0", CoreReloKind.FIELD_BYTE_OFFSET)])


def test_instruction_checks(w: World) -> None:
    with pytest.raises(CoreError, match="register operand"):
        run(
            w,
            program([bpf.Insn(MOV64_X, 0, 1, 0, 0)]),
            [(0, "task", "0:0", CoreReloKind.FIELD_BYTE_OFFSET)],
        )
    with pytest.raises(CoreError, match=r"unexpected ALU imm 7, expected 0 \(-> 8\)"):
        run(w, program(mov(7)), [(0, "task", "0:0", CoreReloKind.FIELD_BYTE_OFFSET)])
    with pytest.raises(CoreError, match="unexpected load/store offset"):
        run(w, program(ldx(LDX_W, 3)), [(0, "task", "0:0", CoreReloKind.FIELD_BYTE_OFFSET)])
    with pytest.raises(CoreError, match="instruction #5"):
        run(w, program(mov(0)), [(5, "task", "0:0", CoreReloKind.FIELD_BYTE_OFFSET)])
    with pytest.raises(CoreError, match="not patchable"):
        run(w, program(), [(0, "task", "0:0", CoreReloKind.FIELD_BYTE_OFFSET)])  # the exit insn
    half = program(mov(0))[:8] + ld64(1)[0].encode()  # ld_imm64 missing its second half
    with pytest.raises(CoreError, match="instruction #1"):
        run(w, half, [(1, "task", "0", CoreReloKind.TYPE_EXISTS)])
    with pytest.raises(CoreError, match="whole number"):
        run(w, program(mov(0))[:12], [])
    with pytest.raises(CoreError, match="no usable type"):
        relocate(
            w.local, program(mov(0)), [CoreRelo(0, 999, "0", CoreReloKind.TYPE_EXISTS)], [w.vmlinux]
        )


def test_input_is_not_modified(w: World) -> None:
    prog = bytearray(program(mov(0)))
    before = bytes(prog)
    res = run(w, prog, [(0, "task", "0:0", CoreReloKind.FIELD_BYTE_OFFSET)])
    assert bytes(prog) == before and res.insns != before


# --- robustness ----------------------------------------------------------------------------

_WORLD = build_world()
_ACCESS = st.lists(st.integers(min_value=0, max_value=12), min_size=0, max_size=6).map(
    lambda xs: ":".join(map(str, xs))
)


@settings(max_examples=fuzzing.examples(400), deadline=None)
@given(
    relos=st.lists(
        st.tuples(
            st.integers(min_value=-2, max_value=6),
            st.integers(min_value=-1, max_value=_WORLD.local.end_id + 1),
            st.one_of(_ACCESS, st.text(max_size=8)),
            st.sampled_from(list(CoreReloKind)),
        ),
        max_size=4,
    ),
    imms=st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), min_size=4, max_size=4),
)
def test_random_relocations_fail_only_with_core_error(
    relos: list[tuple[int, int, str, CoreReloKind]], imms: list[int]
) -> None:
    prog = program(mov(imms[0]), ldx(LDX_W, imms[1] & 0x7FFF), ld64(imms[2]), mov(imms[3]))
    recs = [CoreRelo(i, t, a, k) for i, t, a, k in relos]
    try:
        res = relocate(_WORLD.local, prog, recs, [_WORLD.vmlinux])
    except CoreError:
        return
    assert len(res.insns) == len(prog) and len(res.results) == len(recs)


def test_cyclic_btf_gives_core_error() -> None:
    # A struct whose anonymous member is the struct itself, and a typedef loop: malformed
    # BTF must end in CoreError, never RecursionError or a hang.
    t = TypeBuilder()
    i32 = t.add_int("int", 4, signed=True)
    loop = t.add_struct("loop", 4, [("", 2, 0, 0)])  # member type = itself (id 2)
    td = t.add_typedef("td_loop", 4)  # id 3 -> 4
    t.add_typedef("td_loop2", td)  # id 4 -> 3
    assert (i32, loop, td) == (1, 2, 3)
    target = t.finish("vmlinux")
    b = TypeBuilder()
    li32 = b.add_int("int", 4, signed=True)
    lloop = b.add_struct("loop", 4, [("x", li32, 0, 0)])
    ltd = b.add_typedef("td_loop", li32)
    local = b.finish("obj")
    with pytest.raises(CoreError, match="deeper than"):
        relocate(
            local,
            program(mov(0)),
            [CoreRelo(0, lloop, "0:0", CoreReloKind.FIELD_BYTE_OFFSET)],
            [target],
        )
    with pytest.raises(CoreError):
        relocate(
            local, program(mov(1)), [CoreRelo(0, ltd, "0", CoreReloKind.TYPE_EXISTS)], [target]
        )


def test_flexible_array_member() -> None:
    # struct buf { int n; int data[]; }: any index is fine in a trailing zero-length array.
    t = TypeBuilder()
    ti = t.add_int("int", 4, signed=True)
    tl = t.add_int("long", 8, signed=True)
    tflex = t.add_array(ti, ti, 0)
    t.add_struct("buf", 16, [("pad", tl, 0, 0), ("n", ti, 64, 0), ("data", tflex, 96, 0)])
    target = t.finish("vmlinux")
    b = TypeBuilder()
    li = b.add_int("int", 4, signed=True)
    lflex = b.add_array(li, li, 0)
    lbuf = b.add_struct("buf", 4, [("n", li, 0, 0), ("data", lflex, 32, 0)])
    local = b.finish("obj")
    # data[5]: local 4 + 20 = 24, target 12 + 20 = 32
    res = relocate(
        local,
        program(mov(24)),
        [CoreRelo(0, lbuf, "0:1:5", CoreReloKind.FIELD_BYTE_OFFSET)],
        [target],
    )
    assert res.results[0].target_value == 32 and res.results[0].target_access == "0:2:5"
