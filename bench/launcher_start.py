"""How long a launcher line waits, and how long ``status`` takes.

Starts a real daemon (this checkout's ``schedswitchd``) on a private socket whose ``gaming``
hint maps to ``kernel`` (the host has no sched_ext, and a hint that needs no switch isolates
the wrapper's own cost), then times, each ``--runs`` times in fresh processes, interleaved
so that the host's drift hits every case alike:

* the references: ``python -c pass`` (the interpreter's start and exit with ``site``, as a
  console script starts), in the regular install's venv and in the development venv, and
  ``python -S -c pass`` (without ``site``);
* ``schedswitch-run gaming -- date +%s%N``: from just before spawning the wrapper to the
  wall-clock time ``date`` reads once exec'd (``date`` stands for the target's ``true``: it
  reports when it ran), i.e. wrapper start + hint exchange + exec;
* ``schedswitchctl status``: start to exit;

each of the two three ways: through the console script of a regular install (what a user
runs, and what the targets are judged on), through the development venv's console script
(``site`` runs its editable install's import finder), and as ``python -S`` with the
checkout on ``sys.path`` (what the package's own code costs); and ``schedswitch-run``
once more through the regular install's venv with the wrapper an older pip writes (pip 26
writes one that imports ``sys`` alone; older ones, such as Debian 12's pip 23.0.1, use
distlib's template, which imports ``re`` to strip ``.exe`` from ``argv[0]``), written
here as such a wrapper.

The regular install is built from this checkout at every run: its package files, copied
into the bench's temporary directory, are made into a wheel with the development venv's
pip and setuptools (``--no-build-isolation --no-index``: nothing downloaded), installed
``--no-deps`` into a fresh venv without pip or setuptools (``schedswitch-run`` and the
daemon commands of ``schedswitchctl`` need the standard library alone; the daemon runs from
the development venv). Its console scripts are pip's, as a user's ``pip install`` writes
them.

Every process runs without the caller's ``PYTHON*`` variables (this checkout's environment
sets ``PYTHONDONTWRITEBYTECODE=1`` and ``PYTHONUNBUFFERED=1``, which a user's does not), with
bytecode caching on into a private ``PYTHONPYCACHEPREFIX``, warmed by two unmeasured
rounds: an installed package has its ``.pyc`` files, while a checkout run with
``PYTHONDONTWRITEBYTECODE=1`` compiles every module of the package at each start (~9 ms of
schedswitch-run's imports by ``-X importtime`` on the dev host).

Prints medians of wall time in ms, each as a ratio to the references of the same run, and
the median CPU time (user + system of the process and its children, ms), which a loaded
host inflates less than wall time, with the host's load average before and after. Targets:
start to exec <= 60 ms, status <= 120 ms (wall, regular install's console script). Exit 0
met, 2 missed, 1 failed.

Usage: ``python bench/launcher_start.py [--runs N] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import venv
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
#: Targets, regular install: start to exec and ``status`` each at most this many times
#: ``python -c pass`` in the same venv, measured in the same run.
TARGET_VS_PYTHON = 1.6
REF = "python -c pass, regular install's venv (reference)"
REF_DEV = "python -c pass, development venv (reference)"
REF_S = "python -S -c pass (reference)"
RUN = "schedswitch-run start to exec, regular install"
RUN_DEV = "schedswitch-run start to exec, development console script"
RUN_S = "schedswitch-run start to exec, python -S"
STATUS = "schedswitchctl status, regular install"
STATUS_DEV = "schedswitchctl status, development console script"
STATUS_S = "schedswitchctl status, python -S"
RUN_OLD_PIP = "schedswitch-run start to exec, regular install, older pip's wrapper (re)"
#: A console script as older pips write it (distlib's template): it imports re.
OLD_PIP_WRAPPER = """#!{python}
import re
import sys
from schedswitchd.cli.run import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
"""
#: What a wheel of the package is built from (pyproject.toml names the readme and licence).
PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE", "schedswitchd")


def _children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1e3


#: The environment of every process the bench starts (see the module docstring).
ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def wall_ms(argv: list[str]) -> tuple[float, float]:
    """Start-to-exit of ``argv`` and its CPU time, ms (stdout and stderr discarded)."""
    cpu0 = _children_cpu_ms()
    t0 = time.perf_counter_ns()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    return (time.perf_counter_ns() - t0) / 1e6, _children_cpu_ms() - cpu0


def exec_ms(argv: list[str]) -> tuple[float, float]:
    """Spawn ``argv`` (ending in ``date +%s%N``): ms from spawn to ``date``'s clock, and
    the CPU time of the whole run (``date`` included), ms."""
    cpu0 = _children_cpu_ms()
    t0 = time.time_ns()
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=ENV).stdout
    return (int(out.strip().splitlines()[-1]) - t0) / 1e6, _children_cpu_ms() - cpu0


def no_site(module: str, *args: str) -> list[str]:
    """``python -S`` running ``module``'s ``main`` from this checkout."""
    return [
        sys.executable,
        "-S",
        "-c",
        "import sys; sys.path.insert(0, sys.argv.pop(1)); "
        f"from {module} import main; sys.exit(main())",
        str(REPO),
        *args,
    ]


