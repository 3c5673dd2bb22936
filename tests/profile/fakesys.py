"""Fake sysfs trees for topology tests: the files the kernel writes, as it lays them out
(``Documentation/ABI/testing/sysfs-devices-system-cpu``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path


def fake_sysfs(
    root: str | os.PathLike[str],
    *,
    possible: Sequence[int],
    online: Sequence[int] | None = None,
    siblings: Sequence[Sequence[int]] = (),
    llcs: Sequence[Sequence[int]] = (),
    nodes: Sequence[Sequence[int]] = (),
    capacity: dict[int, int] | None = None,
    max_freq_khz: dict[int, int] | None = None,
    package_of: dict[int, int] | None = None,
    files: dict[str, str] | None = None,
) -> Path:
    """Write a fake sysfs tree under ``root`` (for tests and for ``profile show
    --sysfs``): ``siblings`` lists the thread groups (cores; a CPU in none is its own core),
    ``llcs`` the CPUs sharing each LLC (id = list index), ``nodes`` the NUMA nodes. Offline
    CPUs get no ``topology/`` or ``cache/`` directory, as the kernel removes them. ``files``:
    more files, path under ``root`` -> content (a capacity source such as
    ``devices/system/cpu/cpu0/acpi_cppc/highest_perf``); an empty node is a CPU-less one."""
    r = Path(root)
    cpu_root = r / "devices" / "system" / "cpu"
    cpu_root.mkdir(parents=True, exist_ok=True)
    online = list(possible if online is None else online)

    def fmt(cpus: Iterable[int]) -> str:
        return ",".join(str(c) for c in sorted(cpus))

    (cpu_root / "possible").write_text(fmt(possible) + "\n")
    (cpu_root / "online").write_text(fmt(online) + "\n")
    core_of: dict[int, tuple[int, int]] = {}
    for i, group in enumerate(siblings):
        for c in group:
            core_of[c] = (i, len(group))
    next_core = len(siblings)
    smt = any(len(g) > 1 for g in siblings)
    (cpu_root / "smt").mkdir(exist_ok=True)
    (cpu_root / "smt" / "active").write_text("1\n" if smt else "0\n")
    for c in possible:
        d = cpu_root / f"cpu{c}"
        d.mkdir(exist_ok=True)
        if capacity and c in capacity:
            (d / "cpu_capacity").write_text(f"{capacity[c]}\n")
        if max_freq_khz and c in max_freq_khz:
            (d / "cpufreq").mkdir(exist_ok=True)
            (d / "cpufreq" / "cpuinfo_max_freq").write_text(f"{max_freq_khz[c]}\n")
            (d / "cpufreq" / "cpuinfo_min_freq").write_text(f"{max_freq_khz[c] // 4}\n")
        if c not in online:
            continue
        t = d / "topology"
        t.mkdir(exist_ok=True)
        if c in core_of:
            core = core_of[c][0]
            group = next(g for g in siblings if c in g)
        else:
            core, group = next_core, [c]
            next_core += 1
        (t / "core_id").write_text(f"{core}\n")
        (t / "physical_package_id").write_text(f"{(package_of or {}).get(c, 0)}\n")
        (t / "thread_siblings_list").write_text(fmt(group) + "\n")
        for idx, (level, ctype) in enumerate(((1, "Data"), (1, "Instruction"), (2, "Unified"))):
            ci = d / "cache" / f"index{idx}"
            ci.mkdir(parents=True, exist_ok=True)
            (ci / "level").write_text(f"{level}\n")
            (ci / "type").write_text(f"{ctype}\n")
            (ci / "id").write_text(f"{core}\n")
            (ci / "shared_cpu_list").write_text(fmt(group) + "\n")
        llc_id = next((i for i, g in enumerate(llcs) if c in g), None)
        if llc_id is not None:
            ci = d / "cache" / "index3"
            ci.mkdir(parents=True, exist_ok=True)
            (ci / "level").write_text("3\n")
            (ci / "type").write_text("Unified\n")
            (ci / "id").write_text(f"{llc_id}\n")
            (ci / "shared_cpu_list").write_text(fmt(llcs[llc_id]) + "\n")
    for n, group in enumerate(nodes):
        nd = r / "devices" / "system" / "node" / f"node{n}"
        nd.mkdir(parents=True, exist_ok=True)
        (nd / "cpulist").write_text(fmt(group) + "\n")
    for rel, text in (files or {}).items():
        f = r / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return r
