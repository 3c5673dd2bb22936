"""Resizable global sections (scx's ``RESIZE_ARRAY``, libbpf's ``bpf_map__set_value_size``)
through :func:`~schedswitchd.bpf.customize.resize_array_section`, checked by the host
kernel's verifier: build/tests/bpf/resize.bpf.o (tests/bpf/resize.bpf.c) indexes
``.data.slots`` up to ``nr_slots``, which passes only when the section was resized to hold
that many elements."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from schedswitchd.bpf.customize import resize_array_section, set_variable
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.errors import CustomizationError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import ProgramLoadError, load_object
from tests.build_outputs import missing_build_output

OBJ = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf" / "resize.bpf.o"
SLOTS = 6


def _spec() -> ObjectSpec:
    if not OBJ.is_file():
        missing_build_output(OBJ, "test-objects")
    return open_object(OBJ)


def test_resize_grows_value_btf_and_keeps_initial_data() -> None:
    spec = resize_array_section(_spec(), ".data.slots", SLOTS)
    m = spec.map(".data.slots")
    assert m.value_size == 8 * SLOTS
    assert m.data == (5).to_bytes(8, "little")  # a prefix: zeros after it (MapSpec.data)
    var = m.variable("slots")
    assert var is not None and var.size == 8 * SLOTS
    assert spec.btf is not None and spec.btf.size_of(var.type_id) == 8 * SLOTS
    assert spec.btf.size_of(m.value_type_id) == 8 * SLOTS  # the DATASEC
    shrunk = resize_array_section(spec, ".data.slots", 2)
    assert shrunk.map(".data.slots").value_size == 16


def test_resize_refuses_what_cannot_resize() -> None:
    spec = _spec()
    with pytest.raises(CustomizationError, match=r"only \.data\.NAME"):
        resize_array_section(spec, ".rodata", 4)
    with pytest.raises(CustomizationError, match="no data section"):
        resize_array_section(spec, ".data.absent", 4)
    with pytest.raises(CustomizationError, match="positive int"):
        resize_array_section(spec, ".data.slots", 0)


@pytest.mark.root
def test_verifier_accepts_indexing_only_after_resize(bpffs: Path) -> None:
    spec = set_variable(_spec(), "nr_slots", SLOTS)
    registry = KernelBtfRegistry()
    targets = registry.targets(spec.kmod_btfs)
    with pytest.raises(ProgramLoadError) as err:
        load_object(spec, targets, pin_root=bpffs).close()
    assert "invalid access to map value" in (err.value.verifier_log or "")
    resized = resize_array_section(spec, ".data.slots", SLOTS)
    with load_object(resized, targets, pin_root=bpffs) as obj:
        assert syscall.map_info(obj.maps[".data.slots"].fd).value_size == 8 * SLOTS
        prog = obj.programs["bump"].fd
        assert syscall.prog_test_run(prog, ctx_in=struct.pack("<Q", 0)).retval == 6  # 5 + 1
        assert syscall.prog_test_run(prog, ctx_in=struct.pack("<Q", SLOTS - 1)).retval == 1
        assert syscall.prog_test_run(prog, ctx_in=struct.pack("<Q", SLOTS)).retval == 0
        assert struct.unpack(f"<{SLOTS}Q", obj.read_variable("slots")) == (6, 0, 0, 0, 0, 1)
