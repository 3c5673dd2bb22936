"""Runs inside the sched_ext VM for tests/vm/test_desktop_vm.py: the daemon with
``[dbus.power_profiles]`` on a private system bus (the real polkitd and the real
power-profiles-daemon on it), and on a private session bus the real gamemoded with
``schedswitch-gamemode`` following it. Then ``gamemoderun sleep 20`` and
``powerprofilesctl set power-saver`` / ``balanced``, the kernel's sched_ext view read from
sysfs all along (never the daemon's word), into one JSON file.

    python -m tests.vm.desktop_driver CONFIG OUT LOG
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.desktop.buses import PrivateBus, program, system_bus_with_polkit
from tools.session import Daemon, kernel_view, wait_for

REPO = Path(__file__).resolve().parents[2]
GAMEMODERUN = "/usr/games/gamemoderun"
PPD = "/usr/libexec/power-profiles-daemon"
AGENT = Path(sys.executable).with_name("schedswitch-gamemode")


def _samples_while(proc: subprocess.Popen[bytes], interval_s: float = 0.5) -> list[Any]:
    """The kernel's view every ``interval_s`` until ``proc`` exits."""
    seen = []
    while proc.poll() is None:
        seen.append({"t": round(time.monotonic(), 2), **kernel_view()})
        time.sleep(interval_s)
    return seen


def main(config: str, out: Path, log: Path) -> int:
    result: dict[str, Any] = {}

    def save() -> None:
        out.write_text(json.dumps(result, indent=1))

    with system_bus_with_polkit() as system, PrivateBus("session") as session:
        os.environ["DBUS_SYSTEM_BUS_ADDRESS"] = system.address
        sock = "/tmp/desktop.sock"
        daemon = Daemon(config, sock, log)
        result["daemon_start_s"] = daemon.start(timeout_s=300)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            # GameMode: the real gamemoded, the agent following it (auto: it is on $PATH)
            gamemoded = [program("gamemoded")]
            procs.append(subprocess.Popen(gamemoded, env=session.env(), stderr=subprocess.DEVNULL))
            session.wait_for_name("com.feralinteractive.GameMode", 120)
            agent_log = log.with_name("agent.log")
            with open(agent_log, "ab") as agent_out:
                procs.append(
                    subprocess.Popen(
                        [str(AGENT), "--socket", sock],
                        env=session.env(),
                        stdout=agent_out,
                        stderr=subprocess.STDOUT,
                    )
                )
            result["agent_following"] = wait_for(
                lambda: b"following gamemoded" in agent_log.read_bytes(), 300, 0.2
            )
            result["before_game"] = kernel_view()
            result["game_started_t"] = round(time.monotonic(), 2)
            game = subprocess.Popen([GAMEMODERUN, "sleep", "20"], env=session.env())
            result["game_pid"] = game.pid
            result["while_game"] = _samples_while(game)
            result["game_rc"] = game.returncode
            result["game_ended_t"] = round(time.monotonic(), 2)
            result["after_game_settled"] = wait_for(
                lambda: kernel_view()["ops"] != "ss_latency", 120, 0.2
            )
            result["after_game"] = kernel_view()
            save()
            # power profiles: the real power-profiles-daemon, switched by powerprofilesctl
            procs.append(subprocess.Popen([PPD], env=system.env(), stderr=subprocess.DEVNULL))
            system.wait_for_name("net.hadess.PowerProfiles", 120)
            ctl = [program("powerprofilesctl")]
            result["power_saver_set_t"] = round(time.monotonic(), 2)
            subprocess.run([*ctl, "set", "power-saver"], env=system.env(), check=True, timeout=120)
            fifo = {"state": "enabled", "ops": "ss_fifo"}  # root/ops shows up while "enabling"
            result["power_saver_runs_fifo"] = wait_for(
                lambda: kernel_view().items() >= fifo.items(), 300, 0.2
            )
            result["power_saver"] = kernel_view()
            result["power_saver_seen_t"] = round(time.monotonic(), 2)
            subprocess.run([*ctl, "set", "balanced"], env=system.env(), check=True, timeout=120)
            result["balanced_ends_it"] = wait_for(
                lambda: kernel_view()["state"] == "disabled", 300, 0.2
            )
            result["balanced"] = kernel_view()
            save()
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(60)
            daemon.stop()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
