"""The desktop's launchers and power switch against real sched_ext (one boot for the module):
``gamemoderun sleep 20`` beside the real gamemoded, followed by ``schedswitch-gamemode``,
runs the ``gaming`` hint's scheduler (ss_latency) while it sleeps and not after; the real
power-profiles-daemon's ``powerprofilesctl set power-saver`` runs the ``battery`` hint's
(ss_fifo), ``balanced`` ends it. ``tests/vm/desktop_driver.py`` plays it inside the VM and
reads the kernel's view from sysfs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools import vm
from tools.session import config_variant
from tools.sidkernel import SidKernel

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]

EXTRA = """
[dbus]
scx_loader = false

[dbus.power_profiles]
power-saver = "battery"
"""

SCRIPT = r"""
set -e
cd "$REPO"
modprobe -d "$KMOD_ROOT" uinput
"$PY" -m tests.vm.desktop_driver "$RESULTS/desktop.toml" "$RESULTS/desktop.json" \
    "$RESULTS/daemon.log"
"""


@pytest.fixture(scope="module")
def seen(sid_kernel: SidKernel, sched_objects: Path) -> dict[str, Any]:
    result = vm.run_in_vm(
        SCRIPT,
        kernel=sid_kernel,
        timeout=1500,
        cwd=str(REPO),
        inputs={"desktop.toml": config_variant(REPO, extra=EXTRA)},
    )
    raw = result.files.get("desktop.json")
    logs = {
        name: result.files.get(name, b"").decode(errors="replace")[-4000:]
        for name in ("daemon.log", "agent.log")
    }
    if result.returncode != 0 or raw is None:
        pytest.fail(
            f"the desktop session in the VM failed (rc {result.returncode}, "
            f"{result.elapsed_s:.0f} s)\n{result.tail(60)}\n{json.dumps(logs, indent=1)}"
        )
    data: dict[str, Any] = json.loads(raw)
    data["_logs"] = logs
    latency = [s["t"] for s in data.get("while_game", []) if s["ops"] == "ss_latency"]
    if latency:  # for the record (pytest -s): how the session went under emulation
        print(
            f"\ngamemoderun sleep 20: ss_latency {latency[0] - data['game_started_t']:.1f} s "
            f"after the start, {len(latency)} of {len(data['while_game'])} samples; "
            f"power-saver -> ss_fifo in "
            f"{data.get('power_saver_seen_t', 0) - data.get('power_saver_set_t', 0):.1f} s; "
            f"VM {result.elapsed_s:.0f} s"
        )
    return data


def test_gamemoderun_runs_the_gaming_scheduler_while_the_game_runs(seen: dict[str, Any]) -> None:
    assert seen["agent_following"], seen["_logs"]
    assert seen["before_game"]["state"] == "disabled"
    assert seen["game_rc"] == 0
    ops = [s["ops"] for s in seen["while_game"]]
    assert "ss_latency" in ops, (ops, seen["_logs"])
    # From the first sample that runs it, it runs as long as the game surely runs: `sleep 20`
    # starts after game_started_t, so every sample taken in the 19 s after it falls inside the
    # sleep. Later samples may see the teardown: libgamemode unregisters the game as the
    # process exits, before the driver sees the exit.
    first = ops.index("ss_latency")
    surely_running = seen["game_started_t"] + 19.0
    during = [s["ops"] for s in seen["while_game"][first:] if s["t"] <= surely_running]
    assert during and set(during) == {"ss_latency"}, seen["while_game"]
    assert seen["after_game_settled"], seen["after_game"]
    assert seen["after_game"]["state"] == "disabled"


def test_power_saver_runs_the_battery_scheduler(seen: dict[str, Any]) -> None:
    assert seen["power_saver_runs_fifo"], (seen.get("power_saver"), seen["_logs"])
    assert seen["power_saver"]["state"] == "enabled"
    assert seen["balanced_ends_it"], seen.get("balanced")
