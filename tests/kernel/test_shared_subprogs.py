"""Linking shared ``.text`` subprograms, checked by running the linked programs.

``tests/bpf/shared_subprogs.bpf.c``: three ``SEC("syscall")`` programs reach the same
subprograms (which use a map, ``.data``, ``.rodata``, ``.bss`` and a ``bpf_loop``
callback) in different orders, so every shared function sits at another offset in each
linked program. The linker relocates each function once and re-bases the copies
(:class:`schedswitchd.bpf.subprogs.Linker`); a wrong call offset, a fixup or
``.BTF.ext`` record left at another copy's index, or a callback into the wrong place makes
the verifier refuse a program or a run return the wrong value."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import load_object
from schedswitchd.kernel.syscall import map_update_elem
from tests.build_outputs import missing_build_output

pytestmark = pytest.mark.root

OBJ = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf" / "shared_subprogs.bpf.o"
WEIGHTS = (10, 20, 30, 40)
SCALE, BASE = 3, 100  # the object's .data and .rodata initialisers


def _spec() -> ObjectSpec:
    if not OBJ.is_file():
        missing_build_output(OBJ, "test-objects")
    return open_object(OBJ)


def _mix(x: int, i: int) -> int:
    return SCALE * x + WEIGHTS[i] + BASE


def test_each_program_places_the_shared_functions_in_its_own_order() -> None:
    progs = {p.name: p for p in _spec().programs}
    assert progs["first_mix"].subprograms == ("mix", "bump", "weight")
    assert progs["first_weight"].subprograms == ("weight", "bump", "mix")
    assert progs["looped"].subprograms == ("loop_cb", "mix", "bump", "weight")
    # one func_info record per function, each at the start of its copy
    for p in progs.values():
        assert len(p.func_info) == 1 + len(p.subprograms)
        assert p.func_info[0].insn_idx == 0
        assert all(0 <= li.insn_idx < p.insn_count for li in p.line_info)
        assert all(0 <= fx.insn_idx < p.insn_count for fx in p.fixups)
    # the copies of one function differ only where their position matters
    at = {
        name: {s: p.func_info[k + 1].insn_idx for k, s in enumerate(p.subprograms)}
        for name, p in progs.items()
    }
    assert len({at[name]["bump"] for name in at}) == 3


def test_linked_programs_run_with_the_right_results() -> None:
    registry = KernelBtfRegistry()
    spec = _spec()
    with load_object(
        spec, registry.targets(spec.kmod_btfs), open_btf_object=registry.open_btf_object
    ) as obj:
        fd = obj.maps["weights"].fd
        for i, w in enumerate(WEIGHTS):
            map_update_elem(fd, struct.pack("<I", i), struct.pack("<Q", w))
        assert obj.run_program("first_mix") == _mix(1, 0)
        assert obj.run_program("first_weight") == WEIGHTS[1] + SCALE * 2 + _mix(3, 2)
        assert obj.run_program("looped") == sum(_mix(i, i & 3) for i in range(4)) + SCALE * 5
        # bump ran once per call from any copy: 1 + 2 + (4 + 1)
        assert struct.unpack("<Q", obj.read_variable("calls")) == (8,)
