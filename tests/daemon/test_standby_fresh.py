"""The standby's freshness check on a hit's path: one stat of the object and,
while the watch's uevent listener keeps the module generation true, no listing of
/sys/kernel/btf. Host kernel (struct_ops of tcp_congestion_ops), real loads."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.kernel_backend import KernelBackend
from schedswitchd.daemon.kernel_handle import KernelPrepared
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.uevents import UeventListener
from tests.bpf.conftest import BPF_BUILD_DIR
from tests.build_outputs import missing_build_output
from tests.fs_events import FileEvents

pytestmark = pytest.mark.root


@pytest.fixture
def backend(bpffs: Path, tmp_path: Path) -> KernelBackend:
    root = tmp_path / "sched_ext"
    root.mkdir()
    for name, text in {"state": "disabled", "hotplug_seq": "7", "enable_seq": "3"}.items():
        (root / name).write_text(text + "\n")
    return KernelBackend(
        pin_dir=bpffs / "pins",
        registry=KernelBtfRegistry(),
        sched_ext_root=root,
        ops_type="tcp_congestion_ops",
    )


@pytest.fixture
def prepared(
    backend: KernelBackend, tmp_path: Path
) -> Iterator[tuple[KernelPrepared, SchedulerConfig, Path]]:
    src = BPF_BUILD_DIR / "uei.bpf.o"
    if not src.is_file():
        missing_build_output(src, "test-objects")
    obj = tmp_path / "uei.bpf.o"
    shutil.copyfile(src, obj)
    cfg = SchedulerConfig.model_validate({"object": str(obj), "hotplug_seq": False})
    h = backend.prepare("uei", cfg)
    try:
        yield h, cfg, obj
    finally:
        backend.discard(h)


@pytest.fixture
def module_events(backend: KernelBackend) -> Iterator[None]:
    """The backend's watch running, its uevent listener feeding the module generation (what
    the daemon runs); skips where no uevent socket can be opened."""
    probe = UeventListener()
    try:
        probe.start()
    except (OSError, TimeoutError) as exc:
        pytest.skip(f"no uevent socket here ({exc}): the watch relies on its sysfs check")
    probe.stop()
    stop = backend.watch(lambda: None)
    try:
        yield
    finally:
        stop()


def _listings(events: FileEvents) -> int:
    """How often the BTF root itself was opened (a ``getdents64`` listing, or the
    ``os.scandir`` of the fallback), seen through audit events."""
    return sum(1 for e in events.of("read", "os.scandir", "os.listdir") if e.path == ".")


def test_with_module_events_a_fresh_check_lists_no_directory(
    backend: KernelBackend,
    prepared: tuple[KernelPrepared, SchedulerConfig, Path],
    module_events: None,
) -> None:
    h, cfg, _ = prepared
    with FileEvents(backend.registry.btf_root) as btf:
        assert backend.fresh(h, cfg) and _listings(btf) == 0
        backend.registry.memo.bump()  # a module came or went (or events were lost)
        assert not backend.fresh(h, cfg) and _listings(btf) == 1


def test_without_module_events_the_directory_is_listed(
    backend: KernelBackend,
    prepared: tuple[KernelPrepared, SchedulerConfig, Path],
) -> None:
    h, cfg, _ = prepared
    with FileEvents(backend.registry.btf_root) as btf:  # no watch running
        assert backend.fresh(h, cfg) and _listings(btf) == 1


def test_a_changed_or_replaced_object_is_stale(
    backend: KernelBackend,
    prepared: tuple[KernelPrepared, SchedulerConfig, Path],
    module_events: None,
    tmp_path: Path,
) -> None:
    h, cfg, obj = prepared
    assert backend.fresh(h, cfg)
    st = obj.stat()
    os.utime(obj, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # rebuilt in place
    assert not backend.fresh(h, cfg)
    os.utime(obj, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert backend.fresh(h, cfg)
    # the same bytes, another file (a new inode under the configured name)
    copy = tmp_path / "copy.bpf.o"
    shutil.copy2(obj, copy)
    os.replace(copy, obj)
    assert not backend.fresh(h, cfg)
    obj.unlink()
    assert not backend.fresh(h, cfg)


def _fed(backend: KernelBackend) -> bool:
    return backend.module_events  # a call, so the type checker does not narrow across calls


def test_the_watch_feeds_the_module_generation(backend: KernelBackend) -> None:
    assert not _fed(backend)  # no watch yet
    stop = backend.watch(lambda: None)
    try:
        if not _fed(backend):
            pytest.skip("no uevent socket here: the watch relies on its sysfs check")
    finally:
        stop()
    assert not _fed(backend)


def test_standby_freshness_without_a_module_key(
    backend: KernelBackend,
    prepared: tuple[KernelPrepared, SchedulerConfig, Path],
    bpffs: Path,
    tmp_path: Path,
) -> None:
    """A handle prepared while the module set could not be listed holds ``None``: it is
    compared with a listing each time, never taken on the generation alone (checked by a
    backend whose BTF root cannot be listed either: then it matches)."""
    h, cfg, _ = prepared
    assert h.inputs is not None
    h.inputs.modules = None
    stop = backend.watch(lambda: None)
    try:
        assert not backend.fresh(h, cfg)
    finally:
        stop()
    unlistable = KernelBackend(
        pin_dir=bpffs / "pins-unlistable",
        registry=KernelBtfRegistry(btf_root=tmp_path / "no-btf-here"),
        sched_ext_root=tmp_path / "sched_ext",
        ops_type="tcp_congestion_ops",
    )
    assert unlistable.fresh(h, cfg)
