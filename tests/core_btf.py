"""Small BTFs for the CO-RE engine tests.

``TypeBuilder`` has the add_* API of ``schedswitchd.bpf.btf_builder.BtfBuilder`` (see
/work/contracts.md) and produces an in-memory BTF with the interface the engine uses
(``schedswitchd.bpf.core_access.BtfView``): the engine's tests then describe kernel-like
types directly, with hand-computable layouts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from schedswitchd.bpf.btf_types import (
    Array,
    BtfType,
    Composite,
    Enum,
    EnumValue,
    Float,
    FuncProto,
    Fwd,
    Int,
    Kind,
    Member,
    Param,
    Ref,
    Void,
    essential_name,
)
from schedswitchd.errors import BtfError


class MemBtf:
    """A built BTF: ids ``start_id..end_id-1`` are its own; lower ids go to ``base``."""

    def __init__(self, name: str, types: list[BtfType], base: MemBtf | None) -> None:
        self.name = name
        self.base = base
        self.start_id: int = base.end_id if base else 1
        self.end_id: int = self.start_id + len(types)
        self._types = types
        self.essential_lookups: list[tuple[str, Kind]] = []
        self._by_ess: dict[tuple[str, Kind], list[int]] = defaultdict(list)
        for t in types:
            if t.name:
                self._by_ess[(essential_name(t.name), t.kind)].append(t.id)

    def type(self, type_id: int) -> BtfType:
        if type_id == 0:
            return Void()
        if type_id < self.start_id:
            if self.base is None:
                raise BtfError("bad id", where=str(type_id))
            return self.base.type(type_id)
        if type_id >= self.end_id:
            raise BtfError("type id out of range", where=str(type_id))
        return self._types[type_id - self.start_id]

    def find_by_essential_name(self, ess: str, kind: Kind) -> list[int]:
        self.essential_lookups.append((ess, kind))
        return list(self._by_ess.get((ess, kind), []))

    def size_of(self, type_id: int) -> int:
        for _ in range(64):
            t = self.type(type_id)
            if isinstance(t, Int | Composite | Enum | Float):
                return t.size
            if t.kind == Kind.PTR:
                return 8
            if isinstance(t, Array):
                return t.nelems * self.size_of(t.type)
            if isinstance(t, Ref):
                type_id = t.type
                continue
            raise BtfError(f"{t.kind.name} has no size", where=str(type_id))
        raise BtfError("loop", where=str(type_id))


class TypeBuilder:
    """Collects types; ``finish(name)`` freezes them into a :class:`MemBtf`."""

    def __init__(self, base: MemBtf | None = None) -> None:
        self.base = base
        self._types: list[BtfType] = []

    def _next(self) -> int:
        return (self.base.end_id if self.base else 1) + len(self._types)

    def _add(self, t: BtfType) -> int:
        self._types.append(t)
        return t.id

    def add_int(self, name: str, size: int, signed: bool = False, encoding: int = 0) -> int:
        enc = encoding | (1 if signed else 0)
        return self._add(Int(self._next(), name, size, enc, 0, size * 8))

    def add_float(self, name: str, size: int) -> int:
        return self._add(Float(self._next(), name, size))

    def add_ptr(self, type_id: int) -> int:
        return self._add(Ref(self._next(), Kind.PTR, "", type_id))

    def add_typedef(self, name: str, type_id: int) -> int:
        return self._add(Ref(self._next(), Kind.TYPEDEF, name, type_id))

    def add_const(self, type_id: int) -> int:
        return self._add(Ref(self._next(), Kind.CONST, "", type_id))

    def add_volatile(self, type_id: int) -> int:
        return self._add(Ref(self._next(), Kind.VOLATILE, "", type_id))

    def add_array(self, type_id: int, index_type: int, nelems: int) -> int:
        return self._add(Array(self._next(), type_id, index_type, nelems))

    def _composite(
        self, kind: Kind, name: str, size: int, members: Sequence[tuple[str, int, int, int]]
    ) -> int:
        ms = tuple(Member(n, t, off, bf) for n, t, off, bf in members)
        return self._add(Composite(self._next(), kind, name, size, ms))

    def add_struct(self, name: str, size: int, members: Sequence[tuple[str, int, int, int]]) -> int:
        return self._composite(Kind.STRUCT, name, size, members)

    def add_union(self, name: str, size: int, members: Sequence[tuple[str, int, int, int]]) -> int:
        return self._composite(Kind.UNION, name, size, members)

    def add_enum(
        self, name: str, size: int, values: Sequence[tuple[str, int]], signed: bool = False
    ) -> int:
        vs = tuple(EnumValue(n, v) for n, v in values)
        return self._add(Enum(self._next(), Kind.ENUM, name, size, signed, vs))

    def add_enum64(
        self, name: str, size: int, values: Sequence[tuple[str, int]], signed: bool = False
    ) -> int:
        vs = tuple(EnumValue(n, v) for n, v in values)
        return self._add(Enum(self._next(), Kind.ENUM64, name, size, signed, vs))

    def add_fwd(self, name: str, is_union: bool = False) -> int:
        return self._add(Fwd(self._next(), name, is_union))

    def add_func_proto(self, ret: int, params: Sequence[tuple[str, int]]) -> int:
        ps = tuple(Param(n, t) for n, t in params)
        return self._add(FuncProto(self._next(), ret, ps))

    def finish(self, name: str) -> MemBtf:
        return MemBtf(name, list(self._types), self.base)
