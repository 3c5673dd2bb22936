"""The shipped scheduler profiles (config/profiles/*.toml) against the objects they describe.

Each profile states, as data, what a community scheduler's own userspace does around loading
it. These tests hold the profiles to the objects of ``../shared/corpus`` (the same schedulers,
compiled at the commits the profiles cite): every variable a profile writes exists in the
object, is not static, and takes the profile's literal values through the object's BTF (the
project's own encoder, ``schedswitchd.bpf.customize``); every resized section exists and
resizes; every program it runs is a ``SEC("syscall")`` program whose context struct has the
argument members named; every counter it shows exists; the ops name is the object's. Values
given as expressions depend on the machine's topology and are the framework's to evaluate;
here only their targets are checked (they skip when the corpus is absent). Then the
framework's resolver (``schedswitchd.profile``) evaluates every profile and mode on fake sysfs
trees (the VM's 2 CPUs; 8 CPUs with SMT over 2 LLCs; 16 CPUs over 2 nodes with one offline),
and the values that encode a scheduler's own topology logic are compared with what its
userspace computes for those machines.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from schedswitchd.bpf.btf.types import Composite, Func, FuncProto, Kind, Ref
from schedswitchd.bpf.customize import (
    resize_array_section,
    set_struct_ops_member,
    set_variable,
)
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import MapKind, ObjectSpec
from schedswitchd.errors import SchedSwitchError
from schedswitchd.profile.model import load_profile
from schedswitchd.profile.resolve import KernelFacts, resolve_profile
from schedswitchd.profile.topology import Topology, read_topology
from tests.profile.fakesys import fake_sysfs

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "config" / "profiles"
CORPUS = REPO.parent / "shared" / "corpus"

# profile name -> corpus object (the object each profile was read against)
OBJECTS = {
    "bpfland": "bpfland.bpf.o",
    "flash": "flash.bpf.o",
    "tickless": "tickless.bpf.o",
    "lavd": "lavd.bpf.o",
    "p2dq": "p2dq.bpf.o",
    "scx_simple": "k_simple.bpf.o",
    "scx_qmap": "k_qmap.bpf.o",
    "scx_central": "k_central.bpf.o",
    "scx_flatcg": "k_flatcg.bpf.o",
}
_DATA = (MapKind.DATA, MapKind.RODATA, MapKind.BSS)


def _load(name: str) -> dict[str, Any]:
    with open(PROFILES / f"{name}.toml", "rb") as f:
        return tomllib.load(f)


def _is_expr(v: object) -> bool:
    return isinstance(v, dict) and set(v) == {"expr"}


def _literal(v: object) -> object:
    """``v`` with every expression dropped (dict members) -- or None if ``v`` is one."""
    if _is_expr(v):
        return None
    if isinstance(v, dict):
        return {k: x for k, x in ((k, _literal(x)) for k, x in v.items()) if x is not None}
    if isinstance(v, list):
        if any(_is_expr(x) for x in v):
            return None
        return [_literal(x) for x in v]
    return v


_opened: dict[str, ObjectSpec | str] = {}


def _object(name: str) -> ObjectSpec:
    path = CORPUS / OBJECTS[name]
    if not path.is_file():
        pytest.skip(f"corpus object {path.name} absent (../shared/corpus)")
    if name not in _opened:
        try:
            _opened[name] = open_object(path)
        except SchedSwitchError as exc:  # lavd/p2dq until the opener handles arenas etc.
            _opened[name] = f"{type(exc).__name__}: {exc}"
    got = _opened[name]
    if isinstance(got, str):
        pytest.skip(f"{path.name} does not open with this loader yet: {got}")
    return got


def _layers(prof: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The base and every mode, each as (label, tables)."""
    out = [("base", prof)]
    out += [(f"mode {m}", body) for m, body in prof.get("modes", {}).items()]
    return out


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_profile_header(name: str) -> None:
    prof = _load(name)
    head = prof["profile"]
    assert head["name"] == name
    assert head["ops_name"] and head["summary"]
    assert head["userspace"] == "none"
    # cites its source: the repository, a commit and files
    assert "sched-ext/scx" in head["source"]
    assert any(c in head["source"] for c in ("7a58a3a1", "0f379644")), head["source"]
    for label, layer in _layers(prof)[1:]:
        assert layer.get("summary"), f"{name} {label} has no summary"


