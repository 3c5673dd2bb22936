"""The BTF reader: raw BTF bytes -> :class:`Btf`, with lazy decoding and lazy name indexes.

Format: kernel doc ``Documentation/bpf/btf.rst`` and UAPI ``include/uapi/linux/btf.h``. A raw
BTF blob is a 24-byte (or longer) header, a type section of variable-length records (every
field a 32-bit word), and a string section of NUL-terminated strings. Split BTF (a kernel
module's BTF) continues its base: its type ids start at ``base.end_id`` and its string offsets
at the end of the base's string section.

Built for a long-running daemon that keeps vmlinux BTF (~130k types) resident: one pass over
the type section records each type's word offset in an ``array('I')`` and its kind byte in a
``bytearray``; a type becomes a Python object (:mod:`schedswitchd.bpf.btf.types`) only when
asked for, and name indexes are built per kind on first lookup. Files are read with ``mmap``
where the kernel allows it.

``python -m schedswitchd.bpf.btf PATH [--base BASE]`` prints every type as JSON in the shape of
``bpftool btf dump file PATH [-B BASE] format raw -j`` (see :mod:`schedswitchd.bpf.btf.json_dump`).
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import NamedTuple

from schedswitchd.bpf.btf.types import (
    Array,
    BtfType,
    Composite,
    Datasec,
    DeclTag,
    Enum,
    EnumValue,
    Float,
    Func,
    FuncProto,
    Fwd,
    Int,
    Kind,
    Member,
    Param,
    Ref,
    Var,
    VarSecinfo,
    Void,
    essential_name,
)
from schedswitchd.errors import BtfError

__all__ = ["BTF_MAGIC", "Btf"]

BTF_MAGIC = 0xEB9F
_HDR_MIN = 24
_MAX_KIND = int(Kind.ENUM64)

# Record size in 32-bit words by the top byte of ``info`` (kind_flag bit 7, kind bits 0-4):
# _FIXED = header (3 words) + kind-specific fixed part, _PER_VLEN = words per vlen entry.
# Bytes that are not a valid kind get a step so large that the scan stops right after them.
_BAD_STEP = 1 << 40
_KIND_WORDS: dict[int, tuple[int, int]] = {
    Kind.INT: (1, 0),
    Kind.PTR: (0, 0),
    Kind.ARRAY: (3, 0),
    Kind.STRUCT: (0, 3),
    Kind.UNION: (0, 3),
    Kind.ENUM: (0, 2),
    Kind.FWD: (0, 0),
    Kind.TYPEDEF: (0, 0),
    Kind.VOLATILE: (0, 0),
    Kind.CONST: (0, 0),
    Kind.RESTRICT: (0, 0),
    Kind.FUNC: (0, 0),
    Kind.FUNC_PROTO: (0, 2),
    Kind.VAR: (1, 0),
    Kind.DATASEC: (0, 3),
    Kind.FLOAT: (0, 0),
    Kind.DECL_TAG: (1, 0),
    Kind.TYPE_TAG: (0, 0),
    Kind.ENUM64: (0, 3),
}


def _step_tables() -> tuple[tuple[int, ...], tuple[int, ...]]:
    fixed = [_BAD_STEP] * 256
    per = [0] * 256
    for kind, (extra, vlen_words) in _KIND_WORDS.items():
        for top in (int(kind), int(kind) | 0x80):
            fixed[top] = 3 + extra
            per[top] = vlen_words
    return tuple(fixed), tuple(per)


_FIXED, _PER_VLEN = _step_tables()

_MODIFIERS = frozenset({Kind.CONST, Kind.VOLATILE, Kind.RESTRICT, Kind.TYPE_TAG})
_MODS_AND_TYPEDEF = _MODIFIERS | {Kind.TYPEDEF}
_SIZED = frozenset(
    {Kind.INT, Kind.ENUM, Kind.ENUM64, Kind.STRUCT, Kind.UNION, Kind.DATASEC, Kind.FLOAT}
)
_SIZE_THROUGH = frozenset(
    {
        Kind.TYPEDEF,
        Kind.VOLATILE,
        Kind.CONST,
        Kind.RESTRICT,
        Kind.TYPE_TAG,
        Kind.VAR,
        Kind.DECL_TAG,
    }
)
_CACHE_MAX = 4096
_MAX_NESTING = 256
_U32 = 0xFFFFFFFF


#: Name hashes are kept as 32 bits: a collision only costs one more name comparison.
_HASH_MASK = 0xFFFFFFFF
_tuple_new = tuple.__new__


class _NameIndex(NamedTuple):
    """One kind's names: ``hash(name) & _HASH_MASK`` ascending, and the type's position
    (id - start_id) in the same order; equal hashes keep ascending positions."""

    hashes: array[int]
    positions: array[int]


def _s32(v: int) -> int:
    return v - (1 << 32) if v & 0x80000000 else v


def _s64(v: int) -> int:
    return v - (1 << 64) if v & (1 << 63) else v


class Btf:
    """Parsed raw BTF (base or split), decoded lazily.

    Build with :meth:`from_bytes` or :meth:`from_file`. Type ids of this BTF are
    ``range(start_id, end_id)``; lookups of smaller ids (other than 0, ``void``) go to ``base``.
    Every method raises :class:`~schedswitchd.errors.BtfError` (never ``IndexError`` or
    ``RecursionError``) on malformed data or ids out of range; ``where`` names the type id,
    byte offset or section.

    Attributes: ``name`` ("vmlinux", a module name, an object name), ``base`` (the base of a
    split BTF, else ``None``), ``start_id``, ``end_id``, ``start_str_off`` (0, or the length of
    the base's string space for split BTF), ``raw`` (the exact bytes: header, types, strings).
    """

    name: str
    base: Btf | None
    start_id: int
    end_id: int
    start_str_off: int
    raw: bytes | memoryview
    _offs: array[int]  # word offset of each own type's record in the type section
    _tops: bytearray  # top byte of each own type's info word (kind, kind_flag)

    def __init__(
        self,
        data: bytes | mmap.mmap,
        *,
        base: Btf | None,
        name: str,
        like: Btf | None = None,
    ) -> None:
        """Parse ``data``; prefer :meth:`from_bytes` / :meth:`from_file` / :meth:`patched`."""
        self.name = name
        self.base = base
        self._buf = data
        self.raw = data if isinstance(data, bytes) else memoryview(data)
        self.start_id = base.end_id if base is not None else 1
        self.start_str_off = base._str_end_off if base is not None else 0
        self._cache: dict[int, BtfType] = {}
        self._name_index: dict[int, _NameIndex] = {}
        self._ess_index: dict[int, dict[str, list[int]]] = {}
        self._ptr_size: int | None = None
        self._parse_header()
        self._scan_types(like)
        self.end_id = self.start_id + len(self._offs)
        if like is not None:
            self._keep_decoded(like)

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_bytes(
        cls,
        data: bytes | bytearray | memoryview,
        *,
        base: Btf | None = None,
        name: str = "",
    ) -> Btf:
        """Parse raw BTF from memory (copied into an immutable ``bytes`` unless it is one).

        ``base`` makes it split BTF on top of that base. Raises ``BtfError`` on bad input.
        """
        return cls(bytes(data) if not isinstance(data, bytes) else data, base=base, name=name)

    @classmethod
    def patched(cls, data: bytes, like: Btf, *, name: str = "") -> Btf:
        """Parse ``data``: raw base BTF made from ``like`` (a base BTF too) by rewriting fields
        of its type records in place -- each record keeps its size and kind -- and appending
        types and strings, as the object BTF fix-ups of :mod:`~schedswitchd.bpf.btf.fixup`
        do. ``like``'s record layout is taken over instead of scanned again (only the
        appended types are scanned), and its decoded types whose record bytes are unchanged
        are kept: the fixed-up BTF is parsed at every object open. Raises ``BtfError`` on bad
        input, as :meth:`from_bytes`."""
        return cls(data, base=None, name=name, like=like)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        base: Btf | None = None,
        name: str | None = None,
    ) -> Btf:
        """Parse a BTF file: raw BTF (``/sys/kernel/btf/*``, mapped with ``mmap`` where the
        kernel allows) or an ELF file (``.ko``, ``.ko.xz``, ``.bpf.o``, vmlinux) whose ``.BTF``
        section is used. ``name`` defaults to the file name without ``.ko``/``.xz``/``.o``
        suffixes. Raises ``BtfError`` (also for unreadable files, naming the path).
        """
        from schedswitchd.bpf.btf.source import load_btf_bytes

        data = load_btf_bytes(path)
        if name is None:
            name = _default_name(os.fspath(path))
        return cls(data, base=base, name=name)

    def _parse_header(self) -> None:
        buf = self._buf
        size = len(buf)
        if size < _HDR_MIN:
            raise BtfError(f"truncated BTF: {size} bytes, header needs {_HDR_MIN}", where="header")
        magic_le = struct.unpack_from("<H", buf, 0)[0]
        if magic_le == BTF_MAGIC:
            self._endian = "<"
        elif struct.unpack_from(">H", buf, 0)[0] == BTF_MAGIC:
            self._endian = ">"
        else:
            raise BtfError(f"bad BTF magic 0x{magic_le:04x}, want 0xeb9f", where="offset 0")
        e = self._endian
        _, version, flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from(
            e + "HBBIIIII", buf, 0
        )
        if version != 1:
            raise BtfError(f"unsupported BTF version {version}", where="offset 2")
        if flags != 0:
            raise BtfError(f"unsupported BTF header flags 0x{flags:x}", where="offset 3")
        if hdr_len < _HDR_MIN or hdr_len > size:
            raise BtfError(
                f"header length {hdr_len} outside [{_HDR_MIN}, {size}]", where="offset 4"
            )
        if any(buf[_HDR_MIN:hdr_len]):
            raise BtfError("unknown non-zero header fields", where=f"offset {_HDR_MIN}")
        body = size - hdr_len
        if type_off + type_len > body:
            raise BtfError(
                f"type section [{type_off}, +{type_len}) past the end of {body} data bytes",
                where="type section",
            )
        if str_off + str_len > body:
            raise BtfError(
                f"string section [{str_off}, +{str_len}) past the end of {body} data bytes",
                where="string section",
            )
        if type_off % 4 or type_len % 4:
            raise BtfError(
                f"type section offset {type_off} / length {type_len} not 4-byte aligned",
                where="type section",
            )
        if type_len and str_len and type_off < str_off + str_len and str_off < type_off + type_len:
            raise BtfError("type and string sections overlap", where="header")
        self._hdr_len: int = hdr_len
        self._type_start: int = hdr_len + type_off
        self._type_len: int = type_len
        self._str_start: int = hdr_len + str_off
        self._str_len: int = str_len
        self._str_stop: int = self._str_start + str_len
        str_end = self._str_start + str_len
        if self.base is None and (str_len == 0 or buf[self._str_start] != 0):
            raise BtfError(
                "base BTF string section must start with an empty string",
                where="string section",
            )
        if str_len and buf[str_end - 1] != 0:
            raise BtfError("string section does not end with NUL", where="string section")
        self._str_end_off = self.start_str_off + str_len

    def _scan_types(self, like: Btf | None = None) -> None:
        """One pass over the type section: word offset and top info byte of every type
        (from the end of ``like``'s types, whose layout this section shares, if given)."""
        start, length = self._type_start, self._type_len
        words: memoryview | array[int]
        native = (self._endian == "<") == (sys.byteorder == "little")
        if native:
            words = memoryview(self._buf)[start : start + length].cast("I")
        else:
            swapped = array("I")
            swapped.frombytes(bytes(self._buf[start : start + length]))
            swapped.byteswap()
            words = swapped
        n = len(words)
        offs: array[int] = array("I")
        tops = bytearray()
        i = 0
        if like is not None:
            if like.base is not None or self.base is not None or like._endian != self._endian:
                raise ValueError("patched BTF: both must be base BTF of one byte order")
            if like._type_len > length:
                raise BtfError("patched BTF lost types", where="type section")
            offs.extend(like._offs)
            tops.extend(like._tops)
            i = like._type_len // 4
        add_off = offs.append
        add_top = tops.append
        fixed, per = _FIXED, _PER_VLEN
        try:
            while i < n:
                add_off(i)
                info = words[i + 1]
                top = info >> 24
                add_top(top)
                i += fixed[top] + (info & 0xFFFF) * per[top]
        except IndexError:
            i = n + 1  # a header cut off by the section end; reported below
        if i != n:
            last = len(offs) - 1
            tid = self.start_id + last
            where = f"type id {tid}, byte {self._type_start + 4 * offs[last]}"
            top = tops[last] if last < len(tops) else -1
            if top >= 0 and fixed[top] == _BAD_STEP:
                kind = top & 0x1F
                if 0 < kind <= _MAX_KIND:
                    raise BtfError(
                        f"reserved info bits set (info top byte 0x{top:02x})", where=where
                    )
                raise BtfError(f"unknown BTF kind {kind}", where=where)
            raise BtfError("type record runs past the end of the type section", where=where)
        self._words = words
        self._offs = offs
        self._tops = tops

    def _keep_decoded(self, like: Btf) -> None:
        """Take over ``like``'s decoded types whose records are byte-identical here (names
        resolve alike: the string section only grew at its end)."""
        if (
            self._buf[self._str_start : self._str_start + like._str_len]
            != like._buf[like._str_start : like._str_start + like._str_len]
        ):
            return
        mine, theirs = self._type_start, like._type_start
        offs, last = like._offs, len(like._offs) - 1
        for tid, t in like._cache.items():
            idx = tid - like.start_id
            lo = 4 * offs[idx]
            hi = 4 * offs[idx + 1] if idx < last else like._type_len
            if self._buf[mine + lo : mine + hi] == like._buf[theirs + lo : theirs + hi]:
                self._cache[tid] = t

    # --- raw access -----------------------------------------------------------------------

    def _index(self, type_id: int) -> int:
        """Index into this BTF's own arrays; BtfError unless ``type_id`` is owned here."""
        idx = type_id - self.start_id
        if 0 <= idx < len(self._offs):
            return idx
        raise BtfError(
            f"type id {type_id} out of range [{self.start_id}, {self.end_id})",
            where=f"{self.name or 'btf'} type id {type_id}",
        )

    def _owner(self, type_id: int) -> Btf:
        btf: Btf | None = self
        while btf is not None:
            if type_id >= btf.start_id:
                if type_id < btf.end_id:
                    return btf
                break
            btf = btf.base
        raise BtfError(
            f"type id {type_id} out of range [1, {self.end_id})",
            where=f"{self.name or 'btf'} type id {type_id}",
        )

    def type_offset(self, type_id: int) -> int:
        """Byte offset of type ``type_id``'s record inside :attr:`raw` (for in-place patching).

        Only ids owned by this BTF (not its base). Raises ``BtfError`` otherwise.
        """
        return self._type_start + 4 * self._offs[self._index(type_id)]

    def kind(self, type_id: int) -> Kind:
        """The kind of ``type_id`` without decoding it (``Kind.UNKN`` for id 0, void)."""
        idx = type_id - self.start_id
        if 0 <= idx < len(self._tops):  # an own type: the common case, checked inline
            return _KIND_OF_TOP[self._tops[idx]]
        if type_id == 0:
            return Kind.UNKN
        btf = self._owner(type_id)
        return _KIND_OF_TOP[btf._tops[btf._index(type_id)]]

    def type_name(self, type_id: int) -> str:
        """The name of ``type_id`` ("" for anonymous types and void), without decoding it."""
        idx = type_id - self.start_id
        if 0 <= idx < len(self._offs):
            return self.string(self._words[self._offs[idx]])
        if type_id == 0:
            return ""
        btf = self._owner(type_id)
        return btf.string(btf._words[btf._offs[btf._index(type_id)]])

    def string(self, offset: int) -> str:
        """The NUL-terminated string at ``offset`` of the (split-aware) string space.

        Offsets below :attr:`start_str_off` are the base's. Raises ``BtfError`` if out of bounds.
        """
        loc = offset - self.start_str_off
        if 0 <= loc < self._str_len:  # own strings: the common case
            s = self._str_start + loc
            e = self._buf.find(b"\0", s, self._str_stop)
            if e < 0:  # unreachable while the section ends with NUL; kept as a guard
                raise BtfError("unterminated string", where=f"string offset {offset}")
            return self._buf[s:e].decode("utf-8", "replace") if e > s else ""
        if offset < self.start_str_off:
            if self.base is None or offset < 0:
                raise BtfError(f"negative string offset {offset}", where="string section")
            return self.base.string(offset)
        raise BtfError(
            f"string offset {offset} past the string section end {self._str_end_off}",
            where=f"{self.name or 'btf'} string offset {offset}",
        )

    # --- decoding -------------------------------------------------------------------------

    def type(self, type_id: int) -> BtfType:
        """The decoded type ``type_id`` (``Void`` for 0); base ids are delegated to the base.

        Decoded records are cached (bounded). Raises ``BtfError`` for ids out of range and
        for names pointing outside the string section.
        """
        cached = self._cache.get(type_id)
        if cached is not None:
            return cached
        if type_id == 0:
            return Void()
        if type_id < self.start_id:
            return self._owner(type_id).type(type_id)
        t = self._decode(type_id)
        cache = self._cache
        if len(cache) >= _CACHE_MAX:
            del cache[next(iter(cache))]
        cache[type_id] = t
        return t

    def _decode(self, tid: int) -> BtfType:
        idx = self._index(tid)
        top = self._tops[idx]
        o = self._offs[idx]
        # scan_types admitted only valid kinds, so the table has an entry for every top
        return _DECODERS[top & 0x1F](self, tid, o, self._words[o], self._words[o + 1])

    def _ref_target(self, type_id: int) -> int:
        """The ``type`` word of ``type_id`` (meaningful for ref-like kinds), without decoding."""
        idx = type_id - self.start_id
        if 0 <= idx < len(self._offs):
            return int(self._words[self._offs[idx] + 2])
        btf = self._owner(type_id)
        return int(btf._words[btf._offs[btf._index(type_id)] + 2])

    # --- name lookups ---------------------------------------------------------------------

    def _names_of_kind(self, kind: Kind) -> _NameIndex:
        index = self._name_index.get(kind)
        if index is not None:
            return index
        tops = self._tops
        positions: list[int] = []
        for top in (int(kind), int(kind) | 0x80):
            pos = tops.find(top)
            while pos >= 0:
                positions.append(pos)
                pos = tops.find(top, pos + 1)
        positions.sort()
        words, offs, string = self._words, self._offs, self.string
        # Names are decoded once here and dropped: a dict of vmlinux names kept megabytes of
        # str/int/dict objects resident in the daemon (docs/performance.md, "Memory"); two
        # arrays take 8 bytes per type.
        hashes = [hash(string(words[offs[pos]])) & _HASH_MASK for pos in positions]
        order = sorted(range(len(positions)), key=hashes.__getitem__)  # stable: ids ascend
        index = _NameIndex(array("I", [hashes[i] for i in order]),
                           array("I", [positions[i] for i in order]))  # fmt: skip
        self._name_index[kind] = index
        return index

    def _lookup(self, name: str, kind: Kind) -> list[int]:
        """Own ids of ``kind`` named ``name``, ascending: the hash range of the per-kind
        index, each candidate's name compared (distinct names may share a hash)."""
        hashes, positions = self._names_of_kind(kind)
        h = hash(name) & _HASH_MASK
        i = bisect_left(hashes, h)
        n = len(hashes)
        found: list[int] = []
        words, offs, start = self._words, self._offs, self.start_id
        while i < n and hashes[i] == h:
            pos = positions[i]
            if self.string(words[offs[pos]]) == name:
                found.append(start + pos)
            i += 1
        return found

    def find_ids(self, name: str, kind: Kind) -> list[int]:
        """Ids of this BTF's own types (not the base's) named exactly ``name`` of ``kind``,
        ascending. The per-kind name index is built on first use."""
        return self._lookup(name, Kind(kind))

    def find(self, name: str, kind: Kind) -> int | None:
        """The first type named ``name`` of ``kind``: own types first, then the base's.

        ``None`` when there is none.
        """
        kind = Kind(kind)
        btf: Btf | None = self
        while btf is not None:
            hit = btf._lookup(name, kind)
            if hit:
                return hit[0]
            btf = btf.base
        return None

    def find_by_essential_name(self, ess: str, kind: Kind) -> list[int]:
        """Own type ids of ``kind`` whose essential name (``___flavour`` stripped, see
        :func:`~schedswitchd.bpf.btf.types.essential_name`) is ``ess``, ascending: CO-RE
        candidates."""
        kind = Kind(kind)
        flavoured = self._ess_index.get(kind)
        if flavoured is None:
            # Only names holding "___" can differ from their essential name (few in kernel
            # BTF); every other name is its own essential name and is found by name.
            flavoured = {}
            words, offs, start, string = self._words, self._offs, self.start_id, self.string
            for pos in self._names_of_kind(kind).positions:
                nm = string(words[offs[pos]])
                if "___" in nm:
                    flavoured.setdefault(essential_name(nm), []).append(start + pos)
            self._ess_index[kind] = flavoured
        ids = self._lookup(ess, kind) if "___" not in ess else []
        extra = flavoured.get(ess)
        return sorted(ids + extra) if extra else ids

    def find_enumerators(self, names: Iterable[str]) -> dict[str, list[tuple[int, int]]]:
        """Where each of ``names`` is an enumerator of this BTF's own ENUM/ENUM64 types:
        name -> ``[(enum type id, value), ...]`` in ascending type id (names found nowhere
        are absent). Values are sign-adjusted like :class:`~schedswitchd.bpf.btf.types.Enum`
        (kind_flag = signed; ENUM64 joins ``val_lo32``/``val_hi32``).

        Enumerator names have no index (they are not type names), so this compares string
        offsets instead of strings: each wanted name's offsets in the string section are
        found once, then the ENUM records' words are scanned without decoding a type, far
        less work than decoding every enum of vmlinux.
        """
        wanted: dict[int, str] = {}
        buf, start, end = self._buf, self._str_start, self._str_start + self._str_len
        for name in set(names):
            if not name:
                continue
            needle = b"\0" + name.encode() + b"\0"
            pos = buf.find(needle, start, end)
            while pos >= 0:  # deduplicated BTF has one copy; tolerate several
                wanted[self.start_str_off + pos + 1 - start] = name
                pos = buf.find(needle, pos + 1, end)
        found: dict[str, list[tuple[int, int]]] = {}
        if not wanted:
            return found
        words, offs, tops = self._words, self._offs, self._tops
        for kind in (Kind.ENUM, Kind.ENUM64):
            step = 2 if kind is Kind.ENUM else 3
            for top in (int(kind), int(kind) | 0x80):
                signed = bool(top & 0x80)
                pos = tops.find(top)
                while pos >= 0:
                    o = offs[pos]
                    vlen = words[o + 1] & 0xFFFF
                    for j in range(o + 3, o + 3 + step * vlen, step):
                        hit = wanted.get(words[j])
                        if hit is None:
                            continue
                        if step == 2:
                            v = words[j + 1]
                            value = _s32(v) if signed else v
                        else:
                            v = words[j + 1] | (words[j + 2] << 32)
                            value = _s64(v) if signed else v
                        found.setdefault(hit, []).append((self.start_id + pos, value))
                    pos = tops.find(top, pos + 1)
        for hits in found.values():
            hits.sort()
        return found

    # --- type algebra ---------------------------------------------------------------------

    def _skip(self, type_id: int, kinds: frozenset[Kind]) -> int:
        seen: set[int] | None = None
        steps = 0
        while self.kind(type_id) in kinds:
            steps += 1
            if steps > 32:  # real chains are short; only then pay for cycle detection
                if seen is None:
                    seen = set()
                if type_id in seen:
                    raise BtfError("cycle through modifiers/typedefs", where=f"type id {type_id}")
                seen.add(type_id)
            type_id = self._ref_target(type_id)
        return type_id

    def skip_modifiers(self, type_id: int) -> int:
        """Follow CONST/VOLATILE/RESTRICT/TYPE_TAG to the first other type id.

        Raises ``BtfError`` on a cycle or an id out of range."""
        return self._skip(type_id, _MODIFIERS)

    def skip_mods_and_typedefs(self, type_id: int) -> int:
        """Like :meth:`skip_modifiers`, also through TYPEDEF."""
        return self._skip(type_id, _MODS_AND_TYPEDEF)

    def is_func_pointer(self, type_id: int) -> bool:
        """Whether ``type_id`` is, through typedefs/modifiers, a pointer to a FUNC_PROTO (a
        struct_ops member that a program fills). Raises ``BtfError`` on bad ids or cycles."""
        tid = self.skip_mods_and_typedefs(type_id)
        if self.kind(tid) != Kind.PTR:
            return False  # decided from the kinds array: nothing decoded (struct_ops members)
        return self.kind(self.skip_mods_and_typedefs(self._ref_target(tid))) == Kind.FUNC_PROTO

    def pointer_size(self) -> int:
        """Pointer size in bytes: the size of ``long`` if this BTF (or its base) has one,
        else 8 (libbpf guesses the same way)."""
        if self._ptr_size is None:
            size = 8
            for nm in ("long int", "long unsigned int"):
                tid = self.find(nm, Kind.INT)
                if tid is not None:
                    t = self.type(tid)
                    if isinstance(t, Int) and t.size in (4, 8):
                        size = t.size
                        break
            self._ptr_size = size
        return self._ptr_size

    def size_of(self, type_id: int) -> int:
        """Size in bytes of ``type_id`` through typedefs/modifiers/VAR/DECL_TAG; arrays are
        ``nelems * element size``; pointers :meth:`pointer_size`.

        Raises ``BtfError`` for sizeless kinds (void, FWD, FUNC, FUNC_PROTO), cycles, and
        sizes over 2**32-1 bytes."""
        mult = 1
        seen: set[int] = set()
        tid = type_id
        while True:
            if tid in seen:
                raise BtfError("cycle while computing size", where=f"type id {tid}")
            seen.add(tid)
            kind = self.kind(tid)
            if kind in _SIZED:
                size = self._ref_target(tid)
                break
            if kind == Kind.PTR:
                size = self.pointer_size()
                break
            if kind in _SIZE_THROUGH:
                tid = self._ref_target(tid)
                continue
            if kind == Kind.ARRAY:
                t = self.type(tid)
                assert isinstance(t, Array)
                mult *= t.nelems
                if mult > _U32:
                    raise BtfError("array size overflows 32 bits", where=f"type id {tid}")
                tid = t.type
                continue
            raise BtfError(
                f"type of kind {kind.name} has no size", where=f"type id {tid} (from {type_id})"
            )
        total = size * mult
        if total > _U32:
            raise BtfError("type size overflows 32 bits", where=f"type id {type_id}")
        return total

    def align_of(self, type_id: int) -> int:
        """Alignment in bytes of ``type_id`` (as libbpf's ``btf__align_of``): scalars
        ``min(size, pointer size)``; composites the largest member alignment, or 1 when the
        layout shows the composite is packed. Raises ``BtfError`` for sizeless kinds, cycles and
        nesting deeper than 256."""
        return self._align_of(type_id, 0, set())

    def _align_of(self, type_id: int, depth: int, path: set[int]) -> int:
        if depth > _MAX_NESTING:
            raise BtfError("types nested too deeply", where=f"type id {type_id}")
        tid = self.skip_mods_and_typedefs(type_id)
        kind = self.kind(tid)
        if kind in (Kind.INT, Kind.ENUM, Kind.ENUM64, Kind.FLOAT):
            return max(1, min(self.pointer_size(), self._ref_target(tid)))
        if kind == Kind.PTR:
            return self.pointer_size()
        if kind == Kind.ARRAY:
            t = self.type(tid)
            assert isinstance(t, Array)
            if tid in path or t.type in path:
                raise BtfError("array contains itself (cycle)", where=f"type id {tid}")
            return self._align_of(t.type, depth + 1, path | {tid})
        if kind in (Kind.STRUCT, Kind.UNION):
            if tid in path:
                raise BtfError("composite contains itself (cycle)", where=f"type id {tid}")
            comp = self.type(tid)
            assert isinstance(comp, Composite)
            inner = path | {tid}
            best = 1
            for m in comp.members:
                a = self._align_of(m.type, depth + 1, inner)
                if m.bitfield_size == 0 and m.bit_offset % (8 * a):
                    return 1  # a member placed off its natural alignment: packed
                best = max(best, a)
            if comp.size % best:
                return 1
            return best
        raise BtfError(f"type of kind {kind.name} has no alignment", where=f"type id {tid}")

    def find_member(self, composite_id: int, name: str) -> tuple[int, Member] | None:
        """The member ``name`` of the struct/union ``composite_id`` (typedefs/modifiers
        skipped), also found inside anonymous struct/union members: ``(absolute bit offset
        from the start of composite_id, member)``, or ``None``. Raises ``BtfError`` if
        ``composite_id`` is not a composite, on cycles, and on nesting deeper than 256."""
        tid = self.skip_mods_and_typedefs(composite_id)
        if self.kind(tid) not in (Kind.STRUCT, Kind.UNION):
            raise BtfError(
                f"type is {self.kind(tid).name}, not a struct or union",
                where=f"type id {composite_id}",
            )
        return self._find_member(tid, name, 0, 0, set())

    def _find_member(
        self, tid: int, name: str, base_off: int, depth: int, path: set[int]
    ) -> tuple[int, Member] | None:
        if depth > _MAX_NESTING:
            raise BtfError("anonymous members nested too deeply", where=f"type id {tid}")
        if tid in path:
            raise BtfError("composite contains itself", where=f"type id {tid}")
        comp = self.type(tid)
        assert isinstance(comp, Composite)
        for m in comp.members:
            if m.name == name:
                return base_off + m.bit_offset, m
            if not m.name:
                inner = self.skip_mods_and_typedefs(m.type)
                if self.kind(inner) in (Kind.STRUCT, Kind.UNION):
                    hit = self._find_member(
                        inner, name, base_off + m.bit_offset, depth + 1, path | {tid}
                    )
                    if hit is not None:
                        return hit
        return None

    # --- iteration ------------------------------------------------------------------------

    def own_ids(self) -> range:
        """This BTF's own type ids, ``range(start_id, end_id)``."""
        return range(self.start_id, self.end_id)

    def own_ids_of_kind(self, kind: Kind) -> list[int]:
        """This BTF's own type ids of ``kind``, ascending, found in the kinds array without
        decoding a type (a scheduler's BTF has thousands of types and a few DATASECs)."""
        tops = self._tops
        out: list[int] = []
        for top in (int(kind), int(kind) | 0x80):  # kind_flag is the top byte's high bit
            pos = tops.find(top)
            while pos >= 0:
                out.append(self.start_id + pos)
                pos = tops.find(top, pos + 1)
        out.sort()
        return out

    def __len__(self) -> int:
        """Number of this BTF's own types."""
        return len(self._offs)

    def __repr__(self) -> str:
        return f"<Btf {self.name or '?'} ids [{self.start_id}, {self.end_id})>"


# --- per-kind decoders: (btf, type id, word offset, name_off word, info word) -> type ------
# One function per kind, picked from a table by the kind bits: the decode of a VAR or a
# DATASEC member list is on every object open's path (fix-ups, data maps, struct_ops).


def _d_int(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    name = b.string(name_off)
    w = b._words
    v = w[o + 3]
    return Int(tid, name, w[o + 2], (v >> 24) & 0x0F, (v >> 16) & 0xFF, v & 0xFF)


def _d_ref(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    return Ref(tid, _KIND_OF_TOP[info >> 24], b.string(name_off), b._words[o + 2])


def _d_array(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    b.string(name_off)  # validated as for every kind, though an array has no name
    w = b._words
    return Array(tid, w[o + 3], w[o + 4], w[o + 5])


def _d_composite(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    name = b.string(name_off)
    w = b._words
    vlen = info & 0xFFFF
    rec = w[o + 3 : o + 3 + 3 * vlen].tolist()
    s = b.string
    names = list(map(s, rec[0::3]))
    offs = rec[2::3]
    if info >> 31:  # kind_flag: bitfield size in the top byte of the offset
        members = tuple(
            map(
                _tuple_new,
                repeat(Member),
                zip(
                    names,
                    rec[1::3],
                    [o & 0xFFFFFF for o in offs],
                    [o >> 24 for o in offs],
                    strict=True,
                ),
            )
        )
    else:
        members = tuple(
            map(
                _tuple_new,
                repeat(Member),
                zip(names, rec[1::3], offs, repeat(0, len(offs)), strict=True),
            )
        )
    return Composite(tid, _KIND_OF_TOP[info >> 24], name, w[o + 2], members)


def _d_enum(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    name = b.string(name_off)
    w = b._words
    vlen = info & 0xFFFF
    signed = bool(info >> 31)
    rec = w[o + 3 : o + 3 + 2 * vlen].tolist()
    s = b.string
    if signed:
        values = tuple(EnumValue(s(n), _s32(v)) for n, v in zip(rec[0::2], rec[1::2], strict=True))
    else:
        values = tuple(EnumValue(s(n), v) for n, v in zip(rec[0::2], rec[1::2], strict=True))
    return Enum(tid, Kind.ENUM, name, w[o + 2], signed, values)


def _d_enum64(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    name = b.string(name_off)
    w = b._words
    vlen = info & 0xFFFF
    signed = bool(info >> 31)
    conv = _s64 if signed else int
    rec = w[o + 3 : o + 3 + 3 * vlen].tolist()
    s = b.string
    values = tuple(
        EnumValue(s(n), conv(lo | (hi << 32)))
        for n, lo, hi in zip(rec[0::3], rec[1::3], rec[2::3], strict=True)
    )
    return Enum(tid, Kind.ENUM64, name, w[o + 2], signed, values)


def _d_fwd(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    return Fwd(tid, b.string(name_off), bool(info >> 31))


def _d_func(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    return Func(tid, b.string(name_off), b._words[o + 2], info & 0xFFFF)


def _d_func_proto(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    b.string(name_off)  # validated as for every kind, though a FUNC_PROTO has no name
    w = b._words
    vlen = info & 0xFFFF
    rec = w[o + 3 : o + 3 + 2 * vlen].tolist()
    s = b.string
    params = tuple(map(_tuple_new, repeat(Param), zip(map(s, rec[0::2]), rec[1::2], strict=True)))
    return FuncProto(tid, w[o + 2], params)


def _d_var(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    w = b._words
    return Var(tid, b.string(name_off), w[o + 2], w[o + 3])


def _d_datasec(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    name = b.string(name_off)
    w = b._words
    vlen = info & 0xFFFF
    rec = w[o + 3 : o + 3 + 3 * vlen].tolist()
    secinfo = tuple(
        map(_tuple_new, repeat(VarSecinfo), zip(rec[0::3], rec[1::3], rec[2::3], strict=True))
    )
    return Datasec(tid, name, w[o + 2], secinfo)


def _d_float(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    return Float(tid, b.string(name_off), b._words[o + 2])


def _d_decl_tag(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    w = b._words
    return DeclTag(tid, b.string(name_off), w[o + 2], _s32(w[o + 3]))


def _d_unknown(b: Btf, tid: int, o: int, name_off: int, info: int) -> BtfType:
    # unreachable: _scan_types refuses unknown kinds
    raise BtfError(f"unknown BTF kind {(info >> 24) & 0x1F}", where=f"type id {tid}")


_Decoder = Callable[[Btf, int, int, int, int], BtfType]
_DECODERS: tuple[_Decoder, ...] = tuple(
    {
        Kind.INT: _d_int,
        Kind.PTR: _d_ref,
        Kind.ARRAY: _d_array,
        Kind.STRUCT: _d_composite,
        Kind.UNION: _d_composite,
        Kind.ENUM: _d_enum,
        Kind.FWD: _d_fwd,
        Kind.TYPEDEF: _d_ref,
        Kind.VOLATILE: _d_ref,
        Kind.CONST: _d_ref,
        Kind.RESTRICT: _d_ref,
        Kind.FUNC: _d_func,
        Kind.FUNC_PROTO: _d_func_proto,
        Kind.VAR: _d_var,
        Kind.DATASEC: _d_datasec,
        Kind.FLOAT: _d_float,
        Kind.DECL_TAG: _d_decl_tag,
        Kind.TYPE_TAG: _d_ref,
        Kind.ENUM64: _d_enum64,
    }.get(Kind(k), _d_unknown)
    if k <= _MAX_KIND
    else _d_unknown
    for k in range(32)
)
#: Kind by the top byte of ``info`` (kind_flag and reserved bits masked off).
_KIND_OF_TOP: tuple[Kind, ...] = tuple(
    Kind(t & 0x1F) if (t & 0x1F) <= _MAX_KIND else Kind.UNKN for t in range(256)
)


def _default_name(path: str) -> str:
    base = os.path.basename(path)
    for suffix in (".xz", ".zst", ".gz", ".ko", ".o", ".btf"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    if base.endswith(".bpf"):
        base = base[:-4]
    return base
