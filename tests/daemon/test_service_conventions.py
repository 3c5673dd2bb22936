"""Service conventions: exit status 78 (EX_CONFIG, ``sysexits.h``) from the real
``schedswitchd`` console script when its configuration (or a drop-in) does not load, at
start and with ``--check-config``; the unit does not restart on it
(``RestartPreventExitStatus=78``); both units hold only where sched_ext is
(``ConditionPathIsDirectory=/sys/kernel/sched_ext``, evaluated by systemd itself). Under
real systemd in the VM: tests/vm/test_systemd_unit.py (``bad_config``)."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from schedswitchd.daemon.config_dropins import DROPIN_DIR

REPO = Path(__file__).resolve().parents[2]
DAEMON = Path(sys.executable).parent / "schedswitchd"
UNITS = ("schedswitchd.service", "schedswitchd.socket")
SCHED_EXT = "/sys/kernel/sched_ext"


def _unit(name: str) -> configparser.RawConfigParser:
    # strict=False: a unit file may repeat a key (After=), which systemd accumulates
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(REPO / "systemd" / name)
    return parser


@pytest.mark.parametrize("check", [False, True], ids=["start", "check-config"])
def test_a_bad_drop_in_exits_78_from_the_console_script(tmp_path: Path, check: bool) -> None:
    config = tmp_path / "schedswitchd.toml"
    config.write_text('default = "kernel"\n')
    (tmp_path / DROPIN_DIR).mkdir()
    dropin = tmp_path / DROPIN_DIR / "10-typo.toml"
    dropin.write_text("[limits]\nmax_conections = 1\n")
    argv = [str(DAEMON), "--config", str(config), "--socket", str(tmp_path / "s.sock")]
    proc = subprocess.run(
        argv + (["--check-config"] if check else []),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == os.EX_CONFIG == 78, proc.stderr
    assert proc.stderr == f"schedswitchd: {dropin}: limits.max_conections: unknown key\n"
    assert not (tmp_path / "s.sock").exists()  # it stopped before binding anything


def test_a_missing_configuration_is_ex_config_too(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(DAEMON), "--check-config", "--config", str(tmp_path / "none.toml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == os.EX_CONFIG, proc.stderr


def test_the_unit_does_not_restart_on_a_bad_configuration() -> None:
    service = _unit("schedswitchd.service")["Service"]
    assert service["Restart"] == "on-failure"  # what RestartPreventExitStatus= overrides
    assert service["RestartPreventExitStatus"].split() == [str(os.EX_CONFIG)]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
@pytest.mark.parametrize("unit", UNITS)
def test_units_hold_only_where_sched_ext_is(unit: str) -> None:
    """Each unit's conditions, evaluated by systemd on this machine: they hold exactly when
    the kernel has sched_ext (a host without it sees them fail; the VM sees them hold)."""
    conditions = [
        f"{key}={value}"
        for key, value in _unit(unit)["Unit"].items()
        if key.startswith("Condition")
    ]
    assert conditions == [f"ConditionPathIsDirectory={SCHED_EXT}"]
    proc = subprocess.run(
        ["systemd-analyze", "condition", *conditions],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode == 0) == os.path.isdir(SCHED_EXT), proc.stderr
