"""Checking a profile across machines (schedswitchd.profile.check, ``schedswitchctl profile
check``/``capture``, ``profile show``'s zero-iteration steps): the bundled sysfs trees, a
misspelt member in a step no machine of the check runs, every problem reported, capture of
the host's /sys read back as the same topology."""

from __future__ import annotations

import filecmp
import json
import os
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.cli import ctl
from schedswitchd.profile.check import (
    BUNDLED_DIR,
    bundled_machines,
    check_profile,
    machines,
    static_step_problems,
)
from schedswitchd.profile.model import parse_profile
from schedswitchd.profile.topology import capture_sysfs, read_topology
from tests.build_outputs import missing_build_output
from tests.profile.fakesys import fake_sysfs
from tests.profile.machines import MACHINES, write_machines

OBJ = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf" / "profile.bpf.o"

# enable_sibling_cpu's context is struct pair_args { s32 cpu_id; s32 sibling_cpu_id; }
MISSPELT = """
[profile]
name = "prof"
ops_name = "ssd_prof"

[[run]]
program = "enable_sibling_cpu"
for_each = "smt_pair"
args = { cpu_id = { expr = "pair.cpu" }, sibling_cpuid = { expr = "pair.sibling" } }
"""


@pytest.fixture(scope="module")
def spec() -> ObjectSpec:
    if not OBJ.is_file():
        missing_build_output(OBJ)
    return open_object(OBJ)


def test_bundled_trees_are_the_generators(tmp_path: Path) -> None:
    """The committed trees are exactly what tests/profile/machines.py writes, and each
    is the machine it is named for."""
    write_machines(tmp_path)
    assert sorted(bundled_machines()) == sorted(MACHINES)
    for name in MACHINES:
        ours = sorted(str(p.relative_to(tmp_path / name)) for p in (tmp_path / name).rglob("*"))
        theirs = sorted(
            str(p.relative_to(BUNDLED_DIR / name)) for p in (BUNDLED_DIR / name).rglob("*")
        )
        assert ours == theirs, name
        files = [f for f in ours if (tmp_path / name / f).is_file()]
        _, mismatch, errors = filecmp.cmpfiles(
            tmp_path / name, BUNDLED_DIR / name, files, shallow=False
        )
        assert not mismatch and not errors, name
    t = {n: read_topology(p) for n, p in bundled_machines().items()}
    assert t["smt"].smt_active and t["smt"].nr_cores == 4
    assert t["hybrid"].little_cpus == (4, 5, 6, 7) and t["hybrid"].turbo_cpus == (0, 1)
    assert t["numa"].nr_nodes == 2 and t["numa"].nr_node_ids == 3
    assert t["amd_prefcore"].capacity_source == "cpufreq/amd_pstate_prefcore_ranking"
    assert t["amd_prefcore"].turbo_cpus == (1, 5) and not t["amd_prefcore"].has_big_little
    assert t["one_cpu"].nr_cpus == 1


def test_misspelt_member_in_a_step_that_runs_zero_times(spec: ObjectSpec, tmp_path: Path) -> None:
    """On a machine without SMT the smt_pair step has no iteration, so applying the
    profile there succeeds; the check finds the member anyway (structurally), and the
    bundled SMT tree finds it by applying too."""
    from schedswitchd.profile.apply import profile_spec

    flat = read_topology(fake_sysfs(tmp_path, possible=range(2)))
    prof = parse_profile(MISSPELT)
    profile_spec(spec, prof, flat)  # no error: the step runs zero times here
    assert static_step_problems(spec, prof) == [
        "run[0] enable_sibling_cpu: args: pair_args has no member 'sibling_cpuid'"
    ]
    alone = check_profile(prof, [("flat", flat)], spec=spec)
    assert alone.problems == [
        "run[0] enable_sibling_cpu: args: pair_args has no member 'sibling_cpuid'"
    ]
    topos, _ = machines(None)
    everywhere = check_profile(prof, topos, spec=spec)
    assert any(
        p.startswith("base on bundled smt: ") and "sibling_cpuid" in p for p in everywhere.problems
    )
    assert not any("bundled one_cpu" in p for p in everywhere.problems)


MANY = """
[profile]
name = "p"
[variables]
x = { expr = "topo.cpus[4].id" }
[modes.a.variables]
y = { expr = "nosuchname" }
[modes.b]
userspace = "it polls"
"""


def test_every_problem_is_reported(tmp_path: Path) -> None:
    """Each mode on each machine, every failing key: CPU 4 exists only on the 8-CPU
    trees; mode a fails everywhere (on one_cpu both its keys); the polling mode is a note,
    not a problem."""
    topos, _ = machines(None)
    res = check_profile(parse_profile(MANY), topos)
    base = [p for p in res.problems if p.startswith("base on ")]
    assert sorted(p.split(":")[0] for p in base) == ["base on bundled one_cpu"]
    mode_a = [p for p in res.problems if p.startswith("mode a on ")]
    assert len([p for p in mode_a if "nosuchname" in p]) == len(topos)
    one = [p for p in mode_a if p.startswith("mode a on bundled one_cpu: ")]
    assert len(one) == 2 and "variables.x" in one[0] and "variables.y" in one[1], one
    assert any(n.startswith("mode b: refused:") and "it polls" in n for n in res.notes)
    assert res.checked == 2 * len(topos) and not res.ok


