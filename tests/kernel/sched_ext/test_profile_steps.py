"""A profile's phases on the host kernel: build/tests/bpf/profile.bpf.o (a
tcp_congestion_ops with syscall programs and maps) loaded with a profile resolved for this
machine's real /sys, every write read back from the kernel's maps, the syscall programs
run (on the CPUs asked for: the program records bpf_get_smp_processor_id()), and the link
created from the attach CPU."""

from __future__ import annotations

import os
import struct
import uuid
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.errors import LoadError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import LoadedObject, load_object
from schedswitchd.kernel.sched_ext.profile_steps import (
    ENABLE_HELPER_COMM,
    attach_from_cpu,
    enable_helper_pids,
    helper_on_cpu,
    on_cpu,
    read_stats,
    run_after_attach,
    run_before_attach,
)
from schedswitchd.profile.apply import profile_spec
from schedswitchd.profile.model import parse_profile
from schedswitchd.profile.topology import read_topology
from tests.build_outputs import missing_build_output

pytestmark = pytest.mark.root

OBJ = Path(__file__).resolve().parents[3] / "build" / "tests" / "bpf" / "profile.bpf.o"

PROFILE = """
[profile]
name = "prof"
ops_name = "ssd_prof"

[variables]
nr_cpu_ids = { expr = "topo.nr_cpu_ids" }
cpu_ctxs = { expr = "[{'llc_id': c.llc_id + 40, 'capacity': c.capacity} for c in topo.cpus]" }

[resize]
".data.cpu_ctxs" = { expr = "topo.nr_cpu_ids" }

[struct_ops]
flags = 1

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
program = "record_cpu"
for_each = "online_cpu"
cpu = { expr = "cpu.id" }
args = { slot = { expr = "cpu.id" }, value = 100 }

[[run]]
program = "returns_seven"
when = "after_attach"
expect_retval = 7

# no cpu of its own: after attach it runs on the attach CPU (the loader keeps its pin)
[[run]]
program = "record_cpu"
when = "after_attach"
args = { slot = 63, value = 0 }

[attach]
cpu = { expr = "topo.online_cpus[-1]" }

[[stats]]
name = "runs"
variable = "nr_runs"

[[stats]]
name = "pcpu"
map = "pcpu_stats"
key = 1
"""


def _spec(name: str) -> ObjectSpec:
    if not OBJ.is_file():
        missing_build_output(OBJ)
    spec = open_object(OBJ)
    # A unique tcp_congestion_ops name: kernel-wide, and tests may run in parallel.
    from schedswitchd.bpf.customize import set_struct_ops_member

    return set_struct_ops_member(spec, "ssd_prof", "name", name)


def _load(spec: ObjectSpec, registry: KernelBtfRegistry, pin_root: Path) -> LoadedObject:
    return load_object(
        spec,
        registry.targets(spec.kmod_btfs),
        open_btf_object=registry.open_btf_object,
        pin_root=pin_root,
    )


def test_profile_phases_reach_the_kernel(registry: KernelBtfRegistry, bpffs: Path) -> None:
    name = f"ssdp{uuid.uuid4().hex[:8]}"
    text = PROFILE.replace('ops_name = "ssd_prof"', f'ops_name = "{name}"')
    topo = read_topology("/sys")
    vmlinux: Btf = registry.vmlinux
    ps = profile_spec(_spec(name), parse_profile(text), topo, kernel_btf=vmlinux)
    affinity = os.sched_getaffinity(0)
    with _load(ps.spec, registry, bpffs) as obj:
        assert struct.unpack("<I", obj.read_variable("nr_cpu_ids")) == (topo.nr_cpu_ids,)
        ctxs = obj.read_variable("cpu_ctxs")
        assert len(ctxs) == 8 * topo.nr_cpu_ids
        for c in topo.cpus:
            assert struct.unpack_from("<II", ctxs, 8 * c.id) == (c.llc_id + 40, c.capacity)
        run_before_attach(obj, ps.plan)
        assert struct.unpack("<I", obj.read_variable("armed")) == (3,)
        info = obj.maps["cpu_info"].fd
        for n in topo.online_cpus:
            raw = syscall.map_lookup_elem(info, struct.pack("<I", n), 16)
            assert raw is not None
            assert struct.unpack("<IIQ", raw) == (topo.cpu(n).llc_id, 0, 2 * topo.cpu(n).capacity)
        ran_on = struct.unpack("<64I", obj.read_variable("ran_on"))
        for n in topo.online_cpus:
            if n < 64:
                assert ran_on[n] == n + 1  # bpf_get_smp_processor_id() + 1: it ran on CPU c
        # last_arg = value + armed + nr_cpu_ids: after_load's write was seen by the program
        assert struct.unpack("<q", obj.read_variable("last_arg")) == (100 + 3 + topo.nr_cpu_ids,)
        assert os.sched_getaffinity(0) == affinity  # restored after each run
        for k in ("profile.after_load", "profile.map_updates", "profile.run.before_attach"):
            assert k in obj.timings_ns
        stats = read_stats(obj, ps.plan)
        assert stats == {"runs": topo.nr_cpus, "pcpu": 5 * syscall.possible_cpus()}

        seen: list[set[int]] = []

        def attach() -> None:
            seen.append(os.sched_getaffinity(0))
            obj.attach_struct_ops()

        attach_from_cpu(obj, ps.plan, attach)
        assert seen == [{topo.online_cpus[-1]}]
        assert os.sched_getaffinity(0) == affinity
        assert name in obj.links or obj.links  # the link exists
        avail = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text()
        assert name in avail.split()
        run_after_attach(obj, ps.plan)
        assert "profile.run.after_attach" in obj.timings_ns and "profile.attach" in obj.timings_ns
        ran_on = struct.unpack("<64I", obj.read_variable("ran_on"))
        assert ran_on[63] == topo.online_cpus[-1] + 1
        assert os.sched_getaffinity(0) == affinity
    avail = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text()
    assert name not in avail.split()


