"""How long a launcher line waits: ``schedswitch-run`` start to the command's exec (issue 15).

Starts a real daemon (this checkout's ``schedswitchd``) on a private socket whose ``gaming``
hint maps to ``kernel`` (the host has no sched_ext, and a hint that needs no switch isolates
the wrapper's own cost), then times, each ``--runs`` times in fresh processes:

* ``python -c pass``: the interpreter's own start and exit, the floor (reference);
* ``schedswitch-run gaming -- date +%s%N``: from just before spawning the wrapper to the
  wall-clock time ``date`` prints once exec'd, i.e. wrapper start + hint exchange + exec;
  once through the venv's console script (site, and the editable install's import finder),
  once as ``python -S`` with the checkout on ``sys.path`` (what the wrapper itself costs
  without the development install's site hooks);
* ``schedswitchctl status``: start to exit.

Prints medians in ms and each as a ratio to the reference measured in the same run.
Targets: start to exec <= 60 ms, status <= 120 ms. Exit 0 met, 2 missed, 1 failed.

Usage: ``python bench/launcher_start.py [--runs N] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CONFIG = """
[auth]
hint_uids = [0]
[hints.gaming]
scheduler = "kernel"
"""
TARGET_EXEC_MS = 60.0
TARGET_STATUS_MS = 120.0


def wall_ms(argv: list[str]) -> float:
    """Start-to-exit of ``argv`` in ms (stdout and stderr discarded)."""
    t0 = time.perf_counter_ns()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter_ns() - t0) / 1e6


def exec_ms(argv: list[str]) -> float:
    """Spawn ``argv`` (ending in ``date +%s%N``), return ms from spawn to ``date``'s clock."""
    t0 = time.time_ns()
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return (int(out.strip().splitlines()[-1]) - t0) / 1e6


def wait_for_socket(path: Path, daemon: subprocess.Popen[bytes]) -> None:
    """Until the daemon's socket answers connects (10 s at most)."""
    deadline = time.monotonic() + 10.0
    while not path.exists():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("bench: the daemon did not start")
        time.sleep(0.05)


def main() -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--json", action="store_true", help="one JSON line of results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ssd-launch-") as tmp:
        conf, sock = Path(tmp) / "c.toml", Path(tmp) / "s.sock"
        conf.write_text(CONFIG)
        daemon = subprocess.Popen(
            [str(BIN / "schedswitchd"), "--config", str(conf), "--socket", str(sock)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_socket(sock, daemon)
            date = ["date", "+%s%N"]
            run_script = [str(BIN / "schedswitch-run"), "-q", "--socket", str(sock), "gaming"]
            no_site = [
                sys.executable,
                "-S",
                "-c",
                "import sys; sys.path.insert(0, sys.argv.pop(1)); "
                "from schedswitchd.cli.run import main; sys.exit(main())",
                str(REPO),
                "-q",
                "--socket",
                str(sock),
                "gaming",
            ]
            cases: dict[str, Callable[[], float]] = {
                "python -c pass (reference)": lambda: wall_ms([sys.executable, "-c", "pass"]),
                "schedswitch-run start to exec, console script": lambda: exec_ms(
                    [*run_script, "--", *date]
                ),
                "schedswitch-run start to exec, python -S": lambda: exec_ms(
                    [*no_site, "--", *date]
                ),
                "schedswitchctl status": lambda: wall_ms(
                    [str(BIN / "schedswitchctl"), "--socket", str(sock), "status"]
                ),
            }
            samples: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(args.runs):  # interleaved, so drift hits every case alike
                for name, case in cases.items():
                    samples[name].append(case())
        finally:
            daemon.terminate()
            daemon.wait(timeout=10)
    medians = {name: statistics.median(v) for name, v in samples.items()}
    ref = medians["python -c pass (reference)"]
    exec_med = medians["schedswitch-run start to exec, console script"]
    status_med = medians["schedswitchctl status"]
    met = exec_med <= TARGET_EXEC_MS and status_med <= TARGET_STATUS_MS
    if args.json:
        print(json.dumps({"runs": args.runs, "median_ms": medians, "met": met}))
    else:
        print(f"medians of {args.runs} runs, {os.uname().release}")
        print("| case | median ms | / python -c pass |")
        print("|---|---|---|")
        for name, value in medians.items():
            print(f"| {name} | {value:.1f} | {value / ref:.2f} |")
        print(
            f"targets: start to exec {exec_med:.1f} <= {TARGET_EXEC_MS} ms, "
            f"status {status_med:.1f} <= {TARGET_STATUS_MS} ms: {'met' if met else 'MISSED'}"
        )
    return 0 if met else 2


if __name__ == "__main__":
    sys.exit(main())
