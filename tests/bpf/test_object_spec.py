"""open_object on every test object: the spec is asserted in detail (maps, variables,
programs, linking, fixups, externs, struct_ops, .kmod_btfs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf import insn
from schedswitchd.bpf.btf.types import (
    FUNC_GLOBAL,
    VAR_GLOBAL_ALLOCATED,
    Datasec,
    Func,
    FuncProto,
    Kind,
    Var,
)
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import (
    ATTACH_NONE,
    F_LINK,
    F_MMAPABLE,
    F_NUMA_NODE,
    F_RDONLY_PROG,
    MAP_TYPE_ARENA,
    MAP_TYPE_STRUCT_OPS,
    PIN_BY_NAME,
    PROG_TYPE_KPROBE,
    PROG_TYPE_RAW_TRACEPOINT,
    PROG_TYPE_STRUCT_OPS,
    PROG_TYPE_SYSCALL,
    ExternKind,
    FixupKind,
    KconfigType,
    MapKind,
    ObjectSpec,
    ProgramSpec,
)

Obj = Callable[[str], Path]


def _open(bpf_object: Obj, name: str) -> ObjectSpec:
    return open_object(bpf_object(name))


def _fix(p: ProgramSpec) -> list[tuple[str, int, int, int, str]]:
    return [(f.kind.value, f.insn_idx, f.map_index, f.offset, f.extern) for f in p.fixups]


# --- maps ---------------------------------------------------------------------------------


def test_maps_object(bpf_object: Obj) -> None:
    o = _open(bpf_object, "maps")
    assert o.name == "maps"
    assert o.license == "GPL"
    assert o.kmod_btfs is None
    assert o.externs == ()
    by = {m.name: m for m in o.maps}
    assert set(by) == {
        "counts", "pinned_array", "percpu", "events", "bloom", "lru", "inner_a", "inner_b",
        "outer",
    }  # fmt: skip
    # no global data in this object: no internal maps
    assert all(m.kind is MapKind.DECLARED for m in o.maps)
    c = by["counts"]
    assert (c.type, c.key_size, c.value_size, c.max_entries, c.flags) == (1, 4, 8, 128, 1)
    assert o.btf is not None
    assert o.btf.type_name(c.key_type_id) == "__u32"
    assert o.btf.type_name(c.value_type_id) == "__u64"
    pa = by["pinned_array"]
    assert pa.pinning == PIN_BY_NAME and pa.value_size == 16 and pa.max_entries == 4
    assert o.btf.type_name(pa.value_type_id) == "pair"
    pc = by["percpu"]
    assert (pc.type, pc.key_size, pc.value_size, pc.key_type_id) == (5, 8, 16, 0)
    ev = by["events"]
    assert (ev.type, ev.key_size, ev.value_size, ev.max_entries) == (27, 0, 0, 4096)
    bl = by["bloom"]
    assert (bl.type, bl.key_size, bl.value_size, bl.map_extra) == (30, 0, 4, 3)
    lru = by["lru"]
    assert (lru.type, lru.flags, lru.numa_node) == (9, F_NUMA_NODE, 0)
    out = by["outer"]
    assert (out.type, out.key_size, out.value_size, out.max_entries) == (12, 4, 4, 3)
    assert out.init_slots == ((0, "inner_b"), (2, "inner_a"))
    assert out.inner is not None
    assert (out.inner.type, out.inner.key_size, out.inner.value_size) == (2, 4, 4)
    assert out.inner.max_entries == 1
    assert all(m.kernel_name == m.name for m in o.maps)


def test_maps_programs_and_fixups(bpf_object: Obj) -> None:
    o = _open(bpf_object, "maps")
    on = o.program("on_switch")
    assert on.section == "raw_tp/sched_switch"
    assert (on.prog_type, on.expected_attach_type) == (PROG_TYPE_RAW_TRACEPOINT, ATTACH_NONE)
    assert on.attach_to == "sched_switch" and on.autoload and not on.sleepable
    assert on.subprograms == ()  # clang inlined the static helpers count() and bump_inner()
    names = [o.maps[f.map_index].name for f in on.fixups]
    # one fixup per map reference, in instruction order: count() inlined three times (a
    # lookup and an update each), bump_inner() three times, push/peek on bloom, lookup and
    # update on percpu
    assert names == [
        "counts", "counts", "pinned_array", "outer", "outer", "outer", "events",
        "counts", "counts", "bloom", "bloom", "counts", "counts", "lru", "percpu", "percpu",
    ]  # fmt: skip
    assert [f.insn_idx for f in on.fixups] == sorted(f.insn_idx for f in on.fixups)
    for f in on.fixups:
        assert f.kind is FixupKind.MAP_FD
        ins = insn.decode(on.insns, f.insn_idx)
        assert ins.is_ld_imm64 and ins.src == insn.PSEUDO_MAP_FD and ins.imm == 0
    ps = o.program("probe_sleep")
    assert ps.section == "?kprobe/do_nanosleep" and not ps.autoload
    assert (ps.prog_type, ps.attach_to) == (PROG_TYPE_KPROBE, "do_nanosleep")
    assert [o.maps[f.map_index].name for f in ps.fixups] == ["counts"]
    assert on.func_info[0].insn_idx == 0
    assert o.btf is not None
    assert o.btf.type_name(on.func_info[0].type_id) == "on_switch"
    assert on.btf_func_id == on.func_info[0].type_id
    assert on.line_info and all(0 <= li.insn_idx < on.insn_count for li in on.line_info)


# --- global data ----------------------------------------------------------------------------


def test_globals_maps_and_variables(bpf_object: Obj) -> None:
    o = _open(bpf_object, "globals")
    assert [m.name for m in o.maps] == [
        ".rodata",
        ".data",
        ".bss",
        ".data.cpu_loads",
        ".bss.cpu_ids",
    ]
    ro, data, bss, loads, ids = o.maps
    assert ro.kernel_name == "globals.rodata" and data.kernel_name == "globals.data"
    assert bss.kernel_name == "globals.bss" and loads.kernel_name == ".data.cpu_loads"
    assert ro.flags == F_RDONLY_PROG | F_MMAPABLE and ro.kind is MapKind.RODATA
    assert data.flags == F_MMAPABLE and bss.flags == F_MMAPABLE
    assert all((m.type, m.key_size, m.max_entries) == (2, 4, 1) for m in o.maps)
    v = {x.name: x for x in ro.variables}
    assert (v["nr_cpus"].offset, v["nr_cpus"].size) == (0, 4)
    assert (v["slice_ns"].offset, v["slice_ns"].size) == (8, 8)
    assert (v["tag"].size, v["weights"].size, v["small_u8"].size) == (8, 6, 1)
    assert ro.data is not None
    assert int.from_bytes(ro.data[0:4], "little") == 8
    assert int.from_bytes(ro.data[8:16], "little", signed=True) == -5000000
    assert ro.data[16] == 1
    assert ro.data[17:25] == b"fifo\0\0\0\0"
    assert ro.data[26:32] == b"\x01\x00\x02\x00\x03\x00"
    d = {x.name: x for x in data.variables}
    assert d["hidden_var"].static and d["static_data"].static
    assert not d["counter"].static and not d["signed_data"].static
    assert data.data is not None
    assert int.from_bytes(data.data[d["counter"].offset : d["counter"].offset + 8], "little") == 42
    assert bss.data is None  # all zeros, never materialised (NOBITS)
    assert [x.name for x in bss.variables] == ["zeroed", "stats"]
    assert loads.value_size == 8 and ids.value_size == 16 and ids.kind is MapKind.BSS
    assert o.btf is not None
    for m in o.maps:
        ds = o.btf.type(m.value_type_id)
        assert isinstance(ds, Datasec) and ds.name == m.name and ds.size == m.value_size


def test_globals_fixups_point_at_variables(bpf_object: Obj) -> None:
    o = _open(bpf_object, "globals")
    p = o.program("read_globals")
    # a syscall program (always sleepable), so tests can run it with BPF_PROG_TEST_RUN
    assert (p.section, p.prog_type, p.sleepable) == ("syscall", PROG_TYPE_SYSCALL, True)
    targets = set()
    for f in p.fixups:
        assert f.kind is FixupKind.MAP_VALUE
        ins, hi = insn.decode(p.insns, f.insn_idx), insn.decode(p.insns, f.insn_idx + 1)
        assert ins.src == insn.PSEUDO_MAP_VALUE and hi.imm == f.offset
        m = o.maps[f.map_index]
        var = next(v for v in m.variables if v.offset <= f.offset < v.offset + v.size)
        targets.add(var.name)
    # every variable the program touches, hidden and static ones included
    assert targets == {v.name for m in o.maps for v in m.variables}


# --- subprograms ------------------------------------------------------------------------------


def _callee(insns: bytes, idx: int) -> int:
    ins = insn.decode(insns, idx)
    return idx + ins.imm + 1


def test_subprograms_linked_per_program(bpf_object: Obj) -> None:
    o = _open(bpf_object, "subprogs")
    a = o.program("prog_a")
    assert set(a.subprograms) == {"loop_cb", "map_cb", "twice", "add_one"}
    starts = {o.btf.type_name(fi.type_id): fi.insn_idx for fi in a.func_info}  # type: ignore[union-attr]
    assert starts["prog_a"] == 0 and set(starts) == {"prog_a", *a.subprograms}
    calls, callbacks = [], []
    for k in range(a.insn_count):
        ins = insn.decode(a.insns, k)
        if ins.code == insn.CALL and ins.src == insn.PSEUDO_CALL:
            calls.append((k, _callee(a.insns, k)))
        if ins.is_ld_imm64 and ins.src == insn.PSEUDO_FUNC:
            callbacks.append(_callee(a.insns, k))
    assert sorted(callbacks) == sorted([starts["loop_cb"], starts["map_cb"]])
    called = {t for _, t in calls}
    assert called == {starts["twice"], starts["add_one"]}
    # twice calls add_one twice... compiled as one call (add_one(x) + add_one(x) folded)
    assert sum(1 for _, t in calls if t == starts["add_one"]) >= 2
    # each appended subprogram appears once
    assert len(a.subprograms) == len(set(a.subprograms))
    # line info sorted, within the program, and present in each subprogram
    idxs = [li.insn_idx for li in a.line_info]
    assert idxs == sorted(idxs) and idxs[-1] < a.insn_count
    for name in a.subprograms:
        assert any(li.insn_idx == starts[name] for li in a.line_info)
    # map reference from the subprogram map_cb was re-based
    bss = o.map_index(".bss")
    assert sum(1 for f in a.fixups if f.map_index == bss) == 2
    assert any(starts["map_cb"] <= f.insn_idx < starts["twice"] for f in a.fixups)

    b = o.program("prog_b")
    assert b.subprograms == ("global_helper",)
    c = o.program("prog_c")
    assert c.subprograms == ("add_one",) and c.prog_type == PROG_TYPE_SYSCALL and c.sleepable
    assert c.insn_count < a.insn_count


def test_global_subprogram_keeps_global_linkage(bpf_object: Obj) -> None:
    o = _open(bpf_object, "subprogs")
    assert o.btf is not None
    fid = o.btf.find("global_helper", Kind.FUNC)
    assert fid is not None
    fn = o.btf.type(fid)
    assert isinstance(fn, Func) and fn.linkage == FUNC_GLOBAL


# --- externs ------------------------------------------------------------------------------------


def test_ksyms_externs(bpf_object: Obj) -> None:
    o = _open(bpf_object, "ksyms")
    e = {x.name: x for x in o.externs}
    assert e["bpf_rcu_read_lock"].kind is ExternKind.KFUNC and not e["bpf_rcu_read_lock"].weak
    assert e["bpf_no_such_kfunc"].kind is ExternKind.KFUNC and e["bpf_no_such_kfunc"].weak
    assert e["bpf_task_release___compat"].essential_name == "bpf_task_release"
    assert e["runqueues"].kind is ExternKind.KSYM_VAR and not e["runqueues"].weak
    assert e["init_task"].kind is ExternKind.KSYM_VAR and e["init_task"].type_id == 0
    assert e["no_such_ksym_var"].weak
    assert o.btf is not None
    assert o.btf.type_name(e["runqueues"].type_id) == "rq"
    assert o.btf.type_name(e["no_such_ksym_var"].type_id) == "int"
    proto = o.btf.type(e["bpf_task_acquire"].type_id)
    assert isinstance(proto, FuncProto) and len(proto.params) == 1
    p = o.program("use_ksyms")
    kinds = {(f.kind, f.extern) for f in p.fixups}
    assert (FixupKind.KSYM, "runqueues") in kinds
    assert (FixupKind.KSYM, "init_task") in kinds
    assert (FixupKind.KSYM, "no_such_ksym_var") in kinds
    assert (FixupKind.KFUNC_CALL, "bpf_rcu_read_lock") in kinds
    assert (FixupKind.KFUNC_CALL, "bpf_task_release___compat") in kinds
    # `if (bpf_no_such_kfunc)` loads its address; then it is called
    assert (FixupKind.KSYM, "bpf_no_such_kfunc") in kinds
    assert (FixupKind.KFUNC_CALL, "bpf_no_such_kfunc") in kinds
    for f in p.fixups:
        if f.kind is FixupKind.KFUNC_CALL:
            ins = insn.decode(p.insns, f.insn_idx)
            assert ins.code == insn.CALL and ins.src == insn.PSEUDO_KFUNC_CALL


def test_ksyms_btf_fixed_up_for_kernel(bpf_object: Obj) -> None:
    o = _open(bpf_object, "ksyms")
    btf = o.btf
    assert btf is not None
    ds_id = btf.find(".ksyms", Kind.DATASEC)
    assert ds_id is not None
    ds = btf.type(ds_id)
    assert isinstance(ds, Datasec)
    assert ds.size == 4 * len(ds.vars) == 4 * len(o.externs)
    for i, vsi in enumerate(ds.vars):
        var = btf.type(vsi.type)
        assert isinstance(var, Var) and var.linkage == VAR_GLOBAL_ALLOCATED
        assert (vsi.offset, vsi.size) == (4 * i, 4)
    for e in o.externs:
        if e.kind is ExternKind.KFUNC:
            fn = btf.type(e.btf_id)
            assert isinstance(fn, Func) and fn.linkage == FUNC_GLOBAL
            proto = btf.type(fn.type)
            assert isinstance(proto, FuncProto)
            assert all(p.name for p in proto.params)


def test_kconfig_externs_layout(bpf_object: Obj) -> None:
    o = _open(bpf_object, "kconfig")
    e = {x.name: x for x in o.externs}
    assert all(x.kind is ExternKind.KCONFIG for x in o.externs)
    assert e["CONFIG_BPF_SYSCALL"].kconfig_type is KconfigType.BOOL
    assert e["CONFIG_BPF_JIT"].kconfig_type is KconfigType.TRISTATE
    assert e["CONFIG_HZ"].kconfig_type is KconfigType.INT and e["CONFIG_HZ"].signed
    assert e["LINUX_KERNEL_VERSION"].kconfig_type is KconfigType.INT
    assert not e["LINUX_KERNEL_VERSION"].signed
    assert e["CONFIG_NO_SUCH_CHAR"].kconfig_type is KconfigType.CHAR
    assert e["CONFIG_DEFAULT_HOSTNAME"].kconfig_type is KconfigType.CHAR_ARRAY
    assert e["CONFIG_DEFAULT_HOSTNAME"].size == 16
    assert e["CONFIG_NO_SUCH_U64"].weak and not e["CONFIG_HZ"].weak
    # libbpf layout: alignment descending, then size, then name
    assert [x.name for x in o.externs] == [
        "CONFIG_NO_SUCH_U64", "CONFIG_BPF_JIT", "CONFIG_HZ", "LINUX_KERNEL_VERSION",
        "CONFIG_BPF_SYSCALL", "CONFIG_NO_SUCH_CHAR", "CONFIG_DEFAULT_HOSTNAME",
    ]  # fmt: skip
    assert [x.offset for x in o.externs] == [0, 8, 12, 16, 20, 21, 22]
    k = o.map(".kconfig")
    assert k.kind is MapKind.KCONFIG and k.value_size == 38
    assert k.flags == F_RDONLY_PROG | F_MMAPABLE and k.kernel_name == "kconfig.kconfig"
    assert o.maps.index(k) == len(o.maps) - 1
    p = o.program("read_kconfig")
    kidx = o.map_index(".kconfig")
    kf = {f.extern: f for f in p.fixups if f.map_index == kidx}
    assert set(kf) == set(e)
    for name, f in kf.items():
        assert f.kind is FixupKind.MAP_VALUE and f.offset == e[name].offset


# --- struct_ops -------------------------------------------------------------------------------


def test_struct_ops_both_forms(bpf_object: Obj) -> None:
    o = _open(bpf_object, "struct_ops")
    plain, link = o.struct_ops_maps
    assert (plain.name, link.name) == ("ssd_plain", "ssd_link")
    assert plain.flags == 0 and link.flags == F_LINK
    assert plain.type == MAP_TYPE_STRUCT_OPS and plain.max_entries == 1
    sp, sl = plain.struct_ops, link.struct_ops
    assert sp is not None and sl is not None
    assert sp.type_name == sl.type_name == "tcp_congestion_ops"
    assert (sp.link, sl.link) == (False, True)
    assert sp.section == ".struct_ops" and sl.section == ".struct_ops.link"
    bound = {m.name: m.program for m in sp.members if m.program}
    assert bound == {
        "init": "ssd_init", "ssthresh": "ssd_ssthresh", "cong_avoid": "ssd_cong_avoid",
        "undo_cwnd": "ssd_undo_cwnd",
    }  # fmt: skip
    assert {m.name: m.program for m in sl.members if m.program} == {
        "ssthresh": "ssd_ssthresh", "cong_avoid": "ssd_cong_avoid",
        "undo_cwnd": "ssd_undo_cwnd", "release": "ssd_release",
    }  # fmt: skip
    name = sp.member("name")
    flags = sp.member("flags")
    assert name is not None and flags is not None and not name.is_func_ptr
    assert sp.data[name.offset : name.offset + 10] == b"ssd_plain\0"
    assert int.from_bytes(sp.data[flags.offset : flags.offset + flags.size], "little") == 1
    init = sp.member("init")
    assert init is not None and init.is_func_ptr and init.size == 8
    assert sp.data[init.offset : init.offset + 8] == bytes(8)
    rel = o.program("ssd_release")
    assert rel.sleepable and not rel.autoload and rel.prog_type == PROG_TYPE_STRUCT_OPS
    assert o.program("ssd_init").attach_to == "ssd_init"


# --- .kmod_btfs -------------------------------------------------------------------------------


def test_kmod_btfs_fixed_layout(bpf_object: Obj) -> None:
    o = _open(bpf_object, "kmod_fixed")
    assert o.kmod_btfs == ("nf_tables", "xfs", "no_such_module_xyz")
    assert all(m.section != ".kmod_btfs" for m in o.maps)


def test_kmod_btfs_pointer_layout(bpf_object: Obj) -> None:
    o = _open(bpf_object, "kmod_ptrs")
    assert o.kmod_btfs == ("btrfs", "no_such_module_xyz", "ext4")
    # the string literals only serve .kmod_btfs: no map for them
    assert o.maps == ()


def test_kmod_btfs_empty(bpf_object: Obj) -> None:
    o = _open(bpf_object, "kmod_empty")
    assert o.kmod_btfs == ()
    assert o.maps == ()


def test_no_kmod_btfs_section_means_none(bpf_object: Obj) -> None:
    assert _open(bpf_object, "globals").kmod_btfs is None


@pytest.mark.parametrize(
    "name",
    ["maps", "globals", "subprogs", "ksyms", "kconfig", "struct_ops", "kmod_fixed", "kmod_ptrs"],
)
def test_open_from_bytes_equals_open_from_path(bpf_object: Obj, name: str) -> None:
    path = bpf_object(name)
    a = open_object(path)
    b = open_object(path.read_bytes(), name=name)
    assert a.programs == b.programs
    assert a.maps == b.maps
    assert a.externs == b.externs
    assert a.btf is not None and b.btf is not None and bytes(a.btf.raw) == bytes(b.btf.raw)


# --- arena ------------------------------------------------------------------------------------


def test_arena_globals_relocate_into_the_arena_map(bpf_object: Obj) -> None:
    o = _open(bpf_object, "arena")
    assert [m.name for m in o.maps] == ["arena"]
    arena = o.maps[0]
    assert arena.kind is MapKind.ARENA and arena.type == MAP_TYPE_ARENA
    assert arena.max_entries == 2 and arena.flags == F_MMAPABLE
    assert arena.section == ".addr_space.1"
    # u64 arena_counter = 3; u64 arena_table[4] (zeros): only the initialised prefix is kept
    assert arena.data == b"\x03" and arena.data_size == 40
    assert [(v.name, v.offset, v.size) for v in arena.variables] == [
        ("arena_counter", 0, 8),
        ("arena_table", 8, 32),
    ]
    p = o.program("touch_arena")
    assert {(f.kind, f.map_index) for f in p.fixups} == {(FixupKind.MAP_VALUE, 0)}
    # ld_imm64 of arena_counter (offset 0) and of arena_table (offset 8; [1] is a +8 store)
    assert sorted(f.offset for f in p.fixups) == [0, 8]
