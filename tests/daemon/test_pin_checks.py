"""What a pin needs, checked before a switch: the pin directory on a bpf filesystem that
is mounted writable. A switch pins its scheduler after the reply that says it runs; a pin
that fails then rolled the switch back after an ``ok`` (and again on every pass while the
lease lived), so the real backend refuses such a switch at prepare, before anything is
loaded."""

from __future__ import annotations

import logging
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from schedswitchd.daemon.config import parse_config
from schedswitchd.daemon.kernel_backend import KernelBackend, create_backend
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.sched_ext.scheduler_pins import PinDir, PinError
from tests.daemon.kernel_objects import TCP, object_config

pytestmark = pytest.mark.root


@pytest.fixture
def readonly_bpffs() -> Iterator[Path]:
    """A private bpffs mounted read-only on a temporary directory."""
    where = Path(tempfile.mkdtemp(prefix="schedswitchd-robpffs-"))
    subprocess.run(["mount", "-t", "bpf", "-o", "ro", "bpf", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)
        where.rmdir()


def test_check_accepts_bpffs_and_refuses_the_rest(
    bpffs: Path, readonly_bpffs: Path, tmp_path: Path
) -> None:
    PinDir(bpffs / "not" / "yet").check()  # made at the first pin, on bpffs
    with pytest.raises(PinError, match="not on a bpf filesystem"):
        PinDir(tmp_path / "pins").check()
    with pytest.raises(PinError, match="mounted read-only"):
        PinDir(readonly_bpffs / "pins").check()
    (tmp_path / "file").write_text("")
    with pytest.raises(PinError, match="not a directory"):
        PinDir(tmp_path / "file").check()


@pytest.mark.parametrize("where", ["tmpfs", "readonly"])
def test_prepare_refuses_before_loading_when_pins_cannot_work(
    where: str,
    registry: KernelBtfRegistry,
    scx_root: Path,
    bpf_object: Callable[[str], Path],
    tmp_path: Path,
    readonly_bpffs: Path,
    bpffs: Path,
) -> None:
    pin_dir = tmp_path / "pins" if where == "tmpfs" else readonly_bpffs / "pins"
    backend = KernelBackend(
        pin_dir=pin_dir, registry=registry, sched_ext_root=scx_root, ops_type=TCP
    )
    with pytest.raises(PinError, match=f"cannot pin schedulers under {pin_dir}"):
        backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    assert backend.counters().get("prepare_failures") == 1
    # the same prepare with pins on a writable bpffs goes through
    fine = KernelBackend(
        pin_dir=bpffs / "pins", registry=registry, sched_ext_root=scx_root, ops_type=TCP
    )
    fine.discard(fine.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False)))


def test_the_start_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``create_backend`` (the daemon's start) logs the problem once sched_ext is there."""
    from schedswitchd.kernel.sched_ext import sysfs

    monkeypatch.setattr(sysfs, "available", lambda root=None: True)
    config = parse_config(
        f'[switch]\nruntime_dir = "{tmp_path}"\n[daemon]\npin_dir = "{tmp_path / "pins"}"\n'
    )
    with caplog.at_level(logging.ERROR, logger="schedswitchd"):
        create_backend(config)
    assert "not on a bpf filesystem" in caplog.text
    assert "every switch to a scheduler is refused" in caplog.text
