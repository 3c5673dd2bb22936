"""The topology model against fake sysfs trees and the real host /sys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schedswitchd.profile.topology import (
    OnlineFile,
    TopologyError,
    cpumask,
    parse_cpulist,
    read_topology,
)
from tests.profile.fakesys import fake_sysfs


def test_cpulist_parsing() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    for bad in ("a", "3-1", "-1", "0-99999", "1,,2"):
        with pytest.raises(TopologyError):
            parse_cpulist(bad)


def test_cpumask_layout() -> None:
    assert cpumask([0, 9], 2) == b"\x01\x02"
    assert cpumask([63, 64], 16)[7:9] == b"\x80\x01"
    with pytest.raises(Exception, match="does not fit"):
        cpumask([16], 2)


def test_two_cpu_vm(tmp_path: Path) -> None:
    t = read_topology(fake_sysfs(tmp_path, possible=[0, 1], llcs=[[0, 1]], nodes=[[0, 1]]))
    assert t.nr_cpu_ids == 2 and t.online_cpus == (0, 1) and t.nr_cpus == 2
    assert not t.smt_active and t.smt_pairs == ()
    assert [c.cpus for c in t.cores] == [(0,), (1,)]
    assert [(g.id, g.cpus, g.mask) for g in t.llcs] == [(0, (0, 1), b"\x03")]
    assert t.nr_nodes == 1 and t.max_capacity == 1024 and not t.has_big_little
    assert t.big_cpus == (0, 1) and t.little_cpus == ()


def test_smt_two_llcs(tmp_path: Path) -> None:
    root = fake_sysfs(
        tmp_path,
        possible=range(8),
        siblings=[[0, 4], [1, 5], [2, 6], [3, 7]],
        llcs=[[0, 1, 4, 5], [2, 3, 6, 7]],
        nodes=[[0, 1, 4, 5], [2, 3, 6, 7]],
    )
    t = read_topology(root)
    assert t.smt_active and t.nr_cores == 4 and t.nr_llcs == 2 and t.nr_nodes == 2
    assert t.cpu(4).siblings == (0,) and t.cpu(4).core_id == 0
    assert [(p.cpu, p.sibling) for p in t.smt_pairs][:2] == [(0, 4), (1, 5)]
    assert len(t.smt_pairs) == 8
    assert [g.cpus for g in t.llcs] == [(0, 1, 4, 5), (2, 3, 6, 7)]
    assert t.llcs[1].mask == bytes([0b11001100])
    assert t.cpu(6).llc_id == 1 and t.cpu(6).node_id == 1 and t.cpu(6).l3_id == 1
    assert t.cpu(6).l2_id == 2  # the core's L2, id = core id in the fake tree


def test_big_little(tmp_path: Path) -> None:
    root = fake_sysfs(
        tmp_path,
        possible=range(6),
        llcs=[list(range(6))],
        capacity={0: 446, 1: 446, 2: 446, 3: 446, 4: 1024, 5: 1024},
        max_freq_khz={0: 1800000, 1: 1800000, 2: 1800000, 3: 1800000, 4: 2800000, 5: 2800000},
    )
    t = read_topology(root)
    assert t.has_big_little and t.big_cpus == (4, 5) and t.little_cpus == (0, 1, 2, 3)
    assert t.cpu(0).capacity == 446 and t.cpu(5).max_freq_khz == 2800000
    assert t.cpu(0).min_freq_khz == 450000


def test_offline_cpus(tmp_path: Path) -> None:
    root = fake_sysfs(
        tmp_path,
        possible=range(4),
        online=[0, 2, 3],
        siblings=[[0, 1], [2, 3]],
        llcs=[[0, 1, 2, 3]],
    )
    t = read_topology(root)
    assert t.nr_cpu_ids == 4 and t.online_cpus == (0, 2, 3) and t.nr_cpus == 3
    off = t.cpu(1)
    assert not off.online and off.core_id == -1 and off.llc_id == -1
    assert t.cpu(0).siblings == ()  # its sibling is offline
    assert [c.cpus for c in t.cores] == [(0,), (2, 3)]
    assert t.llcs[0].cpus == (0, 2, 3) and t.llcs[0].mask == b"\x0d"
    assert len(t.cpus) == 4  # every possible CPU is listed


def test_sparse_possible_sets_nr_cpu_ids(tmp_path: Path) -> None:
    t = read_topology(fake_sysfs(tmp_path, possible=[0, 1, 8], online=[0, 1]))
    assert t.nr_cpu_ids == 9 and t.mask_bytes == 2


def test_missing_and_malformed(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="possible"):
        read_topology(tmp_path)
    root = fake_sysfs(tmp_path / "x", possible=[0, 1])
    (root / "devices/system/cpu/cpu1/topology/core_id").write_text("one\n")
    with pytest.raises(TopologyError, match="core_id"):
        read_topology(root)


@pytest.mark.skipif(not os.path.exists("/sys/devices/system/cpu/possible"), reason="no /sys")
def test_real_host_sysfs() -> None:
    t = read_topology("/sys")
    assert t.nr_cpu_ids == len(os.sched_getaffinity(0)) or t.nr_cpu_ids >= t.nr_cpus
    assert t.nr_cpus == os.cpu_count()
    online = set(t.online_cpus)
    assert online == {c.id for c in t.cpus if c.online}
    assert sorted(c for g in t.cores for c in g.cpus) == sorted(online)
    assert sorted(c for g in t.llcs for c in g.cpus) == sorted(online)
    for c in t.cpus:
        if c.online:
            assert c.core_id >= 0 and c.llc_id >= 0
            raw = Path(f"/sys/devices/system/cpu/cpu{c.id}/topology/core_id").read_text()
            assert c.core_id == int(raw)


def test_online_file_reads_the_list_as_it_is_now(tmp_path: Path) -> None:
    """A test tree's file is read afresh each time (it may be replaced); the running
    kernel's through a held descriptor, which reads what the kernel has now."""
    sysfs = Path(fake_sysfs(tmp_path / "sys", possible=range(4)))
    online = OnlineFile(sysfs)
    assert online.read() == b"0,1,2,3\n"
    (sysfs / "devices/system/cpu/online").write_text("0-2\n")
    assert online.read() == b"0-2\n"
    (sysfs / "devices/system/cpu/online").unlink()
    assert online.read() is None
    live = OnlineFile("/sys")
    assert live.read() == live.read() == Path("/sys/devices/system/cpu/online").read_bytes()


