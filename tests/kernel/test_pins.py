"""Pinning a loaded struct_ops object: the congestion control stays registered after every
fd of this process is closed, re-opening the pins works, and unpinning unregisters it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.errors import LoadError
from schedswitchd.kernel import bpf_uapi, syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import load_object
from schedswitchd.kernel.pins import is_bpffs, open_pinned, pin_object, unpin_directory
from tests.build_outputs import missing_build_output
from tests.kernel.unique_ops import ca_name, unique_object

pytestmark = pytest.mark.root

OBJ = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf" / "struct_ops.bpf.o"
CA_LIST = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
#: The congestion controls registered, named for this process (tests/kernel/unique_ops.py).
PLAIN, LINK = ca_name("ssd_plain"), ca_name("ssd_link")


def _cas() -> list[str]:
    return CA_LIST.read_text().split()


def test_pinned_struct_ops_outlive_fds_and_unpin(bpffs: Path, tmp_path: Path) -> None:
    if not OBJ.is_file():
        missing_build_output(OBJ, "test-objects")
    reg = KernelBtfRegistry()
    spec = open_object(unique_object(OBJ))
    targets = reg.targets(spec.kmod_btfs)  # parses (and maps) vmlinux BTF once
    fds_before = len(os.listdir("/proc/self/fd"))
    pin_dir = bpffs / "ssd"
    with load_object(spec, targets) as obj:
        obj.attach_struct_ops()
        made = pin_object(obj, pin_dir)
        link_id = syscall.link_info(obj.links["ssd_link"]).id
    assert {"link_ssd_link", "prog_ssd_ssthresh", "map_ssd_plain"} <= set(made)
    assert len(os.listdir("/proc/self/fd")) == fds_before
    # every fd is closed: the pins keep both forms registered
    assert LINK in _cas() and PLAIN in _cas()
    with open_pinned(pin_dir) as pinned:
        assert syscall.link_info(pinned.links["ssd_link"]).id == link_id
        assert set(pinned.maps) == {"ssd_plain", "ssd_link"}
    removed = unpin_directory(pin_dir)
    assert "link_ssd_link" in removed and not pin_dir.exists()
    assert LINK not in _cas() and PLAIN not in _cas()


def test_pin_outside_bpffs_is_refused(tmp_path: Path) -> None:
    assert not is_bpffs(tmp_path)
    with pytest.raises(LoadError, match="not a directory"):
        unpin_directory(tmp_path / "nope")


def test_unpin_refuses_a_directory_not_on_bpffs(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    names = ["notes.txt", "map_x", "link_y", "prog_z"]
    for n in names:
        (victim / n).write_text("important")
    with pytest.raises(LoadError, match="not on a bpf filesystem"):
        unpin_directory(victim)
    assert sorted(os.listdir(victim)) == sorted(names)
    assert (victim / "notes.txt").read_text() == "important"


def test_unpin_refuses_the_bpffs_root(bpffs: Path) -> None:
    with pytest.raises(LoadError, match="root of a bpf filesystem"):
        unpin_directory(bpffs.parent)
    assert bpffs.is_dir()


def _pin_array(path: Path) -> None:
    with syscall.map_create(bpf_uapi.MapType.ARRAY, 4, 4, 1, name="pintest") as fd:
        syscall.obj_pin(fd, path)


def test_unpin_removes_only_its_pins_and_never_recurses(bpffs: Path) -> None:
    d = bpffs / "obj"
    d.mkdir()
    _pin_array(d / "map_mine")
    _pin_array(d / "foreign")  # a pin pin_object never names
    (d / "map_sub").mkdir()  # a directory with a pin-like name
    _pin_array(d / "map_sub" / "map_inner")
    os.symlink("/etc/hostname", d / "map_sym")
    assert unpin_directory(d) == ["map_mine"]
    assert sorted(os.listdir(d)) == ["foreign", "map_sub", "map_sym"]
    assert os.listdir(d / "map_sub") == ["map_inner"]
    for n in ("foreign", "map_sym"):
        os.unlink(d / n)
    os.unlink(d / "map_sub" / "map_inner")
    (d / "map_sub").rmdir()
    _pin_array(d / "map_again")
    assert unpin_directory(d) == ["map_again"] and not d.exists()  # empty: removed
