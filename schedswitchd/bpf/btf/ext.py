""".BTF.ext: per-section func_info, line_info and CO-RE relocation records.

Source: kernel doc ``Documentation/bpf/btf.rst`` section "BTF Extension" and libbpf's
``struct btf_ext_header``. Layout (little endian)::

    u16 magic = 0xeB9F; u8 version = 1; u8 flags; u32 hdr_len;
    u32 func_info_off, func_info_len, line_info_off, line_info_len;
    [u32 core_relo_off, core_relo_len]              (when hdr_len >= 32)

Offsets are relative to the end of the header. Each info block is ``u32 rec_size``
followed by ``{u32 sec_name_off, u32 num_info, rec_size * num_info bytes}`` groups; the
section name is a string of the object's ``.BTF``. Record ``insn_off`` values are byte
offsets inside the ELF section (they become instruction indices when programs are linked).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from schedswitchd.errors import ObjectError

MAGIC = 0xEB9F
FUNC_INFO_MIN = 8
LINE_INFO_MIN = 16
CORE_RELO_MIN = 16


class ExtColumns(NamedTuple):
    """One section's records of one kind, in file order, as columns: ``insn_off`` (bytes
    from the section start) and the record's other fields, one list per field --
    ``(type_id,)`` for func_info, ``(file_name_off, line_off, line_col)`` for line_info,
    ``(type_id, access, kind)`` for CO-RE relocations (``access`` resolved from ``.BTF``'s
    strings). Columns, not a record object each: a scheduler's ``.text`` has tens of
    thousands of line_info records, and the linker only slices them per function."""

    insn_off: list[int]
    fields: tuple[list[Any], ...]


class ExtRecords(NamedTuple):
    """One section's func_info or line_info records, in file order: ``insn_off`` (bytes from
    the section start, one per record) and ``words``, the records themselves as 32-bit
    words, ``width`` per record (2 for func_info: ``insn_off, type_id``; 4 for line_info:
    ``insn_off, file_name_off, line_off, line_col``), so that the records of a function
    are a slice of it handed on undecoded until its program is loaded
    (:class:`~schedswitchd.bpf.spec.ExtInfo`)."""

    insn_off: list[int]
    words: array[int]
    width: int


@dataclass(frozen=True, slots=True)
class BtfExt:
    """All records, keyed by ELF section name."""

    func_info: dict[str, ExtRecords]
    line_info: dict[str, ExtRecords]
    core_relos: dict[str, ExtColumns]


_HDR = struct.Struct("<HBBIIIII")
_CORE_HDR = struct.Struct("<II")
# The fields the loader reads of each record: their first words (a larger rec_size from a
# newer compiler appends fields, which are skipped).
_FUNC_INFO_WORDS = FUNC_INFO_MIN // 4
_LINE_INFO_WORDS = LINE_INFO_MIN // 4
_CORE_RELO_WORDS = CORE_RELO_MIN // 4
_SWAP = sys.byteorder != "little"


def parse_btf_ext(data: bytes, string: Callable[[int], str]) -> BtfExt:
    """Parse ``.BTF.ext`` bytes; ``string(off)`` resolves a ``.BTF`` string offset (it may
    raise :class:`~schedswitchd.errors.BtfError`).

    Raises :class:`ObjectError` for a bad header, blocks outside the section, record sizes
    below the minimum or not multiples of 4, truncated groups, and CO-RE relocations whose
    access string offset is not in ``.BTF``'s strings.
    """
    if len(data) < _HDR.size:
        raise ObjectError(f".BTF.ext is {len(data)} bytes, shorter than its header")
    magic, version, _flags, hdr_len, fi_off, fi_len, li_off, li_len = _HDR.unpack_from(data)
    if magic != MAGIC:
        raise ObjectError(f".BTF.ext magic is {magic:#x}, expected {MAGIC:#x}")
    if version != 1:
        raise ObjectError(f".BTF.ext version {version} is not supported")
    if hdr_len < _HDR.size or hdr_len > len(data):
        raise ObjectError(f".BTF.ext header length {hdr_len} does not fit")
    cr_off = cr_len = 0
    if hdr_len >= _HDR.size + _CORE_HDR.size:
        cr_off, cr_len = _CORE_HDR.unpack_from(data, _HDR.size)
    body = data[hdr_len:]

    def resolve(name: str, cols: ExtColumns) -> None:
        # CO-RE access strings are resolved (and checked) here, for every record: the few
        # hundred a scheduler has are all used when its programs are relocated.
        offs, accs = cols.insn_off, cols.fields[1]
        for i, acc in enumerate(accs):
            try:
                accs[i] = string(acc)
            except Exception as exc:  # BtfError from the string table, or out of range
                raise ObjectError(
                    f".BTF.ext CO-RE relocation in {name!r} at insn offset {offs[i]}: bad "
                    f"access string offset {acc}: {exc}"
                ) from exc

    return BtfExt(
        func_info=_records(body, fi_off, fi_len, _FUNC_INFO_WORDS, "func_info", string),
        line_info=_records(body, li_off, li_len, _LINE_INFO_WORDS, "line_info", string),
        core_relos=_columns(body, cr_off, cr_len, _CORE_RELO_WORDS, "core_relo", string, resolve),
    )


class _Group(NamedTuple):
    """One group of an info block: its section's name and its records as 32-bit words
    (``stride`` words per record, native byte order)."""

    name: str
    words: array[int]
    stride: int


def _groups(
    body: bytes, off: int, length: int, words: int, what: str, string: Callable[[int], str]
) -> list[_Group]:
    """The groups of one info block, each read with one array conversion; checks the block's
    bounds, its record size (at least ``words`` words, a multiple of 4 bytes) and each
    group's header, record count and section name."""
    min_rec = 4 * words
    if length == 0:
        return []
    if off + length > len(body):
        raise ObjectError(f".BTF.ext {what} block [{off}, {off + length}) is outside the section")
    blk = body[off : off + length]
    if len(blk) < 4:
        raise ObjectError(f".BTF.ext {what} block is too short for its record size")
    (rec_size,) = struct.unpack_from("<I", blk)
    if rec_size < min_rec or rec_size % 4:
        raise ObjectError(f".BTF.ext {what} record size {rec_size} is invalid (min {min_rec})")
    stride = rec_size // 4
    pos = 4
    out: list[_Group] = []
    while pos < len(blk):
        if pos + 8 > len(blk):
            raise ObjectError(f".BTF.ext {what} group header at {pos} is truncated")
        name_off, num = struct.unpack_from("<II", blk, pos)
        pos += 8
        if num == 0:
            raise ObjectError(f".BTF.ext {what} group at {pos - 8} has no records")
        if pos + num * rec_size > len(blk):
            raise ObjectError(f".BTF.ext {what} group at {pos - 8} with {num} records is truncated")
        try:
            name = string(name_off)
        except Exception as exc:
            raise ObjectError(
                f".BTF.ext {what} group at {pos - 8}: bad section name offset {name_off}"
            ) from exc
        arr = array("I")
        arr.frombytes(blk[pos : pos + num * rec_size])
        if _SWAP:
            arr.byteswap()
        out.append(_Group(name, arr, stride))
        pos += num * rec_size
    return out


