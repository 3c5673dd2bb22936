"""The Makefile's choice of the venv's interpreter: the distribution's ``python3`` (what the
service runs), not whichever ``python3`` comes first in ``PATH`` (docs/performance.md, "The
interpreter")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path("/usr/bin/python3")


def _venv_command(tmp_path: Path, path: str) -> str:
    """The recipe line that makes a venv at ``tmp_path/v``, as ``make -n`` prints it with
    ``PATH`` set to ``path`` (nothing is run; the variables of an enclosing ``make`` are
    left out so that they cannot choose for it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "MAKEFLAGS", "MAKELEVEL")}
    env["PATH"] = path
    venv = tmp_path / "v"
    out = subprocess.run(
        ["make", "-n", "-B", f"{venv}/.stamp", f"VENV={venv}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return next(line for line in out.splitlines() if f" -m venv {venv}" in line)


def test_the_venv_is_made_from_the_distributions_python3_before_one_first_in_path(
    tmp_path: Path,
) -> None:
    if shutil.which("make") is None:
        pytest.skip("no make")
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"no {SYSTEM_PYTHON}: the Makefile falls back to python3 in PATH")
    recent = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys; sys.exit(sys.version_info < (3, 11))"], check=False
    )
    # A version manager's python3, first in PATH: here, the interpreter running the tests.
    shim = tmp_path / "bin" / "python3"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    line = _venv_command(tmp_path, f"{shim.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    chosen = SYSTEM_PYTHON if recent.returncode == 0 else shim
    assert line.endswith(f"|| {chosen} -m venv {tmp_path / 'v'}"), line
