"""Three fixed daemon defects on the real sched_ext kernel (one boot; the driver:
tests/vm/defects_driver.py). A lease holds ss_fifo throughout.

- A prepare that raises an exception of no project type (injected into the real backend)
  is a failed switch: recorded failed (code ``internal``), ss_fifo stays enabled, the
  scheduler backed off and not prepared again.
- CPU 1 offline and online four times: eight restarts the kernel asks for
  (``SCX_EXIT_UNREG_KERN``, ``ACT_RESTART | RSN_HOTPLUG``), past the five a minute loaded
  at once: none backs ss_fifo off, the lease's ss_fifo runs again after each.
- Pins on tmpfs: a switch is refused (code ``pin``) before anything is enabled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools import vm
from tools.sidkernel import SidKernel

from .drivers import driver_line, driver_part

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
FIFO = REPO / "build" / "bpf" / "fifo.bpf.o"
VTIME = REPO / "build" / "bpf" / "vtime.bpf.o"

CONFIG = f"""
default = "kernel"
[auth]
admin_uids = [0]
hint_uids = [0]
[limits]
switch_timeout_s = 30.0
[backoff]
base_s = 120.0
max_s = 600.0
[standby]
max = 0
[daemon]
adopt_grace_s = 0.0
pin_dir = "PIN_DIR"
[schedulers.fifo]
object = "{FIFO}"
[schedulers.corrupt]
object = "{VTIME}"
[hints.desk]
scheduler = "fifo"
priority = 10
[hints.bad]
scheduler = "corrupt"
priority = 50
"""

SCRIPT = r"""
set -e
cd "$REPO"
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
""" + driver_line(
    "defects_driver",
    "run",
    '"$RESULTS/d.toml"',
    '"$RESULTS/nopin.toml"',
    '"$RESULTS/defects.json"',
    '"$RESULTS/daemon.log"',
)


@pytest.fixture(scope="module")
def run(sid_kernel: SidKernel, sched_objects: Path) -> dict[str, Any]:
    result = vm.run_in_vm(
        SCRIPT,
        kernel=sid_kernel,
        timeout=2400,
        cwd=str(REPO),
        inputs={
            "d.toml": CONFIG.replace("PIN_DIR", "/sys/fs/bpf/ssd-defects-vm"),
            "nopin.toml": CONFIG.replace("PIN_DIR", "/tmp/ssd-defects-pins"),
        },
    )
    raw = result.files.get("defects.json")
    log = result.files.get("daemon.log", b"").decode(errors="replace")
    data: dict[str, Any] = json.loads(raw) if raw else {}
    if result.returncode != 0 or not data.get("done"):
        pytest.fail(
            f"the VM run failed (rc {result.returncode}, {result.elapsed_s:.0f} s)\n"
            f"{result.tail(40)}\n--- daemon log ---\n{log[-6000:]}"
        )
    data["_elapsed_s"] = result.elapsed_s
    return data


def test_a_prepare_that_raises_is_a_failed_switch(run: dict[str, Any]) -> None:
    case = driver_part(run, "prepare_raises")
    switch = case["status"]["last_switch"]
    assert switch["target"] == "corrupt" and switch["result"] == "failed", switch
    assert switch["error"]["code"] == "internal" and "IndexError" in switch["error"]["message"]
    for status, kernel in ((case["status"], case["kernel"]), (case["later"], case["kernel_later"])):
        assert status["active"] == "fifo" and kernel["state"] == "enabled"
        assert kernel["ops"] == "ss_fifo"  # the kernel's word, not the daemon's
        assert [b["scheduler"] for b in status["backoff"]] == ["corrupt"]
    assert case["defects_logged"] == 1  # backed off: not prepared again by later passes


def test_hotplug_restarts_never_back_the_lease_scheduler_off(run: dict[str, Any]) -> None:
    case = driver_part(run, "hotplug")
    for step in case["steps"]:
        st = step["status"]
        assert "fifo" not in [b["scheduler"] for b in st["backoff"]], step
        assert st["desired"] == "fifo" and st["lease"]["workload"] == "desk", step
        assert step["kernel"]["state"] == "enabled" and step["kernel"]["ops"] == "ss_fifo"
    ejected = [e for e in case["history"] if e["result"] == "ejected"]
    assert len(ejected) >= 8
    for e in ejected[-8:]:
        assert e["exit"]["kind_name"] == "UNREG_KERN" and e["exit"]["exit_code"] & (1 << 48)
    assert "ejected by the kernel" not in run["log"]  # the backoff branch's log line
    # the eight came within the minute, so the bound was met: the later ones waited
    assert case["steps"][-1]["s"] < 60, [round(s["s"], 1) for s in case["steps"]]
    assert "(over 5 restarts within 60 s)" in run["log"]


def test_a_switch_without_usable_pins_is_refused_before_anything_runs(
    run: dict[str, Any],
) -> None:
    case = driver_part(run, "no_pins")
    reply = case["reply"]
    # schedswitchctl --json prints an error reply as {"error": {...}} (exit status 1)
    assert isinstance(reply, dict) and reply.get("ok") is not True, case
    assert reply["error"]["code"] == "pin", case
    assert "not on a bpf filesystem" in reply["error"]["message"]
    # nothing was enabled and rolled back: the kernel's enable_seq did not move
    assert case["after"]["enable_seq"] == case["before"]["enable_seq"]
    assert case["after"]["state"] == "disabled"