def test_all_nine_shipped() -> None:
    assert {p.stem for p in PROFILES.glob("*.toml")} >= set(OBJECTS)
    for name in ("lavd", "bpfland"):
        assert len(_load(name).get("modes", {})) >= 2, name


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_ops_name_is_the_objects(name: str) -> None:
    spec = _object(name)
    prof = _load(name)
    ops = [m.struct_ops for m in spec.maps if m.struct_ops is not None]
    assert len(ops) == 1
    so = ops[0]
    mem = so.member("name")
    assert mem is not None
    raw = so.data[mem.offset : mem.offset + mem.size].split(b"\0", 1)[0].decode()
    assert raw == prof["profile"]["ops_name"]


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_variables_exist_and_take_the_values(name: str) -> None:
    spec = _object(name)
    prof = _load(name)
    known = {v.name: v for m in spec.maps if m.kind in _DATA for v in m.variables}
    for label, layer in _layers(prof):
        for table in ("variables", "after_load"):
            for var, value in layer.get(table, {}).items():
                where = f"{name} {label} [{table}] {var}"
                assert var in known, f"{where}: no such global in {OBJECTS[name]}"
                assert not known[var].static, f"{where}: static, cannot be set"
                lit = _literal(value)
                if lit is not None and lit != {}:
                    set_variable(spec, var, lit)  # raises on a wrong type, size or range


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_resized_sections_resize(name: str) -> None:
    spec = _object(name)
    for label, layer in _layers(_load(name)):
        for section, count in layer.get("resize", {}).items():
            n = count if isinstance(count, int) else 2
            resized = resize_array_section(spec, section, n)
            assert resized.map(section).value_size > 0, f"{name} {label} {section}"


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_struct_ops_members_exist(name: str) -> None:
    spec = _object(name)
    ops_map = next(m.name for m in spec.maps if m.struct_ops is not None)
    for _label, layer in _layers(_load(name)):
        for member, value in layer.get("struct_ops", {}).items():
            if member in ("flags", "add_flags", "remove_flags", "required_flags"):
                continue  # names resolved against the kernel's BTF, not the object's
            if _is_expr(value):
                value = 1  # e.g. hotplug_seq from sysfs: check the member takes an int
            set_struct_ops_member(spec, ops_map, member, value)


def _ctx_struct(spec: ObjectSpec, program: str) -> Composite:
    btf = spec.btf
    assert btf is not None
    prog = spec.program(program)
    func = btf.type(prog.btf_func_id)
    assert isinstance(func, Func)
    proto = btf.type(func.type)
    assert isinstance(proto, FuncProto) and len(proto.params) == 1, program
    ptr = btf.type(btf.skip_mods_and_typedefs(proto.params[0].type))
    assert isinstance(ptr, Ref) and ptr.kind == Kind.PTR, f"{program}: argument not a pointer"
    ctx = btf.type(btf.skip_mods_and_typedefs(ptr.type))
    assert isinstance(ctx, Composite), f"{program}: its argument is not a struct pointer"
    return ctx


