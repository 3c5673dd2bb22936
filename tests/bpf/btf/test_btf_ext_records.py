"""func_info and line_info kept as undecoded ``.BTF.ext`` records until load.

The opener keeps each function's records as a slice of its section's words
(:class:`~schedswitchd.bpf.spec.ExtInfo`) and re-bases them only when the loader asks for
the packed records. These tests pin what that must keep: the packed records equal the
decoded ones, longer records of a newer compiler are cut to the kernel's fields, records
out of file order are sorted as before, and a misaligned record is still refused at open.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.ext import parse_btf_ext
from schedswitchd.bpf.elf import read_elf
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.errors import ObjectError
from schedswitchd.kernel.spec_cache import SpecCache

Obj = Callable[[str], Path]
_HDR = struct.Struct("<HBBIIIII")


def _records(spec: ObjectSpec) -> dict[str, tuple[object, object]]:
    return {p.name: (p.func_info, p.line_info) for p in spec.programs}


def test_packed_records_are_the_decoded_records(bpf_object: Obj) -> None:
    spec = open_object(bpf_object("shared_subprogs"))
    assert any(len(p.func_info) > 1 for p in spec.programs)  # programs with subprograms
    for p in spec.programs:
        assert p.func_info and p.line_info
        assert p.ext_info.func_info_bytes() == b"".join(struct.pack("=II", *f) for f in p.func_info)
        assert p.ext_info.line_info_bytes() == b"".join(
            struct.pack("=IIII", *li) for li in p.line_info
        )
        # one record per function copy, at its start; line info inside the program
        assert p.func_info[0].insn_idx == 0
        assert all(0 <= li.insn_idx < p.insn_count for li in p.line_info)


def test_ext_info_compares_by_records(bpf_object: Obj) -> None:
    a = open_object(bpf_object("shared_subprogs"))
    b = open_object(bpf_object("shared_subprogs"))
    assert a.programs[0].ext_info is not b.programs[0].ext_info
    assert a.programs[0].ext_info == b.programs[0].ext_info
    assert hash(a.programs[0].ext_info) == hash(b.programs[0].ext_info)
    assert a.programs[0].ext_info != a.programs[1].ext_info


def _ext(groups: list[tuple[int, int, list[tuple[int, ...]]]]) -> bytes:
    """A .BTF.ext with one func_info block of ``(name_off, rec_size, records)`` groups."""
    rec_size = groups[0][1]
    blk = struct.pack("<I", rec_size)
    for name_off, size, recs in groups:
        assert size == rec_size
        blk += struct.pack("<II", name_off, len(recs))
        for r in recs:
            blk += struct.pack(f"<{size // 4}I", *r)
    return _HDR.pack(0xEB9F, 1, 0, _HDR.size, 0, len(blk), len(blk), 0) + blk


def test_longer_records_are_cut_to_the_kernels_fields() -> None:
    # a 12-byte func_info record (a field appended by a newer compiler), two groups of
    # one section: the records keep insn_off and type_id, in file order
    data = _ext([(1, 12, [(0, 5, 99), (16, 6, 98)]), (1, 12, [(40, 7, 97)])])
    ext = parse_btf_ext(data, {1: ".text"}.__getitem__)
    recs = ext.func_info[".text"]
    assert recs.width == 2
    assert recs.insn_off == [0, 16, 40]
    assert recs.words.tolist() == [0, 5, 16, 6, 40, 7]
    assert ext.line_info == {}


def _line_info_group(data: bytes, section: str) -> tuple[int, int, int]:
    """File offset of ``section``'s first line_info record, the record size and count."""
    elf = read_elf(data)
    btf_sec, ext_sec = elf.section_by_name(".BTF"), elf.section_by_name(".BTF.ext")
    assert btf_sec is not None and ext_sec is not None
    (hdr_len,) = struct.unpack_from("<I", btf_sec.data, 4)  # struct btf_header
    str_off, _str_len = struct.unpack_from("<II", btf_sec.data, 16)
    strings = btf_sec.data[hdr_len + str_off :]
    base = data.index(ext_sec.data)
    _m, _v, _f, ext_hdr, _fo, _fl, li_off, li_len = _HDR.unpack_from(ext_sec.data)
    pos = ext_hdr + li_off
    end = pos + li_len
    (rec_size,) = struct.unpack_from("<I", ext_sec.data, pos)
    pos += 4
    while pos < end:
        name_off, num = struct.unpack_from("<II", ext_sec.data, pos)
        name = strings[name_off : strings.index(b"\0", name_off)].decode()
        if name == section:
            return base + pos + 8, rec_size, num
        pos += 8 + num * rec_size
    raise AssertionError(f"no line_info for {section}")


def test_records_out_of_file_order_are_sorted(bpf_object: Obj) -> None:
    raw = bpf_object("shared_subprogs").read_bytes()
    want = _records(open_object(raw))
    at, size, num = _line_info_group(raw, ".text")
    assert num > 2
    moved = bytearray(raw)
    first, last = at, at + (num - 1) * size
    moved[first : first + size], moved[last : last + size] = (
        raw[last : last + size],
        raw[first : first + size],
    )
    assert bytes(moved) != raw
    assert _records(open_object(bytes(moved))) == want


def test_misaligned_line_info_is_refused_when_linked(bpf_object: Obj, tmp_path: Path) -> None:
    """A function's records are checked when a program pulling it in is linked: at the
    program's first use, by ``link_programs``, and so by the daemon's open (``SpecCache``),
    before any switch -- linking moved from ``open_object`` to first use (as libbpf's)."""
    raw = bytearray(bpf_object("shared_subprogs").read_bytes())
    at, size, num = _line_info_group(bytes(raw), ".text")
    (off,) = struct.unpack_from("<I", raw, at + size * (num // 2))
    struct.pack_into("<I", raw, at + size * (num // 2), off + 4)
    misaligned = r"line_info record at offset \d+ of .* is misaligned"
    spec = open_object(bytes(raw))
    with pytest.raises(ObjectError, match=misaligned):
        spec.link_programs()
    with pytest.raises(ObjectError, match=misaligned):  # again: a failed link is not kept
        spec.link_programs()
    path = tmp_path / "misaligned.bpf.o"
    path.write_bytes(raw)
    with pytest.raises(ObjectError, match=misaligned):
        SpecCache().open(path)
