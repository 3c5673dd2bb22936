"""Runs inside the sched_ext VM for tests/vm/test_profiles_vm.py: the daemon with a
profiled scheduler (tests/vm/bpf/profiled.bpf.o + tests/vm/profiles/profiled.toml), a hint
in the base mode and one in a mode, then CPU 1 taken offline and brought back while the
scheduler runs; then a launcher intent for the mode and its hint (a standby hit), and an
intent held while CPU 1 goes offline, then its hint. After each step it records the
daemon's status (profile, mode, counters read from the loaded maps), the kernel's sched_ext
view and the history, in one JSON file.

    python -m tests.vm.profile_driver CONFIG OUT LOG
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
SCX = Path("/sys/kernel/sched_ext")
CPU1 = Path("/sys/devices/system/cpu/cpu1/online")


def ctl(sock: str, *args: str) -> Any:
    try:
        out = subprocess.run(
            [str(BIN / "schedswitchctl"), "--socket", sock, *args, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:  # a status waits while a first load runs (TCG)
        raise RuntimeError(f"schedswitchctl {args}: no answer in 60 s") from exc
    if out.returncode != 0:
        raise RuntimeError(f"schedswitchctl {args}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def kernel() -> dict[str, Any]:
    def read(name: str) -> str | None:
        try:
            return (SCX / name).read_text().strip()
        except OSError:
            return None

    return {
        "state": read("state"),
        "ops": read("root/ops"),
        "enable_seq": read("enable_seq"),
        "hotplug_seq": read("hotplug_seq"),
        "online": Path("/sys/devices/system/cpu/online").read_text().strip(),
    }


def wait(sock: str, cond: Any, timeout: float = 600.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            last = ctl(sock, "status")["status"]
            if cond(last):
                return last
        except (RuntimeError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"condition not reached; last status {json.dumps(last)[:2000]}")


def holding(sock: str, workload: str) -> subprocess.Popen[bytes]:
    """A launcher holding a hint for ``workload`` while its command (a long sleep) runs;
    terminating it ends the hint."""
    return subprocess.Popen(
        [str(BIN / "schedswitch-run"), "--socket", sock, workload, "--", "sleep", "3600"]
    )


def stats(status: dict[str, Any]) -> dict[str, int]:
    prof = status.get("profile") or {}
    return dict(prof.get("stats") or {})


def main() -> int:
    config, out_path, log_path = sys.argv[1:4]
    sock = "/run/ssd-profiles-vm.sock"  # not in $RESULTS: 9p cannot hold a socket
    result: dict[str, Any] = {"steps": []}

    def record(step: str, status: dict[str, Any]) -> None:
        result["steps"].append({"step": step, "status": status, "kernel": kernel()})
        Path(out_path).write_text(json.dumps(result, indent=1))

    with open(log_path, "w") as log:
        daemon = subprocess.Popen(
            [str(BIN / "schedswitchd"), "--config", config, "--socket", sock],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    holders: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(900):
            if os.path.exists(sock) or daemon.poll() is not None:
                break
            time.sleep(0.2)
        if daemon.poll() is not None:
            raise RuntimeError(f"the daemon exited with {daemon.returncode}")
        holders.append(holding(sock, "desk"))
        st = wait(sock, lambda s: s["active"] == "prof" and stats(s).get("nr_online") == 2)
        record("base", st)
        holders.append(holding(sock, "fast"))
        st = wait(sock, lambda s: s["active"] == "prof@short" and stats(s).get("slice_ns"))
        record("mode", st)
        holders.pop().terminate()
        st = wait(sock, lambda s: s["active"] == "prof" and stats(s).get("nr_online") == 2)
        record("base_again", st)
        seq = st["kernel"]["enable_seq"]
        CPU1.write_text("0\n")
        st = wait(
            sock,
            lambda s: (
                s["active"] == "prof"
                and s["kernel"]["enable_seq"] != seq
                and s["kernel"]["state"] == "enabled"
                and stats(s).get("nr_online") == 1
            ),
        )
        record("cpu1_offline", st)
        seq = st["kernel"]["enable_seq"]
        CPU1.write_text("1\n")
        st = wait(
            sock,
            lambda s: (
                s["active"] == "prof"
                and s["kernel"]["enable_seq"] != seq
                and s["kernel"]["state"] == "enabled"
                and stats(s).get("nr_online") == 2
            ),
        )
        record("cpu1_online", st)

        def held(name: str) -> Any:
            return lambda s: s["idle"] and any(e["scheduler"] == name for e in s["standby"])

        # A launcher's intent holds prof@short prepared (profiled, for these 2 CPUs); its
        # hint is a standby hit, whose take checks the topology by hotplug_seq and the
        # online list only.
        ctl(sock, "prepare", "fast", "--ttl", "600")
        record("intent", wait(sock, held("prof@short")))
        holders.append(holding(sock, "fast"))
        st = wait(sock, lambda s: s["active"] == "prof@short" and stats(s).get("slice_ns"))
        record("standby_hit", st)
        holders.pop().terminate()
        st = wait(sock, lambda s: s["active"] == "prof" and stats(s).get("nr_online") == 2)
        # Held again, for 2 CPUs; then CPU 1 goes: the hint that follows must run values
        # for the one CPU left, whether the pool re-prepared it first or the take found
        # it stale.
        ctl(sock, "prepare", "fast", "--ttl", "600")
        wait(sock, held("prof@short"))
        seq = st["kernel"]["enable_seq"]
        CPU1.write_text("0\n")
        wait(
            sock,
            lambda s: (
                s["active"] == "prof"
                and s["kernel"]["enable_seq"] != seq
                and stats(s).get("nr_online") == 1
            ),
        )
        holders.append(holding(sock, "fast"))
        st = wait(sock, lambda s: s["active"] == "prof@short" and stats(s).get("slice_ns"))
        record("hit_after_offline", st)
        holders.pop().terminate()
        CPU1.write_text("1\n")
        result["history"] = ctl(sock, "history")
        result["done"] = True
    except Exception as exc:  # the test reports it with the daemon's log
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for h in holders:
            h.terminate()
        daemon.terminate()
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        if CPU1.read_text().strip() != "1":
            CPU1.write_text("1\n")
        Path(out_path).write_text(json.dumps(result, indent=1))
    return 0 if result.get("done") else 1


if __name__ == "__main__":
    raise SystemExit(main())
