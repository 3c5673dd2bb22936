"""CO-RE engine over a real clang object (``tests/bpf/core_kinds.bpf.c``) against the host's
``/sys/kernel/btf/vmlinux``.

Every relocation clang emitted is matched to an expectation computed from bpftool's JSON
dump of vmlinux and of the object (``tests/bpf/core/core_expect.py``); then the patched instructions
are compared slot by slot with what libbpf itself produces for the same object.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf import insn as bpf
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.core.patch import POISON_IMM
from schedswitchd.bpf.core.relo import CoreReloKind
from schedswitchd.bpf.core.relocate import CoreResult, relocate
from schedswitchd.bpf.object import open_object
from tests.bpf.core.core_expect import JsonBtf, bitfield_window, bpftool_types
from tests.libbpf_ref import libbpf_relocated_insns

VMLINUX = Path("/sys/kernel/btf/vmlinux")
pytestmark = pytest.mark.skipif(not VMLINUX.exists(), reason="no kernel BTF on this host")
POISON = bpf.Insn(bpf.CALL, 0, 0, 0, POISON_IMM)
PROG = "core_kinds"


def newer_clang() -> str | None:
    """A clang that can emit TYPE_MATCHES (LLVM >= 15), if one is installed."""
    for major in range(25, 14, -1):
        path = shutil.which(f"clang-{major}")
        if path:
            return path
    return None


@pytest.fixture(scope="module", params=["make", "newer-clang"])
def obj_path(
    request: pytest.FixtureRequest,
    bpf_object: Callable[[str], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """``make test-objects``'s core_kinds.bpf.o (clang 14 on Debian 12: no TYPE_MATCHES),
    and the same source built by clang-16 from the Makefile's packages (all 13 kinds)."""
    made = bpf_object("core_kinds")
    if request.param == "make":
        return made
    clang = newer_clang()
    if clang is None:
        # The Makefile installs clang-16 so that TYPE_MATCHES is checked on a real object.
        pytest.fail(
            "no clang >= 15 installed (make deps installs clang-16): cannot emit TYPE_MATCHES"
        )
    out = tmp_path_factory.mktemp("core_kinds") / "core_kinds.bpf.o"
    src = Path(__file__).parents[1] / "core_kinds.bpf.c"  # tests/bpf/, beside the other objects
    vmlinux_h = made.parents[2] / "host"
    subprocess.run(
        [clang, "-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86", f"-I{vmlinux_h}",
         f"-I{src.parent}", "-c", str(src), "-o", str(out)],
        check=True,
    )  # fmt: skip
    return out


def clang_major(obj: Path) -> int:
    """The major version of the clang that built ``obj`` (from its .comment section)."""
    data = obj.read_bytes()
    at = data.find(b"clang version ")
    assert at >= 0
    return int(data[at + 14 : data.index(b".", at)])


@pytest.fixture(scope="module")
def result(obj_path: Path, vmlinux: Btf) -> CoreResult:
    spec = open_object(obj_path)
    assert spec.btf is not None
    prog = spec.program(PROG)
    return relocate(spec.btf, prog.insns, prog.core_relos, [vmlinux])


