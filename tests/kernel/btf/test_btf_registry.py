"""The kernel BTF registry on real split BTF: Debian sid's vmlinux and module BTFs.

``tools.sidkernel`` caches the kernel once (``make kernel``); its ``btf_root`` is shaped like
``/sys/kernel/btf`` and holds ~4200 module BTFs. The counters prove which BTFs were read.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Kind
from schedswitchd.errors import BtfError, RegistryError
from schedswitchd.kernel.btf.registry import KernelBtfRegistry, normalize_module_name
from schedswitchd.kernel.uevents import UeventListener, make_uevent
from tests.build_outputs import sid_kernel
from tools.sidkernel import SidKernel

# Types that live in one module's own BTF, not in vmlinux (checked in test_fixture_facts).
NFT_TYPE = ("nft_expr_ops", Kind.STRUCT)  # nf_tables
KVM_TYPE = ("kvm_mmu_page", Kind.STRUCT)  # kvm


@pytest.fixture(scope="module")
def kernel() -> SidKernel:
    return sid_kernel()


@pytest.fixture(scope="module")
def full_root(kernel: SidKernel) -> Path:
    return kernel.btf_root


def _subset(kernel: SidKernel, dest: Path, names: list[str], *, copy: bool = False) -> Path:
    """A btf_root holding vmlinux and ``names`` (symlinks, or copies when ``copy``)."""
    dest.mkdir()
    os.symlink(kernel.btf_root / "vmlinux", dest / "vmlinux")
    for n in names:
        if copy:
            shutil.copyfile(kernel.btf_root / n, dest / n)
        else:
            os.symlink(kernel.btf_root / n, dest / n)
    return dest


def _find(btf: Btf, what: tuple[str, Kind]) -> int | None:
    ids = btf.find_ids(*what)
    return ids[0] if ids else None


def test_fixture_facts(full_root: Path) -> None:
    vmlinux = Btf.from_file(full_root / "vmlinux")
    assert len(os.listdir(full_root)) > 1000
    assert _find(vmlinux, NFT_TYPE) is None and _find(vmlinux, KVM_TYPE) is None
    nft = Btf.from_file(full_root / "nf_tables", base=vmlinux)
    assert _find(nft, NFT_TYPE) is not None


def test_declared_two_modules_reads_exactly_two(full_root: Path) -> None:
    reg = KernelBtfRegistry(btf_root=full_root)
    t = reg.targets(["nf_tables", "kvm"])
    assert t.report.read == ["nf_tables", "kvm"] and t.report.modules_read == 2
    assert t.report.read_ns > 0 and t.report.missing == []
    assert reg.stats().module_btfs_read == 2
    btfs = t.all()
    assert [b.name for b in btfs] == ["vmlinux", "nf_tables", "kvm"]
    assert all(b.base is t.vmlinux for b in btfs[1:])
    assert btfs[1].start_id == t.vmlinux.end_id
    assert _find(btfs[1], NFT_TYPE) is not None and _find(btfs[2], KVM_TYPE) is not None
    # A lookup that fails in the declared set never reaches other modules.
    assert t.first(lambda b: _find(b, ("xfs_mount", Kind.STRUCT))) is None
    assert reg.stats().module_btfs_read == 2
    assert t.searched == ("vmlinux", "nf_tables", "kvm")

    again = reg.targets(["kvm", "nf_tables"])
    assert again.report.modules_read == 0 and again.report.cache_hits == 2
    s = reg.stats()
    assert (s.module_btfs_read, s.cache.hits, s.cache.entries) == (2, 2, 2)
    assert s.cache.bytes_held == sum(os.path.getsize(full_root / n) for n in ("kvm", "nf_tables"))
    flat = s.as_counters()
    assert flat["kmod_btfs_read"] == 2 and flat["btf_cache_hits"] == 2
    assert flat["btf_cache_bytes"] == s.cache.bytes_held and "btf_id_full_scans" not in flat


def test_config_extras_duplicates_dashes_and_absent_modules(full_root: Path) -> None:
    reg = KernelBtfRegistry(btf_root=full_root)
    t = reg.targets(["nf-tables", "nf_tables", "vmlinux", "not_loaded_mod"], extra=["kvm", "kvm"])
    r = t.report
    assert r.declared == ("nf_tables", "not_loaded_mod", "kvm")
    assert (r.found, r.missing, r.modules_read) == (["nf_tables", "kvm"], ["not_loaded_mod"], 2)
    err = t.not_found("kfunc scx_bpf_nope")
    assert "vmlinux, nf_tables, kvm" in str(err) and "not_loaded_mod" in str(err)
    # extras alone (object without .kmod_btfs) are a declaration too
    assert reg.targets(["", "kvm"]).report.declared == ("kvm",)  # all-NUL entries skipped
    only_extra = reg.targets(None, extra=["kvm"])
    assert not only_extra.fallback and only_extra.report.found == ["kvm"]


@pytest.mark.parametrize("bad", ["../vmlinux", "a/b", ".", "x" * 56, "nf tables", "é", "a\0b"])
def test_invalid_module_names(full_root: Path, bad: str) -> None:
    reg = KernelBtfRegistry(btf_root=full_root)
    with pytest.raises(RegistryError, match="not a kernel module name"):
        reg.targets([bad])
    assert reg.stats().module_btfs_read == 0


def test_normalize_module_name() -> None:
    assert normalize_module_name("snd-hda-intel") == "snd_hda_intel"


def test_vmlinux_parsed_once_per_process(full_root: Path) -> None:
    a = KernelBtfRegistry(btf_root=full_root)
    b = KernelBtfRegistry(btf_root=full_root)
    assert a.vmlinux is b.vmlinux


def test_missing_vmlinux(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="no vmlinux BTF"):
        KernelBtfRegistry(btf_root=tmp_path).targets(["kvm"])


def test_malformed_module_btf_names_module(kernel: SidKernel, tmp_path: Path) -> None:
    root = _subset(kernel, tmp_path / "root", [])
    (root / "broken").write_bytes(b"\x9f\xeb\x01\x00" + bytes(8))
    with pytest.raises(BtfError, match="broken"):
        KernelBtfRegistry(btf_root=root).targets(["broken"])


def test_eviction_order_by_entry_count(full_root: Path) -> None:
    reg = KernelBtfRegistry(btf_root=full_root, max_entries=3)
    for n in ("ext4", "xfs", "btrfs"):
        reg.targets([n])
    reg.targets(["ext4"])  # ext4 becomes most recently used
    reg.targets(["nf_tables"])  # evicts the least recently used: xfs
    assert reg.cached_modules() == ["btrfs", "ext4", "nf_tables"]
    s = reg.stats()
    assert (s.cache.evictions, s.cache.entries, s.module_btfs_read) == (1, 3, 4)
    assert reg.targets(["xfs"]).report.modules_read == 1  # evicted, so read again


def test_byte_bound(full_root: Path) -> None:
    size = {n: os.path.getsize(full_root / n) for n in ("kvm", "kvm_intel", "nf_tables", "ext4")}
    bound = size["kvm"] + size["kvm_intel"] + size["nf_tables"]
    reg = KernelBtfRegistry(btf_root=full_root, max_entries=100, max_bytes=bound)
    reg.targets(["kvm", "kvm_intel", "nf_tables"])
    assert reg.stats().cache.bytes_held == bound
    reg.targets(["ext4"])  # does not fit: the oldest (kvm) goes, then it does
    s = reg.stats()
    assert s.cache.bytes_held <= bound
    assert reg.cached_modules() == ["kvm_intel", "nf_tables", "ext4"]
    assert s.cache.evictions == 1
    held = sum(size[n] for n in reg.cached_modules())
    assert s.cache.bytes_held == held
    # A module larger than the whole bound is served but never cached.
    tiny = KernelBtfRegistry(btf_root=full_root, max_bytes=1000)
    assert tiny.targets(["xfs"]).report.found == ["xfs"]
    assert tiny.stats().cache.entries == 0 and tiny.stats().cache.rejected == 1


def test_fallback_reads_modules_only_when_vmlinux_lacks_the_name(
    kernel: SidKernel, tmp_path: Path
) -> None:
    mods = ["ext4", "kvm", "nf_tables", "xfs", "zram"]
    reg = KernelBtfRegistry(btf_root=_subset(kernel, tmp_path / "root", mods))
    t = reg.targets(None)
    assert t.fallback
    hit = t.first(lambda b: _find(b, ("task_struct", Kind.STRUCT)))
    assert hit is not None and hit[0].name == "vmlinux"
    assert t.report.modules_read == 0 and reg.stats().module_btfs_read == 0

    hit = t.first(lambda b: _find(b, NFT_TYPE))
    assert hit is not None and hit[0].name == "nf_tables"
    # sorted order, stopping at the first module that has it
    assert t.report.read == ["ext4", "kvm", "nf_tables"]
    assert t.searched == ("vmlinux", "ext4", "kvm", "nf_tables")
    # the same set does not read a module twice; a new load hits the cache
    assert t.first(lambda b: _find(b, NFT_TYPE)) is not None
    assert t.report.modules_read == 3
    t2 = reg.targets(None)
    assert t2.first(lambda b: _find(b, NFT_TYPE)) is not None
    assert t2.report.modules_read == 0 and t2.report.cache_hits == 3


def test_declared_set_never_falls_back(kernel: SidKernel, tmp_path: Path) -> None:
    reg = KernelBtfRegistry(btf_root=_subset(kernel, tmp_path / "root", ["kvm", "nf_tables"]))
    t = reg.targets(["kvm"])
    assert t.first(lambda b: _find(b, NFT_TYPE)) is None
    assert t.module("nf_tables") is None
    assert reg.stats().module_btfs_read == 1


def _replace(root: Path, name: str, source: Path) -> None:
    tmp = root / f".{name}.new"
    shutil.copyfile(source, tmp)
    os.replace(tmp, root / name)  # a new inode, as a reloaded module's sysfs node


def test_remove_add_events_never_serve_stale(kernel: SidKernel, tmp_path: Path) -> None:
    root = _subset(kernel, tmp_path / "root", ["nf_tables"], copy=True)
    reg = KernelBtfRegistry(btf_root=root)
    listener = UeventListener()
    sub = reg.attach(listener)
    old = reg.module("nf_tables")
    assert old is not None and _find(old, NFT_TYPE) is not None

    # "rmmod": the file disappears and the kernel says remove
    os.unlink(root / "nf_tables")
    listener.dispatch(make_uevent("remove", "/module/nf_tables", "module"))
    assert reg.cached_modules() == []
    assert reg.targets(["nf_tables"]).report.missing == ["nf_tables"]

    # "modprobe" of a different build: new content under the same name, then add
    _replace(root, "nf_tables", kernel.btf_root / "kvm")
    listener.dispatch(make_uevent("add", "/module/nf_tables", "module"))
    new = reg.targets(["nf_tables"]).module("nf_tables")
    assert new is not None and new is not old
    assert _find(new, KVM_TYPE) is not None and _find(new, NFT_TYPE) is None
    assert reg.stats().module_uevents == 2

    sub.cancel()
    listener.dispatch(make_uevent("remove", "/module/nf_tables", "module"))
    assert reg.stats().module_uevents == 2


def test_missed_events_still_never_serve_stale(kernel: SidKernel, tmp_path: Path) -> None:
    root = _subset(kernel, tmp_path / "root", ["nf_tables"], copy=True)
    reg = KernelBtfRegistry(btf_root=root)
    assert reg.targets(["nf_tables"]).report.modules_read == 1
    _replace(root, "nf_tables", kernel.btf_root / "kvm")  # no uevent at all
    t = reg.targets(["nf_tables"])
    assert t.report.modules_read == 1 and t.report.cache_hits == 0
    got = t.module("nf_tables")
    assert got is not None and _find(got, KVM_TYPE) is not None
    s = reg.stats()
    assert s.stale_dropped == 1 and s.cache.invalidations == 1


def test_event_during_read_is_not_cached(kernel: SidKernel, tmp_path: Path) -> None:
    # A remove event that arrives while a module is being read must win: what was read
    # is returned to that caller, but not cached for the next load. The module's file is
    # a FIFO here, so the read cannot pass its open() before a writer comes: the writer
    # delivers the event once the reader holds the FIFO open, then the bytes.
    root = _subset(kernel, tmp_path / "root", [])
    reg = KernelBtfRegistry(btf_root=root)
    vmlinux = reg.vmlinux
    os.mkfifo(root / "nf_tables")
    data = (kernel.btf_root / "nf_tables").read_bytes()
    failed: list[BaseException] = []

    def event_then_bytes() -> None:
        try:
            with open(root / "nf_tables", "wb") as fifo:  # returns once the reader opened it
                reg.handle_uevent(make_uevent("remove", "/module/nf_tables", "module"))
                fifo.write(data)
        except BaseException as exc:
            failed.append(exc)

    writer = threading.Thread(target=event_then_bytes)
    writer.start()
    try:
        got = reg.module("nf_tables")
    finally:
        writer.join(30)
    assert failed == [] and got is not None and _find(got, NFT_TYPE) is not None
    assert reg.cached_modules() == [] and vmlinux is reg.vmlinux
    (root / "nf_tables").unlink()  # the module's file, without a race this time
    os.symlink(kernel.btf_root / "nf_tables", root / "nf_tables")
    assert reg.module("nf_tables") is not None and reg.cached_modules() == ["nf_tables"]


def test_concurrent_loads_and_events_keep_bounds(full_root: Path) -> None:
    names = ["ext4", "kvm", "kvm_intel", "nf_tables", "xfs", "zram", "dummy", "xor"]
    size = {n: os.path.getsize(full_root / n) for n in names}
    bound = sorted(size.values())[-1] + sorted(size.values())[-2]
    reg = KernelBtfRegistry(btf_root=full_root, max_entries=3, max_bytes=bound)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(40):
                pick = [names[(k + i) % len(names)], names[(k * 3 + i) % len(names)]]
                t = reg.targets(pick)
                assert {b.name for b in t.all()[1:]} == set(pick)
                if i % 7 == 0:
                    reg.handle_uevent(make_uevent("remove", f"/module/{pick[0]}", "module"))
                s = reg.stats().cache
                assert s.entries <= 3 and s.bytes_held <= bound
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = reg.stats().cache
    assert s.bytes_held == sum(size[n] for n in reg.cached_modules())


def test_overflow_resync_drops_everything(full_root: Path) -> None:
    reg = KernelBtfRegistry(btf_root=full_root)
    listener = UeventListener()
    reg.attach(listener)
    reg.targets(["kvm", "nf_tables"])
    listener._overflowed()  # what the reader calls after ENOBUFS
    assert reg.cached_modules() == []
    assert reg.targets(["kvm"]).report.modules_read == 1


def test_directory_root_has_no_kernel_objects(full_root: Path) -> None:
    reg = KernelBtfRegistry(btf_root=full_root)
    assert reg.ids is None and reg.btf_object_id("kvm") is None
    with pytest.raises(RegistryError, match="no kernel BTF objects"):
        reg.open_btf_object("kvm")