def test_resolution_can_list_every_failing_key(tmp_path: Path) -> None:
    """resolve_profile(problems=[...]) goes on past a failing key: a variable, a flag
    entry, a step's iteration and the attach CPU each give a line; without the list the
    first raises."""
    from schedswitchd.errors import ProfileError
    from schedswitchd.profile.resolve import resolve_profile

    text = """
[profile]
name = "p"
[variables]
a = { expr = "nope1" }
b = 2
[struct_ops]
add_flags = [{ expr = "nope2" }]
[[run]]
program = "x"
for_each = "online_cpu"
args = { v = { expr = "cpu.nope3" } }
[attach]
cpu = 99
"""
    topo = read_topology(fake_sysfs(tmp_path, possible=range(2)))
    found: list[str] = []
    res = resolve_profile(parse_profile(text), topo, problems=found)
    assert [f.split(": ")[1] for f in found] == [
        "variables.a", "struct_ops.add_flags", "run[0].args.v", "attach.cpu"
    ], found  # fmt: skip
    assert res.variables == {"b": 2}
    with pytest.raises(ProfileError, match=r"variables\.a"):
        resolve_profile(parse_profile(text), topo)


def test_profile_check_command(
    spec: ObjectSpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "prof.toml"
    bad.write_text(MISSPELT)
    flat = fake_sysfs(tmp_path / "flat", possible=range(2))
    argv = ["check", str(bad), "--object", str(OBJ), "--sysfs", str(flat), "--vmlinux", ""]
    assert ctl.main(["profile", *argv, "--no-bundled"]) == 1
    out = capsys.readouterr().out
    assert (
        "problem: run[0] enable_sibling_cpu: args: pair_args has no member 'sibling_cpuid'" in out
    )
    assert ctl.main(["profile", *argv, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["machines"][0] == str(flat) and "bundled smt" in doc["machines"]
    assert doc["checked"] == 1 + len(MACHINES) and not doc["ok"]
    good = tmp_path / "good" / "prof.toml"
    good.parent.mkdir()
    good.write_text(MISSPELT.replace("sibling_cpuid", "sibling_cpu_id"))
    assert ctl.main(["profile", "check", str(good), "--object", str(OBJ), "--vmlinux", ""]) == 0
    assert capsys.readouterr().out.rstrip().endswith("ok")


def test_profile_show_marks_zero_iteration_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "prof.toml"
    p.write_text(MISSPELT)
    flat = fake_sysfs(tmp_path / "flat", possible=range(2))
    assert ctl.main(["profile", "show", str(p), "--sysfs", str(flat), "--vmlinux", ""]) == 0
    out = capsys.readouterr().out
    assert "steps with zero iterations on this machine" in out
    assert "run[0] enable_sibling_cpu: 0 iterations" in out
    smt = bundled_machines()["smt"]
    assert (
        ctl.main(["profile", "show", str(p), "--sysfs", str(smt), "--vmlinux", "", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["iterations"] == {"run[0] enable_sibling_cpu": 8}


@pytest.mark.skipif(not os.path.exists("/sys/devices/system/cpu/possible"), reason="no /sys")
def test_capture_reads_back_as_this_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "cap"
    assert ctl.main(["profile", "capture", str(dest)]) == 0
    assert "files from /sys" in capsys.readouterr().out
    assert read_topology(dest) == read_topology("/sys")
    assert (dest / "devices/system/cpu/possible").read_bytes() == Path(
        "/sys/devices/system/cpu/possible"
    ).read_bytes()
    again = capture_sysfs(tmp_path / "again", dest)  # a capture captures again
    assert read_topology(tmp_path / "again") == read_topology(dest) and again
    with pytest.raises(Exception, match="not a sysfs tree"):
        capture_sysfs(tmp_path / "x", tmp_path / "nothing")


def test_every_key_the_object_refuses_is_reported(spec: ObjectSpec) -> None:
    """Keys that all resolve but that the object refuses (no such variable, struct_ops
    member or map) are each listed on each machine; applying without a list raises at
    the first."""
    from schedswitchd.errors import CustomizationError
    from schedswitchd.profile.apply import apply_profile
    from schedswitchd.profile.resolve import NO_KERNEL, resolve_profile

    text = """
[profile]
name = "prof"
ops_name = "ssd_prof"
[variables]
no_such_var = 1
[struct_ops]
no_such_member = 2
[after_load]
no_such_late = 3
[[map_updates]]
map = "no_such_map"
key = 0
value = 0
"""
    profile = parse_profile(text)
    topos, _ = machines(None)
    res = check_profile(profile, topos, spec=spec)
    for name, _topo in topos:
        mine = [p for p in res.problems if p.startswith(f"base on {name}: ")]
        for key in ("no_such_var", "no_such_member", "no_such_late", "no_such_map"):
            assert len([p for p in mine if key in p]) == 1, (name, key, mine)
    resolved = resolve_profile(profile, topos[0][1], kernel=NO_KERNEL)
    with pytest.raises(CustomizationError, match="no_such_var") as info:
        apply_profile(spec, resolved)
    assert "no_such_member" not in str(info.value)
