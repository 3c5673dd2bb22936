"""Kernel BTF object ids by name, on the host kernel (which has vmlinux BTF and no modules)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.errors import RegistryError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.ids import KernelBtfIds
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.fd import BtfFd
from schedswitchd.kernel.uevents import make_uevent

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[3]


def _user_btf() -> BtfFd:
    b = BtfBuilder()
    b.add_int("int", 4, signed=True)
    return syscall.btf_load(b.build())


def test_walk_finds_vmlinux_and_skips_user_btf() -> None:
    with _user_btf() as user:
        user_id = syscall.btf_info(user).id
        ids = KernelBtfIds()
        names = ids.names()
        assert "vmlinux" in names and user_id not in names.values()
        assert ids.stats().full_scans == 1 and not ids.stats().walk_denied
        with ids.open("vmlinux") as fd:
            info = syscall.btf_info(fd)
            assert (info.name, info.kernel_btf, info.id) == ("vmlinux", True, names["vmlinux"])


def test_stale_id_is_detected_and_rescanned() -> None:
    ids = KernelBtfIds()
    real = ids.lookup("vmlinux")
    with _user_btf() as user:
        # Simulate a missed event: the map points at an id that now names another object.
        ids._ids["vmlinux"] = syscall.btf_info(user).id
        with ids.open("vmlinux") as fd:
            assert syscall.btf_info(fd).id == real
    s = ids.stats()
    assert (s.mismatches, s.full_scans) == (1, 2)
    # A freed id (ENOENT) is handled the same way.
    with _user_btf() as user:
        gone = syscall.btf_info(user).id
    ids._ids["vmlinux"] = gone
    with ids.open("vmlinux") as fd:
        assert syscall.btf_info(fd).name == "vmlinux"


def test_module_events_update_the_map() -> None:
    ids = KernelBtfIds()
    ids.names()
    ids.forget("vmlinux")  # as a remove event would
    assert "vmlinux" not in ids.names()
    ids.note_added("vmlinux")  # as an add event would: walk ids above the highest seen
    assert ids.lookup("vmlinux") is not None
    s = ids.stats()
    assert s.incremental_scans == 1 and s.full_scans == 2  # not above max: full rescan


def test_not_loaded_module_is_a_clear_error() -> None:
    with pytest.raises(RegistryError, match="no kernel BTF object named 'nf_tables'"):
        KernelBtfIds().open("nf_tables")


def test_registry_on_sysfs_root() -> None:
    reg = KernelBtfRegistry()
    assert reg.ids is not None
    vid = reg.btf_object_id("vmlinux")
    with reg.open_btf_object("vmlinux") as fd:
        assert syscall.btf_info(fd).id == vid
    assert reg.vmlinux.name == "vmlinux" and reg.vmlinux.end_id > 1000
    t = reg.targets(["nf_tables"])  # the host has no modules: reported, not an error
    assert t.report.missing == ["nf_tables"] and t.report.modules_read == 0
    reg.handle_uevent(make_uevent("remove", "/module/nf_tables", "module"))
    assert reg.stats().module_uevents == 1
    assert reg.stats().as_counters()["btf_id_full_scans"] >= 1


def test_eperm_while_walking_is_not_fatal() -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs setpriv (util-linux)")
    code = (
        "from schedswitchd.kernel.btf.ids import KernelBtfIds\n"
        "from schedswitchd.errors import RegistryError\n"
        "ids = KernelBtfIds()\n"
        "assert ids.names() == {}, ids.names()\n"
        "assert ids.stats().walk_denied and ids.stats().eperm >= 1\n"
        "try:\n"
        "    ids.open('vmlinux')\n"
        "except RegistryError as e:\n"
        "    assert 'EPERM' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('open succeeded without privileges')\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
