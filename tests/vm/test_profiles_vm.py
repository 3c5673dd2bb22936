"""Scheduler profiles through the daemon in the sched_ext VM (one boot): a profiled test
scheduler (tests/vm/bpf/profiled.bpf.c with tests/vm/profiles/profiled.toml) switched to by
a hint, a mode picked by another hint, and CPU 1 taken offline and back online while it
runs. The kernel ejects it on each hotplug (it has no cpu_online/cpu_offline ops: exit kind
SCX_EXIT_UNREG_KERN, SCX_ECODE_ACT_RESTART | SCX_ECODE_RSN_HOTPLUG); the daemon loads it
again with values for the new topology, read back from the loaded maps (status counters).
Then a launcher intent holds the mode's variant as a standby, and its hint takes it; and one
held while CPU 1 goes offline is not run with the values of the CPUs it was prepared for."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tools import vm
from tools.sidkernel import SidKernel

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
OBJ = REPO / "build" / "tests" / "vm" / "bpf" / "profiled.bpf.o"
PROFILE = REPO / "tests" / "vm" / "profiles" / "profiled.toml"

#: A skip reason while this test is known not to pass on main (``None``: it runs);
#: ``SCHEDSWITCHD_RUN_GATED_VM=1`` runs it anyway. Lifted after its first passing VM run.
GATE: str | None = None

CONFIG = f"""
default = "kernel"
[auth]
admin_uids = [0]
[limits]
switch_timeout_s = 30.0
[daemon]
adopt_grace_s = 0.0
pin_dir = "/sys/fs/bpf/ssd-profiles-vm"
[schedulers.prof]
object = "{OBJ}"
profile = "{PROFILE}"
[hints.desk]
scheduler = "prof"
[hints.fast]
scheduler = "prof"
mode = "short"
priority = 10
"""

SCRIPT = r"""
set -e
cd "$REPO"
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
"$PY" -m tests.vm.profile_driver "$RESULTS/p.toml" "$RESULTS/profiles.json" \
    "$RESULTS/daemon.log" || true
dmesg | grep -i "sched_ext" > "$RESULTS/dmesg.txt" || true
"""


@pytest.fixture(scope="module")
def run(sid_kernel: SidKernel, sched_objects: Path) -> dict[str, Any]:
    if GATE is not None and os.environ.get("SCHEDSWITCHD_RUN_GATED_VM") != "1":
        pytest.skip(GATE)
    assert OBJ.is_file(), "make schedulers builds tests/vm/bpf/*.bpf.c"
    result = vm.run_in_vm(
        SCRIPT, kernel=sid_kernel, timeout=2400, cwd=str(REPO), inputs={"p.toml": CONFIG}
    )
    raw = result.files.get("profiles.json")
    log = result.files.get("daemon.log", b"").decode(errors="replace")
    dmesg = result.files.get("dmesg.txt", b"").decode(errors="replace")
    data: dict[str, Any] = json.loads(raw) if raw else {}
    if result.returncode != 0 or not data.get("done"):
        pytest.fail(
            f"profile session in the VM failed (rc {result.returncode}, "
            f"{result.elapsed_s:.0f} s): {data.get('error')}\n{result.tail(40)}\n"
            f"--- daemon log ---\n{log[-6000:]}\n--- dmesg ---\n{dmesg[-3000:]}"
        )
    data["_log"], data["_dmesg"] = log, dmesg
    return data


def _step(run: dict[str, Any], name: str) -> dict[str, Any]:
    step: dict[str, Any] = next(s for s in run["steps"] if s["step"] == name)
    return step


def test_profile_values_reach_the_kernel(run: dict[str, Any]) -> None:
    base = _step(run, "base")
    st = base["status"]
    assert st["kernel"]["state"] == "enabled" and st["kernel"]["ops"] == "ss_profiled"
    # status names the profile by its [profile] name, though configured by path
    assert st["profile"]["name"] == "profiled" and st["profile"]["mode"] is None
    # 2 vCPUs: the .rodata values, the after-load write and the syscall runs (one per CPU)
    assert st["profile"]["stats"] == {
        "nr_online": 2,
        "online_mask": 0b11,
        "noted_mask": 0b11,
        "armed": 1,
        "slice_ns": 20000000,
    }


def test_mode_from_a_hint(run: dict[str, Any]) -> None:
    st = _step(run, "mode")["status"]
    assert st["active"] == "prof@short" and st["kernel"]["ops"] == "ss_profiled"
    assert st["profile"]["mode"] == "short"
    assert st["profile"]["stats"]["slice_ns"] == 2000000  # the mode's value, from the map
    back = _step(run, "base_again")["status"]
    assert back["profile"]["stats"]["slice_ns"] == 20000000


def test_hotplug_reloads_with_the_new_topology(run: dict[str, Any]) -> None:
    off = _step(run, "cpu1_offline")
    assert off["kernel"]["online"] == "0"
    assert off["status"]["profile"]["stats"]["nr_online"] == 1
    assert off["status"]["profile"]["stats"]["online_mask"] == 0b01
    assert off["status"]["profile"]["stats"]["noted_mask"] == 0b01
    assert off["status"]["backoff"] == []  # a restart, not a failure
    on = _step(run, "cpu1_online")
    assert on["kernel"]["online"] == "0-1"
    assert on["status"]["profile"]["stats"]["nr_online"] == 2
    assert on["status"]["profile"]["stats"]["online_mask"] == 0b11
    assert int(on["kernel"]["enable_seq"]) > int(off["kernel"]["enable_seq"])
    # the kernel's exit record: ejected for the hotplug, asking for a restart
    ejected = [e for e in run["history"]["entries"] if e["result"] == "ejected"]
    assert len(ejected) >= 2
    for e in ejected[-2:]:
        assert e["exit"]["kind_name"] == "UNREG_KERN"
        assert e["exit"]["exit_code"] & (1 << 48)  # SCX_ECODE_ACT_RESTART
    assert "exited asking for a restart" in run["_log"]


def test_a_profiled_standby_hit(run: dict[str, Any]) -> None:
    """An intent holds prof@short prepared; the hint that follows takes it (no prepare
    in the switch) and runs the mode's values for both CPUs."""
    assert [e["scheduler"] for e in _step(run, "intent")["status"]["standby"]] == ["prof@short"]
    st = _step(run, "standby_hit")["status"]
    assert st["last_switch"]["target"] == "prof@short", st["last_switch"]
    assert st["last_switch"]["standby"] is True, st["last_switch"]
    assert "prepare" not in st["last_switch"]["phases_ns"]
    assert st["profile"]["stats"]["slice_ns"] == 2000000
    assert st["profile"]["stats"]["nr_online"] == 2


def test_a_standby_held_across_a_cpu_offline_is_not_used_for_the_old_cpus(
    run: dict[str, Any],
) -> None:
    """prof@short held for 2 CPUs, then CPU 1 offline, then its hint: what runs was
    computed for the one CPU left."""
    st = _step(run, "hit_after_offline")
    assert st["kernel"]["online"] == "0"
    assert st["status"]["active"] == "prof@short"
    assert st["status"]["profile"]["stats"]["nr_online"] == 1
    assert st["status"]["profile"]["stats"]["online_mask"] == 0b01
    assert st["status"]["profile"]["stats"]["slice_ns"] == 2000000
