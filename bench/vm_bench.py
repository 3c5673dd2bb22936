"""Helpers shared by the benchmarks that run in the sched_ext VM (``switch_latency.py``,
``gap_profile.py``, ``daemon_rss.py``, ``daemon_flood_vm.py``, ``cold_steps.py``, ...): the
kernel's sched_ext view from sysfs, waiting for a state, a process's resident memory, and
the host side's common steps (build the sample schedulers, get the kernel, describe the VM
run, the host's load and the checkout's commit for a report, a report's command line, tell
a failed VM run, save a run's data and report, redo a report from the saved data with
``--from-json``).

Imported by those scripts as ``vm_bench`` (each puts its own directory on ``sys.path``), in
the VM as on the host. No import of the package here: the VM-side processes time their own
imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tools.sidkernel import SidKernel

REPO = Path(__file__).resolve().parent.parent
SCHED_DIR = REPO / "build" / "bpf"
CORPUS = REPO.parent / "shared" / "corpus"
#: ``Documentation/scheduler/sched-ext.rst``: ``state`` and the running scheduler's name.
STATE = Path("/sys/kernel/sched_ext/state")
OPS = Path("/sys/kernel/sched_ext/root/ops")


def scx() -> tuple[str, str | None]:
    """``(state, ops)`` of ``/sys/kernel/sched_ext`` now; ``ops`` is ``None`` while no
    scheduler's ``root`` directory exists."""
    state = STATE.read_text().strip()
    try:
        ops: str | None = OPS.read_text().strip()
    except OSError:
        ops = None
    return state, ops


def wait_scx(
    state: str, ops: str | None = None, timeout_s: float = 30.0, poll_s: float = 0.001
) -> int:
    """Poll sysfs every ``poll_s`` s until sched_ext is ``state`` (running ``ops``, when
    given); returns ``time.monotonic_ns()`` then. RuntimeError on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        st, cur = scx()
        if st == state and (ops is None or cur == ops):
            return time.monotonic_ns()
        if time.monotonic() > deadline:
            raise RuntimeError(f"sched_ext still {st} ({cur}), wanted {state} ({ops})")
        time.sleep(poll_s)


def rss_kib(pid: int | str = "self") -> dict[str, int]:
    """``VmRSS`` and its parts of ``pid`` in KiB (``/proc/PID/status``, ``man 5 proc``) as
    ``rss_kib``, ``rss_anon_kib``, ``rss_file_kib``, ``rss_shmem_kib`` (0 when absent);
    libraries mapped from a tmpfs root (the ramroot VM) count as ``RssShmem``."""
    keys = {"VmRSS": "rss_kib", "RssAnon": "rss_anon_kib", "RssFile": "rss_file_kib",
            "RssShmem": "rss_shmem_kib"}  # fmt: skip
    got = dict.fromkeys(keys.values(), 0)
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in keys:
            got[keys[key]] = int(rest.split()[0])
    return got


def rss_mib(pid: int | str = "self") -> dict[str, float]:
    """:func:`rss_kib` in MiB as ``rss_mib``, ``anon_mib`` and ``file_mib`` (``RssFile`` +
    ``RssShmem``)."""
    k = rss_kib(pid)
    return {
        "rss_mib": k["rss_kib"] / 1024,
        "anon_mib": k["rss_anon_kib"] / 1024,
        "file_mib": (k["rss_file_kib"] + k["rss_shmem_kib"]) / 1024,
    }


def repo_relative(path: str | Path) -> str:
    """``path`` as a report should show it: relative to the checkout, or under
    ``../shared/corpus`` for a corpus object; else its file name (an absolute path is the
    machine's, not the result's)."""
    p = Path(path).resolve()
    for base, shown in ((REPO, ""), (CORPUS.resolve(), "../shared/corpus/")):
        try:
            return shown + str(p.relative_to(base))
        except ValueError:
            continue
    return p.name


def load_text() -> str:
    """The host's load average (1, 5, 15 min) as ``uptime`` gives it, for a report."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def host_prepare() -> SidKernel | None:
    """The host side's first steps: build the sample schedulers (``make schedulers``) and
    get the sched_ext kernel; ``None`` when the build failed."""
    from tools.sidkernel import ensure_kernel

    if subprocess.run(["make", "-s", "schedulers"], cwd=REPO, check=False).returncode != 0:
        return None
    return ensure_kernel()


