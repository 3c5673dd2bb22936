"""The console scripts parse their arguments and report their version."""

from __future__ import annotations

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