def _per_cpu(src: str, values: dict[int, int]) -> dict[str, str]:
    return {f"devices/system/cpu/cpu{c}/{src}": f"{v}\n" for c, v in values.items()}


def test_capacity_source_is_the_first_that_differs(tmp_path: Path) -> None:
    """A source equal on every CPU (a driver that lies) is passed over for a later one
    that tells the CPUs apart; the source is named on each CPU and on the machine."""
    files = {
        **_per_cpu("cpufreq/amd_pstate_prefcore_ranking", dict.fromkeys(range(4), 200)),
        **_per_cpu("acpi_cppc/highest_perf", {0: 100, 1: 100, 2: 50, 3: 50}),
        **_per_cpu("cpu_capacity", {0: 1024, 1: 1024, 2: 1000, 3: 1000}),
    }
    t = read_topology(fake_sysfs(tmp_path, possible=range(4), files=files))
    assert t.capacity_source == "acpi_cppc/highest_perf"
    assert t.cpu(2).capacity_source == "acpi_cppc/highest_perf"
    assert [c.raw_capacity for c in t.cpus] == [100, 100, 50, 50]
    assert [c.capacity for c in t.cpus] == [1024, 1024, 512, 512]


def test_capacity_source_all_equal_is_the_last_positive(tmp_path: Path) -> None:
    files = {
        **_per_cpu("acpi_cppc/highest_perf", dict.fromkeys(range(2), 166)),
        **_per_cpu("cpufreq/cpuinfo_max_freq", dict.fromkeys(range(2), 3_000_000)),
    }
    t = read_topology(fake_sysfs(tmp_path, possible=range(2), files=files))
    assert t.capacity_source == "cpufreq/cpuinfo_max_freq"
    assert [c.capacity for c in t.cpus] == [1024, 1024]
    assert [c.core_type for c in t.cpus] == ["big", "big"] and not t.has_big_little
    bare = read_topology(fake_sysfs(tmp_path / "bare", possible=range(2)))
    assert bare.capacity_source == "" and [c.capacity for c in bare.cpus] == [1024, 1024]


