"""A verifier rejection names the real cause first (host kernel).

A weak kfunc the kernel lacks is legitimate: its call is poisoned (``call
unknown#2002000000 + extern index``, as libbpf does) and a ``bpf_ksym_exists()`` guard (the
kfunc's address loads as 0) keeps the verifier away from it. When such a program fails for
another reason, the error leads with the kernel's own message and mentions the absent kfunc
only after it; when the verifier does reach the poisoned call, the error leads with the
kfunc's name. Programs are assembled here (``tests/kernel/asm.py``) so the failure is exact;
the same case compiled by clang, through our ELF opener, is build/tests/bpf/weak_cause.bpf.o
(tests/bpf/weak_cause.bpf.c).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import (
    ExternKind,
    ExternSpec,
    Fixup,
    FixupKind,
    ObjectSpec,
    ProgramSpec,
)
from schedswitchd.kernel import bpf_uapi
from schedswitchd.kernel.loader import ProgramLoadError, StaticKernelBtfs, load_object
from tests.build_outputs import missing_build_output
from tests.kernel import asm

pytestmark = pytest.mark.root

SYS_VMLINUX = Path("/sys/kernel/btf/vmlinux")
REPO = Path(__file__).resolve().parents[2]
KFUNC = "ssd_no_such_kfunc_zz"


def _spec(*, guarded: bool, bad_stack_read: bool) -> ObjectSpec:
    """One SYSCALL program calling weak kfunc ``KFUNC``: behind ``if (&KFUNC)`` when
    ``guarded``; then, with ``bad_stack_read``, a read above the frame pointer (the
    verifier's "invalid read from stack")."""
    b = BtfBuilder()
    f = b.add_func(KFUNC, b.add_func_proto(0, []))
    btf = Btf.from_bytes(b.build(), name="cause")
    insns = b""
    fixups = []
    if guarded:  # r1 = &KFUNC (ksym ld_imm64: 0 when unresolved); if r1 == 0 goto +1
        fixups.append(Fixup(FixupKind.KSYM, 0, extern=KFUNC))
        insns += asm.ld_imm64(1) + asm.jeq_imm(1, 0, 1)
    fixups.append(Fixup(FixupKind.KFUNC_CALL, len(insns) // 8, extern=KFUNC))
    insns += asm.kfunc_call()
    if bad_stack_read:
        insns += asm.ldx_dw(0, 10, 8)
    insns += asm.ret(0)
    prog = ProgramSpec(
        name="cause",
        section="syscall",
        prog_type=bpf_uapi.ProgType.SYSCALL,
        expected_attach_type=0,
        attach_to="",
        sleepable=True,
        autoload=True,
        insns=insns,
        fixups=tuple(fixups),
    )
    ext = ExternSpec(KFUNC, KFUNC, ExternKind.KFUNC, True, f, f + 1)
    return ObjectSpec("cause", "GPL", 0, btf, (prog,), (), (ext,))


@pytest.fixture(scope="module")
def kernel() -> StaticKernelBtfs:
    return StaticKernelBtfs(Btf.from_file(SYS_VMLINUX, name="vmlinux"))


def test_guarded_absent_kfunc_follows_the_real_error(kernel: StaticKernelBtfs) -> None:
    with pytest.raises(ProgramLoadError) as info:
        load_object(_spec(guarded=True, bad_stack_read=True), kernel)
    msg = str(info.value)
    assert msg.startswith("program cause: BPF_PROG_LOAD failed with EACCES"), msg
    assert "invalid read from stack" in msg.split("[")[0], msg
    assert msg.endswith(
        f"[absent from the kernel (searched vmlinux) but not where the verifier failed: "
        f"kfunc {KFUNC}]"
    ), msg
    assert "unknown#2002000000" not in (info.value.verifier_log or "")


def test_guarded_absent_kfunc_alone_loads(kernel: StaticKernelBtfs) -> None:
    with load_object(_spec(guarded=True, bad_stack_read=False), kernel) as obj:
        assert not obj.externs[KFUNC].resolved
        assert "cause" in obj.programs


def test_reached_absent_kfunc_leads(kernel: StaticKernelBtfs) -> None:
    with pytest.raises(ProgramLoadError) as info:
        load_object(_spec(guarded=False, bad_stack_read=True), kernel)
    msg = str(info.value)
    assert msg.startswith(f"program cause: not found (searched vmlinux): kfunc {KFUNC}: "), msg
    assert "[" not in msg, msg  # nothing unreached to add
    assert "unknown#2002000000" in (info.value.verifier_log or "")


def test_compiled_object_leads_with_the_verifier(kernel: StaticKernelBtfs) -> None:
    """weak_cause.bpf.o: its weak kfunc sits behind ``if (kfunc)``, its verifier error (a
    map value read without the NULL check) comes after; the message leads with the latter."""
    obj = REPO / "build" / "tests" / "bpf" / "weak_cause.bpf.o"
    if not obj.is_file():
        missing_build_output(obj, "test-objects")
    spec = open_object(obj)
    with pytest.raises(ProgramLoadError) as info:
        load_object(spec, kernel)
    msg = str(info.value)
    first, _, rest = msg.partition(" [")
    assert first.startswith("program weak_then_null: BPF_PROG_LOAD failed with EACCES"), msg
    assert "invalid mem access 'map_value_or_null'" in first, msg
    assert "ssd_no_such_kfunc_zz" not in first, msg
    assert rest.startswith("absent from the kernel") and "kfunc ssd_no_such_kfunc_zz" in rest, msg
    # the verifier never reached the poisoned call: the guard pruned it
    assert "unknown#2002000000" not in (info.value.verifier_log or "")
