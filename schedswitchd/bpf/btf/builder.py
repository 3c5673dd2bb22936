"""Building raw BTF bytes: for tests, fuzzing and sanitising objects before load.

Encoding per kernel doc ``Documentation/bpf/btf.rst`` / UAPI ``include/uapi/linux/btf.h``:
24-byte header, then the type section, then the string section, little-endian (host order on
x86). With a ``base`` the result is split BTF: ids continue at ``base.end_id`` and string
offsets after the base's string space; the split string section holds only new strings.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterable, Sequence

from schedswitchd.bpf.btf.reader import BTF_MAGIC, Btf
from schedswitchd.bpf.btf.types import FUNC_GLOBAL, VAR_GLOBAL_ALLOCATED, Kind
from schedswitchd.errors import BtfError

__all__ = ["BtfBuilder"]

_U32 = 0xFFFFFFFF


class BtfBuilder:
    """Accumulates types and strings, then :meth:`build` returns raw BTF bytes.

    Every ``add_*`` returns the new type's id. Sizes are bytes; member offsets are bits.
    Values that do not fit their fields raise ``BtfError``; referenced ids are *not* checked
    (tests build deliberately broken BTF through :meth:`add_raw`).
    """

    def __init__(self, base: Btf | None = None) -> None:
        self.base = base
        self._first_id = base.end_id if base is not None else 1
        self._str_base = base.start_str_off + base._str_len if base is not None else 0
        self._strings = bytearray() if base is not None else bytearray(b"\0")
        self._str_offs: dict[str, int] = {"": 0}
        self._types: list[bytes] = []

    @property
    def next_id(self) -> int:
        """The id the next added type will get."""
        return self._first_id + len(self._types)

    def add_string(self, s: str) -> int:
        """Offset of ``s`` in the (split-aware) string space, adding it if new."""
        off = self._str_offs.get(s)
        if off is None:
            data = s.encode()
            if b"\0" in data:
                raise BtfError(f"string {s!r} contains NUL", where="builder")
            off = self._str_base + len(self._strings)
            self._strings += data + b"\0"
            self._str_offs[s] = off
        return off

    def add_raw(
        self,
        kind: int,
        name: str | int,
        vlen: int,
        kflag: bool,
        size_or_type: int,
        tail: Iterable[int] = (),
    ) -> int:
        """Append one record as given: ``kind`` (any 5-bit value), ``name`` (string or raw
        offset), ``vlen``, ``kflag``, the size/type word and the following u32 words."""
        name_off = name if isinstance(name, int) else self.add_string(name)
        if not 0 <= vlen <= 0xFFFF or not 0 <= kind <= 0x1F:
            raise BtfError(f"vlen {vlen} / kind {kind} out of range", where="builder")
        info = (int(kflag) << 31) | (kind << 24) | vlen
        words = [name_off, info, size_or_type, *tail]
        for w in words:
            if not 0 <= w <= _U32:
                raise BtfError(f"value {w} does not fit a u32 field", where="builder")
        self._types.append(struct.pack(f"<{len(words)}I", *words))
        return self.next_id - 1

    # --- one method per kind ----------------------------------------------------------------

    def add_int(
        self,
        name: str,
        size: int,
        signed: bool = False,
        *,
        encoding: int | None = None,
        bits: int | None = None,
        offset: int = 0,
    ) -> int:
        """INT of ``size`` bytes; ``encoding`` (``INT_*`` mask) overrides ``signed``."""
        enc = encoding if encoding is not None else int(signed)
        nbits = bits if bits is not None else size * 8
        return self.add_raw(Kind.INT, name, 0, False, size, [(enc << 24) | (offset << 16) | nbits])

    def add_ptr(self, type_id: int) -> int:
        """PTR to ``type_id``."""
        return self.add_raw(Kind.PTR, "", 0, False, type_id)

    def _add_composite(
        self, kind: Kind, name: str, size: int, members: Sequence[tuple[str, int, int, int]]
    ) -> int:
        kflag = any(bits for _, _, _, bits in members)
        tail: list[int] = []
        for m_name, m_type, bit_off, bits in members:
            if kflag:
                if bit_off > 0xFFFFFF or bits > 0xFF:
                    raise BtfError("bitfield offset/size does not fit", where=f"member {m_name}")
                bit_off |= bits << 24
            tail += [self.add_string(m_name), m_type, bit_off]
        return self.add_raw(kind, name, len(members), kflag, size, tail)

    def add_struct(
        self, name: str, size: int, members: Sequence[tuple[str, int, int, int]] = ()
    ) -> int:
        """STRUCT of ``size`` bytes; members ``(name, type_id, bit_offset, bitfield_size)``
        (kind_flag set when any bitfield_size is non-zero)."""
        return self._add_composite(Kind.STRUCT, name, size, members)

    def add_union(
        self, name: str, size: int, members: Sequence[tuple[str, int, int, int]] = ()
    ) -> int:
        """UNION, members as for :meth:`add_struct`."""
        return self._add_composite(Kind.UNION, name, size, members)

    def add_enum(
        self, name: str, size: int, values: Sequence[tuple[str, int]], signed: bool = False
    ) -> int:
        """ENUM of ``size`` bytes (1, 2, 4); values stored as 32 bits."""
        tail: list[int] = []
        for v_name, v in values:
            tail += [self.add_string(v_name), v & _U32]
        return self.add_raw(Kind.ENUM, name, len(values), signed, size, tail)

    def add_enum64(
        self, name: str, size: int, values: Sequence[tuple[str, int]], signed: bool = False
    ) -> int:
        """ENUM64 of ``size`` bytes; values stored as lo/hi 32-bit halves."""
        tail: list[int] = []
        for v_name, v in values:
            v &= (1 << 64) - 1
            tail += [self.add_string(v_name), v & _U32, v >> 32]
        return self.add_raw(Kind.ENUM64, name, len(values), signed, size, tail)

    def add_fwd(self, name: str, is_union: bool = False) -> int:
        """FWD declaration of a struct (or a union)."""
        return self.add_raw(Kind.FWD, name, 0, is_union, 0)

    def add_typedef(self, name: str, type_id: int) -> int:
        """TYPEDEF ``name`` for ``type_id``."""
        return self.add_raw(Kind.TYPEDEF, name, 0, False, type_id)

    def add_const(self, type_id: int) -> int:
        """CONST of ``type_id``."""
        return self.add_raw(Kind.CONST, "", 0, False, type_id)

    def add_volatile(self, type_id: int) -> int:
        """VOLATILE of ``type_id``."""
        return self.add_raw(Kind.VOLATILE, "", 0, False, type_id)

    def add_restrict(self, type_id: int) -> int:
        """RESTRICT of ``type_id``."""
        return self.add_raw(Kind.RESTRICT, "", 0, False, type_id)

    def add_type_tag(self, name: str, type_id: int) -> int:
        """TYPE_TAG ``name`` on ``type_id``."""
        return self.add_raw(Kind.TYPE_TAG, name, 0, False, type_id)

    def add_array(self, type_id: int, index_type: int, nelems: int) -> int:
        """ARRAY of ``nelems`` ``type_id`` indexed by ``index_type``."""
        return self.add_raw(Kind.ARRAY, "", 0, False, 0, [type_id, index_type, nelems])

    def add_func_proto(self, ret: int, params: Sequence[tuple[str, int]] = ()) -> int:
        """FUNC_PROTO returning ``ret`` with ``(name, type_id)`` params (``("", 0)`` = ``...``)."""
        tail: list[int] = []
        for p_name, p_type in params:
            tail += [self.add_string(p_name), p_type]
        return self.add_raw(Kind.FUNC_PROTO, "", len(params), False, ret, tail)

    def add_func(self, name: str, proto: int, linkage: int = FUNC_GLOBAL) -> int:
        """FUNC ``name`` of FUNC_PROTO ``proto``; ``linkage`` is ``FUNC_*`` (kept in vlen)."""
        return self.add_raw(Kind.FUNC, name, linkage, False, proto)

    def add_var(self, name: str, type_id: int, linkage: int = VAR_GLOBAL_ALLOCATED) -> int:
        """VAR ``name`` of ``type_id``; ``linkage`` is ``VAR_*``."""
        return self.add_raw(Kind.VAR, name, 0, False, type_id, [linkage])

    def add_datasec(self, name: str, size: int, vars: Sequence[tuple[int, int, int]] = ()) -> int:
        """DATASEC ``name`` of ``size`` bytes; entries ``(type_id, offset, size)`` in bytes."""
        tail: list[int] = []
        for v_type, v_off, v_size in vars:
            tail += [v_type, v_off, v_size]
        return self.add_raw(Kind.DATASEC, name, len(vars), False, size, tail)

    def add_float(self, name: str, size: int) -> int:
        """FLOAT of ``size`` bytes."""
        return self.add_raw(Kind.FLOAT, name, 0, False, size)

    def add_decl_tag(self, name: str, type_id: int, component_idx: int = -1) -> int:
        """DECL_TAG ``name`` on ``type_id`` (``component_idx`` -1 = the whole type)."""
        return self.add_raw(Kind.DECL_TAG, name, 0, False, type_id, [component_idx & _U32])

    # --- output -------------------------------------------------------------------------------

    def build(self) -> bytes:
        """Raw BTF: header (hdr_len 24, types at 0, strings right after), types, strings."""
        types = b"".join(self._types)
        header = struct.pack(
            "<HBBIIIII", BTF_MAGIC, 1, 0, 24, 0, len(types), len(types), len(self._strings)
        )
        if sys.byteorder != "little":  # pragma: no cover - the project targets x86-64
            raise BtfError("BtfBuilder writes little-endian BTF only", where="builder")
        return header + types + bytes(self._strings)
