"""Host-side parts of tools/vm_systemd.py: the files it puts in the guest root (the boot
itself is tests/vm/test_systemd_unit.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from schedswitchd import __version__
from tools import vm, vm_systemd


def _fake_venv(tmp_path: Path, python_target: str) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /x/bin\nversion = 3.11.7\n")
    (venv / "bin" / "python").symlink_to(python_target)
    return venv


def test_launchers_run_the_entry_points_from_the_venv(tmp_path: Path) -> None:
    scripts = vm_systemd.launchers()
    assert set(scripts) == set(vm_systemd.PROGRAMS)
    for name, text in scripts.items():
        interpreter = text.splitlines()[0].removeprefix("#!")
        assert not any(Path(interpreter).is_relative_to(h) for h in vm_systemd._HIDDEN)
        path = tmp_path / name
        path.write_text(text)
        if name == "schedswitch-run":
            continue  # no --version; its import is the same as schedswitchctl's
        out = subprocess.run(
            [interpreter, str(path), "--version"], capture_output=True, text=True, check=True
        )
        assert __version__ in out.stdout + out.stderr


def test_launcher_interpreter_avoids_paths_the_unit_hides(tmp_path: Path) -> None:
    hidden = _fake_venv(tmp_path, "/root/pythons/3.11/bin/python3")  # under ProtectHome=
    assert vm_systemd.launchers(hidden)["schedswitchd"].startswith("#!/usr/bin/python3.11\n")
    shutil.rmtree(hidden)
    visible = _fake_venv(tmp_path, "/opt/py/bin/python3.11")
    assert vm_systemd.launchers(visible)["schedswitchd"].startswith("#!/opt/py/bin/python3.11\n")


def test_checkout_dropin_only_for_private_tmp_paths() -> None:
    assert vm_systemd.checkout_dropin(Path("/srv/checkout/x")) == {}
    dropin = vm_systemd.checkout_dropin(Path("/tmp/ci/clone"))
    assert dropin == {
        "/etc/systemd/system/schedswitchd.service.d/checkout.conf": (
            "[Service]\nBindReadOnlyPaths=/tmp/ci/clone\n"
        )
    }


def test_install_files_carry_the_shipped_units_unchanged() -> None:
    files = vm_systemd.install_files(
        vm_systemd.shipped_units(), {"/etc/schedswitchd/schedswitchd.toml": "x"}
    )
    root = ".vm/root"
    for unit in ("schedswitchd.service", "schedswitchd.socket"):
        shipped = (vm.REPO / "systemd" / unit).read_text()
        assert files[f"{root}/etc/systemd/system/{unit}"] == shipped
    assert files[f"{root}/etc/schedswitchd/schedswitchd.toml"] == "x"
    assert f"{root}/etc/systemd/system/{vm_systemd.TARGET}" in files
    assert "D /tmp" not in str(files[f"{root}/etc/tmpfiles.d/tmp.conf"])
    for name in vm_systemd.PROGRAMS:
        assert f"{root}/usr/bin/{name}" in files
        assert f'"$1/usr/bin/{name}"' in str(files[".vm/install.sh"])
    with pytest.raises(ValueError, match="not absolute"):
        vm_systemd.install_files({}, {"etc/x": ""})


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    files = vm_systemd.install_files(vm_systemd.shipped_units())
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    for rel, text in files.items():
        if rel.startswith(".vm/root/etc/systemd/system/"):
            (unit_dir / Path(rel).name).write_text(str(text))
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit_dir / vm_systemd.TARGET)],
        capture_output=True,
        text=True,
        env={"SYSTEMD_UNIT_PATH": f"{unit_dir}:", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "schedswitchd" not in proc.stderr, proc.stderr
