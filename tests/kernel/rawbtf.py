"""A few raw BTF blobs built by hand (kernel doc ``Documentation/bpf/btf.rst``), so kernel
tests need no BTF library: header, type records, string section."""

from __future__ import annotations

import struct

BTF_MAGIC = 0xEB9F
KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT = 1, 2, 3, 4
INT_SIGNED = 1


class RawBtf:
    """Appends type records; ids start at 1 in order of the ``add_*`` calls."""

    def __init__(self) -> None:
        self.types = bytearray()
        self.strings = bytearray(b"\0")
        self.count = 0

    def name(self, text: str) -> int:
        if not text:
            return 0
        off = len(self.strings)
        self.strings += text.encode() + b"\0"
        return off

    def _rec(self, name: str, kind: int, vlen: int, size_or_type: int) -> int:
        self.types += struct.pack("<III", self.name(name), (kind << 24) | vlen, size_or_type)
        self.count += 1
        return self.count

    def int_(self, name: str, size: int, *, signed: bool = False) -> int:
        tid = self._rec(name, KIND_INT, 0, size)
        self.types += struct.pack("<I", ((INT_SIGNED if signed else 0) << 24) | size * 8)
        return tid

    def ptr(self, target: int) -> int:
        return self._rec("", KIND_PTR, 0, target)

    def array(self, elem: int, index: int, nelems: int) -> int:
        tid = self._rec("", KIND_ARRAY, 0, 0)
        self.types += struct.pack("<III", elem, index, nelems)
        return tid

    def struct(self, name: str, size: int, members: list[tuple[str, int, int]]) -> int:
        """``members``: (name, type id, bit offset)."""
        tid = self._rec(name, KIND_STRUCT, len(members), size)
        for mname, mtype, bitoff in members:
            self.types += struct.pack("<III", self.name(mname), mtype, bitoff)
        return tid

    def raw_type(self, record: bytes) -> int:
        """Append an already-encoded record (for deliberately broken BTF)."""
        self.types += record
        self.count += 1
        return self.count

    def build(self) -> bytes:
        hdr = struct.pack(
            "<HBBIIIII",
            BTF_MAGIC,
            1,
            0,
            24,
            0,
            len(self.types),
            len(self.types),
            len(self.strings),
        )
        return hdr + bytes(self.types) + bytes(self.strings)


def int_and_pair() -> tuple[bytes, int, int, int]:
    """BTF with ``int`` (id 1), ``unsigned long long`` (id 2) and
    ``struct pair { int a; unsigned long long b; }`` (id 3, 16 bytes): (raw, 1, 2, 3)."""
    b = RawBtf()
    i32 = b.int_("int", 4, signed=True)
    u64 = b.int_("unsigned long long", 8)
    pair = b.struct("pair", 16, [("a", i32, 0), ("b", u64, 64)])
    return b.build(), i32, u64, pair
