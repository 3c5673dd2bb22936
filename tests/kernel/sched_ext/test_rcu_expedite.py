"""Expedited RCU around a switch: the host kernel's /sys/kernel/rcu_expedited, and fakes of it
for the cases the real file cannot show (absent, read-only)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedswitchd.daemon.config import parse_config
from schedswitchd.daemon.kernel_backend import create_backend
from schedswitchd.kernel.sched_ext.rcu_expedite import RCU_EXPEDITED, RcuExpediter

REAL = Path("/sys") / RCU_EXPEDITED


@pytest.fixture
def real_rcu() -> Iterator[Path]:
    if not REAL.exists() or os.geteuid() != 0:
        pytest.skip("needs root and /sys/kernel/rcu_expedited")
    before = REAL.read_text()
    if before.strip() != "0":
        pytest.skip(f"rcu_expedited is {before.strip()} on this host (an admin's value)")
    yield REAL
    REAL.write_text(before)


@pytest.mark.root
def test_real_kernel_value_is_one_inside_and_zero_after(real_rcu: Path, tmp_path: Path) -> None:
    rcu = RcuExpediter(Path("/sys"), tmp_path / "run" / "marker")
    with rcu.expedited() as ours:
        assert ours
        assert real_rcu.read_text().strip() == "1"
        assert (tmp_path / "run" / "marker").exists()
    assert real_rcu.read_text().strip() == "0"
    assert not (tmp_path / "run" / "marker").exists()
    assert rcu.used == 1


@pytest.mark.root
def test_real_kernel_restored_after_an_exception(real_rcu: Path, tmp_path: Path) -> None:
    rcu = RcuExpediter(Path("/sys"), tmp_path / "marker")
    with pytest.raises(RuntimeError), rcu.expedited():
        raise RuntimeError("attach failed")
    assert real_rcu.read_text().strip() == "0"


@pytest.mark.root
def test_an_admins_value_is_left_alone(real_rcu: Path, tmp_path: Path) -> None:
    real_rcu.write_text("1\n")
    rcu = RcuExpediter(Path("/sys"), tmp_path / "marker")
    with rcu.expedited() as ours:
        assert not ours
    assert real_rcu.read_text().strip() == "1"
    assert rcu.left_alone == 1 and rcu.used == 0
    assert not rcu.recover()  # no marker: not ours to restore
    assert real_rcu.read_text().strip() == "1"


@pytest.mark.root
def test_recover_after_a_daemon_died_mid_switch(real_rcu: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    real_rcu.write_text("1\n")
    marker.touch()  # what a daemon killed inside expedited() leaves
    assert RcuExpediter(Path("/sys"), marker).recover()
    assert real_rcu.read_text().strip() == "0"
    assert not marker.exists()


@pytest.mark.root
def test_the_daemons_backend_recovers_at_creation(real_rcu: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "rcu_expedited.ours").touch()
    real_rcu.write_text("1\n")
    config = parse_config(f'[switch]\nruntime_dir = "{run}"\n[daemon]\npin_dir = "{tmp_path}"\n')
    backend = create_backend(config)
    assert real_rcu.read_text().strip() == "0"
    with backend.switch_window() as ours:
        assert ours and real_rcu.read_text().strip() == "1"
    off = create_backend(parse_config(f'[switch]\nexpedite_rcu = false\nruntime_dir = "{run}"\n'))
    with off.switch_window() as ours:
        assert not ours and real_rcu.read_text().strip() == "0"


def test_absent_file_is_a_no_op(tmp_path: Path) -> None:
    rcu = RcuExpediter(tmp_path, tmp_path / "marker")
    assert not rcu.available()
    with rcu.expedited() as ours:
        assert not ours
    assert not (tmp_path / "marker").exists()


def test_unwritable_marker_dir_leaves_the_value_alone(tmp_path: Path) -> None:
    (tmp_path / "kernel").mkdir()
    (tmp_path / RCU_EXPEDITED).write_text("0\n")
    blocker = tmp_path / "file"
    blocker.write_text("")
    rcu = RcuExpediter(tmp_path, blocker / "sub" / "marker")  # a file is in the way
    with rcu.expedited() as ours:
        assert not ours
    assert (tmp_path / RCU_EXPEDITED).read_text() == "0\n"


def test_disabled_never_touches_the_file(tmp_path: Path) -> None:
    (tmp_path / "kernel").mkdir()
    (tmp_path / RCU_EXPEDITED).write_text("0\n")
    rcu = RcuExpediter(tmp_path, tmp_path / "marker", enabled=False)
    with rcu.expedited() as ours:
        assert not ours
        assert (tmp_path / RCU_EXPEDITED).read_text() == "0\n"


@pytest.mark.root
def test_the_held_descriptor_reads_each_new_value(real_rcu: Path, tmp_path: Path) -> None:
    """The kernel's file is held open and read with pread at offset 0: a value an admin
    writes between two switches is seen (sysfs runs the attribute's show again), and the
    marker is made again when its directory went."""
    rcu = RcuExpediter(Path("/sys"), tmp_path / "run" / "marker")
    assert rcu.keep_open
    try:
        with rcu.expedited() as ours:
            assert ours and real_rcu.read_text().strip() == "1"
        assert rcu._fd is not None  # held across switches
        real_rcu.write_text("1\n")  # an admin's value, by another open file
        with rcu.expedited() as ours:
            assert not ours
        assert real_rcu.read_text().strip() == "1" and rcu.left_alone == 1
        real_rcu.write_text("0\n")
        (tmp_path / "run").rmdir()
        with rcu.expedited() as ours:
            assert ours and (tmp_path / "run" / "marker").exists()
        assert real_rcu.read_text().strip() == "0" and rcu.used == 2
    finally:
        rcu.close()


def test_a_plain_file_is_opened_at_each_access(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    (sysfs / "kernel").mkdir(parents=True)
    (sysfs / RCU_EXPEDITED).write_text("0\n")
    rcu = RcuExpediter(sysfs, tmp_path / "marker")
    assert not rcu.keep_open
    with rcu.expedited() as ours:
        assert ours and (sysfs / RCU_EXPEDITED).read_text() == "1\n"
    assert rcu._fd is None and (sysfs / RCU_EXPEDITED).read_text() == "0\n"


@pytest.mark.root
def test_a_switch_window_opens_no_file_once_the_kernels_is_held(
    real_rcu: Path, tmp_path: Path
) -> None:
    """After the first window, each window reads and writes the kernel's file through the
    one held descriptor and makes its marker without opening a file (mknod): no ``open``
    of the kernel's file or the marker, the same descriptor every time; the marker is
    there inside each window and gone after it."""
    from tests.fs_events import FileEvents

    marker = tmp_path / "run" / "marker"
    rcu = RcuExpediter(Path("/sys"), marker)
    try:
        with rcu.expedited() as ours:
            assert ours
        fd = rcu._fd
        assert fd is not None
        with FileEvents(tmp_path) as run, FileEvents(REAL.parent) as sysfs:
            for _ in range(3):
                with rcu.expedited() as ours:
                    assert ours and marker.exists() and real_rcu.read_text().strip() == "1"
                assert not marker.exists() and rcu._fd == fd
                assert real_rcu.read_text().strip() == "0"
            assert run.paths("read", "write") == []
            # the reads above are the test's own (read_text), not the expediter's
            assert sysfs.paths("write") == []
        assert rcu.used == 4
    finally:
        rcu.close()


@pytest.mark.root
def test_recover_through_the_held_descriptor_then_switch_again(
    real_rcu: Path, tmp_path: Path
) -> None:
    """A marker left by a daemon that died mid-switch: recover restores 0 through the held
    descriptor, and the next window uses that descriptor. A marker left after the value
    was already restored (died between the restore and the marker's removal) restores
    nothing and is removed."""
    marker = tmp_path / "marker"
    real_rcu.write_text("1\n")
    marker.touch()
    rcu = RcuExpediter(Path("/sys"), marker)
    try:
        assert rcu.recover() and real_rcu.read_text().strip() == "0"
        assert not marker.exists()
        fd = rcu._fd
        assert fd is not None
        with rcu.expedited() as ours:
            assert ours and rcu._fd == fd
        marker.touch()  # the value is 0 already
        assert not rcu.recover() and not marker.exists()
        assert real_rcu.read_text().strip() == "0"
    finally:
        rcu.close()


def test_a_marker_is_opened_where_mknod_is_refused(tmp_path: Path) -> None:
    """Where the filesystem refuses ``mknod`` the marker is created by ``open`` instead
    (here: told so), with the same lifetime."""
    sysfs = tmp_path / "sys"
    (sysfs / "kernel").mkdir(parents=True)
    (sysfs / RCU_EXPEDITED).write_text("0\n")
    rcu = RcuExpediter(sysfs, tmp_path / "run" / "marker")
    rcu._mknod = False
    with rcu.expedited() as ours:
        assert ours and (tmp_path / "run" / "marker").exists()
    assert not (tmp_path / "run" / "marker").exists()


@pytest.mark.root
def test_the_backends_window_undoes_both_parts_after_an_exception(
    real_rcu: Path, tmp_path: Path
) -> None:
    """The backend's switch window (the watch hushed, then the RCU window) is undone in
    full when its body raises, and nests: an inner window finds the value set (not its
    own: left alone) and the watch stays hushed until the outer one ends."""
    run = tmp_path / "run"
    run.mkdir()
    config = parse_config(f'[switch]\nruntime_dir = "{run}"\n[daemon]\npin_dir = "{tmp_path}"\n')
    backend = create_backend(config)
    marker = run / "rcu_expedited.ours"
    with pytest.raises(RuntimeError), backend.switch_window() as ours:
        assert ours and real_rcu.read_text().strip() == "1" and backend.watcher.quiet == 1
        assert marker.exists()
        raise RuntimeError("attach failed")
    assert real_rcu.read_text().strip() == "0" and backend.watcher.quiet == 0
    assert not marker.exists()
    with backend.switch_window() as outer:
        with backend.switch_window() as inner:
            assert outer and not inner and backend.watcher.quiet == 2
        assert backend.watcher.quiet == 1 and real_rcu.read_text().strip() == "1"
    assert backend.watcher.quiet == 0 and real_rcu.read_text().strip() == "0"
