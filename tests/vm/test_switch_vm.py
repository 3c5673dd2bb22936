"""A standby hit's two halves with the real backend in the sched_ext VM (one boot, driver
``tests/vm/switch_driver.py``): what the kernel leaves in an old scheduler's exit record
after the hit's detach tells an ejection before it from the detach itself, so the hit needs
no read of the kernel's state before its detach. ss_fifo detached by the hit left
``SCX_EXIT_UNREG`` (no ejection found); ss_fifo with ``error_after``, ejected by the kernel
with nobody watching, left ``SCX_EXIT_ERROR_BPF``, which the hit's second half records as
an ejection after switching to ss_vtime."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tools import vm

from .drivers import driver_line, driver_part

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def observed(vm_run: Callable[..., vm.VmResult], sched_objects: Path) -> dict[str, Any]:
    script = driver_line("switch_driver", '"$REPO/build/bpf"', '"$RESULTS/switch.json"')
    res = vm_run(script, timeout=420)
    res.check()
    out: dict[str, Any] = json.loads(res.text("switch.json"))
    return out


def test_a_standby_hit_from_a_running_scheduler(observed: dict[str, Any]) -> None:
    o = driver_part(observed, "ours")
    assert o["first"] == "ok" and o["held"] and o["late_check_ok"]
    assert o["kernel_reads_in_first_half"] == 0
    assert o["running"]
    assert o["kernel_after_first_half"]["state"] == "enabled"
    assert o["kernel_after_first_half"]["ops"] == "ss_vtime"
    assert o["record"] == {"result": "ok", "previous": "fifo", "finished": True}
    assert o["gone"] is None  # its own detach: SCX_EXIT_UNREG
    assert o["kernel_after"]["ops"] == "ss_vtime"
    assert o["end"] == "ok"


def test_an_ejection_before_the_hit_is_found_in_the_exit_record(observed: dict[str, Any]) -> None:
    o = driver_part(observed, "ejected")
    assert o["first"] == "ok" and o["ejected_by_kernel"], o
    assert o["kernel_before_hit"]["state"] != "enabled"
    assert o["late_check_ok"] and o["kernel_reads_in_first_half"] == 0
    assert o["running"] and o["kernel_after_first_half"]["ops"] == "ss_vtime"
    assert o["record"] == {"result": "ok", "previous": "faulty", "finished": True}
    gone = o["gone"]
    assert gone is not None, o
    assert (gone["previous"], gone["result"], gone["kind_name"]) == (
        "faulty",
        "ejected",
        "ERROR_BPF",
    )
    assert gone["ran_for_ns"] > 0
    assert o["history"][-2:] == [["faulty", "vtime", "ok"], ["faulty", "kernel", "ejected"]]
    assert o["kernel_after"]["ops"] == "ss_vtime"
    assert o["end"] == "ok"


def test_a_first_enable_is_confirmed_from_its_exit_record(observed: dict[str, Any]) -> None:
    o = driver_part(observed, "confirm")
    assert o["initial"]["state"] == "disabled"
    assert o["kernel_first"]["ops"] == "ss_fifo" and o["ops_reads_first"] == 0
    # attached again, its record holds the detach's SCX_EXIT_UNREG: sysfs confirms
    assert o["kernel_again"]["ops"] == "ss_fifo" and o["ops_reads_again"] == 1


def test_a_failed_enable_is_not_reported_enabled(observed: dict[str, Any]) -> None:
    o = driver_part(observed, "confirm")
    assert o["failed_enable"] != "reported enabled", o
    assert o["kernel_after_failed"]["state"] == "disabled"
    assert o["failed_exit"] == "UNREG_KERN", o