def regular_install(tmp: Path) -> Path:
    """A venv under ``tmp`` with this checkout's package installed from a wheel, as
    ``pip install`` installs it (see the module docstring); its ``bin`` directory.

    Raises ``subprocess.CalledProcessError`` if the wheel cannot be built or installed
    (``make deps`` installs the build backend, setuptools, into the development venv)."""
    src, wheels, env = tmp / "src", tmp / "wheels", tmp / "venv"
    src.mkdir()
    for name in PACKAGE_FILES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    build = ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels)]
    subprocess.run([*pip, *build, str(src)], check=True, stdout=subprocess.DEVNULL)
    venv.EnvBuilder(with_pip=False).create(env)
    install = ["--python", str(env / "bin" / "python"), "install", "--no-deps", "--no-index"]
    wheel = [str(path) for path in wheels.glob("*.whl")]
    subprocess.run([*pip, *install, *wheel], check=True, stdout=subprocess.DEVNULL)
    return env / "bin"


def wait_for_socket(path: Path, daemon: subprocess.Popen[bytes]) -> None:
    """Until the daemon's socket exists (60 s at most: its start on a loaded host)."""
    deadline = time.monotonic() + 60.0
    while not path.exists():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("bench: the daemon did not start")
        time.sleep(0.05)


def measure(runs: int, tmp: Path) -> dict[str, list[tuple[float, float]]]:
    """Every case's ``runs`` samples of (wall ms, CPU ms), interleaved, against a daemon
    started here."""
    installed = regular_install(tmp)
    old_pip = installed / "schedswitch-run-older-pip"
    old_pip.write_text(OLD_PIP_WRAPPER.format(python=installed / "python"))
    old_pip.chmod(0o755)
    conf, sock = tmp / "c.toml", tmp / "s.sock"
    conf.write_text(CONFIG)
    ENV["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    # The daemon is not measured: it runs in the caller's environment (its imports need
    # no fresh bytecode cache).
    daemon = subprocess.Popen(
        [str(BIN / "schedswitchd"), "--config", str(conf), "--socket", str(sock)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_socket(sock, daemon)
        date = ["date", "+%s%N"]
        run_args = ["-q", "--socket", str(sock), "gaming", "--", *date]
        status_args = ["--socket", str(sock), "status"]
        cases: dict[str, Callable[[], tuple[float, float]]] = {
            REF: lambda: wall_ms([str(installed / "python"), "-c", "pass"]),
            REF_DEV: lambda: wall_ms([sys.executable, "-c", "pass"]),
            REF_S: lambda: wall_ms([sys.executable, "-S", "-c", "pass"]),
            RUN: lambda: exec_ms([str(installed / "schedswitch-run"), *run_args]),
            RUN_DEV: lambda: exec_ms([str(BIN / "schedswitch-run"), *run_args]),
            RUN_S: lambda: exec_ms(no_site("schedswitchd.cli.run", *run_args)),
            STATUS: lambda: wall_ms([str(installed / "schedswitchctl"), *status_args]),
            STATUS_DEV: lambda: wall_ms([str(BIN / "schedswitchctl"), *status_args]),
            STATUS_S: lambda: wall_ms(no_site("schedswitchd.cli.ctl", *status_args)),
            RUN_OLD_PIP: lambda: exec_ms([str(old_pip), *run_args]),
        }
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for _ in range(2):  # fill the bytecode cache, unmeasured
            for case in cases.values():
                case()
        for _ in range(runs):
            for name, case in cases.items():
                samples[name].append(case())
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)
    return samples


def main() -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--json", action="store_true", help="one JSON line of results")
    args = parser.parse_args()
    load_before = os.getloadavg()
    started = time.strftime("%H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="ssd-launch-") as tmp:
        samples = measure(args.runs, Path(tmp))
    load_after = os.getloadavg()
    medians = {name: statistics.median(w for w, _ in v) for name, v in samples.items()}
    cpu = {name: statistics.median(c for _, c in v) for name, v in samples.items()}
    exec_med, status_med = medians[RUN], medians[STATUS]
    exec_x, status_x = exec_med / medians[REF], status_med / medians[REF]
    met = exec_x <= TARGET_VS_PYTHON and status_x <= TARGET_VS_PYTHON
    if args.json:
        result = {
            "runs": args.runs,
            "started": started,
            "load": [load_before, load_after],
            "median_ms": medians,
            "cpu_ms": cpu,
            "met": met,
        }
        print(json.dumps(result))
    else:
        loads = " / ".join(" ".join(f"{x:.1f}" for x in load) for load in (load_before, load_after))
        print(f"medians of {args.runs} runs, {os.uname().release}, started {started}")
        print(f"load average (1, 5, 15 min) before / after: {loads}")
        print("| case | wall ms | / `python -c pass` | / `python -S -c pass` | CPU ms |")
        print("|---|---:|---:|---:|---:|")
        for name, value in medians.items():
            print(
                f"| {name} | {value:.1f} | {value / medians[REF]:.2f} "
                f"| {value / medians[REF_S]:.2f} | {cpu[name]:.1f} |"
            )
        print(
            f"targets (regular install, x `python -c pass` in its venv): start to exec "
            f"{exec_x:.2f} <= {TARGET_VS_PYTHON:g}, status {status_x:.2f} <= "
            f"{TARGET_VS_PYTHON:g}: {'met' if met else 'MISSED'}"
        )
    return 0 if met else 2


if __name__ == "__main__":
    sys.exit(main())
