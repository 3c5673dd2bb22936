"""``org.scx.Loader`` switching a real sched_ext scheduler in the VM (one boot): ``busctl
call org.scx.Loader /org/scx/Loader org.scx.Loader SwitchScheduler su scx_bpfland 1`` makes
the kernel run scx_bpfland (``../shared/corpus``, its shipped profile) in its gaming mode,
``CurrentScheduler`` reads ``scx_bpfland``, a ``PropertiesChanged`` said so, and
``StopScheduler`` disables it (tests/vm/scx_loader_driver.py). Skips without the corpus."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.corpus import corpus_object
from tools import vm
from tools.session import config_variant
from tools.sidkernel import SidKernel

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
set -e
cd "$REPO"
# scx schedulers read __kconfig externs: this kernel's config where a distro keeps it
mount -t tmpfs tmpfs /boot && cp "$KMOD_ROOT/lib/modules/$KVER/config" "/boot/config-$KVER"
"$PY" -m tests.vm.scx_loader_driver "$RESULTS/loader.toml" "$RESULTS/loader.json" \
    "$RESULTS/daemon.log"
"""


@pytest.fixture(scope="module")
def seen(sid_kernel: SidKernel, sched_objects: Path) -> dict[str, Any]:
    bpfland = corpus_object("bpfland")
    extra = (
        f'[schedulers.bpfland]\nobject = "{bpfland}"\nprofile = "bpfland"\n'
        # the kernel's watchdog under TCG (as tests/vm/test_profiles_corpus.py)
        "struct_ops = { timeout_ms = 30000 }\n"
        '[dbus]\n[dbus.scx_names]\nscx_bpfland = "bpfland"\n'
        "[standby]\nrecent = false\n"
    )
    result = vm.run_in_vm(
        SCRIPT,
        kernel=sid_kernel,
        timeout=1800,
        cwd=str(REPO),
        inputs={"loader.toml": config_variant(REPO, extra=extra)},
    )
    raw = result.files.get("loader.json")
    log = result.files.get("daemon.log", b"").decode(errors="replace")
    if raw is None:
        pytest.fail(
            f"driver in the VM failed (rc {result.returncode}, {result.elapsed_s:.0f} s)\n"
            f"{result.tail(60)}\n--- daemon log ---\n{log[-6000:]}"
        )
    data: dict[str, Any] = json.loads(raw)
    data["_log"] = log
    return data


def test_switch_scheduler_runs_bpfland_in_gaming_mode(seen: dict[str, Any]) -> None:
    assert seen["before"]["current"] == "unknown"
    switch = seen["switch"]
    assert switch["rc"] == 0, (switch["stderr"], seen["_log"][-4000:])
    assert switch["kernel"]["state"] == "enabled" and switch["kernel"]["ops"] == "bpfland"
    assert switch["current"] == "scx_bpfland" and switch["mode"] == 1
    status = seen["status"]
    assert status["active"] == "bpfland@gaming" and status["override"] == "bpfland@gaming"
    assert status["profile"]["name"] == "bpfland" and status["profile"]["mode"] == "gaming"
    assert status["kernel"]["ops"] == "bpfland"


def test_properties_changed_was_seen(seen: dict[str, Any]) -> None:
    changes = seen["signals"]
    assert any(c.get("CurrentScheduler", {}).get("data") == "scx_bpfland" for c in changes), changes
    assert any(c.get("SchedulerMode", {}).get("data") == 1 for c in changes), changes


def test_stop_scheduler_disables_it(seen: dict[str, Any]) -> None:
    stop = seen["stop"]
    assert stop["rc"] == 0, stop["stderr"]
    assert stop["kernel"]["state"] == "disabled" and stop["current"] == "unknown"
    changes = seen["signals"]
    assert changes and changes[-1].get("CurrentScheduler", {}).get("data") == "unknown", changes
