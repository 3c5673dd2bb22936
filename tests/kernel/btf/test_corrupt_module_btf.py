"""One corrupt module BTF (a file cut to its 24-byte header) does not break loads that
search every module: an object without ``.kmod_btfs`` whose weak kfunc is nowhere loads on
the host kernel, the bad module is skipped with one warning and counted
(``kmod_btf_skipped``, the daemon's ``module_btfs_skipped``). A module an object declares
still fails its load when it cannot be parsed.

``btf_root`` is a directory shaped like ``/sys/kernel/btf``: the host's vmlinux (symlink)
and the broken module, named to sort first so every walk meets it before anything else.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Kind
from schedswitchd.bpf.spec import ExternKind, ExternSpec, Fixup, FixupKind, ObjectSpec, ProgramSpec
from schedswitchd.errors import BtfError
from schedswitchd.kernel import bpf_uapi
from schedswitchd.kernel.btf.module_memo import ModuleLookup
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import load_object
from tests.kernel import asm

SYS_VMLINUX = Path("/sys/kernel/btf/vmlinux")
BROKEN = "aaa_broken"

pytestmark = pytest.mark.skipif(not SYS_VMLINUX.exists(), reason="no /sys/kernel/btf/vmlinux")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    os.symlink(SYS_VMLINUX, tmp_path / "vmlinux")
    with open(SYS_VMLINUX, "rb") as f:
        header = f.read(24)  # a valid header whose type and string sections are cut off
    (tmp_path / BROKEN).write_bytes(header)
    with pytest.raises(BtfError):
        Btf.from_bytes(header, base=Btf.from_file(SYS_VMLINUX))
    return tmp_path


def _weak_kfunc_spec(kmod_btfs: tuple[str, ...] | None) -> ObjectSpec:
    """A SYSCALL program ``r1 = 0; if r1 == 0 goto +1; call ssd_nowhere_kfunc; r0 = 0``:
    the weak kfunc is in no BTF, so the call is poisoned, in dead code."""
    b = BtfBuilder()
    proto = b.add_func_proto(0, [])
    f = b.add_func("ssd_nowhere_kfunc", proto)
    btf = Btf.from_bytes(b.build(), name="weak_kfunc")
    prog = ProgramSpec(
        name="weak_kfunc",
        section="syscall",
        prog_type=bpf_uapi.ProgType.SYSCALL,
        expected_attach_type=0,
        attach_to="",
        sleepable=True,
        autoload=True,
        insns=asm.mov64_imm(1, 0) + asm.jeq_imm(1, 0, 1) + asm.kfunc_call() + asm.ret(0),
        fixups=(Fixup(FixupKind.KFUNC_CALL, 2, extern="ssd_nowhere_kfunc"),),
    )
    ext = ExternSpec("ssd_nowhere_kfunc", "ssd_nowhere_kfunc", ExternKind.KFUNC, True, f, proto)
    return ObjectSpec(
        name="weak_kfunc",
        license="GPL",
        kern_version=0,
        btf=btf,
        programs=(prog,),
        maps=(),
        externs=(ext,),
        kmod_btfs=kmod_btfs,
    )


def test_walk_skips_the_corrupt_module_once(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    reg = KernelBtfRegistry(btf_root=root)
    lookup = ModuleLookup("ssd_nowhere_kfunc", (Kind.FUNC,))
    with caplog.at_level(logging.WARNING, logger="schedswitchd.kernel.btf.registry"):
        t = reg.targets(None)
        assert t.modules_holding([lookup]) == []
        assert [n for n, _ in t.report.skipped] == [BROKEN]
        # lazy iteration over every module (TargetBtfs.first) skips it too, without a
        # second read or warning of the unchanged file
        t2 = reg.targets(None)
        assert t2.first(lambda b: b.find("ssd_nowhere_kfunc", Kind.FUNC)) is None
        assert t2.report.skipped == [(BROKEN, "unchanged since it could not be parsed")]
    warnings = [r for r in caplog.records if BROKEN in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert reg.stats().skipped == 2
    assert reg.stats().as_counters()["kmod_btf_skipped"] == 2


@pytest.mark.root
def test_weak_kfunc_object_without_kmod_btfs_loads(root: Path) -> None:
    reg = KernelBtfRegistry(btf_root=root)
    t = reg.targets(None)
    with load_object(_weak_kfunc_spec(None), t) as obj:
        assert obj.programs["weak_kfunc"].fd.fd >= 0
    assert [n for n, _ in t.report.skipped] == [BROKEN]
    assert reg.stats().skipped == 1


def test_a_declared_corrupt_module_still_fails(root: Path) -> None:
    reg = KernelBtfRegistry(btf_root=root)
    with pytest.raises(BtfError, match=BROKEN):
        reg.targets([BROKEN])
    assert reg.stats().skipped == 0
