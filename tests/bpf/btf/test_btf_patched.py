"""``Btf.patched``: the fixed-up object BTF takes over the record layout and the unchanged
decoded types of the object's own ``.BTF`` instead of scanning and decoding again. Whatever
it took over must be what a fresh parse of the same bytes gives, for every corpus object
and the test objects that carry BTF."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.fixup import fixup_object_btf
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.elf import read_elf
from schedswitchd.bpf.externs import collect_externs
from schedswitchd.bpf.spec import ExternKind
from schedswitchd.errors import BtfError
from tests.corpus import OBJECTS, corpus_object

TEST_OBJECTS = ("maps", "globals", "kconfig", "ksyms", "struct_ops", "subprogs", "arena")


def _check(path: Path) -> None:
    elf = read_elf(path.read_bytes())
    sec = elf.section_by_name(".BTF")
    assert sec is not None
    orig = Btf.from_bytes(sec.data, name="o")
    externs, kconfig_size = collect_externs(elf, orig)
    kcfg = {e.name: (e.offset, e.size) for e in externs if e.kind is ExternKind.KCONFIG}
    for tid in orig.own_ids():  # decode everything, so that every type could be taken over
        orig.type(tid)
    fixed = fixup_object_btf(orig, elf, kcfg, kconfig_size)
    patched = Btf.patched(fixed, orig, name="o")
    fresh = Btf.from_bytes(fixed, name="o")
    assert (patched.start_id, patched.end_id) == (fresh.start_id, fresh.end_id)
    assert patched._offs == fresh._offs
    assert patched._tops == fresh._tops
    kept = 0
    for tid in fresh.own_ids():
        kept += tid in patched._cache
        assert patched.type(tid) == fresh.type(tid), tid
    assert kept > 0  # the unchanged types were taken over, not decoded again


@pytest.mark.parametrize("name", OBJECTS)
def test_patched_matches_fresh_parse_corpus(name: str) -> None:
    _check(corpus_object(name))


@pytest.mark.parametrize("name", TEST_OBJECTS)
def test_patched_matches_fresh_parse_test_objects(
    name: str, bpf_object: Callable[[str], Path]
) -> None:
    _check(bpf_object(name))


def test_patched_refuses_fewer_types() -> None:
    # a "patched" BTF whose type section is shorter than the original's is not one
    big = _raw(
        [(1 << 24, 4, (1 << 24) | 32), (1 << 24, 8, (1 << 24) | 64)],  # two INTs
    )
    small = _raw([(1 << 24, 4, (1 << 24) | 32)])
    with pytest.raises(BtfError):
        Btf.patched(small, Btf.from_bytes(big))


def _raw(ints: list[tuple[int, int, int]]) -> bytes:
    import struct

    types = b"".join(struct.pack("<IIII", 1, info, size, enc) for info, size, enc in ints)
    strings = b"\0i\0"
    hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return hdr + types + strings
