"""Applying a resolved profile to a real object's spec (build/tests/bpf/profile.bpf.o),
without a kernel: the pre-load edits read back from the spec, the plan's bytes checked
against the C layout of tests/bpf/profile.bpf.c."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.errors import CustomizationError
from schedswitchd.profile.apply import apply_profile
from schedswitchd.profile.model import parse_profile
from schedswitchd.profile.resolve import resolve_profile
from schedswitchd.profile.topology import Topology, read_topology
from tests.build_outputs import missing_build_output
from tests.profile.fakesys import fake_sysfs

OBJ = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf" / "profile.bpf.o"

PROFILE = """
[profile]
name = "prof"
ops_name = "ssd_prof"

[variables]
nr_cpu_ids = { expr = "topo.nr_cpu_ids" }
slice_ns = 5_000_000
smt_enabled = { expr = "topo.smt_active" }
llc_mask = { expr = "topo.llcs[-1].mask" }
cpu_ctxs = { expr = "[{'llc_id': c.llc_id, 'capacity': c.capacity} for c in topo.cpus]" }

[resize]
".data.cpu_ctxs" = { expr = "topo.nr_cpu_ids" }

[struct_ops]
flags = ["TCP_CONG_NON_RESTRICTED", "NOT_A_FLAG"]

[after_load]
armed = 3

[[map_updates]]
map = "cpu_info"
for_each = "online_cpu"
key = { expr = "cpu.id" }
value = { llc = { expr = "cpu.llc_id" }, cap = { expr = "cpu.capacity * 2" } }

[[map_updates]]
map = "pcpu_stats"
key = 1
value = 5

[[run]]
program = "enable_sibling_cpu"
for_each = "smt_pair"
args = { cpu_id = { expr = "pair.cpu" }, sibling_cpu_id = { expr = "pair.sibling" } }

[[run]]
program = "record_cpu"
for_each = "online_cpu"
cpu = { expr = "cpu.id" }
args = { slot = { expr = "cpu.id" }, value = -5 }

[[stats]]
name = "runs"
variable = "nr_runs"

