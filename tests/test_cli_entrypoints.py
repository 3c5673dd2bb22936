"""The console scripts parse their arguments and report their version."""

from __future__ import annotations

import argparse
import contextlib
import io

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