def test_capacity_scaled_by_the_largest_raw_value(tmp_path: Path) -> None:
    """Frequencies in kHz become SCHED_CAPACITY_SCALE units: raw * 1024 // max. A CPU
    without the file counts as the largest."""
    freq = {0: 1_800_000, 1: 1_800_000, 2: 2_800_000}
    root = fake_sysfs(tmp_path, possible=range(4), max_freq_khz=freq)
    t = read_topology(root)
    assert t.capacity_source == "cpufreq/cpuinfo_max_freq"
    assert [c.capacity for c in t.cpus] == [658, 658, 1024, 1024]
    assert t.cpu(3).raw_capacity == 2_800_000


def test_core_types_hybrid(tmp_path: Path) -> None:
    """446 x 4 + 1024 x 2: 1024 >= 1.3 * 446, so big/LITTLE; the CPUs at the maximum are
    turbo (the average, 638, is lower), the rest below the average little."""
    cap = {0: 446, 1: 446, 2: 446, 3: 446, 4: 1024, 5: 1024}
    t = read_topology(fake_sysfs(tmp_path, possible=range(6), capacity=cap))
    assert t.capacity_source == "cpu_capacity"
    assert [c.core_type for c in t.cpus] == ["little"] * 4 + ["turbo"] * 2
    assert t.big_cpus == t.turbo_cpus == (4, 5) and t.little_cpus == (0, 1, 2, 3)
    assert t.has_big_little


def test_core_types_big_little_threshold(tmp_path: Path) -> None:
    """The 1.3x rule: 1000/1300 is big/LITTLE (the 1000s little), 1000/1299 is not (the
    1000s big); in both the maximum is turbo."""
    t = read_topology(
        fake_sysfs(tmp_path / "a", possible=range(3), capacity={0: 1000, 1: 1000, 2: 1300})
    )
    assert [c.core_type for c in t.cpus] == ["little", "little", "turbo"]
    t = read_topology(
        fake_sysfs(tmp_path / "b", possible=range(3), capacity={0: 1000, 1: 1000, 2: 1299})
    )
    assert [c.core_type for c in t.cpus] == ["big", "big", "turbo"]
    assert t.little_cpus == () and t.big_cpus == (0, 1, 2) and t.turbo_cpus == (2,)


def test_core_types_amd_prefcore(tmp_path: Path) -> None:
    """Preferred-core rankings differ by a few percent: no little cores, the best-ranked
    CPUs turbo, capacities scaled from the ranking."""
    rank = {0: 236, 1: 236, 2: 231, 3: 231, 4: 226, 5: 226, 6: 221, 7: 221}
    files = _per_cpu("cpufreq/amd_pstate_prefcore_ranking", rank)
    t = read_topology(fake_sysfs(tmp_path, possible=range(8), files=files))
    assert t.capacity_source == "cpufreq/amd_pstate_prefcore_ranking"
    assert t.turbo_cpus == (0, 1) and t.little_cpus == () and len(t.big_cpus) == 8
    assert t.cpu(6).capacity == 221 * 1024 // 236


def test_nr_node_ids_counts_cpuless_nodes(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, possible=range(4), nodes=[[0, 1], [2, 3], []])
    t = read_topology(root)
    assert t.nr_nodes == 2 and t.nr_node_ids == 3
    assert read_topology(fake_sysfs(tmp_path / "flat", possible=range(2))).nr_node_ids == 1


def test_cpus_indexed_by_id_with_holes_in_possible(tmp_path: Path) -> None:
    """possible = 0-1,4-5: cpus[i].id == i for i < nr_cpu_ids, the holes listed as not
    possible; for_each "cpu" still visits possible CPUs only."""
    from schedswitchd.profile.resolve import _iterations

    t = read_topology(fake_sysfs(tmp_path, possible=[0, 1, 4, 5], online=[0, 1, 5]))
    assert t.nr_cpu_ids == 6 and len(t.cpus) == 6
    assert all(t.cpus[i].id == i for i in range(6))
    assert [c.possible for c in t.cpus] == [True, True, False, False, True, True]
    assert t.cpus[4].possible and not t.cpus[4].online and t.cpus[5].online
    with pytest.raises(Exception, match="not a possible CPU"):
        t.cpu(2)
    ids = [b["cpu"].id for b, _ in _iterations("cpu", t, {}, "x")]  # type: ignore[attr-defined]
    assert ids == [0, 1, 4, 5]
    assert [b["cpu"].id for b, _ in _iterations("online_cpu", t, {}, "x")] == [0, 1, 5]  # type: ignore[attr-defined]