def test_wrong_retval_names_program_and_iteration(registry: KernelBtfRegistry, bpffs: Path) -> None:
    name = f"ssdp{uuid.uuid4().hex[:8]}"
    text = PROFILE.replace('ops_name = "ssd_prof"', f'ops_name = "{name}"').replace(
        "expect_retval = 7", "expect_retval = 0"
    )
    ps = profile_spec(_spec(name), parse_profile(text), read_topology("/sys"))
    with _load(ps.spec, registry, bpffs) as obj:
        run_before_attach(obj, ps.plan)
        with pytest.raises(LoadError, match=r"run\[1\] returns_seven: returns_seven returned 7"):
            run_after_attach(obj, ps.plan)


def test_on_cpu_refuses_an_impossible_cpu() -> None:
    before = os.sched_getaffinity(0)
    with pytest.raises(LoadError, match="CPU 100000"), on_cpu(100000):
        pass
    assert os.sched_getaffinity(0) == before


def test_enable_helper_pids_reads_kthreads_of_that_name(tmp_path: Path) -> None:
    def task(pid: int, comm: str, ppid: int) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} 0 0 0\n")

    task(77, "scx_enable_helper", 2)
    task(78, "scx_enable_helper", 1)  # a user process calling itself that: not a kthread
    task(79, "kworker/0:1 (x)", 2)
    (tmp_path / "self").mkdir()
    assert enable_helper_pids(str(tmp_path)) == [77]
    assert enable_helper_pids(str(tmp_path / "absent")) == []


def _fake_proc(root: Path, tasks: dict[int, str]) -> str:
    """A ``/proc`` holding only ``PID/stat`` files: ``tasks`` pid -> "comm ppid"."""
    for pid, what in tasks.items():
        comm, ppid = what.rsplit(" ", 1)
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1\n")
    (root / "self").mkdir()  # not a pid: passed over
    return str(root)