def _runs(layer: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for run in layer.get("run", []):
        out.append(run)
    return out


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_run_programs_are_syscall_programs_with_those_args(name: str) -> None:
    spec = _object(name)
    for label, layer in _layers(_load(name)):
        for run in _runs(layer):
            prog = spec.program(run["program"])
            assert prog.section == "syscall", f"{name} {label}: {prog.name} is {prog.section}"
            members = {m.name for m in _ctx_struct(spec, prog.name).members}
            missing = set(run.get("args", {})) - members
            assert not missing, f"{name} {label} {prog.name}: no ctx member {missing}"


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_stats_name_existing_counters(name: str) -> None:
    spec = _object(name)
    known = {v.name for m in spec.maps if m.kind in _DATA for v in m.variables}
    for stat in _load(name).get("stats", []):
        if "variable" in stat:
            assert stat["variable"].split(".")[0] in known, stat
        else:
            m = spec.map(stat["map"])
            assert 0 <= stat["key"] < m.max_entries, stat


# --- with the framework's resolver (schedswitchd.profile) on fake sysfs trees ---------------

TOPOLOGIES: dict[str, dict[str, Any]] = {
    # the VM: 2 CPUs, no SMT, one LLC, one node
    "vm2": {"possible": [0, 1], "llcs": [[0, 1]], "nodes": [[0, 1]]},
    # 4 cores x 2 threads over 2 LLCs
    "smt8": {
        "possible": list(range(8)),
        "siblings": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "llcs": [[0, 1, 4, 5], [2, 3, 6, 7]],
        "nodes": [list(range(8))],
    },
    # 2 nodes, 4 LLCs, SMT, CPU 15 offline
    "numa16": {
        "possible": list(range(16)),
        "online": list(range(15)),
        "siblings": [[i, i + 8] for i in range(7)] + [[7]],
        "llcs": [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14]],
        "nodes": [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14]],
    },
}
# the enumerators the profiles ask the kernel for (values of the VM kernel's BTF)
KERNEL = KernelFacts({"SCX_SLICE_DFL": 20_000_000}.get, "test table")


@pytest.fixture(scope="module")
def topologies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Topology]:
    out = {}
    for name, shape in TOPOLOGIES.items():
        root = fake_sysfs(tmp_path_factory.mktemp(name), **shape)
        out[name] = read_topology(root)
    return out


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_every_mode_resolves_on_every_topology(name: str, topologies: dict[str, Topology]) -> None:
    prof = load_profile(PROFILES / f"{name}.toml")
    for tname, topo in topologies.items():
        for mode in [None, *prof.modes]:
            r = resolve_profile(prof, topo, mode=mode, kernel=KERNEL)
            assert r.name == name, (tname, mode)


def test_bpfland_values(topologies: dict[str, Topology]) -> None:
    prof = load_profile(PROFILES / "bpfland.toml")
    r = resolve_profile(prof, topologies["vm2"], kernel=KERNEL)
    assert r.variables["primary_all"] is True and r.variables["smt_enabled"] is False
    assert [(x.program, x.args["cpu_id"]) for x in r.runs] == [
        ("enable_primary_cpu", -1),
        ("enable_primary_cpu", 0),
        ("enable_primary_cpu", 1),
    ]
    r = resolve_profile(prof, topologies["smt8"], kernel=KERNEL)
    sib = [(x.args["cpu_id"], x.args["sibling_cpu_id"]) for x in r.runs if "sibling" in x.program]
    assert sib == [(c, (c + 4) % 8) for c in range(8)]
    # numa16: CPU 7 has no online sibling, offline CPU 15 gets -1 too
    r = resolve_profile(prof, topologies["numa16"], kernel=KERNEL)
    by_cpu = {x.args["cpu_id"]: x.args["sibling_cpu_id"] for x in r.runs if "sibling" in x.program}
    assert by_cpu[7] == -1 and by_cpu[15] == -1 and by_cpu[0] == 8
    assert r.variables["primary_all"] is False  # 15 of 16 possible CPUs online
    ps = resolve_profile(prof, topologies["vm2"], mode="powersave", kernel=KERNEL)
    assert ps.variables["slice_max"] == 20_000_000 and ps.after_load["cpufreq_perf_lvl"] == 0


def test_tickless_timer_cpu(topologies: dict[str, Topology]) -> None:
    prof = load_profile(PROFILES / "tickless.toml")
    r = resolve_profile(prof, topologies["vm2"], kernel=KERNEL)
    # -m 0: the slowest online CPU, the last of the capacity-descending order
    assert r.attach_cpu == 1
    assert [(x.program, x.args["cpu_id"], x.when) for x in r.runs][-1] == (
        "start_timer",
        1,
        "after_attach",
    )