def expectations(js: JsonBtf, obj_path: Path) -> dict[tuple[CoreReloKind, str, str], int | None]:
    """(kind, local root type name, access string) -> expected value; None = poisoned.

    Member indices refer to ``struct task_struct___kinds`` in core_kinds.bpf.c:
    0 pid, 1 tgid, 2 flags, 3 comm, 4 no_such_field, 5 sched_reset_on_fork,
    6 init_private_fork_class.
    """
    local = JsonBtf(bpftool_types(obj_path))
    task = js.find("task_struct", "STRUCT")

    def field(name: str) -> int:
        f = js.member(task, name)
        assert f is not None and f.bitfield_size == 0
        return f.bit_offset // 8

    comm = js.member(task, "comm")
    assert comm is not None
    tk = "task_struct___kinds"
    want: dict[tuple[CoreReloKind, str, str], int | None] = {
        (CoreReloKind.FIELD_BYTE_OFFSET, tk, "0:0"): field("pid"),
        (CoreReloKind.FIELD_EXISTS, tk, "0:0"): 1,
        (CoreReloKind.FIELD_EXISTS, tk, "0:4"): 0,
        (CoreReloKind.FIELD_BYTE_SIZE, tk, "0:3"): comm.size,
        (CoreReloKind.FIELD_BYTE_OFFSET, tk, "0:4"): None,  # the guarded read of the missing field
        (CoreReloKind.TYPE_ID_LOCAL, tk, "0"): local.find(tk, "STRUCT")["id"],
        (CoreReloKind.TYPE_ID_TARGET, "task_struct", "0"): task["id"],
        (CoreReloKind.TYPE_EXISTS, "task_struct", "0"): 1,
        (CoreReloKind.TYPE_EXISTS, "no_such_struct___kinds", "0"): 0,
        (CoreReloKind.TYPE_SIZE, "task_struct", "0"): task["size"],
        (CoreReloKind.ENUMVAL_EXISTS, "pid_type", "1"): 1,
        (CoreReloKind.ENUMVAL_EXISTS, "pid_type___kinds", "1"): 0,
        (CoreReloKind.ENUMVAL_VALUE, "pid_type___kinds", "0"): js.enum_value(
            "pid_type", "PIDTYPE_SID"
        ),
        (CoreReloKind.TYPE_MATCHES, "list_head", "0"): 1,
    }
    for access, name in (("0:5", "sched_reset_on_fork"), ("0:6", "init_private_fork_class")):
        f = js.member(task, name)
        assert f is not None and f.bitfield_size > 0
        off, size, lshift, rshift = bitfield_window(f)
        want[(CoreReloKind.FIELD_BYTE_OFFSET, tk, access)] = off
        want[(CoreReloKind.FIELD_BYTE_SIZE, tk, access)] = size
        want[(CoreReloKind.FIELD_LSHIFT_U64, tk, access)] = lshift
        want[(CoreReloKind.FIELD_RSHIFT_U64, tk, access)] = rshift
        want[(CoreReloKind.FIELD_SIGNED, tk, access)] = 0
    return want


def patched_value(insns: bytes, idx: int) -> int:
    ins = bpf.decode(insns, idx)
    if ins.is_ld_imm64:
        return (ins.imm & 0xFFFFFFFF) | ((bpf.decode(insns, idx + 1).imm & 0xFFFFFFFF) << 32)
    if ins.cls in (bpf.CLASS_LDX, bpf.CLASS_ST, bpf.CLASS_STX):
        return ins.off
    return ins.imm


def test_every_relocation_matches_bpftool(
    result: CoreResult, js: JsonBtf, obj_path: Path, vmlinux: Btf
) -> None:
    spec = open_object(obj_path)
    assert spec.btf is not None
    want = expectations(js, obj_path)
    seen_kinds = set()
    for r in result.results:
        name = spec.btf.type_name(r.relo.type_id)
        key = (r.kind, name, r.relo.access)
        assert key in want, f"unexpected relocation {key}"
        seen_kinds.add(r.kind)
        if want[key] is None:
            assert r.poisoned and bpf.decode(result.insns, r.relo.insn_idx) == POISON
        else:
            assert not r.poisoned
            assert (r.target_value, patched_value(result.insns, r.relo.insn_idx)) == (
                want[key],
                want[key],
            ), key
    if clang_major(obj_path) >= 15:
        assert seen_kinds == set(CoreReloKind)
    else:
        # clang < 15 cannot emit TYPE_MATCHES (core_kinds.bpf.c says so); the engine's
        # tests cover it with hand-built relocations.
        assert seen_kinds == set(CoreReloKind) - {CoreReloKind.TYPE_MATCHES}
    assert result.consulted == ("vmlinux",)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="libbpf loads the object: needs root")
def test_same_instructions_as_libbpf(result: CoreResult, obj_path: Path) -> None:
    original = open_object(obj_path).program(PROG).insns
    theirs = libbpf_relocated_insns(obj_path)[PROG]
    assert len(theirs) == len(result.insns)
    for r in result.results:
        idx = r.relo.insn_idx
        slots = 2 if bpf.decode(original, idx).is_ld_imm64 else 1
        for i in range(idx, idx + slots):
            assert bpf.decode(result.insns, i) == bpf.decode(theirs, i), (r.kind, r.relo, i)
