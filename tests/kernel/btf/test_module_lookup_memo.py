"""The module lookup memo on real split BTF: an object without ``.kmod_btfs`` whose CO-RE
relocations need types only the ``uinput`` module has, loaded into the host kernel against a
``btf_root`` of Debian sid's vmlinux and 300 of its module BTFs (plus uinput, 8021q, garp).

The counters prove what was read: the first load walks every module once for both names;
later loads read only uinput (or nothing, from the cache); a module set change (a new file, a
removed one, a replaced one; with or without uevents) makes the next load walk again, so
the result is always the one a full walk gives -- including an ambiguity a new module adds.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Composite, Enum, Kind
from schedswitchd.bpf.core.relo import CoreRelo, CoreReloKind
from schedswitchd.bpf.core.relocate import relocate
from schedswitchd.bpf.insn import decode
from schedswitchd.bpf.spec import ObjectSpec, ProgramSpec
from schedswitchd.errors import CoreError, RegistryError
from schedswitchd.kernel import bpf_uapi
from schedswitchd.kernel.btf.module_memo import LookupMemo, ModuleLookup, dirent_names, read_dirents
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import ProgramLoadError, load_object
from schedswitchd.kernel.uevents import UeventListener, make_uevent
from tests.build_outputs import sid_kernel
from tests.kernel import asm
from tools.sidkernel import SidKernel

pytestmark = pytest.mark.root

N_OTHER = 300
EXTRA = ["uinput", "8021q", "garp"]


@pytest.fixture(scope="module")
def kernel() -> SidKernel:
    return sid_kernel()


@pytest.fixture(scope="module")
def module_names(kernel: SidKernel) -> list[str]:
    others = [n for n in kernel.module_btf_names() if n not in EXTRA][:N_OTHER]
    return sorted([*others, *EXTRA])


@pytest.fixture(scope="module")
def truth(kernel: SidKernel) -> tuple[int, int]:
    """(sizeof(struct uinput_device), UIST_CREATED) from uinput's own BTF."""
    vmlinux = Btf.from_file(kernel.btf_root / "vmlinux", name="vmlinux")
    assert not vmlinux.find_ids("uinput_device", Kind.STRUCT)
    mod = Btf.from_file(kernel.btf_root / "uinput", base=vmlinux, name="uinput")
    dev = mod.type(mod.find_ids("uinput_device", Kind.STRUCT)[0])
    state = mod.type(mod.find_ids("uinput_state", Kind.ENUM)[0])
    assert isinstance(dev, Composite) and isinstance(state, Enum)
    return dev.size, next(v.value for v in state.values if v.name == "UIST_CREATED")


@pytest.fixture
def root(kernel: SidKernel, module_names: list[str], tmp_path: Path) -> Path:
    d = tmp_path / "btf"
    d.mkdir()
    os.symlink(kernel.btf_root / "vmlinux", d / "vmlinux")
    for n in module_names:
        os.symlink(kernel.btf_root / n, d / n)
    return d


def _spec() -> ObjectSpec:
    """``r0 = sizeof(struct uinput_device___ss); r1 = UIST_CREATED___ss; exit`` with a
    TYPE_SIZE and an ENUMVAL_VALUE relocation, and no ``.kmod_btfs`` (``kmod_btfs=None``)."""
    b = BtfBuilder()
    dev = b.add_struct("uinput_device___ss", 0, [])
    state = b.add_enum("uinput_state___ss", 4, [("UIST_CREATED___ss", 0)])
    btf = Btf.from_bytes(b.build(), name="nokmod")
    prog = ProgramSpec(
        name="uses_uinput",
        section="syscall",
        prog_type=bpf_uapi.ProgType.SYSCALL,
        expected_attach_type=0,
        attach_to="",
        sleepable=True,
        autoload=True,
        insns=asm.mov64_imm(0, 0) + asm.mov64_imm(1, 0) + asm.exit_(),
        core_relos=(
            CoreRelo(0, dev, "0", CoreReloKind.TYPE_SIZE),
            CoreRelo(1, state, "0", CoreReloKind.ENUMVAL_VALUE),
        ),
    )
    return ObjectSpec(
        name="nokmod",
        license="GPL",
        kern_version=0,
        btf=btf,
        programs=(prog,),
        maps=(),
        externs=(),
        kmod_btfs=None,
    )


SPEC = _spec()


