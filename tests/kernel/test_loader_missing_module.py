"""A load that fails because a declared module is not loaded says so: the host kernel
verifies a program whose CO-RE relocation (ENUMVAL_VALUE of a module-only enum) found no
candidate and was poisoned, and a strong kfunc that only a module would have; the registry
is a ``btf_root`` holding only vmlinux, so the declared ``uinput`` is reported missing."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.core.relo import CoreRelo, CoreReloKind
from schedswitchd.bpf.spec import (
    ExternKind,
    ExternSpec,
    Fixup,
    FixupKind,
    ObjectSpec,
    ProgramSpec,
)
from schedswitchd.errors import LoadError
from schedswitchd.kernel import bpf_uapi
from schedswitchd.kernel.btf.registry import KernelBtfRegistry, TargetBtfs
from schedswitchd.kernel.loader import ProgramLoadError, StaticKernelBtfs, load_object
from tests.kernel import asm

pytestmark = pytest.mark.root

SYS_VMLINUX = Path("/sys/kernel/btf/vmlinux")


@pytest.fixture
def targets(tmp_path: Path) -> TargetBtfs:
    """Targets of an object declaring ``uinput`` on a root where uinput is not loaded."""
    os.symlink(SYS_VMLINUX, tmp_path / "vmlinux")
    t = KernelBtfRegistry(btf_root=tmp_path).targets(["uinput"])
    assert t.report.missing == ["uinput"]
    return t


def _spec(*, strong_kfunc: bool = False) -> ObjectSpec:
    """One SYSCALL program ``r0 = UIST_CREATED___ss; exit`` whose ``mov`` carries an
    ENUMVAL_VALUE relocation on a local ``enum uinput_state___ss`` (only uinput has
    ``enum uinput_state``), optionally with a strong extern kfunc ``uinput_ssd_kfunc``."""
    b = BtfBuilder()
    enum = b.add_enum("uinput_state___ss", 4, [("UIST_CREATED___ss", 2)])
    f = b.add_func("uinput_ssd_kfunc", b.add_func_proto(0, []))
    btf = Btf.from_bytes(b.build(), name="missing_mod")
    prog = ProgramSpec(
        name="uses_uinput",
        section="syscall",
        prog_type=bpf_uapi.ProgType.SYSCALL,
        expected_attach_type=0,
        attach_to="",
        sleepable=True,
        autoload=True,
        insns=asm.mov64_imm(0, 2) + asm.exit_(),
        core_relos=(CoreRelo(0, enum, "0", CoreReloKind.ENUMVAL_VALUE),),
    )
    externs: tuple[ExternSpec, ...] = ()
    if strong_kfunc:
        externs = (
            ExternSpec("uinput_ssd_kfunc", "uinput_ssd_kfunc", ExternKind.KFUNC, False, f, f + 1),
        )
        prog = dataclasses.replace(
            prog,
            insns=asm.kfunc_call() + asm.exit_(),
            fixups=(Fixup(FixupKind.KFUNC_CALL, 0, extern="uinput_ssd_kfunc"),),
            core_relos=(),
        )
    return ObjectSpec(
        name="missing_mod",
        license="GPL",
        kern_version=0,
        btf=btf,
        programs=(prog,),
        maps=(),
        externs=externs,
        kmod_btfs=("uinput",),
    )


def test_poisoned_core_relocation_names_the_missing_module(targets: TargetBtfs) -> None:
    with pytest.raises(ProgramLoadError) as info:
        load_object(_spec(), targets)
    err = info.value
    msg = str(err)
    assert msg.startswith(
        "program uses_uinput: declared module(s) not loaded: uinput; not found (searched "
        "vmlinux): CO-RE ENUMVAL_VALUE of enum uinput_state___ss (insn #0): BPF_PROG_LOAD "
    ), msg
    assert err.missing_modules == ("uinput",)
    assert err.errno_name == "EINVAL"
    assert err.verifier_log and "invalid func unknown#195896080" in err.verifier_log


def test_without_declared_modules_the_relocation_is_still_named() -> None:
    kernel = StaticKernelBtfs(Btf.from_file(SYS_VMLINUX, name="vmlinux"))
    with pytest.raises(ProgramLoadError) as info:
        load_object(_spec(), kernel)
    msg = str(info.value)
    assert "declared module" not in msg
    assert "not found (searched vmlinux): CO-RE ENUMVAL_VALUE of enum uinput_state___ss" in msg
    assert info.value.missing_modules == ()


def test_missing_strong_kfunc_names_the_missing_module(targets: TargetBtfs) -> None:
    with pytest.raises(LoadError) as info:
        load_object(_spec(strong_kfunc=True), targets)
    assert str(info.value) == (
        "kfunc uinput_ssd_kfunc not found in kernel BTF "
        "(searched vmlinux; declared module(s) not loaded: uinput)"
    )
