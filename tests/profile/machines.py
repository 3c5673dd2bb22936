"""The sysfs trees bundled with schedswitchd (``schedswitchd/profile/machines/NAME``), which
``--check-config`` and ``schedswitchctl profile check`` resolve every profile for: each
written here by :func:`tests.profile.fakesys.fake_sysfs` from a shape. A test holds the
committed trees to this file; ``python -m tests.profile.machines DIR`` writes them again."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.profile.fakesys import fake_sysfs


def _per_cpu(src: str, values: dict[int, int]) -> dict[str, str]:
    return {f"devices/system/cpu/cpu{c}/{src}": f"{v}\n" for c, v in values.items()}


SMT_PAIRS = [[0, 4], [1, 5], [2, 6], [3, 7]]

#: name -> fake_sysfs keyword arguments.
MACHINES: dict[str, dict[str, Any]] = {
    # 4 cores x 2 threads, one LLC, one node; every CPU alike
    "smt": {
        "possible": list(range(8)),
        "siblings": SMT_PAIRS,
        "llcs": [list(range(8))],
        "nodes": [list(range(8))],
        "max_freq_khz": dict.fromkeys(range(8), 3_600_000),
    },
    # a hybrid part: two P-cores with SMT (0-1 the faster pair), four E-cores; capacity
    # from acpi_cppc/highest_perf, as on Intel hybrid machines
    "hybrid": {
        "possible": list(range(8)),
        "siblings": [[0, 1], [2, 3]],
        "llcs": [list(range(8))],
        "nodes": [list(range(8))],
        "files": _per_cpu(
            "acpi_cppc/highest_perf", {0: 72, 1: 72, 2: 70, 3: 70, 4: 45, 5: 45, 6: 45, 7: 45}
        ),
    },
    # two NUMA nodes of four CPUs (an LLC each) and a third node without CPUs (memory only)
    "numa": {
        "possible": list(range(8)),
        "llcs": [[0, 1, 2, 3], [4, 5, 6, 7]],
        "nodes": [[0, 1, 2, 3], [4, 5, 6, 7], []],
    },
    # AMD with preferred cores: rankings differ a few percent between cores (core 1 best)
    "amd_prefcore": {
        "possible": list(range(8)),
        "siblings": SMT_PAIRS,
        "llcs": [list(range(8))],
        "nodes": [list(range(8))],
        "files": {
            **_per_cpu(
                "cpufreq/amd_pstate_prefcore_ranking",
                {0: 231, 4: 231, 1: 236, 5: 236, 2: 226, 6: 226, 3: 221, 7: 221},
            ),
            **_per_cpu("cpufreq/amd_pstate_highest_perf", dict.fromkeys(range(8), 166)),
            **_per_cpu("acpi_cppc/highest_perf", dict.fromkeys(range(8), 166)),
        },
    },
    # one CPU
    "one_cpu": {"possible": [0], "llcs": [[0]], "nodes": [[0]]},
}


def write_machines(root: Path) -> None:
    """Write every tree of :data:`MACHINES` under ``root/NAME``."""
    for name, shape in MACHINES.items():
        fake_sysfs(root / name, **shape)


if __name__ == "__main__":
    write_machines(Path(sys.argv[1]))