def _load(reg: KernelBtfRegistry) -> tuple[tuple[int, int], list[str]]:
    """Load SPEC into the host kernel; (patched immediates, module BTFs read)."""
    t = reg.targets(SPEC.kmod_btfs)
    assert t.fallback
    with load_object(SPEC, t) as obj:
        insns = obj.programs["uses_uinput"].insns
        got = (decode(insns, 0).imm, decode(insns, 1).imm)
    return got, list(t.report.read)


def _module_with_device(vmlinux: Btf, size: int) -> bytes:
    """A split BTF on ``vmlinux`` holding only ``struct uinput_device`` of ``size`` bytes."""
    b = BtfBuilder(base=vmlinux)
    b.add_struct("uinput_device", size, [])
    return b.build()


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a new inode, as a reloaded module's sysfs node


def test_second_load_reads_no_module_btf(root: Path, truth: tuple[int, int]) -> None:
    reg = KernelBtfRegistry(btf_root=root)
    got, read = _load(reg)
    assert got == truth
    # One walk for both names: every module BTF read exactly once.
    assert sorted(read) == sorted(n for n in os.listdir(root) if n != "vmlinux")
    m = reg.stats().lookups
    assert (m.misses, m.hits, m.walks, m.entries) == (2, 0, 1, 2)
    # Modules without a candidate are not admitted: the walk evicted nothing useful.
    assert reg.cached_modules() == ["uinput"]

    for _ in range(2):
        got, read = _load(reg)
        assert got == truth and read == []
    s = reg.stats()
    assert (s.lookups.hits, s.lookups.walks, s.lookups.invalidations) == (4, 1, 0)
    assert s.module_btfs_read == len(os.listdir(root)) - 1
    flat = s.as_counters()
    assert flat["module_lookup_hits"] == 4 and flat["module_lookup_walks"] == 1
    assert flat["module_set_checks"] == 3 and flat["module_set_check_ns"] > 0


def test_cold_cache_reads_only_the_holder(root: Path, truth: tuple[int, int]) -> None:
    reg = KernelBtfRegistry(btf_root=root, max_bytes=1)  # nothing fits: every use reads
    assert len(_load(reg)[1]) == len(os.listdir(root)) - 1
    assert _load(reg) == (truth, ["uinput"])


def test_same_result_as_a_full_walk(root: Path) -> None:
    reg = KernelBtfRegistry(btf_root=root)
    prog = SPEC.programs[0]
    assert SPEC.btf is not None
    full = relocate(SPEC.btf, prog.insns, prog.core_relos, reg.targets(None).all())
    t = reg.targets(None)
    lookups = [ModuleLookup.core(SPEC.btf, r.type_id) for r in prog.core_relos]
    mods = t.modules_holding([lk for lk in lookups if lk is not None])
    assert [b.name for b in mods] == ["uinput"]
    memo = relocate(SPEC.btf, prog.insns, prog.core_relos, [t.vmlinux, *mods])
    assert memo.insns == full.insns
    assert [(r.target_value, r.candidates, r.target_btf) for r in memo.results] == [
        (r.target_value, r.candidates, r.target_btf) for r in full.results
    ]


def test_first_holding_keeps_the_walk_order(root: Path) -> None:
    # garp_applicant lives in garp and in 8021q (a copy): the first in walk order wins,
    # as with a probe over every module.
    reg = KernelBtfRegistry(btf_root=root)
    lk = ModuleLookup("garp_applicant", (Kind.STRUCT,))

    def probe(b: Btf) -> int | None:
        ids = b.find_ids("garp_applicant", Kind.STRUCT)
        return ids[0] if ids else None

    full = reg.targets(None).first(probe)
    t = reg.targets(None)
    hit = t.first_holding(lk, probe)
    assert full is not None and hit is not None
    assert hit[0].name == full[0].name == "8021q" and hit[1] == full[1]
    assert reg.holders([lk]) == {lk: (("8021q", None), ("garp", None))}
    # A kfunc-style lookup (FUNC) that no module has: remembered as "none".
    none = ModuleLookup("ssd_no_such_func", (Kind.FUNC,))
    assert reg.targets(None).first_holding(none, lambda b: None) is None
    t2 = reg.targets(None)
    assert t2.first_holding(none, lambda b: None) is None
    assert t2.report.read == [] and reg.holders([none]) == {none: ()}
    assert t2.searched == ("vmlinux", f"all {len(os.listdir(root)) - 1} module BTFs")


