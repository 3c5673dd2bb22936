"""The profile language's additions, resolved against fake sysfs trees: ``[let]``,
flags given by expressions, a mode's runs before the base's, a mode's own ``userspace``,
``[[perf_events]]`` and their refusals (no kernel needed; the kernel side is
tests/kernel/sched_ext/test_profile_steps.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedswitchd.errors import ProfileError
from schedswitchd.profile.model import parse_profile
from schedswitchd.profile.resolve import resolve_profile
from schedswitchd.profile.topology import Topology, read_topology
from tests.profile.fakesys import fake_sysfs

NUMA_FLAGS = """
[profile]
name = "p"

[let]
numa = "topo.nr_nodes > 1"
idle_flag = "['SCX_OPS_BUILTIN_IDLE_PER_NODE'] if numa else []"

[variables]
numa_enabled = { expr = "numa" }

[struct_ops]
flags = ["SCX_OPS_ENQ_LAST"]
add_flags = [{ expr = "idle_flag" }, "SCX_OPS_ENQ_EXITING"]
remove_flags = [{ expr = "'SCX_OPS_ENQ_LAST' if numa else []" }]
"""


@pytest.fixture
def one_node(tmp_path: Path) -> Topology:
    return read_topology(fake_sysfs(tmp_path / "one", possible=range(2), nodes=[[0, 1]]))


@pytest.fixture
def two_nodes(tmp_path: Path) -> Topology:
    """Two nodes with CPUs and a CPU-less third: two count for NUMA."""
    return read_topology(
        fake_sysfs(tmp_path / "two", possible=range(4), nodes=[[0, 1], [2, 3], []])
    )


def test_let_and_flag_expressions(one_node: Topology, two_nodes: Topology) -> None:
    prof = parse_profile(NUMA_FLAGS)
    one = resolve_profile(prof, one_node)
    assert one.variables == {"numa_enabled": False}
    assert one.flags == ["SCX_OPS_ENQ_LAST"]
    assert one.add_flags == ["SCX_OPS_ENQ_EXITING"] and one.remove_flags == []
    two = resolve_profile(prof, two_nodes)
    assert two.variables == {"numa_enabled": True}
    assert two.add_flags == ["SCX_OPS_BUILTIN_IDLE_PER_NODE", "SCX_OPS_ENQ_EXITING"]
    assert two.remove_flags == ["SCX_OPS_ENQ_LAST"]
    assert two.let == {"numa": True, "idle_flag": ["SCX_OPS_BUILTIN_IDLE_PER_NODE"]}


def test_flags_as_one_expression(two_nodes: Topology) -> None:
    text = NUMA_FLAGS.replace(
        'flags = ["SCX_OPS_ENQ_LAST"]', "flags = { expr = \"['SCX_OPS_ENQ_LAST'] + idle_flag\" }"
    )
    res = resolve_profile(parse_profile(text), two_nodes)
    assert res.flags == ["SCX_OPS_ENQ_LAST", "SCX_OPS_BUILTIN_IDLE_PER_NODE"]
    as_int = NUMA_FLAGS.replace(
        'flags = ["SCX_OPS_ENQ_LAST"]', 'flags = { expr = "3 if numa else 1" }'
    )
    assert resolve_profile(parse_profile(as_int), two_nodes).flags == 3


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ('"SCX_OPS_ENQ_EXITING"]', "add_flags: 'bad name' is not an SCX_OPS_\\* flag name"),
        ('{ expr = "idle_flag" }', "add_flags: 5 is not an SCX_OPS_\\* flag name"),
    ],
)
def test_flag_expression_errors(edit: str, match: str, two_nodes: Topology) -> None:
    bad = {
        '"SCX_OPS_ENQ_EXITING"]': "{ expr = \"'bad name'\" }]",
        '{ expr = "idle_flag" }': '{ expr = "5" }',
    }
    text = NUMA_FLAGS.replace(edit, bad[edit])
    with pytest.raises(ProfileError, match=match):
        resolve_profile(parse_profile(text), two_nodes)


def test_let_is_evaluated_once_in_order_and_names_are_checked(one_node: Topology) -> None:
    text = (
        '[profile]\nname = "p"\n[let]\na = "topo.nr_cpus"\nb = "a * 10"\n'
        '[variables]\nx = { expr = "b + a" }\n'
    )
    assert resolve_profile(parse_profile(text), one_node).variables == {"x": 22}
    for name in ("topo", "cpu", "len", "_x"):
        with pytest.raises(ProfileError, match=f"let.*{name}"):
            parse_profile(f'[profile]\nname = "p"\n[let]\n{name} = "1"\n')
    later = '[profile]\nname = "p"\n[let]\nb = "a"\na = "1"\n'
    with pytest.raises(ProfileError, match=r"let\.b.*unknown name 'a'"):
        resolve_profile(parse_profile(later), one_node)


MODES = """
[profile]
name = "p"

[let]
n = "topo.nr_cpus"

[[run]]
program = "base_step"

[modes.m]
[modes.m.let]
n = "100"
[[modes.m.run]]
program = "mode_first"
before_base = true
args = { v = { expr = "n" } }
[[modes.m.run]]
program = "mode_after"

[modes.polling]
userspace = "its user space polls CPU utilisation every 250 ms (-p)"
"""


def test_mode_runs_before_the_base_and_its_own_let(one_node: Topology) -> None:
    res = resolve_profile(parse_profile(MODES), one_node, mode="m")
    assert [r.program for r in res.runs] == ["mode_first", "base_step", "mode_after"]
    assert res.runs[0].args == {"v": 100}
    base = resolve_profile(parse_profile(MODES), one_node)
    assert [r.program for r in base.runs] == ["base_step"] and base.let == {"n": 2}
    with pytest.raises(ProfileError, match="before_base is for a mode"):
        parse_profile(MODES.replace('program = "base_step"', 'program = "b"\nbefore_base = true'))


def test_a_polling_mode_is_refused_with_its_sentence(one_node: Topology) -> None:
    from schedswitchd.profile.apply import profile_spec

    prof = parse_profile(MODES)
    assert prof.with_mode("polling").profile.userspace.startswith("its user space polls")
    assert prof.with_mode("m").profile.runnable
    with pytest.raises(
        ProfileError,
        match=r"mode polling.*polls CPU utilisation every 250 ms.*no executable is configured",
    ):
        profile_spec(None, prof, one_node, mode="polling")  # type: ignore[arg-type]


PERF = """
[profile]
name = "p"
[[perf_events]]
map = "pmu"
for_each = "cpu"
only_if = { expr = "cpu.online" }
type = 0
config = { expr = "0x10 if mode else 0xc0" }
cpu = { expr = "cpu.id" }
"""


def test_perf_events_resolve_per_cpu(tmp_path: Path) -> None:
    topo = read_topology(fake_sysfs(tmp_path, possible=[0, 1, 3], online=[0, 3]))
    res = resolve_profile(parse_profile(PERF), topo)
    assert [(e.cpu, e.key, e.config, e.type) for e in res.perf_events] == [
        (0, 0, 0xC0, 0),
        (3, 3, 0xC0, 0),
    ]
    bad = PERF.replace('cpu = { expr = "cpu.id" }', "cpu = 2")
    with pytest.raises(ProfileError, match=r"perf_events\[0\].cpu: 2 is not a possible CPU"):
        resolve_profile(parse_profile(bad), topo)
    neg = PERF.replace("type = 0", "type = -1")
    with pytest.raises(ProfileError, match=r"perf_events\[0\].type: -1 is not a u32"):
        resolve_profile(parse_profile(neg), topo)
