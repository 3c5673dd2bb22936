"""``schedswitchctl`` error handling: OS errors are one line, a closed pipe is quiet, and
``--socket`` works before the command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from schedswitchd.cli import ctl
from tests.build_outputs import missing_build_output

OBJ = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf" / "struct_ops.bpf.o"


def test_socket_is_a_global_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sock = tmp_path / "nosuch.sock"
    assert ctl.main(["--socket", str(sock), "status"]) == 3  # unreachable
    err = capsys.readouterr().err
    assert str(sock) in err and err.count("\n") == 1


def test_socket_after_the_command_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "a.sock", tmp_path / "b.sock"
    assert ctl.main(["--socket", str(first), "status", "--socket", str(second)]) == 3
    err = capsys.readouterr().err
    assert str(second) in err and str(first) not in err


def test_os_error_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(path: str) -> None:
        raise PermissionError(13, "Permission denied", "/sys/fs/bpf/maps.debug")

    monkeypatch.setattr("schedswitchd.cli.object_cmd.open_object_noted", refuse)
    assert ctl.main(["object", "inspect", "x.bpf.o"]) == 1
    err = capsys.readouterr().err
    assert err == "schedswitchctl: Permission denied: /sys/fs/bpf/maps.debug\n"


def test_closed_pipe_is_quiet() -> None:
    if not OBJ.is_file():
        missing_build_output(OBJ, "test-objects")
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written, as after `| head -1`
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "schedswitchd.cli.ctl", "object", "inspect", str(OBJ)],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(w)
    assert proc.stderr == ""
    assert proc.returncode == 141  # 128 + SIGPIPE, as `head` users expect
