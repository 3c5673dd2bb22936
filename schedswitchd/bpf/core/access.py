"""CO-RE access specifications: the parsed form of a relocation's access string.

An access string such as ``"0:1:2:3"`` names a path from a root type: the first number is
an array index on the root (``&p->x`` is ``&p[0].x``), each later number is either a member
index of the struct/union reached so far (anonymous members are stepped through like any
other, but leave no named accessor) or an element index of the array reached so far.

Source of the semantics: kernel doc ``Documentation/bpf/llvm_reloc.rst`` (CO-RE section)
and libbpf ``src/relo_core.c`` (``bpf_core_parse_spec``), whose algorithm this follows.

Also home of the few BTF helpers every CO-RE module needs (:class:`BtfView`, :func:`type_of`,
:func:`skip_mods_and_typedefs`, :func:`size_of`), written against the small structural
interface the engine requires of a BTF, so the engine does not depend on how BTF is parsed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from schedswitchd.bpf.btf.types import (
    Array,
    BtfType,
    Composite,
    Enum,
    Kind,
    Ref,
    Void,
)
from schedswitchd.bpf.core.relo import CoreReloKind
from schedswitchd.errors import BtfError, CoreError

#: libbpf's ``BPF_CORE_SPEC_MAX_LEN``: the deepest access path (low-level steps) accepted.
SPEC_MAX_LEN = 64

#: Bound on chains of modifiers/typedefs, so a malformed BTF with a cycle cannot hang us.
_MAX_MOD_CHAIN = 64

_MODIFIERS = frozenset({Kind.CONST, Kind.VOLATILE, Kind.RESTRICT, Kind.TYPE_TAG, Kind.TYPEDEF})

FIELD_KINDS = frozenset(
    {
        CoreReloKind.FIELD_BYTE_OFFSET,
        CoreReloKind.FIELD_BYTE_SIZE,
        CoreReloKind.FIELD_EXISTS,
        CoreReloKind.FIELD_SIGNED,
        CoreReloKind.FIELD_LSHIFT_U64,
        CoreReloKind.FIELD_RSHIFT_U64,
    }
)
TYPE_KINDS = frozenset(
    {
        CoreReloKind.TYPE_ID_LOCAL,
        CoreReloKind.TYPE_ID_TARGET,
        CoreReloKind.TYPE_EXISTS,
        CoreReloKind.TYPE_MATCHES,
        CoreReloKind.TYPE_SIZE,
    }
)
ENUMVAL_KINDS = frozenset({CoreReloKind.ENUMVAL_EXISTS, CoreReloKind.ENUMVAL_VALUE})


class BtfView(Protocol):
    """What the CO-RE engine needs from a BTF (``schedswitchd.bpf.btf.reader.Btf`` provides it)."""

    @property
    def name(self) -> str:
        """``"vmlinux"``, a module name, or an object name."""
        ...

    def type(self, type_id: int) -> BtfType:
        """Decoded type ``type_id``; raises ``BtfError`` when out of range."""
        ...

    def find_by_essential_name(self, ess: str, kind: Kind) -> list[int]:
        """Ids of this BTF's *own* types of ``kind`` whose essential name is ``ess``."""
        ...

    def size_of(self, type_id: int) -> int:
        """Size in bytes; raises ``BtfError`` for types without a size (void, FWD, FUNC)."""
        ...


def type_of(btf: BtfView, type_id: int) -> BtfType:
    """Type ``type_id`` of ``btf``, with id 0 as :class:`Void`; ``CoreError`` if absent."""
    if type_id == 0:
        return Void()
    try:
        return btf.type(type_id)
    except BtfError as exc:
        raise CoreError(f"BTF {btf.name!r} has no usable type [{type_id}]: {exc}") from exc


def skip_mods_and_typedefs(btf: BtfView, type_id: int) -> tuple[int, BtfType]:
    """Follow CONST/VOLATILE/RESTRICT/TYPE_TAG/TYPEDEF from ``type_id``.

    Returns ``(id, type)`` of the first other type. ``CoreError`` on a chain longer than
    64 links (only a malformed, cyclic BTF has one).
    """
    t = type_of(btf, type_id)
    for _ in range(_MAX_MOD_CHAIN):
        if t.kind not in _MODIFIERS:
            return type_id, t
        assert isinstance(t, Ref)
        type_id = t.type
        t = type_of(btf, type_id)
    raise CoreError(f"BTF {btf.name!r}: modifier/typedef chain too long at [{type_id}]")


def size_of(btf: BtfView, type_id: int) -> int:
    """Resolved size in bytes of ``type_id`` (libbpf ``btf__resolve_size``); ``CoreError``
    when the type has none."""
    try:
        return btf.size_of(type_id)
    except BtfError as exc:
        raise CoreError(f"BTF {btf.name!r}: type [{type_id}] has no size: {exc}") from exc


