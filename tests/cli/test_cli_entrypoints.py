"""The console scripts parse their arguments and report their version."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

import pytest

from schedswitchd import __version__
from schedswitchd.cli import ctl


def test_ctl_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        ctl.main(["--version"])
    assert exc.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_ctl_without_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main([]) == 2
    assert "usage: schedswitchctl" in capsys.readouterr().out


def _all_helps() -> list[tuple[str, str]]:
    """(command line, --help text) of schedswitchctl, every sub-command, and the two daemons."""
    from schedswitchd.cli import run
    from schedswitchd.daemon import service

    out: list[tuple[str, str]] = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        out.append((name, parser.format_help()))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}")

    walk(ctl.build_parser(), "schedswitchctl")
    for prog, entry in (("schedswitchd", service.main), ("schedswitch-run", run.main)):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
            entry(["--help"])
        out.append((prog, buf.getvalue()))
    return out


def test_help_texts_carry_no_docstring_markup() -> None:
    helps = _all_helps()
    assert len(helps) >= 12  # ctl + its sub-commands + the two daemons
    for name, text in helps:
        assert text.startswith("usage:"), name
        for markup in ("``", ":class:", ":func:", ":mod:", ":meth:"):
            assert markup not in text, f"{name} --help shows {markup!r}:\n{text}"


def test_ctl_family_table_matches_what_the_families_register() -> None:
    """ctl imports only the chosen command's family, found through its static table: each
    family must register exactly the commands the table gives it."""
    import importlib

    for module, commands in ctl._FAMILIES.items():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(sub)
        assert tuple(sub.choices) == commands, module
    # "status" is the socket path here
    assert ctl._family_of(["--socket", "status", "object"]) == "schedswitchd.cli.object_cmd"
    assert ctl._family_of(["--socket", "/s", "status"]) == "schedswitchd.cli.daemon_cmds"
    assert ctl._family_of(["object", "inspect", "x.o"]) == "schedswitchd.cli.object_cmd"
    assert ctl._family_of(["--help", "status"]) is None
    assert ctl._family_of(["nosuch"]) is None


def test_ctl_status_does_not_import_the_loader_or_the_profile_engine(tmp_path: Path) -> None:
    """``schedswitchctl status`` (target: <= 120 ms start to finish) leaves the object and
    profile families unimported: checked in a fresh interpreter, against no daemon."""
    import subprocess
    import sys

    heavy = (
        "schedswitchd.kernel.loader",
        "schedswitchd.cli.object_cmd",
        "schedswitchd.profile.apply",
        "schedswitchd.cli.profile_cmd",
    )
    code = (
        "import sys\n"
        "from schedswitchd.cli import ctl\n"
        "ctl.main(['--socket', sys.argv[1], 'status'])\n"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules) or 'none')\n"
    )
    sock = str(tmp_path / "absent.sock")  # no daemon: status fails, after its imports
    out = subprocess.run(
        [sys.executable, "-c", code, sock], capture_output=True, text=True, check=False
    )
    assert out.stdout.strip().splitlines()[-1] == "none", out.stdout + out.stderr


def test_every_command_says_its_exit_statuses() -> None:
    """A packager's or a launcher's script needs them: each of the three says them in
    ``--help`` (and so in its man page, generated from the same parser)."""
    tops = {name: text for name, text in _all_helps() if " " not in name}
    assert set(tops) == {"schedswitchctl", "schedswitchd", "schedswitch-run"}
    for name, text in tops.items():
        assert "Exit status:" in text, f"{name} --help says no exit status:\n{text}"
    assert "$SCHEDSWITCHD_CONFIG" in tops["schedswitchd"]  # --config's real default


def test_a_command_familys_summary_names_its_subcommands() -> None:
    """``schedswitchctl --help`` sums up ``object`` and ``profile`` by their sub-commands:
    each sub-command is named (the profile line once promised a ``check`` there is not,
    and left ``topology`` out), and each family's own --help says what it is."""
    parser = ctl.build_parser()
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {c.dest: c.help or "" for c in top._choices_actions}
    for family in ("object", "profile"):
        group = top.choices[family]
        nested = next(a for a in group._actions if isinstance(a, argparse._SubParsersAction))
        words = set(summaries[family].replace(",", " ").split())
        assert set(nested.choices) <= words, (family, summaries[family])
        assert "check" not in words or "check" in nested.choices, summaries[family]
        assert group.description, f"schedswitchctl {family} --help has no description"


def test_a_malformed_set_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """``object load --set bad`` exits 2 (bad usage, per the exit table), before the object
    is even looked for; it exited 1, as a failed load does."""
    with pytest.raises(SystemExit) as info:
        ctl.main(["object", "load", "/nonexistent.bpf.o", "--set", "bad"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--set: wants VAR=VALUE or MAP.MEMBER=VALUE, got 'bad'" in err, err
    assert "nonexistent" not in err.splitlines()[-1]


def test_profile_list_keeps_its_columns(capsys: pytest.CaptureFixture[str]) -> None:
    """Every shipped profile's path starts in the same column (lavd's five modes pushed its
    path out of line when the modes column had a fixed width)."""
    assert ctl.main(["profile", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 9 and any(line.startswith("lavd ") for line in lines)
    starts = {line.index("/") for line in lines}
    assert len(starts) == 1, lines