[[stats]]
name = "pcpu"
map = "pcpu_stats"
key = 1
"""


@pytest.fixture(scope="module")
def spec() -> ObjectSpec:
    if not OBJ.is_file():
        missing_build_output(OBJ)
    return open_object(OBJ)


@pytest.fixture
def topo(tmp_path: Path) -> Topology:
    root = fake_sysfs(tmp_path, possible=range(4), siblings=[[0, 2], [1, 3]], llcs=[[0, 2], [1, 3]])
    return read_topology(root)


def _var(spec: ObjectSpec, name: str) -> bytes:
    for m in spec.maps:
        v = m.variable(name)
        if v is not None and m.data is not None:
            return m.data[v.offset : v.offset + v.size]
    raise KeyError(name)


FLAGS = {"TCP_CONG_NON_RESTRICTED": 1}


def test_pre_load_edits_and_plan(spec: ObjectSpec, topo: Topology) -> None:
    res = resolve_profile(parse_profile(PROFILE), topo)
    out, plan = apply_profile(spec, res, flags=FLAGS)
    assert struct.unpack("<I", _var(out, "nr_cpu_ids")) == (4,)
    assert struct.unpack("<Q", _var(out, "slice_ns")) == (5_000_000,)
    assert _var(out, "smt_enabled") == b"\x01"
    assert _var(out, "llc_mask") == b"\x0a" + bytes(15)
    # resized to nr_cpu_ids elements of struct cpu_ctx {u32 llc_id; u32 capacity;}
    assert out.map(".data.cpu_ctxs").value_size == 4 * 8
    ctxs = struct.unpack("<8I", _var(out, "cpu_ctxs"))
    assert ctxs == (0, 1024, 1, 1024, 0, 1024, 1, 1024)
    so = out.map("ssd_prof").struct_ops
    assert so is not None
    flags = so.member("flags")
    assert flags is not None
    assert so.data[flags.offset : flags.offset + 4] == b"\x01\0\0\0"
    assert plan.notes == ["struct_ops.flags: flag NOT_A_FLAG dropped: the kernel lacks it"]
    assert plan.after_load == [("armed", struct.pack("<I", 3))]
    info = [u for u in plan.map_updates if u.map == "cpu_info"]
    # struct info {u32 llc; u64 cap;}: 4 bytes of padding after llc
    assert [(u.key, u.value) for u in info][1] == (
        struct.pack("<I", 1),
        struct.pack("<IIQ", 1, 0, 2048),
    )
    pcpu = [u for u in plan.map_updates if u.map == "pcpu_stats"]
    assert pcpu[0].percpu and pcpu[0].value == struct.pack("<Q", 5)
    sib = [r.ctx for r in plan.runs if r.program == "enable_sibling_cpu"]
    assert sib[0] == struct.pack("<ii", 0, 2) and len(sib) == 4
    rec = [r for r in plan.runs if r.program == "record_cpu"]
    assert [r.cpu for r in rec] == [0, 1, 2, 3]
    assert rec[3].ctx == struct.pack("<IIq", 3, 0, -5)
    assert [(s.name, s.variable, s.map, s.size) for s in plan.stats] == [
        ("runs", "nr_runs", None, 8),
        ("pcpu", None, "pcpu_stats", 8),
    ]
    # the input spec is untouched (specs are values)
    assert struct.unpack("<I", _var(spec, "nr_cpu_ids")) == (1,)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (('ops_name = "ssd_prof"', 'ops_name = "other"'), "registers 'ssd_prof'"),
        (("slice_ns = 5_000_000", "slice_ns = -1"), r"variables\.slice_ns: .*out of range"),
        (("slice_ns = 5_000_000", "no_such = 1"), r"variables\.no_such: no global variable"),
        (("armed = 3", "nr_cpu_ids = 3"), r"after_load\.nr_cpu_ids: .*frozen after load"),
        (('map = "pcpu_stats"', 'map = "nope"'), r"map_updates\[1\] nope: .*no map 'nope'"),
        (("value = 5", "value = { a = 1 }"), r"map_updates\[1\] pcpu_stats value"),
        (("value = -5", "valu = -5"), r"run\[1\] record_cpu \(cpu 0\) args: .*no member 'valu'"),
        (('program = "record_cpu"', 'program = "ssd_prof_ssthresh"'), r'not SEC\("syscall"\)'),
        (('flags = ["TCP', 'required_flags = ["NOT_A_FLAG"]\nflags = ["TCP'), "required flag"),
        (('".data.cpu_ctxs" = {', '".data.nope" = {'), r"resize\.'\.data\.nope'"),
        (
            ('name = "pcpu"\nmap = "pcpu_stats"', 'name = "pcpu"\nmap = "cpu_info"\nfield = "x"'),
            r"stats\.pcpu: .*no member 'x'",
        ),
    ],
)
def test_mismatches_are_refused(
    spec: ObjectSpec, topo: Topology, edit: tuple[str, str], match: str
) -> None:
    old, new = edit
    assert old in PROFILE
    res = resolve_profile(parse_profile(PROFILE.replace(old, new, 1)), topo)
    with pytest.raises(CustomizationError, match=match):
        apply_profile(spec, res, flags=FLAGS)


def test_args_for_void_ctx_program(spec: ObjectSpec, topo: Topology) -> None:
    text = PROFILE + '\n[[run]]\nprogram = "returns_seven"\nargs = { x = 1 }\n'
    res = resolve_profile(parse_profile(text), topo)
    with pytest.raises(CustomizationError, match="takes no context struct"):
        apply_profile(spec, res, flags=FLAGS)
    text = PROFILE + '\n[[run]]\nprogram = "returns_seven"\nexpect_retval = 7\n'
    _, plan = apply_profile(spec, resolve_profile(parse_profile(text), topo), flags=FLAGS)
    assert plan.runs[-1].ctx == b"" and plan.runs[-1].expect_retval == 7
