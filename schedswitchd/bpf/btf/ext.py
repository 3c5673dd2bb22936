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
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from schedswitchd.errors import ObjectError

MAGIC = 0xEB9F
FUNC_INFO_MIN = 8
LINE_INFO_MIN = 16
CORE_RELO_MIN = 16


class ExtFuncInfo(NamedTuple):
    """``bpf_func_info`` with ``insn_off`` in bytes from the section start."""

    insn_off: int
    type_id: int


class ExtLineInfo(NamedTuple):
    """``bpf_line_info`` with ``insn_off`` in bytes from the section start."""

    insn_off: int
    file_name_off: int
    line_off: int
    line_col: int


class ExtCoreRelo(NamedTuple):
    """``bpf_core_relo`` with ``insn_off`` in bytes and the access string resolved."""

    insn_off: int
    type_id: int
    access: str
    kind: int


@dataclass(frozen=True, slots=True)
class BtfExt:
    """All records, keyed by ELF section name."""

    func_info: dict[str, tuple[ExtFuncInfo, ...]]
    line_info: dict[str, tuple[ExtLineInfo, ...]]
    core_relos: dict[str, tuple[ExtCoreRelo, ...]]


T = TypeVar("T")

_HDR = struct.Struct("<HBBIIIII")
_CORE_HDR = struct.Struct("<II")
# The fields the loader reads of each record (their first bytes; a larger rec_size from a
# newer compiler appends fields, which are skipped).
_FUNC_INFO = struct.Struct("<II")
_LINE_INFO = struct.Struct("<IIII")
_CORE_RELO = struct.Struct("<IIII")


def parse_btf_ext(data: bytes, string: Callable[[int], str]) -> BtfExt:
    """Parse ``.BTF.ext`` bytes; ``string(off)`` resolves a ``.BTF`` string offset (it may
    raise :class:`~schedswitchd.errors.BtfError`).

    Raises :class:`ObjectError` for a bad header, blocks outside the section, record sizes
    below the minimum or not multiples of 4, or truncated groups.
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

    def fi(rec: tuple[int, ...], _name: str) -> ExtFuncInfo:
        return ExtFuncInfo(rec[0], rec[1])

    def li(rec: tuple[int, ...], _name: str) -> ExtLineInfo:
        return ExtLineInfo(rec[0], rec[1], rec[2], rec[3])

    def cr(rec: tuple[int, ...], name: str) -> ExtCoreRelo:
        off, tid, acc, kind = rec
        try:
            access = string(acc)
        except Exception as exc:  # BtfError from the string table, or an out-of-range offset
            raise ObjectError(
                f".BTF.ext CO-RE relocation in {name!r} at insn offset {off}: bad access "
                f"string offset {acc}: {exc}"
            ) from exc
        return ExtCoreRelo(off, tid, access, kind)

    return BtfExt(
        func_info=_blocks(body, fi_off, fi_len, _FUNC_INFO, "func_info", string, fi),
        line_info=_blocks(body, li_off, li_len, _LINE_INFO, "line_info", string, li),
        core_relos=_blocks(body, cr_off, cr_len, _CORE_RELO, "core_relo", string, cr),
    )


def _blocks(
    body: bytes,
    off: int,
    length: int,
    record: struct.Struct,
    what: str,
    string: Callable[[int], str],
    make: Callable[[tuple[int, ...], str], T],
) -> dict[str, tuple[T, ...]]:
    min_rec = record.size
    if length == 0:
        return {}
    if off + length > len(body):
        raise ObjectError(f".BTF.ext {what} block [{off}, {off + length}) is outside the section")
    blk = body[off : off + length]
    if len(blk) < 4:
        raise ObjectError(f".BTF.ext {what} block is too short for its record size")
    (rec_size,) = struct.unpack_from("<I", blk)
    if rec_size < min_rec or rec_size % 4:
        raise ObjectError(f".BTF.ext {what} record size {rec_size} is invalid (min {min_rec})")
    pos = 4
    out: dict[str, tuple[T, ...]] = {}
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
        group = blk[pos : pos + num * rec_size]
        if rec_size == record.size:
            recs = tuple(make(rec, name) for rec in record.iter_unpack(group))
        else:
            recs = tuple(make(record.unpack_from(group, i * rec_size), name) for i in range(num))
        pos += num * rec_size
        out[name] = out.get(name, ()) + recs
    return out