def test_lavd_tables(topologies: dict[str, Topology]) -> None:
    prof = load_profile(PROFILES / "lavd.toml")
    v = resolve_profile(prof, topologies["vm2"], kernel=KERNEL).variables
    assert v["nr_pco_states"] == 2 and v["pco_bounds"][:2] == [1024, 2048]
    assert [t[:2] for t in v["pco_table"][:2]] == [[0, 1], [0, 1]]
    assert v["cpdom_ctxs"][0]["is_valid"] == 1 and v["cpdom_ctxs"][1]["is_valid"] == 0
    assert v["cpdom_ctxs"][0]["__cpumask"][0] == 0b11
    v = resolve_profile(prof, topologies["smt8"], kernel=KERNEL).variables
    # powersave order fills a core's threads first, performance order one thread per core
    assert v["pco_table"][0][:8] == [0, 4, 1, 5, 2, 6, 3, 7]
    assert v["pco_table"][1][:8] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert v["cpu_sibling"][:8] == [4, 5, 6, 7, 0, 1, 2, 3]
    v = resolve_profile(prof, topologies["numa16"], kernel=KERNEL).variables
    doms = v["cpdom_ctxs"]
    assert [d["is_valid"] for d in doms[:5]] == [1, 1, 1, 1, 0]
    # domain 0: one neighbour in its node (1), two in the other (2, 3)
    assert doms[0]["nr_neighbors"] == [1, 2, 0]
    assert doms[0]["neighbor_ids"][0] == 1 and doms[0]["neighbor_ids"][128:130] == [2, 3]
    assert doms[3]["numa_id"] == 1
    gaming = resolve_profile(prof, topologies["vm2"], mode="gaming", kernel=KERNEL)
    assert [x.args for x in gaming.runs if x.program == "set_power_profile"][-1] == {
        "power_mode": 0
    }


SID_BTF = REPO / "build" / "sid" / "vmlinux.btf"


@pytest.mark.parametrize(
    ("name", "var", "on"), [("bpfland", "numa_enabled", True), ("flash", "numa_disabled", False)]
)
def test_numa_exactly_on_multi_node_machines(
    name: str, var: str, on: bool, topologies: dict[str, Topology]
) -> None:
    """bpfland and flash turn NUMA on, with SCX_OPS_BUILTIN_IDLE_PER_NODE, exactly when
    more than one node has CPUs (main.rs: nr_nodes > 1), in every mode; against the
    corpus object and the sched_ext kernel's BTF the flag reaches sched_ext_ops.flags."""
    prof = load_profile(PROFILES / f"{name}.toml")
    flag = "SCX_OPS_BUILTIN_IDLE_PER_NODE"
    for tname, topo in topologies.items():
        multi = topo.nr_nodes > 1
        for mode in [None, *prof.modes]:
            r = resolve_profile(prof, topo, mode=mode, kernel=KERNEL)
            assert r.variables[var] is (on if multi else not on), (tname, mode)
            assert (flag in r.add_flags) is multi, (tname, mode)
    assert topologies["numa16"].nr_nodes == 2 and topologies["vm2"].nr_nodes == 1
    obj_path = CORPUS / OBJECTS[name]
    if not obj_path.is_file() or not SID_BTF.is_file():
        pytest.skip("the corpus object or build/sid/vmlinux.btf is absent (make kernel)")
    from schedswitchd.bpf.btf.reader import Btf
    from schedswitchd.bpf.ops_flags import ops_flags_table
    from schedswitchd.profile.apply import profile_spec

    btf = Btf.from_file(SID_BTF, name="vmlinux")
    bit = ops_flags_table(btf)[flag]
    for tname in ("vm2", "numa16"):
        ps = profile_spec(open_object(obj_path), prof, topologies[tname], kernel_btf=btf)
        so = ps.spec.map(name + "_ops").struct_ops
        assert so is not None
        mem = so.member("flags")
        assert mem is not None
        value = int.from_bytes(so.data[mem.offset : mem.offset + mem.size], "little")
        assert bool(value & bit) is (tname == "numa16"), tname