def machine(result: Any, kernel: SidKernel, memory_mib: float = 2048) -> str:
    """How the VM ran, for a report: accelerator, vCPUs, memory, kernel, host cores, and
    the interpreter the VM's processes ran (:func:`interpreter`)."""
    rr = getattr(result, "ramroot", None) or {}
    return (
        f"qemu {result.accel} (single-threaded TCG, -cpu max, 2 vCPUs, "
        f"{rr.get('memory_mib', memory_mib):.0f} MiB), kernel {kernel.version}, "
        f"host {os.cpu_count()} cores; {interpreter()}"
    )


#: The interpreter the VM's processes run: the venv's (tools/vm.py's ``PY``), whatever
#: interpreter started the bench on the host.
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
_DESCRIBE = (
    "import json, os, platform, sys; "
    "print(json.dumps([platform.python_implementation(), platform.python_version(), "
    "os.path.realpath(getattr(sys, '_base_executable', sys.executable)), "
    "open('/proc/self/maps').read()]))"
)


def interpreter(python: Path = VENV_PYTHON) -> str:
    """The interpreter ``python`` runs (by default the venv's, which the VM runs), for a
    report, as :func:`describe_interpreter` words it from what a process of it says of
    itself; ``"interpreter unknown (...)"`` when it cannot be run. The daemon's figures
    depend on how that interpreter was built (docs/performance.md, "The interpreter")."""
    try:
        out = subprocess.run(
            [str(python), "-I", "-S", "-c", _DESCRIBE],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        implementation, version, executable, maps = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return f"interpreter unknown ({exc.__class__.__name__})"
    return describe_interpreter(implementation, version, executable, maps)


def describe_interpreter(implementation: str, version: str, executable: str, maps: str) -> str:
    """``"CPython 3.11.2 (/usr/bin/python3.11, interpreter in the executable)"``, or ``"...
    in libpython3.11.so.1.0"`` when a ``libpython`` is mapped in ``maps`` (the process's
    ``/proc/self/maps``, ``proc(5)``): the interpreter runs from a shared library. An
    ``executable`` (its real path) outside ``/usr`` is a checkout's or a user's own
    build, said to be ``built outside /usr``."""
    where = "interpreter in the executable"
    for line in maps.splitlines():
        name = line.rsplit("/", 1)[-1]
        if name.startswith("libpython"):
            where = f"interpreter in {name}"
            break
    source = executable if executable.startswith("/usr/") else "built outside /usr"
    return f"{implementation} {version} ({source}, {where})"


def argv_without_out(argv: list[str]) -> str:
    """The command line for the report's produced-by line, without ``--out DIR`` (a run's
    output directory is often a temporary one of the machine, not part of how it was made)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        elif not arg.startswith("--out="):
            kept.append(arg)
    return " ".join(kept)


def checkout_commit() -> str:
    """The checkout's commit for a report: its short hash, with ``-dirty`` when a tracked
    file differs from it; ``"unknown"`` without git or outside a checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def utc_now() -> str:
    """The report's date: ``YYYY-MM-DD HH:MM UTC``."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def redo_page(from_json: str, out: Path, page: str, render: Callable[[dict[str, Any]], str]) -> int:
    """``--from-json``: write ``out/page`` again from a run's saved JSON (``render`` gets the
    whole saved object, as :func:`save_run` wrote it) and print it; returns exit status 0.
    Lets a report's wording change without another VM run."""
    text = render(json.loads(Path(from_json).read_text()))
    out.mkdir(parents=True, exist_ok=True)
    (out / page).write_text(text)
    print(text)
    return 0


def vm_run_failed(
    result: Any, needed: str, logs: Sequence[str] = (), log_chars: int = 6000
) -> bool:
    """Whether the VM run ``result`` (:func:`tools.vm.run_in_vm`) failed: a non-zero exit or
    no ``needed`` file among its results. On failure prints the console's tail and the last
    ``log_chars`` characters of each of ``logs`` it brought back, to stderr."""
    if result.returncode == 0 and needed in result.files:
        return False
    print(f"VM run failed\n{result.tail(60)}", file=sys.stderr)
    for name in logs:
        if name in result.files:
            print(result.text(name)[-log_chars:], file=sys.stderr)
    return True


def save_run(out: Path, name: str, saved: dict[str, Any], text: str, page: str) -> None:
    """Write a run's data as ``out/name`` (JSON, what :func:`redo_page` reads back) and its
    report as ``out/page``, and print the report."""
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(saved, indent=1))
    (out / page).write_text(text)
    print(text)