@pytest.mark.parametrize("with_event", [False, True])
def test_new_module_with_a_candidate_invalidates_and_is_ambiguous(
    root: Path, truth: tuple[int, int], with_event: bool
) -> None:
    reg = KernelBtfRegistry(btf_root=root)
    listener = UeventListener()
    reg.attach(listener)
    assert _load(reg)[0] == truth
    # A module without any candidate: the set changed, so the next load walks again.
    shutil.copyfile(root / "garp", root / "zz_plain")
    if with_event:
        listener.dispatch(make_uevent("add", "/module/zz_plain", "module"))
    got, read = _load(reg)
    assert got == truth and "zz_plain" in read
    assert reg.stats().lookups.invalidations == 1 and reg.stats().lookups.walks == 2

    # A module that also defines struct uinput_device, with another size: ambiguous.
    (root / "zz_uinput_copy").write_bytes(_module_with_device(reg.vmlinux, truth[0] + 8))
    if with_event:
        listener.dispatch(make_uevent("add", "/module/zz_uinput_copy", "module"))
    with pytest.raises(CoreError, match=r"ambiguity.*zz_uinput_copy"):
        _load(reg)
    assert reg.stats().lookups.invalidations == 2
    # Removing it again: back to the unambiguous answer (another walk).
    os.unlink(root / "zz_uinput_copy")
    if with_event:
        listener.dispatch(make_uevent("remove", "/module/zz_uinput_copy", "module"))
    assert _load(reg)[0] == truth
    assert reg.stats().lookups.walks == 4
    assert reg.stats().lookups.unheard == (0 if with_event else 3)


@pytest.mark.parametrize("with_event", [False, True])
def test_removed_module_invalidates(root: Path, truth: tuple[int, int], with_event: bool) -> None:
    reg = KernelBtfRegistry(btf_root=root)
    listener = UeventListener()
    reg.attach(listener)
    assert _load(reg)[0] == truth
    os.unlink(root / "uinput")
    if with_event:
        listener.dispatch(make_uevent("remove", "/module/uinput", "module"))
    with pytest.raises(ProgramLoadError) as info:
        _load(reg)
    n = len(os.listdir(root)) - 1
    assert (
        f"not found (searched vmlinux, all {n} module BTFs): CO-RE ENUMVAL_VALUE of "
        "enum uinput_state___ss" in str(info.value)
    )
    m = reg.stats().lookups
    assert m.invalidations == 1 and m.walks == 2
    assert m.unheard == (0 if with_event else 1)  # only the listing told


def test_replaced_module_without_events_is_not_stale(root: Path, truth: tuple[int, int]) -> None:
    reg = KernelBtfRegistry(btf_root=root)
    assert _load(reg)[0] == truth
    # "rmmod; insmod" of another build of uinput, and no uevent at all.
    _replace(root / "uinput", _module_with_device(reg.vmlinux, truth[0] + 16))
    with pytest.raises(ProgramLoadError):  # the new build has no enum uinput_state
        _load(reg)
    t = reg.targets(None)
    lk = ModuleLookup("uinput_device", (Kind.STRUCT,), essential=True)
    (mod,) = t.modules_holding([lk])
    dev = mod.type(mod.find_ids("uinput_device", Kind.STRUCT)[0])
    assert isinstance(dev, Composite) and dev.size == truth[0] + 16
    assert reg.stats().lookups.invalidations == 1


def test_memo_is_bounded() -> None:
    memo = LookupMemo(max_entries=2)
    root = Path(__file__).parent
    mods = memo.scan(root)
    lks = [ModuleLookup(f"t{i}", (Kind.STRUCT,)) for i in range(3)]
    assert memo.store(mods, {lk: () for lk in lks})
    known, missing, unheard = memo.get(mods, lks)
    assert list(known) == lks[1:] and missing == lks[:1] and not unheard
    s = memo.stats()
    assert (s.entries, s.evictions, s.max_entries, s.hits, s.misses) == (2, 1, 2, 2, 1)
    memo.bump()
    assert memo.stats().entries == 0 and memo.stats().invalidations == 1
    # An answer computed before an event is not kept.
    assert not memo.store(mods, {lks[0]: ()})
    with pytest.raises(ValueError):
        LookupMemo(max_entries=0)


def test_dirent_records_name_every_entry(root: Path) -> None:
    raw = read_dirents(root)
    assert sorted(dirent_names(raw)) == sorted(os.listdir(root))
    assert read_dirents(root) == raw  # nothing changed: the same bytes
    os.symlink(root / "garp", root / "zz_new")
    assert read_dirents(root) != raw
    with pytest.raises(RegistryError):
        # d_ino, d_off, d_reclen 24, d_type, then a name with no NUL within the record
        dirent_names(struct.pack("=QqHB", 1, 0, 24, 0) + b"abcdefgh")
    with pytest.raises(RegistryError):
        dirent_names(raw + b"\x01")