def test_helper_on_cpu_binds_and_restores(tmp_path: Path) -> None:
    """A real task stands in for the kernel's helper (the host has no sched_ext), found in
    a /proc that lists it as kthreadd's ``scx_enable_helper``: its affinity is the attach
    CPU inside the block and what it was after."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        cpu = sorted(os.sched_getaffinity(0))[-1]
        before = os.sched_getaffinity(pid)
        helper = f"{ENABLE_HELPER_COMM} 2"
        proc = _fake_proc(
            tmp_path / "proc",
            {
                pid: helper,
                999_999_999: helper,  # gone by the time it is bound: skipped
                os.getpid(): f"{ENABLE_HELPER_COMM} 1",  # that comm, not kthreadd's child
                1: "systemd 0",
            },
        )
        assert sorted(enable_helper_pids(proc)) == [pid, 999_999_999]
        with helper_on_cpu(cpu, proc=proc) as bound:
            assert bound == [pid]  # the vanished pid is skipped
            assert os.sched_getaffinity(pid) == {cpu}
        assert os.sched_getaffinity(pid) == before
        with helper_on_cpu(None, proc=proc) as bound:
            assert bound == []
        # pids found earlier (by prepare): no /proc walk now (this one lists another helper)
        other = _fake_proc(tmp_path / "other", {os.getpid(): helper})
        with helper_on_cpu(cpu, [pid], proc=other) as bound:
            assert bound == [pid] and os.sched_getaffinity(pid) == {cpu}
        assert os.sched_getaffinity(pid) == before
    finally:
        os.close(w)
        os.waitpid(pid, 0)


def test_object_load_cli_with_profile_from_executable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``schedswitchctl object load EXE --profile P --mode M`` on the host kernel: the
    object embedded in build/tests/embed/two_obj, the mode's value read back (stats)."""
    import json

    from schedswitchd.cli import ctl

    exe = OBJ.parents[1] / "embed" / "two_obj"
    if not exe.is_file():
        missing_build_output(exe)
    prof = tmp_path / "prof.toml"
    prof.write_text(
        PROFILE.replace(
            "[[stats]]", '[[stats]]\nname = "armed"\nvariable = "armed"\n\n[[stats]]', 1
        )
        + "\n[modes.loud]\n[modes.loud.after_load]\narmed = 9\n"
    )
    name = f"ssdp{uuid.uuid4().hex[:8]}"
    argv = ["object", "load", str(exe), "--profile", str(prof), "--set", f"ssd_prof.name={name}"]
    assert ctl.main([*argv, "--mode", "loud", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    topo = read_topology("/sys")
    assert out["profile"]["mode"] == "loud"
    # stats are read after the after-attach runs: one record_cpu per online CPU, plus one
    assert out["profile"]["stats"]["armed"] == 9
    assert out["profile"]["stats"]["runs"] == topo.nr_cpus + 1
    assert "chose the first with struct_ops" in out["embedded"]
    assert "profile.attach" in out["timings_ns"] and out["links"] == ["ssd_prof"]
    assert ctl.main([*argv, "--mode", "quiet"]) == 1
    assert "no mode 'quiet' (modes: loud)" in capsys.readouterr().err


PERF = """
[profile]
name = "perf"
ops_name = "NAME"

[[perf_events]]
map = "pmu_counters"
for_each = "online_cpu"
type = 1                 # PERF_TYPE_SOFTWARE
config = 0               # PERF_COUNT_SW_CPU_CLOCK: counts on any machine, PMU or not
cpu = { expr = "cpu.id" }
key = { expr = "cpu.id + 64" }
"""


def _live_keys(obj: LoadedObject, keys: range) -> list[int]:
    """Keys of the perf event array holding an event: deleting an empty slot is ENOENT."""
    fd = obj.maps["pmu_counters"].fd
    return [k for k in keys if syscall.map_delete_elem(fd, struct.pack("<I", k))]


def test_perf_events_opened_per_cpu_and_stored(registry: KernelBtfRegistry, bpffs: Path) -> None:
    """One software counter per online CPU, opened by perf_event_open(2) and written into
    the BPF_MAP_TYPE_PERF_EVENT_ARRAY at cpu + 64; the map holds them after our fds are
    closed (no fd of ours is left open)."""
    name = f"ssdp{uuid.uuid4().hex[:8]}"
    topo = read_topology("/sys")
    ps = profile_spec(_spec(name), parse_profile(PERF.replace("NAME", name)), topo)
    assert [(e.cpu, e.key) for e in ps.plan.perf_events] == [
        (c, struct.pack("<I", c + 64)) for c in topo.online_cpus
    ]
    with _load(ps.spec, registry, bpffs) as obj:
        fds_before = len(os.listdir("/proc/self/fd"))
        run_before_attach(obj, ps.plan)
        assert len(os.listdir("/proc/self/fd")) == fds_before
        assert "profile.perf_events" in obj.timings_ns
        assert _live_keys(obj, range(128)) == [c + 64 for c in topo.online_cpus]


def test_perf_event_the_kernel_refuses(registry: KernelBtfRegistry, bpffs: Path) -> None:
    """An event type no PMU has: ENOENT from perf_event_open(2) is a LoadError naming the
    step, or with on_error = "skip" a note per CPU and an empty slot."""
    name = f"ssdp{uuid.uuid4().hex[:8]}"
    text = PERF.replace("NAME", name).replace("type = 1 ", "type = 0x7ffffff0 ")
    topo = read_topology("/sys")
    ps = profile_spec(_spec(name), parse_profile(text), topo)
    with (
        _load(ps.spec, registry, bpffs) as obj,
        pytest.raises(
            LoadError, match=r"perf_events\[0\] pmu_counters \(cpu \d+\): perf_event_open"
        ),
    ):
        run_before_attach(obj, ps.plan)
    skip = text.replace("key = {", 'on_error = "skip"\nkey = {')
    ps = profile_spec(_spec(name), parse_profile(skip), topo)
    with _load(ps.spec, registry, bpffs) as obj:
        run_before_attach(obj, ps.plan)
        assert len([n for n in obj.notes if "skipped" in n]) == topo.nr_cpus
        assert _live_keys(obj, range(128)) == []
