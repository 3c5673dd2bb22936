"""Every command of the three entry points ends quietly when its output pipe is closed
(``schedswitchd --print-schema | head``): no traceback, exit status 141 (128 + SIGPIPE),
as a program that ``SIGPIPE`` killed; argparse's own ``--help``/``--version`` output
ignores write errors and exits 0. Each case runs the real console script with stdout (or
stderr) on a real pipe whose reader is closed before the command writes. Every daemon
command of ``schedswitchctl`` runs for real (``--json`` against an unreachable daemon
writes its error document to stdout); of the argparse help texts a few stand for all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from schedswitchd.entry import EXIT_BROKEN_PIPE
from tests.build_outputs import missing_build_output

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONFIG = REPO / "config" / "schedswitchd.toml"
OBJ = REPO / "build" / "tests" / "bpf" / "struct_ops.bpf.o"
NO_SOCKET = "/nonexistent/schedswitchd-test.sock"

_CTL_COMMANDS = (
    "status", "list", "history", "switch", "stop", "reload", "hint", "prepare", "release",
)  # fmt: skip
_CTL_ARGS = {"switch": ["fifo"], "hint": ["gaming"], "prepare": ["gaming"], "release": ["L1"]}

CASES: list[tuple[str, list[str]]] = [
    ("schedswitchd", ["--help"]),
    ("schedswitchd", ["--version"]),
    ("schedswitchd", ["--print-schema"]),
    ("schedswitchd", ["--check-config", "--config", str(CONFIG)]),
    ("schedswitch-run", ["--help"]),
    ("schedswitch-run", ["--version"]),
    ("schedswitchctl", ["--help"]),
    ("schedswitchctl", []),  # no command: the help on stdout
    ("schedswitchctl", ["object", "load", "--help"]),
    ("schedswitchctl", ["object", "inspect", str(OBJ)]),
    ("schedswitchctl", ["object", "inspect", "--json", str(OBJ)]),
    ("schedswitchctl", ["profile", "list"]),
    # unreachable daemon with --json: the error document goes to stdout
    *(
        ("schedswitchctl", [c, *_CTL_ARGS.get(c, []), "--json", "--socket", NO_SOCKET])
        for c in _CTL_COMMANDS
    ),
]


def _run_into_closed_pipe(
    argv: list[str], *, stream: str = "stdout"
) -> subprocess.CompletedProcess[str]:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written, as after `| head -1`
    try:
        return subprocess.run(
            argv,
            stdout=w if stream == "stdout" else subprocess.PIPE,
            stderr=w if stream == "stderr" else subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "SCHEDSWITCHD_SOCKET": NO_SOCKET},
        )
    finally:
        os.close(w)


@pytest.mark.parametrize(("prog", "args"), CASES, ids=[" ".join([p, *a])[:70] for p, a in CASES])
def test_closed_stdout_is_quiet(prog: str, args: list[str]) -> None:
    exe = BIN / prog
    if not exe.exists():
        pytest.fail(f"{exe} is missing: the package is not installed in this venv (make deps)")
    if str(OBJ) in args and not OBJ.is_file():
        missing_build_output(OBJ)
    proc = _run_into_closed_pipe([str(exe), *args])
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    if "--help" in args or "--version" in args:
        expected: tuple[int, ...] = (0, EXIT_BROKEN_PIPE)  # argparse ignores write errors
    elif not args:
        expected = (2, EXIT_BROKEN_PIPE)  # the help through argparse, then bad usage
    else:
        expected = (EXIT_BROKEN_PIPE,)
    assert proc.returncode in expected, (proc.returncode, proc.stderr)


@pytest.mark.parametrize(
    "args", [["schedswitchd.bpf.btf", "/sys/kernel/btf/vmlinux"]], ids=lambda a: " ".join(a)
)
def test_module_entry_points_into_a_closed_pipe_are_quiet(args: list[str]) -> None:
    """The ``python -m`` tools the docs show (``... | head``) end as the commands do."""
    if not Path(args[-1]).exists() and args[-1].startswith("/"):
        pytest.skip(f"{args[-1]} is absent: this kernel has no BTF")
    proc = _run_into_closed_pipe([sys.executable, "-m", *args])
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == EXIT_BROKEN_PIPE, (proc.returncode, proc.stderr)


def test_print_schema_into_head_is_quiet() -> None:
    """The reported case, as a shell runs it: ``--print-schema | head -n 1``."""
    exe = BIN / "schedswitchd"
    proc = subprocess.run(
        ["sh", "-c", f"'{exe}' --print-schema | head -n 1; echo status=${{PIPESTATUS:-}}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.stdout.startswith("{"), proc.stdout
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_schedswitch_run_survives_a_closed_stderr() -> None:
    """Its warnings go to stderr; a gone reader there must not stop the game it launches."""
    exe = BIN / "schedswitch-run"
    proc = _run_into_closed_pipe(
        [str(exe), "--socket", NO_SOCKET, "gaming", "--", "sh", "-c", "exit 5"], stream="stderr"
    )
    assert proc.returncode == 5, proc.stdout
