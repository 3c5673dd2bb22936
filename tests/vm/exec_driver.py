"""Runs inside the sched_ext VM for tests/vm/test_executables_vm.py: the daemon (the real
backend) with ss_fifo as a lease's object scheduler, then schedulers run as their own
programs (``build/tests/exec/``, ``tests/vm/exec/*.c``), each case recorded in one JSON file:

- ``gaps``: three switches from ss_fifo to ss_vtime loaded by the daemon (``vobj``) and
  three to ss_vtime run by ``scx_ssfifo`` (``vexec``), each ended by its lease (back to
  ss_fifo): the kernel's view and status while each runs, the switch records (gap, phases);
- ``stubborn``: a program that ignores SIGINT, whose lease ends;
- ``broken``: a program that exits 1 at start, hinted while ss_fifo runs;
- ``killed``: the running program killed from outside (SIGKILL) while its lease holds.

    python -m tests.vm.exec_driver CONFIG OUT LOG
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vm.defects_driver import stop
from tests.vm.profile_driver import BIN, ctl, holding, kernel, wait

ROUNDS = 3


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def last_switch_to(target: str, seq: int) -> Callable[[dict[str, Any]], bool]:
    def cond(s: dict[str, Any]) -> bool:
        last = s.get("last_switch") or {}
        return bool(
            last.get("seq", 0) > seq and last.get("target") == target and last.get("finished")
        )

    return cond


def seq_of(status: dict[str, Any]) -> int:
    return int((status.get("last_switch") or {}).get("seq", 0))


def one_round(sock: str, workload: str, name: str) -> dict[str, Any]:
    """Hint ``workload`` (its scheduler ``name``) from ss_fifo, record it running, end the
    lease and record ss_fifo back."""
    before = ctl(sock, "status")["status"]
    lease = holding(sock, workload)
    try:
        running = wait(sock, last_switch_to(name, seq_of(before)), timeout=300)
        out: dict[str, Any] = {"running": running, "kernel": kernel()}
        runs = running.get("runs") or {}
        if runs.get("pid"):
            out["cmdline"] = cmdline(runs["pid"])
            out["pid_alive"] = alive(runs["pid"])
    finally:
        lease.terminate()
        lease.wait()
    back = wait(sock, last_switch_to("fifo", seq_of(running)), timeout=300)
    out["back"], out["kernel_back"] = back, kernel()
    if runs.get("pid"):
        out["pid_alive_after"] = alive(runs["pid"])
    return out


def case_gaps(sock: str) -> dict[str, Any]:
    out: dict[str, Any] = {"vobj": [], "vexec": []}
    for _ in range(ROUNDS):
        out["vobj"].append(one_round(sock, "obj", "vobj"))
        out["vexec"].append(one_round(sock, "game", "vexec"))
    return out


def case_stubborn(sock: str) -> dict[str, Any]:
    return one_round(sock, "stuck", "stubborn")


def case_broken(sock: str, log_path: str) -> dict[str, Any]:
    before = ctl(sock, "status")["status"]
    lease = holding(sock, "bad")
    try:
        st = wait(sock, last_switch_to("broken", seq_of(before)), timeout=300)
        out: dict[str, Any] = {"status": st, "kernel": kernel()}
        time.sleep(5)  # later passes: the backoff holds, the program is not started again
        out["later"], out["kernel_later"] = ctl(sock, "status")["status"], kernel()
        out["starts_logged"] = Path(log_path).read_text().count("scx_ssexit1: refusing to start")
    finally:
        lease.terminate()
        lease.wait()
    return out


def case_killed(sock: str) -> dict[str, Any]:
    before = ctl(sock, "status")["status"]
    lease = holding(sock, "game")
    try:
        running = wait(sock, last_switch_to("vexec", seq_of(before)), timeout=300)
        pid = running["runs"]["pid"]
        os.kill(pid, signal.SIGKILL)
        back = wait(
            sock,
            lambda s: (
                s["active"] == "fifo"
                and "vexec" in [b["scheduler"] for b in s["backoff"]]
                and s["kernel"]["ops"] == "ss_fifo"
            ),
            timeout=300,
        )
        history = ctl(sock, "history")["entries"]
        return {"running": running, "back": back, "kernel": kernel(), "history": history}
    finally:
        lease.terminate()
        lease.wait()


def run(config: str, out_path: str, log_path: str) -> int:
    sock = "/run/ssd-exec-vm.sock"  # not in $RESULTS: 9p cannot hold a socket
    result: dict[str, Any] = {}

    def save() -> None:
        Path(out_path).write_text(json.dumps(result, indent=1))

    with open(log_path, "w") as log:
        daemon = subprocess.Popen(
            [str(BIN / "schedswitchd"), "--config", config, "--socket", sock],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for _ in range(1500):  # the launcher below needs the socket (else: no lease)
            if os.path.exists(sock) or daemon.poll() is not None:
                break
            time.sleep(0.2)
        desk = holding(sock, "desk")
        try:
            result["fifo"] = wait(sock, lambda s: s["active"] == "fifo", timeout=600)
            cases: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                ("gaps", lambda: case_gaps(sock)),
                ("stubborn", lambda: case_stubborn(sock)),
                ("broken", lambda: case_broken(sock, log_path)),
                ("killed", lambda: case_killed(sock)),
            ]
            for name, case in cases:
                try:
                    result[name] = case()
                except Exception as exc:
                    result[name] = {"exception": repr(exc), "tb": traceback.format_exc()}
                save()
            result["history"] = ctl(sock, "history")["entries"]
            result["stopped"] = ctl(sock, "stop")
        finally:
            desk.terminate()
            desk.wait()
            stop(daemon)
    result["log"] = Path(log_path).read_text()
    result["done"] = True
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(run(*sys.argv[1:4]))
