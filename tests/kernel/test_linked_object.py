"""An object linked from two files by ``bpftool gen object`` (build/tests/bpf/linked.bpf.o from
tests/bpf/linked/*.bpf.c): statics of the same name in both files keep the DATASEC offsets
the linker gave them, the host kernel's ``BPF_BTF_LOAD`` accepts the fixed-up BTF, and the
program sees each file's own variables when run (``BPF_PROG_TEST_RUN``)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import load_object
from tests.build_outputs import missing_build_output

OBJ = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf" / "linked.bpf.o"


def _spec() -> ObjectSpec:
    if not OBJ.is_file():
        missing_build_output(OBJ, "test-objects")
    return open_object(OBJ)


def test_same_named_statics_keep_their_own_offsets() -> None:
    spec = _spec()
    data = [v for v in spec.map(".data").variables if v.name == "hits"]
    rodata = [v for v in spec.map(".rodata").variables if v.name == "scale"]
    assert len(data) == 2 and len(rodata) == 2
    assert len({v.offset for v in data}) == 2 and len({v.offset for v in rodata}) == 2
    initial = spec.map(".data").data
    assert initial is not None
    # each file's initialiser sits at its own VAR's offset (7 in main, 3 in lib)
    assert sorted(struct.unpack_from("<I", initial, v.offset)[0] for v in data) == [3, 7]


@pytest.mark.root
def test_linked_object_btf_loads_and_program_runs(bpffs: Path) -> None:
    spec = _spec()
    assert spec.btf is not None
    syscall.btf_load(spec.btf.raw).close()  # the kernel's BTF checker: "Invalid offset" before
    registry = KernelBtfRegistry()
    with load_object(spec, registry.targets(spec.kmod_btfs), pin_root=bpffs) as obj:
        prog = obj.programs["run_linked"].fd
        # main: hits 7 + add, scale 1000; lib: hits 3 + 2 * add, scale 1
        assert syscall.prog_test_run(prog, ctx_in=struct.pack("<Q", 5)).retval == 12 * 1000 + 13
        assert syscall.prog_test_run(prog, ctx_in=struct.pack("<Q", 1)).retval == 13 * 1000 + 15
