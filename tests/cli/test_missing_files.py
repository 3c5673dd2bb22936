"""A file that is missing (or is a directory) is reported by every command with its path
said once and what was expected there: the configuration, a scheduler's object, a profile,
a BTF file, the command of ``schedswitch-run``. Before, the object's error repeated the
path inside the OS error's own text (``cannot read BPF object '/x.o': [Errno 2] No such
file or directory: '/x.o'``), and ``--check-config`` said it a third time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.json_dump import main as btf_main
from schedswitchd.cli import ctl
from schedswitchd.cli import run as run_cli
from schedswitchd.daemon import service

NO_SOCKET = "/nonexistent/schedswitchd-missing-files.sock"


def _said_once(text: str, path: Path | str, expected: str) -> None:
    assert text.count(str(path)) == 1, text
    assert f"(expected {expected}" in text, text


@pytest.mark.parametrize("check", [False, True])
def test_missing_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], check: bool
) -> None:
    path = tmp_path / "none.toml"
    argv = ["--config", str(path)] + (["--check-config"] if check else [])
    assert service.main(argv) == os.EX_CONFIG  # documented: the configuration does not load
    err = capsys.readouterr().err
    assert err.startswith(f"schedswitchd: {path}: cannot read: No such file or directory")
    _said_once(err, path, "the daemon's TOML configuration file")
    assert err.endswith("name a configuration file with --config PATH or $SCHEDSWITCHD_CONFIG\n")


def test_a_configuration_that_does_not_parse_gets_no_hint_about_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("default = \n")
    assert service.main(["--config", str(path), "--check-config"]) == os.EX_CONFIG
    err = capsys.readouterr().err
    assert err.startswith(f"schedswitchd: {path}: (syntax)"), err
    assert "--config PATH" not in err


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_check_config_with_a_missing_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    obj = tmp_path / "sched.bpf.o"
    if kind == "directory":
        obj.mkdir()
    conf = tmp_path / "s.toml"
    conf.write_text('default = "kernel"\n[schedulers.one]\nobject = "sched.bpf.o"\n')
    assert service.main(["--config", str(conf), "--check-config"]) == 1
    out = capsys.readouterr().out
    reason = "No such file or directory" if kind == "missing" else "Is a directory"
    assert f"  one: FAILED [object] {obj}\n    problem: cannot read: {reason}" in out
    _said_once(out, obj, "a .bpf.o BPF ELF object")


def test_check_config_with_a_missing_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "s.toml"
    conf.write_text(
        'default = "kernel"\n[schedulers.one]\nobject = "x.bpf.o"\nprofile = "p/none.toml"\n'
    )
    assert service.main(["--config", str(conf), "--check-config"]) == os.EX_CONFIG
    err = capsys.readouterr().err
    _said_once(err, tmp_path / "p" / "none.toml", "a scheduler profile's .toml file")
    assert "does not exist" in err


@pytest.mark.parametrize("command", ["inspect", "load"])
def test_object_command_with_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    obj = tmp_path / "none.bpf.o"
    assert ctl.main(["object", command, str(obj)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"schedswitchctl: cannot read BPF object '{obj}': No such file")
    assert err.count("\n") == 1
    _said_once(err, obj, "a .bpf.o BPF ELF object")


def test_profile_show_with_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "none.toml"
    assert ctl.main(["profile", "show", str(path)]) == 1
    _said_once(capsys.readouterr().err, path, "a scheduler profile's .toml file")


def test_btf_dump_of_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "none.btf"
    assert btf_main([str(path)]) == 1
    _said_once(capsys.readouterr().err, path, "raw BTF, or an ELF file with a .BTF section")


def test_run_with_a_missing_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    command = tmp_path / "no-such-game"
    assert run_cli.main(["--socket", NO_SOCKET, "gaming", "--", str(command)]) == 127
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "cannot run" in x)
    _said_once(line, command, "an executable")
