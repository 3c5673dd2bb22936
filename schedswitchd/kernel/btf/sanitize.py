"""Rewrite an object's BTF so an older kernel accepts it, touching only what it lacks.

The rules are libbpf's ``bpf_object__sanitize_btf`` (``tools/lib/bpf/libbpf.c``); records
are rewritten in place with the same size, so every type id stays valid (func_info,
line_info, map key/value ids still point at the same records). Encoding: kernel doc
``Documentation/bpf/btf.rst``. What is rewritten, per missing feature
(:class:`~schedswitchd.kernel.btf.features.BtfFeatures`):

* ``datasec``: VAR -> 1-byte INT; DATASEC -> STRUCT whose members are the variables (name
  with ``.``/``?`` turned into ``_``);
* ``qmark_datasec``: a DATASEC name's leading ``?`` -> ``_``;
* ``decl_tag``: DECL_TAG -> 1-byte INT;
* ``func``: FUNC_PROTO -> 4-byte ENUM (parameters become enumerators), FUNC -> TYPEDEF;
* ``func_global``: FUNC linkage -> static;
* ``float``: FLOAT -> anonymous empty STRUCT of the same size;
* ``type_tag``: TYPE_TAG -> CONST;
* ``enum64``: ENUM loses kind_flag (signedness); ENUM64 -> UNION of an appended 8-byte INT.
"""

from __future__ import annotations

import struct

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Kind
from schedswitchd.errors import BtfError
from schedswitchd.kernel.btf.features import BtfFeatures

_HDR = struct.Struct("<HBBIIIII")
_U32 = struct.Struct("<I")


def _info(kind: Kind, vlen: int = 0, kflag: bool = False) -> int:
    return (int(kflag) << 31) | (int(kind) << 24) | vlen


def needs_sanitizing(btf: Btf, features: BtfFeatures) -> bool:
    """Whether :func:`sanitize_btf` would change ``btf`` under ``features``."""
    return sanitize_btf(btf, features) != bytes(btf.raw)


def sanitize_btf(btf: Btf, features: BtfFeatures) -> bytes:
    """The raw bytes of ``btf`` rewritten for a kernel with ``features`` (unchanged bytes
    when nothing is missing). Only base (non-split) BTF is supported; ``BtfError`` else."""
    raw = bytearray(btf.raw)
    if btf.base is not None:
        raise BtfError("sanitising split BTF is not supported", where=btf.name)
    magic, _ver, _flags, hdr_len, type_off, type_len, str_off, str_len = _HDR.unpack_from(raw)
    str_start = hdr_len + str_off
    placeholder: int | None = None

    def name_off(rec: int) -> int:
        return int(_U32.unpack_from(raw, rec)[0])

    def put(rec: int, word: int, value: int) -> None:
        _U32.pack_into(raw, rec + 4 * word, value & 0xFFFFFFFF)

    def fix_name(off: int, *, all_chars: bool) -> None:
        i = str_start + off
        while i < len(raw) and raw[i]:
            if raw[i] in b".?" and (all_chars or i == str_start + off):
                raw[i] = ord("_")
            i += 1

    for tid in range(btf.start_id, btf.end_id):
        kind = btf.kind(tid)
        rec = btf.type_offset(tid)
        info = int(_U32.unpack_from(raw, rec + 4)[0])
        vlen = info & 0xFFFF
        if (not features.datasec and kind == Kind.VAR) or (
            not features.decl_tag and kind == Kind.DECL_TAG
        ):
            put(rec, 1, _info(Kind.INT))
            put(rec, 2, 1)
            put(rec, 3, 8)  # BTF_INT_ENC(0, 0, 8)
        elif not features.datasec and kind == Kind.DATASEC:
            fix_name(name_off(rec), all_chars=True)
            put(rec, 1, _info(Kind.STRUCT, vlen))
            for j in range(vlen):
                at = rec + 12 + 12 * j
                var_type, var_off, _size = struct.unpack_from("<III", raw, at)
                var_name = name_off(btf.type_offset(var_type)) if var_type else 0
                if var_off * 8 > 0xFFFFFFFF:  # a member offset is in bits, 32 of them
                    raise BtfError(
                        f"DATASEC entry at byte {var_off} cannot become a struct member (its "
                        "bit offset overflows 32 bits) for a kernel without DATASEC",
                        where=f"type id {tid}",
                    )
                struct.pack_into("<III", raw, at, var_name, var_type, var_off * 8)
        elif not features.qmark_datasec and kind == Kind.DATASEC:
            fix_name(name_off(rec), all_chars=False)
        elif not features.func and kind == Kind.FUNC_PROTO:
            put(rec, 1, _info(Kind.ENUM, vlen))
            put(rec, 2, 4)
        elif not features.func and kind == Kind.FUNC:
            put(rec, 1, _info(Kind.TYPEDEF))
        elif not features.func_global and kind == Kind.FUNC:
            put(rec, 1, _info(Kind.FUNC))
        elif not features.float and kind == Kind.FLOAT:
            put(rec, 0, 0)
            put(rec, 1, _info(Kind.STRUCT))
        elif not features.type_tag and kind == Kind.TYPE_TAG:
            put(rec, 0, 0)
            put(rec, 1, _info(Kind.CONST))
        elif not features.enum64 and kind == Kind.ENUM:
            put(rec, 1, _info(Kind.ENUM, vlen))
        elif not features.enum64 and kind == Kind.ENUM64:
            if placeholder is None:
                placeholder = btf.end_id
            put(rec, 1, _info(Kind.UNION, vlen))
            for j in range(vlen):
                at = rec + 12 + 12 * j
                struct.pack_into("<II", raw, at + 4, placeholder, 0)
    if placeholder is None:
        return bytes(raw)
    # Append the placeholder INT (8 bytes, unsigned, 64 bits) at the end of the type section.
    type_end = hdr_len + type_off + type_len
    extra = struct.pack("<IIII", 0, _info(Kind.INT), 8, 64)
    out = raw[:type_end] + extra + raw[type_end:]
    new_str_off = str_off + len(extra) if str_off >= type_off + type_len else str_off
    _HDR.pack_into(
        out, 0, magic, _ver, _flags, hdr_len, type_off, type_len + len(extra), new_str_off, str_len
    )
    return bytes(out)
