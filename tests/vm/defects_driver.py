"""Runs inside the sched_ext VM for tests/vm/test_daemon_defects_vm.py: the daemon (the real
backend) and a launcher's lease, then three cases, each recorded in one JSON file:

- ``prepare_raises``: a scheduler whose prepare raises an exception of no project type (a
  loader defect, injected into the real backend by the ``daemon`` sub-command: its
  ``prepare`` of ``corrupt`` raises ``IndexError``) is hinted while ss_fifo runs;
- ``hotplug``: CPU 1 goes offline and online four times while the lease's ss_fifo runs:
  eight restarts the kernel asks for, past the five a minute loaded at once;
- ``no_pins``: a second daemon whose pin directory is on tmpfs is hinted.

    python -m tests.vm.defects_driver run CONFIG NOPIN_CONFIG OUT LOG
    python -m tests.vm.defects_driver daemon CONFIG SOCKET   (the daemon, defect injected)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vm.profile_driver import BIN, CPU1, REPO, ctl, holding, kernel, wait


def start_daemon(config: str, sock: str, log: Any) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.vm.defects_driver", "daemon", config, sock],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    for _ in range(1500):
        if os.path.exists(sock) or proc.poll() is not None:
            break
        time.sleep(0.2)
    if proc.poll() is not None:
        raise RuntimeError(f"the daemon exited with {proc.returncode}")
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def case_prepare_raises(sock: str, log_path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    bad = holding(sock, "bad")
    try:
        # The record shows from the switch's start (``finished`` False, result still "ok"):
        # wait for the switcher to be done with it.
        st = wait(
            sock,
            lambda s: (
                (s.get("last_switch") or {}).get("target") == "corrupt"
                and s["last_switch"].get("finished", True)
            ),
        )
        out["status"], out["kernel"] = st, kernel()
        time.sleep(5)  # later passes: the backoff holds, nothing is prepared again
        out["later"], out["kernel_later"] = ctl(sock, "status")["status"], kernel()
        out["history"] = ctl(sock, "history")["entries"]
        out["defects_logged"] = Path(log_path).read_text().count("raised an unexpected error")
    finally:
        bad.terminate()
        bad.wait()
    return out


def case_hotplug(sock: str) -> dict[str, Any]:
    out: dict[str, Any] = {"steps": []}
    started = time.monotonic()
    for online in "01010101":
        seq = kernel()["enable_seq"]
        CPU1.write_text(f"{online}\n")

        def restarted(s: dict[str, Any], seq: str | None = seq) -> bool:
            return bool(
                s["active"] == "fifo"
                and s["kernel"]["state"] == "enabled"
                and str(s["kernel"]["enable_seq"]) != seq
            )

        st = wait(sock, restarted, timeout=300)
        out["steps"].append(
            {"online": online, "s": time.monotonic() - started, "status": st, "kernel": kernel()}
        )
    out["history"] = ctl(sock, "history")["entries"]
    return out


def case_no_pins(config: str, log: Any) -> dict[str, Any]:
    sock = "/run/ssd-defects-nopin.sock"
    daemon = start_daemon(config, sock, log)
    try:
        before = kernel()
        reply = subprocess.run(
            [str(BIN / "schedswitchctl"), "--socket", sock, "switch", "fifo", "--json"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        return {
            "before": before,
            "reply": json.loads(reply.stdout) if reply.stdout else reply.stderr,
            "after": kernel(),
            "status": ctl(sock, "status")["status"],
        }
    finally:
        stop(daemon)


def run(config: str, nopin_config: str, out_path: str, log_path: str) -> int:
    sock = "/run/ssd-defects-vm.sock"  # not in $RESULTS: 9p cannot hold a socket
    result: dict[str, Any] = {}

    def save() -> None:
        Path(out_path).write_text(json.dumps(result, indent=1))

    with open(log_path, "w") as log:
        daemon = start_daemon(config, sock, log)
        desk = holding(sock, "desk")
        try:
            result["fifo"] = wait(sock, lambda s: s["active"] == "fifo")
            cases: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                ("prepare_raises", lambda: case_prepare_raises(sock, log_path)),
                ("hotplug", lambda: case_hotplug(sock)),
            ]
            for name, case in cases:
                try:
                    result[name] = case()
                except Exception as exc:
                    result[name] = {"exception": repr(exc), "tb": traceback.format_exc()}
                save()
            # the kernel's own scheduler before the next daemon (SIGTERM leaves it pinned)
            result["stopped"] = ctl(sock, "stop")
        finally:
            desk.terminate()
            desk.wait()
            stop(daemon)
            if CPU1.read_text().strip() != "1":
                CPU1.write_text("1\n")
        try:
            result["no_pins"] = case_no_pins(nopin_config, log)
        except Exception as exc:
            result["no_pins"] = {"exception": repr(exc), "tb": traceback.format_exc()}
    result["log"] = Path(log_path).read_text()
    result["done"] = True
    save()
    return 0


def daemon(config: str, sock: str) -> int:
    """The daemon with the real backend, whose prepare of ``corrupt`` raises IndexError (as
    a loader defect some object provokes would)."""
    from schedswitchd.daemon import kernel_backend, service

    def factory(cfg: Any) -> Any:
        backend = kernel_backend.create_backend(cfg)
        real = backend.prepare

        def prepare(name: str, spec: Any) -> Any:
            if name == "corrupt":
                raise IndexError("index out of range (injected loader defect)")
            return real(name, spec)

        backend.prepare = prepare  # type: ignore[method-assign]
        return backend

    return service.main(["--config", config, "--socket", sock], backend_factory=factory)


if __name__ == "__main__":
    if sys.argv[1] == "daemon":
        raise SystemExit(daemon(*sys.argv[2:4]))
    raise SystemExit(run(*sys.argv[2:6]))