def _records(
    body: bytes, off: int, length: int, words: int, what: str, string: Callable[[int], str]
) -> dict[str, ExtRecords]:
    """func_info or line_info records per section: the first ``words`` words of each record
    (a newer compiler's longer records are cut to the fields the kernel is given), groups of
    one section concatenated in file order."""
    out: dict[str, ExtRecords] = {}
    for name, arr, stride in _groups(body, off, length, words, what, string):
        if stride != words:  # keep the known fields only
            cut = array("I", bytes(4 * words * (len(arr) // stride)))
            for k in range(words):
                cut[k::words] = arr[k::stride]
            arr = cut
        have = out.get(name)
        if have is None:
            out[name] = ExtRecords(arr[0::words].tolist(), arr, words)
        else:
            have.insn_off.extend(arr[0::words])
            have.words.extend(arr)
    return out


def _columns(
    body: bytes,
    off: int,
    length: int,
    words: int,
    what: str,
    string: Callable[[int], str],
    finish: Callable[[str, ExtColumns], None],
) -> dict[str, ExtColumns]:
    """CO-RE relocation records per section, as columns (strided slices of each group's
    words); ``finish(section, columns)`` post-processes a group's columns (its access
    strings)."""
    out: dict[str, ExtColumns] = {}
    for name, arr, stride in _groups(body, off, length, words, what, string):
        cols = ExtColumns(
            arr[0::stride].tolist(), tuple(arr[k::stride].tolist() for k in range(1, words))
        )
        finish(name, cols)
        have = out.get(name)
        if have is None:
            out[name] = cols
        else:
            have.insn_off.extend(cols.insn_off)
            for mine, more in zip(have.fields, cols.fields, strict=True):
                mine.extend(more)
    return out
