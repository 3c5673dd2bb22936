"""A profiled standby's quick freshness check in the sched_ext VM (one boot, driver
``tests/vm/standby_fresh_driver.py``): what it relies on and what it decides. A standby
hit's take reads ``hotplug_seq`` instead of the CPU topology (see
``KernelBackend.fresh``); that is sound only if the kernel moves ``hotplug_seq`` on every
CPU offline and online even when no BPF scheduler is attached, which this kernel is asked
here, while nothing is attached. CPU 1 offline: the quick check reads the topology again
and finds the standby stale; back online: the topology is the one the profile's values
came from, so both checks find it fresh, and the quick one then trusts the new value."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tools import vm

from .drivers import driver_line

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
OBJ = REPO / "build" / "tests" / "vm" / "bpf" / "profiled.bpf.o"


@pytest.fixture(scope="module")
def observed(vm_run: Callable[..., vm.VmResult], sched_objects: Path) -> dict[str, Any]:
    assert OBJ.is_file(), "make schedulers builds tests/vm/bpf/*.bpf.c"
    script = "mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf\n" + driver_line(
        "standby_fresh_driver", '"$RESULTS/fresh.json"'
    )
    res = vm_run(script, timeout=600)
    res.check()
    out: dict[str, Any] = json.loads(res.text("fresh.json"))
    assert "exception" not in out, out.get("tb")
    assert out.get("done"), out
    steps: dict[str, Any] = out["steps"]
    return steps


def test_hotplug_seq_moves_with_cpu_hotplug_while_nothing_is_attached(
    observed: dict[str, Any],
) -> None:
    seqs = [observed[s]["kernel"]["hotplug_seq"] for s in ("prepared", "cpu1_offline", "cpu1_back")]
    assert all(observed[s]["kernel"]["state"] == "disabled" for s in observed)
    assert observed["cpu1_offline"]["kernel"]["online"] == "0"
    assert seqs[0] < seqs[1] < seqs[2], seqs


def test_the_quick_check_follows_the_cpus(observed: dict[str, Any]) -> None:
    """``prof``'s values depend on the CPUs alone: stale while CPU 1 is away, fresh again
    once it is back, and the quick check then trusts the new ``hotplug_seq``: no topology
    read while nothing moved, one when it did."""
    assert observed["prepared"]["prof"] == {
        "quick": True,
        "quick_reads": 0,
        "full": True,
        "full_reads": 1,
    }
    offline = observed["cpu1_offline"]["prof"]
    assert not offline["quick"] and not offline["full"], offline
    assert observed["cpu1_back"]["kernel"]["online"] == "0-1"
    assert observed["cpu1_back"]["prof"] == {
        "quick": True,
        "quick_reads": 1,
        "quick_again": True,
        "quick_again_reads": 0,
        "full": True,
        "full_reads": 1,
    }


def test_a_standby_built_for_an_older_hotplug_seq_stays_stale(observed: dict[str, Any]) -> None:
    """``prof_seq`` carries the ``hotplug_seq`` it was prepared at in its ``ops``, which the
    kernel refuses once it moved: stale for good, whatever the topology, which is not read."""
    assert observed["prepared"]["prof_seq"]["quick"] and observed["prepared"]["prof_seq"]["full"]
    for step in ("cpu1_offline", "cpu1_back"):
        checks = observed[step]["prof_seq"]
        assert not any(v for k, v in checks.items() if not k.endswith("_reads")), checks
        assert not any(v for k, v in checks.items() if k.endswith("_reads")), checks
