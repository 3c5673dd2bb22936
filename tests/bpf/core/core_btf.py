"""Small BTFs for the CO-RE engine tests, built as raw BTF bytes and parsed back.

``TypeBuilder`` forwards to :class:`schedswitchd.bpf.btf.builder.BtfBuilder`; ``finish``
parses the bytes with :class:`schedswitchd.bpf.btf.reader.Btf` and wraps the result in
:class:`SpyBtf`, which records every candidate search (``essential_lookups``) so tests can
prove which target BTFs the engine touched.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import BtfType, Kind


class SpyBtf:
    """A parsed :class:`Btf` that logs ``find_by_essential_name`` calls."""

    def __init__(self, btf: Btf) -> None:
        self.btf = btf
        self.essential_lookups: list[tuple[str, Kind]] = []

    @property
    def name(self) -> str:
        return self.btf.name

    @property
    def end_id(self) -> int:
        return self.btf.end_id

    def type(self, type_id: int) -> BtfType:
        return self.btf.type(type_id)

    def size_of(self, type_id: int) -> int:
        return self.btf.size_of(type_id)

    def find_by_essential_name(self, ess: str, kind: Kind) -> list[int]:
        self.essential_lookups.append((ess, kind))
        return self.btf.find_by_essential_name(ess, kind)


class TypeBuilder:
    """The ``add_*`` calls of :class:`BtfBuilder`; ``finish(name)`` gives a :class:`SpyBtf`."""

    def __init__(self, base: SpyBtf | None = None) -> None:
        self._base = base
        self._b = BtfBuilder(base.btf if base is not None else None)

    def add_int(self, name: str, size: int, signed: bool = False) -> int:
        return self._b.add_int(name, size, signed)

    def add_float(self, name: str, size: int) -> int:
        return self._b.add_float(name, size)

    def add_ptr(self, type_id: int) -> int:
        return self._b.add_ptr(type_id)

    def add_typedef(self, name: str, type_id: int) -> int:
        return self._b.add_typedef(name, type_id)

    def add_const(self, type_id: int) -> int:
        return self._b.add_const(type_id)

    def add_volatile(self, type_id: int) -> int:
        return self._b.add_volatile(type_id)

    def add_array(self, type_id: int, index_type: int, nelems: int) -> int:
        return self._b.add_array(type_id, index_type, nelems)

    def add_struct(self, name: str, size: int, members: Sequence[tuple[str, int, int, int]]) -> int:
        return self._b.add_struct(name, size, members)

    def add_union(self, name: str, size: int, members: Sequence[tuple[str, int, int, int]]) -> int:
        return self._b.add_union(name, size, members)

    def add_enum(
        self, name: str, size: int, values: Sequence[tuple[str, int]], signed: bool = False
    ) -> int:
        return self._b.add_enum(name, size, values, signed)

    def add_enum64(
        self, name: str, size: int, values: Sequence[tuple[str, int]], signed: bool = False
    ) -> int:
        return self._b.add_enum64(name, size, values, signed)

    def add_fwd(self, name: str, is_union: bool = False) -> int:
        return self._b.add_fwd(name, is_union)

    def add_func_proto(self, ret: int, params: Sequence[tuple[str, int]]) -> int:
        return self._b.add_func_proto(ret, params)

    def finish(self, name: str) -> SpyBtf:
        base = self._base.btf if self._base is not None else None
        return SpyBtf(Btf.from_bytes(self._b.build(), base=base, name=name))
