"""Reading /sys/kernel/sched_ext: file formats from kernel/sched/ext.c, written to a directory.

The host kernel has no sched_ext, so the real directory is only checked for the clear
"unavailable" error; the VM tests exercise a live scheduler.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedswitchd.errors import SchedExtError
from schedswitchd.kernel.sched_ext import sysfs
from schedswitchd.kernel.sched_ext.sysfs import SchedExtUnavailable, ScxState


def _sysfs(tmp_path: Path, state: str = "disabled", ops: str | None = None) -> Path:
    root = tmp_path / "sched_ext"
    root.mkdir()
    (root / "state").write_text(f"{state}\n")
    (root / "switch_all").write_text("0\n")
    (root / "nr_rejected").write_text("0\n")
    (root / "hotplug_seq").write_text("3\n")
    (root / "enable_seq").write_text("7\n")
    if ops is not None:
        _attach(root, ops)
    return root


def _attach(root: Path, ops: str) -> None:
    (root / "root").mkdir(exist_ok=True)
    (root / "root" / "ops").write_text(f"{ops}\n")
    (root / "root" / "events").write_text(
        "SCX_EV_SELECT_CPU_FALLBACK 12\nSCX_EV_DISPATCH_KEEP_LAST 0\n"
    )
    (root / "state").write_text("enabled\n")


def test_host_without_sched_ext_is_a_clear_error() -> None:
    if sysfs.available():
        pytest.skip("this kernel has sched_ext")
    with pytest.raises(SchedExtUnavailable, match="CONFIG_SCHED_CLASS_EXT"):
        sysfs.read_status()


def test_status_disabled(tmp_path: Path) -> None:
    st = sysfs.read_status(_sysfs(tmp_path))
    assert st.state is ScxState.DISABLED
    assert st.ops is None and st.events == {}
    assert (st.switch_all, st.nr_rejected, st.hotplug_seq, st.enable_seq) == (False, 0, 3, 7)


def test_status_enabled_with_ops_and_events(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, ops="simple")
    (root / "switch_all").write_text("1\n")
    st = sysfs.read_status(root)
    assert st.state is ScxState.ENABLED and st.ops == "simple" and st.switch_all
    assert st.events["SCX_EV_SELECT_CPU_FALLBACK"] == 12
    assert sysfs.read_ops(root) == "simple"


def test_older_kernel_without_enable_seq(tmp_path: Path) -> None:
    root = _sysfs(tmp_path)
    (root / "enable_seq").unlink()
    assert sysfs.read_status(root).enable_seq is None
    assert sysfs.read_enable_seq(root) is None


def test_single_file_readers(tmp_path: Path) -> None:
    root = _sysfs(tmp_path)
    assert (sysfs.read_enable_seq(root), sysfs.read_hotplug_seq(root)) == (7, 3)
    (root / "hotplug_seq").write_text("soon\n")
    with pytest.raises(SchedExtError, match="not an integer"):
        sysfs.read_hotplug_seq(root)
    (root / "hotplug_seq").unlink()
    with pytest.raises(SchedExtError, match="hotplug_seq is missing"):
        sysfs.read_hotplug_seq(root)
    with pytest.raises(SchedExtUnavailable):
        sysfs.read_hotplug_seq(tmp_path / "absent")


@pytest.mark.parametrize(
    ("name", "text"),
    [("state", "sleepy\n"), ("nr_rejected", "many\n"), ("root/events", "X\n")],
)
def test_malformed_files(tmp_path: Path, name: str, text: str) -> None:
    root = _sysfs(tmp_path, ops="simple")
    (root / name).write_text(text)
    with pytest.raises(SchedExtError):
        sysfs.read_status(root)


def test_missing_required_file(tmp_path: Path) -> None:
    root = _sysfs(tmp_path)
    (root / "hotplug_seq").unlink()
    with pytest.raises(SchedExtError, match="hotplug_seq"):
        sysfs.read_status(root)


# --- StateFiles: the switch path's reads through held descriptors ---------------------------


def _rewrite(path: Path, text: str) -> None:
    """Rewrite ``path`` in place (same inode), as a sysfs attribute changes its value."""
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(text.encode())


def test_state_files_hold_descriptors_and_read_each_change(tmp_path: Path) -> None:
    root = _sysfs(tmp_path)
    files = sysfs.StateFiles(root, keep_open=True)
    try:
        assert (files.state(), files.ops(), files.enable_seq(), files.hotplug_seq()) == (
            ScxState.DISABLED,
            None,
            7,
            3,
        )
        _rewrite(root / "state", "enabled\n")
        _rewrite(root / "enable_seq", "8\n")
        _rewrite(root / "hotplug_seq", "12\n")
        _attach(root, "ss_fifo")
        assert (files.state(), files.ops(), files.enable_seq(), files.hotplug_seq()) == (
            ScxState.ENABLED,
            "ss_fifo",
            8,
            12,
        )
        # the same answers as the module's functions, which open the files each time
        assert files.state() == sysfs.read_state(root)
        assert files.ops() == sysfs.read_ops(root)
        # the files stay open: a file replaced (new inode) is not seen, by design (sysfs
        # attributes are never replaced); that is why this is only the default under /sys
        (root / "state").unlink()
        (root / "state").write_text("disabling\n")
        assert files.state() is ScxState.ENABLED
        _rewrite(root / "state", "bogus\n")  # the new file: not the one held
        assert files.state() is ScxState.ENABLED
    finally:
        files.close()
    # closed: the next read opens again (and sees the new file)
    with pytest.raises(SchedExtError, match="unknown state"):
        files.state()
    files.close()


def test_state_files_absent_files(tmp_path: Path) -> None:
    root = _sysfs(tmp_path)
    (root / "enable_seq").unlink()  # kernels before 6.12
    files = sysfs.StateFiles(root, keep_open=True)
    try:
        assert files.enable_seq() is None
        (root / "hotplug_seq").unlink()
        with pytest.raises(SchedExtError, match="hotplug_seq is missing"):
            files.hotplug_seq()
    finally:
        files.close()
    gone = sysfs.StateFiles(tmp_path / "nowhere", keep_open=True)
    with pytest.raises(SchedExtUnavailable):
        gone.state()
    with pytest.raises(SchedExtUnavailable):
        gone.ops()
    with pytest.raises(SchedExtUnavailable):
        gone.hotplug_seq()


def test_state_files_keep_descriptors_only_under_sys(tmp_path: Path) -> None:
    assert sysfs.StateFiles().keep_open
    assert not sysfs.StateFiles(_sysfs(tmp_path)).keep_open
