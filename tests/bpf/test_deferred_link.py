"""Programs are linked at first use, not by ``open_object`` (as libbpf links at load): the
linked fields are the same whichever program or field is read first, a malformed program
is refused at that use, by ``ObjectSpec.link_programs`` and by the daemon's open
(``SpecCache``), with open's error naming, and a deferred program behaves as the frozen
dataclass it is (comparison, ``dataclasses.replace``, copies, pickling)."""

from __future__ import annotations

import copy
import dataclasses
import gc
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf.elf import read_elf
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import LinkedCode, ObjectSpec, ProgramSpec
from schedswitchd.errors import ObjectError
from schedswitchd.kernel.spec_cache import SpecCache
from tests.corpus import corpus_object

Obj = Callable[[str], Path]


def _linked(spec: ObjectSpec) -> list[tuple[object, ...]]:
    return [
        (p.name, p.insns, p.fixups, p.func_info, p.line_info, p.core_relos, p.subprograms)
        for p in spec.programs
    ]


def test_open_leaves_programs_unlinked_until_used(bpf_object: Obj) -> None:
    spec = open_object(bpf_object("shared_subprogs"))
    assert len(spec.programs) > 1
    assert not any(p.is_linked for p in spec.programs)
    first = spec.programs[0]
    assert first.insn_count > 0  # reading a linked field links that program only
    assert first.is_linked
    assert not any(p.is_linked for p in spec.programs[1:])
    assert spec.link_programs() is spec
    assert all(p.is_linked for p in spec.programs)


def _same_in_any_order(path: Path) -> None:
    in_order = open_object(path).link_programs()
    reverse = open_object(path)
    for p in reversed(reverse.programs):
        assert p.core_relos is not None  # any linked field links the program
    assert _linked(reverse) == _linked(in_order)
    assert reverse.programs == in_order.programs
    assert any(p.subprograms for p in in_order.programs)


@pytest.mark.parametrize("name", ["shared_subprogs", "subprogs"])
def test_linking_order_does_not_change_the_result(bpf_object: Obj, name: str) -> None:
    """The linker relocates each shared ``.text`` function once, for the first program that
    pulls it in: reading the programs in reverse order, one field each, gives the same
    layout, fixups and records as linking them in order."""
    _same_in_any_order(bpf_object(name))


@pytest.mark.parametrize("name", ["k_flatcg", "bpfland", "lavd"])
def test_linking_order_does_not_change_a_corpus_object(name: str) -> None:
    _same_in_any_order(corpus_object(name))


def _misaligned_line_info(raw: bytes) -> bytes:
    """``raw`` with its first line_info record moved 4 bytes off its instruction."""
    ext_sec = read_elf(raw).section_by_name(".BTF.ext")
    assert ext_sec is not None
    # struct btf_ext_header: hdr_len at byte 4, line_info_off at byte 16
    (hdr_len,) = struct.unpack_from("<I", ext_sec.data, 4)
    (li_off,) = struct.unpack_from("<I", ext_sec.data, 16)
    # the line_info block: rec_size, then the first group's sec_name_off and num_info
    first = raw.index(ext_sec.data) + hdr_len + li_off + 4 + 8
    out = bytearray(raw)
    (insn_off,) = struct.unpack_from("<I", out, first)
    struct.pack_into("<I", out, first, insn_off + 4)
    return bytes(out)


MISALIGNED = r"line_info record at offset \d+ of .* is misaligned"


def test_a_malformed_program_is_refused_where_it_is_linked(bpf_object: Obj, tmp_path: Path) -> None:
    bad = _misaligned_line_info(bpf_object("shared_subprogs").read_bytes())
    path = tmp_path / "bad.bpf.o"
    path.write_bytes(bad)
    spec = open_object(path)  # maps, BTF, relocations are read; code is linked later
    with pytest.raises(ObjectError, match=MISALIGNED) as first:
        spec.link_programs()
    assert str(first.value).startswith(f"{path}: ")  # named as open's errors are
    broken = next(p for p in spec.programs if not p.is_linked)
    with pytest.raises(ObjectError, match=MISALIGNED):
        broken.insns  # noqa: B018  -- the read that links it
    with pytest.raises(ObjectError, match=MISALIGNED) as from_bytes:
        open_object(bad).link_programs()
    assert not str(from_bytes.value).startswith(str(path))
    with pytest.raises(ObjectError, match=MISALIGNED):  # the daemon's open refuses it
        SpecCache().open(path)


def test_the_daemons_open_links_every_program(bpf_object: Obj) -> None:
    opened = SpecCache().open(bpf_object("shared_subprogs"))
    assert opened.spec.programs
    assert all(p.is_linked for p in opened.spec.programs)


def test_a_deferred_program_is_still_a_frozen_dataclass(bpf_object: Obj) -> None:
    path = bpf_object("subprogs")
    eager = open_object(path).link_programs().programs[0]
    p = open_object(path).programs[0]
    assert not p.is_linked
    assert p == eager and hash(p) == hash(eager)  # comparing links it
    q = open_object(path).programs[0]
    off = dataclasses.replace(q, autoload=False)
    assert not off.autoload and off.insns == eager.insns and off.fixups == eager.fixups
    assert dataclasses.replace(off, autoload=True) == eager
    r = open_object(path).programs[0]
    assert copy.deepcopy(r) == eager and copy.copy(r) == eager
    assert pickle.loads(pickle.dumps(open_object(path).programs[0])) == eager
    assert repr(open_object(path).programs[0]) == repr(eager)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.insns = b""  # type: ignore[misc]
    with pytest.raises(AttributeError):
        getattr(p, "no_such_field")  # noqa: B009
    made = ProgramSpec(p.name, p.section, p.prog_type, p.expected_attach_type, p.attach_to,
                       p.sleepable, p.autoload, *p.link(), btf_func_id=p.btf_func_id)  # fmt: skip
    assert made == eager and made.is_linked
    assert isinstance(made.link(), LinkedCode)


def test_linking_leaves_the_collector_as_it_was(bpf_object: Obj) -> None:
    """``link_programs`` holds the cyclic collector off while it links (as the open does)
    and gives it back as it found it, also when a program does not link."""
    bad = open_object(_misaligned_line_info(bpf_object("shared_subprogs").read_bytes()))
    good = open_object(bpf_object("shared_subprogs"))
    assert gc.isenabled()
    with pytest.raises(ObjectError, match=MISALIGNED):
        bad.link_programs()
    assert gc.isenabled()
    gc.disable()
    try:
        good.link_programs()
        assert not gc.isenabled()
    finally:
        gc.enable()
