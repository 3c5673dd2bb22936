"""Runs inside the sched_ext VM for tests/vm/test_scx_loader_vm.py: ``schedswitchd`` with
``[dbus]`` on a private system bus (the shipped bus policy), driven by ``busctl`` as a user
of scx_loader would: ``SwitchScheduler su scx_bpfland 1``, the kernel's view and the
properties after it, then ``StopScheduler``; ``busctl monitor`` records the
``PropertiesChanged`` signals meanwhile. Writes what it saw as one JSON file.

    python -m tests.vm.scx_loader_driver CONFIG OUT LOG
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.desktop.buses import PrivateBus, program
from tools.session import kernel_view

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
NAME, PATH, IFACE = "org.scx.Loader", "/org/scx/Loader", "org.scx.Loader"
#: Bounds, s: the daemon's start and a first load of bpfland take minutes under TCG.
START_S = 600
CALL_S = 900


def main(config: str, out_path: str, log_path: str) -> int:
    seen: dict[str, Any] = {}
    sock = "/tmp/scx-loader-vm.sock"
    with (
        PrivateBus("system", [REPO / "dbus" / "org.scx.Loader.conf"]) as bus,
        open(log_path, "w") as log,
    ):
        base = [program("busctl"), f"--address={bus.address}", "--json=short", "--"]

        def busctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*base, *args], capture_output=True, text=True, timeout=timeout, check=False
            )

        def prop(name: str) -> Any:
            got = busctl("get-property", NAME, PATH, IFACE, name)
            return json.loads(got.stdout)["data"] if got.returncode == 0 else got.stderr

        daemon = subprocess.Popen(
            [str(BIN / "schedswitchd"), "--config", config, "--socket", sock],
            env=bus.env(),
            stdout=log,
            stderr=log,
        )
        monitor = subprocess.Popen(
            [*base[:-1], "monitor", NAME, "--json=short"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            t0 = time.monotonic()
            bus.wait_for_name(NAME, START_S)
            seen["start_s"] = time.monotonic() - t0
            seen["before"] = {"kernel": kernel_view(), "current": prop("CurrentScheduler")}
            t0 = time.monotonic()
            call = busctl(
                "call", NAME, PATH, IFACE, "SwitchScheduler", "su", "scx_bpfland", "1",
                timeout=CALL_S,
            )  # fmt: skip
            seen["switch"] = {
                "rc": call.returncode,
                "stderr": call.stderr,
                "s": time.monotonic() - t0,
                "kernel": kernel_view(),
                "current": prop("CurrentScheduler"),
                "mode": prop("SchedulerMode"),
            }
            status = subprocess.run(
                [str(BIN / "schedswitchctl"), "status", "--json", "--socket", sock],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            seen["status"] = json.loads(status.stdout)["status"] if status.returncode == 0 else None
            stop = busctl("call", NAME, PATH, IFACE, "StopScheduler", timeout=CALL_S)
            seen["stop"] = {
                "rc": stop.returncode,
                "stderr": stop.stderr,
                "kernel": kernel_view(),
                "current": prop("CurrentScheduler"),
            }
            time.sleep(1)  # the signals of the stop reach the monitor
        finally:
            monitor.terminate()
            signals, _ = monitor.communicate(timeout=30)
            daemon.terminate()
            daemon.wait(120)
        seen["signals"] = [
            msg["payload"]["data"][1]
            for msg in map(json.loads, signals.splitlines())
            if msg.get("type") == "signal" and msg.get("member") == "PropertiesChanged"
        ]
    Path(out_path).write_text(json.dumps(seen, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