@dataclass(slots=True)
class Accessor:
    """One high-level step of a spec: a named member (``name`` set; ``type_id`` is the
    struct/union holding it and ``idx`` its member index) or an array/root index
    (``name`` None; ``type_id`` the element type, modifiers skipped). For enum-value
    relocations the single accessor names the enumerator (``idx`` = its index)."""

    type_id: int
    idx: int
    name: str | None


@dataclass(slots=True)
class Spec:
    """A resolved access path in one BTF (libbpf ``struct bpf_core_spec``).

    ``raw`` is the low-level path (one entry per access-string number, anonymous members
    included), ``accessors`` the high-level one, ``bit_offset`` the field's offset in bits
    from the root pointer.
    """

    btf: BtfView
    root_type_id: int
    kind: CoreReloKind
    raw: list[int] = field(default_factory=list)
    accessors: list[Accessor] = field(default_factory=list)
    bit_offset: int = 0

    def access_string(self) -> str:
        """The low-level path as an access string (``"0:1:2"``)."""
        return ":".join(str(i) for i in self.raw)


def is_flex_array(btf: BtfView, prev: Accessor, arr: Array) -> bool:
    """True for a zero-length array that is the last member of a struct (``T x[];``),
    where any index is allowed; ``prev`` is the accessor that reached the array."""
    if prev.name is None or arr.nelems > 0:
        return False
    holder = type_of(btf, prev.type_id)
    return isinstance(holder, Composite) and prev.idx == len(holder.members) - 1


def _parse_numbers(access: str) -> list[int]:
    if not access or access.startswith(":"):
        raise CoreError(f"malformed CO-RE access string {access!r}")
    parts = access.split(":")
    if len(parts) > SPEC_MAX_LEN:
        raise CoreError(f"CO-RE access string {access!r} is deeper than {SPEC_MAX_LEN}")
    out: list[int] = []
    for part in parts:
        if not part.isascii() or not part.isdigit() or len(part) > 10:
            raise CoreError(f"malformed CO-RE access string {access!r}")
        out.append(int(part))
    return out


def parse_spec(btf: BtfView, root_type_id: int, access: str, kind: CoreReloKind) -> Spec:
    """Parse ``access`` against ``root_type_id`` of the local BTF.

    Type-based kinds need the access string ``"0"`` and yield an empty path; enum-value
    kinds need one enumerator index on an ENUM/ENUM64 root; field-based kinds walk the
    path accumulating ``bit_offset``. ``CoreError`` for a malformed string, an index out
    of range, or a step into a type that is neither composite nor array.
    """
    spec = Spec(btf=btf, root_type_id=root_type_id, kind=kind)
    numbers = _parse_numbers(access)
    if kind in TYPE_KINDS:
        if access != "0":
            raise CoreError(f"type-based CO-RE relocation needs access string '0', not {access!r}")
        return spec
    spec.raw = numbers
    type_id, t = skip_mods_and_typedefs(btf, root_type_id)
    first = numbers[0]
    if kind in ENUMVAL_KINDS:
        if not isinstance(t, Enum) or len(numbers) > 1 or first >= len(t.values):
            raise CoreError(
                f"enum-value CO-RE relocation on [{root_type_id}] with access {access!r} "
                "does not name an enumerator"
            )
        spec.accessors.append(Accessor(type_id, first, t.values[first].name))
        return spec
    if kind not in FIELD_KINDS:
        raise CoreError(f"unknown CO-RE relocation kind {kind}")

    spec.accessors.append(Accessor(type_id, first, None))
    spec.bit_offset = first * size_of(btf, type_id) * 8
    for i in range(1, len(numbers)):
        type_id, t = skip_mods_and_typedefs(btf, type_id)
        idx = numbers[i]
        if isinstance(t, Composite):
            if idx >= len(t.members):
                raise CoreError(
                    f"CO-RE access {access!r}: member #{idx} of [{type_id}] {t.name!r} "
                    f"does not exist ({len(t.members)} members)"
                )
            m = t.members[idx]
            spec.bit_offset += m.bit_offset
            if m.name:
                spec.accessors.append(Accessor(type_id, idx, m.name))
            type_id = m.type
        elif isinstance(t, Array):
            elem_id, _ = skip_mods_and_typedefs(btf, t.type)
            if not is_flex_array(btf, spec.accessors[-1], t) and idx >= t.nelems:
                raise CoreError(
                    f"CO-RE access {access!r}: index {idx} out of bounds of array "
                    f"[{type_id}] with {t.nelems} elements"
                )
            spec.accessors.append(Accessor(elem_id, idx, None))
            spec.bit_offset += idx * size_of(btf, elem_id) * 8
            type_id = elem_id
        else:
            raise CoreError(
                f"CO-RE access {access!r} steps into [{type_id}] of kind {t.kind.name}, "
                "which is neither struct, union nor array"
            )
    return spec
