"""Runs inside the sched_ext VM for tests/vm/test_standby_fresh_vm.py: a profiled test
scheduler (tests/vm/bpf/profiled.bpf.o with tests/vm/profiles/profiled.toml) prepared by
the real backend twice, as ``prof`` (``hotplug_seq = false``: only its profile's values
depend on the CPUs) and ``prof_seq`` (the default: ``ops.hotplug_seq`` set too), never
attached; their quick and full freshness checks asked while CPU 1 goes offline and comes
back, with nothing attached; ``hotplug_seq`` and the kernel's state read around each step,
and how many full topology reads each check made. Writes one JSON object.

    python -m tests.vm.standby_fresh_driver OUT
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

from schedswitchd.daemon import kernel_prepare
from schedswitchd.daemon.config import parse_config
from schedswitchd.daemon.kernel_backend import KernelBackend
from schedswitchd.profile import topology

REPO = Path(__file__).resolve().parents[2]
SCX = Path("/sys/kernel/sched_ext")
CPU1 = Path("/sys/devices/system/cpu/cpu1/online")
CONFIG = f"""
[schedulers.prof]
object = "{REPO / "build" / "tests" / "vm" / "bpf" / "profiled.bpf.o"}"
profile = "{REPO / "tests" / "vm" / "profiles" / "profiled.toml"}"
hotplug_seq = false
[schedulers.prof_seq]
object = "{REPO / "build" / "tests" / "vm" / "bpf" / "profiled.bpf.o"}"
profile = "{REPO / "tests" / "vm" / "profiles" / "profiled.toml"}"
"""


def kernel() -> dict[str, Any]:
    return {
        "state": (SCX / "state").read_text().strip(),
        "hotplug_seq": int((SCX / "hotplug_seq").read_text()),
        "online": Path("/sys/devices/system/cpu/online").read_text().strip(),
    }


def main(out: str) -> int:
    result: dict[str, Any] = {"steps": {}}
    # Full topology reads, counted: each check records how many it made.
    reads = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads[0] += 1
        return topology.read_topology(*args, **kwargs)

    # The name the backend calls, replaced in its module (a driver process of its own).
    setattr(kernel_prepare, "read_topology", counted)  # noqa: B010
    schedulers = parse_config(CONFIG, str(REPO / "x.toml")).schedulers
    backend = KernelBackend(pin_dir="/sys/fs/bpf/ssd-fresh-vm")
    try:
        handles = {name: backend.prepare(name, cfg) for name, cfg in schedulers.items()}
        try:

            def step(name: str, *checks: str) -> None:
                result["steps"][name] = {"kernel": kernel()}
                for sched, h in handles.items():
                    cfg = schedulers[sched]
                    # In this order: a quick check that reads the topology in full remembers
                    # hotplug_seq when it finds the topology unchanged.
                    got: dict[str, Any] = {}
                    for check in checks:
                        before = reads[0]
                        got[check] = backend.fresh(h, cfg, quick=check.startswith("quick"))
                        got[f"{check}_reads"] = reads[0] - before
                    result["steps"][name][sched] = got

            step("prepared", "quick", "full")
            CPU1.write_text("0")
            step("cpu1_offline", "quick", "full")
            CPU1.write_text("1")
            step("cpu1_back", "quick", "quick_again", "full")
        finally:
            for h in handles.values():
                backend.discard(h)
        result["done"] = True
    except Exception as exc:  # reported whole to the test
        result["exception"] = repr(exc)
        result["tb"] = traceback.format_exc()
    finally:
        if CPU1.read_text().strip() != "1":
            CPU1.write_text("1")
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
