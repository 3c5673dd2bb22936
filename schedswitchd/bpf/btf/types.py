"""BTF type values: small immutable records, one class per BTF kind family.

Source of the format: kernel doc ``Documentation/bpf/btf.rst`` and the UAPI header
``include/uapi/linux/btf.h``. Type ids are ints; id 0 is ``void``. Sizes are in bytes,
offsets of struct members in *bits* (as BTF stores them), DATASEC variable offsets in bytes.

These records are what :class:`schedswitchd.bpf.btf.reader.Btf` hands out when a type is asked
for; nothing else in the package builds them from raw bytes. The per-entry records of a type
(:class:`Member`, :class:`EnumValue`, :class:`Param`, :class:`VarSecinfo`) are named tuples:
a struct or DATASEC decodes tens of them, at every object open.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple


class Kind(IntEnum):
    """``BTF_KIND_*`` from ``include/uapi/linux/btf.h``."""

    UNKN = 0
    INT = 1
    PTR = 2
    ARRAY = 3
    STRUCT = 4
    UNION = 5
    ENUM = 6
    FWD = 7
    TYPEDEF = 8
    VOLATILE = 9
    CONST = 10
    RESTRICT = 11
    FUNC = 12
    FUNC_PROTO = 13
    VAR = 14
    DATASEC = 15
    FLOAT = 16
    DECL_TAG = 17
    TYPE_TAG = 18
    ENUM64 = 19


#: ``BTF_INT_*`` encoding bits (``include/uapi/linux/btf.h``).
INT_SIGNED = 1 << 0
INT_CHAR = 1 << 1
INT_BOOL = 1 << 2

#: ``BTF_FUNC_*`` linkage and ``BTF_VAR_*`` linkage values.
FUNC_STATIC, FUNC_GLOBAL, FUNC_EXTERN = 0, 1, 2
VAR_STATIC, VAR_GLOBAL_ALLOCATED, VAR_GLOBAL_EXTERN = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Void:
    """Type id 0."""

    id: int = 0
    kind: Kind = Kind.UNKN
    name: str = ""


@dataclass(frozen=True, slots=True)
class Int:
    """``BTF_KIND_INT``: ``size`` bytes; ``encoding`` is a mask of ``INT_*``; ``offset`` and
    ``bits`` are the bit offset and width of the value inside the storage."""

    id: int
    name: str
    size: int
    encoding: int
    offset: int
    bits: int
    kind: Kind = Kind.INT

    @property
    def signed(self) -> bool:
        """Whether ``BTF_INT_SIGNED`` is set in the encoding (``include/uapi/linux/btf.h``)."""
        return bool(self.encoding & INT_SIGNED)


@dataclass(frozen=True, slots=True)
class Ref:
    """A type that only points at another: PTR, TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG.

    ``type`` is the referenced type id (0 for ``void *``); ``name`` is empty except for
    TYPEDEF and TYPE_TAG.
    """

    id: int
    kind: Kind
    name: str
    type: int


@dataclass(frozen=True, slots=True)
class Array:
    """``BTF_KIND_ARRAY``: ``nelems`` elements of ``type``; ``index_type`` is the index's type."""

    id: int
    type: int
    index_type: int
    nelems: int
    name: str = ""
    kind: Kind = Kind.ARRAY


class Member(NamedTuple):
    """A struct/union member. ``bit_offset`` from the start of the enclosing composite;
    ``bitfield_size`` in bits, 0 when the member is not a bitfield (kind_flag semantics of
    ``btf.rst`` already applied). ``name`` is empty for anonymous members."""

    name: str
    type: int
    bit_offset: int
    bitfield_size: int


@dataclass(frozen=True, slots=True)
class Composite:
    """``BTF_KIND_STRUCT`` or ``BTF_KIND_UNION`` (``kind`` says which); ``size`` in bytes."""

    id: int
    kind: Kind
    name: str
    size: int
    members: tuple[Member, ...]


class EnumValue(NamedTuple):
    """One enumerator; ``value`` already sign-adjusted from the enum's signedness."""

    name: str
    value: int


@dataclass(frozen=True, slots=True)
class Enum:
    """``BTF_KIND_ENUM`` or ``BTF_KIND_ENUM64`` (``kind`` says which); ``size`` in bytes;
    ``signed`` from kind_flag."""

    id: int
    kind: Kind
    name: str
    size: int
    signed: bool
    values: tuple[EnumValue, ...]


@dataclass(frozen=True, slots=True)
class Fwd:
    """``BTF_KIND_FWD``: a forward declaration; ``is_union`` from kind_flag."""

    id: int
    name: str
    is_union: bool
    kind: Kind = Kind.FWD


@dataclass(frozen=True, slots=True)
class Func:
    """``BTF_KIND_FUNC``: ``type`` is its FUNC_PROTO id; ``linkage`` is ``FUNC_*``."""

    id: int
    name: str
    type: int
    linkage: int
    kind: Kind = Kind.FUNC


class Param(NamedTuple):
    """A FUNC_PROTO parameter; ``type`` 0 with an empty name marks ``...`` (varargs)."""

    name: str
    type: int


@dataclass(frozen=True, slots=True)
class FuncProto:
    """``BTF_KIND_FUNC_PROTO``: ``return_type`` (0 = void) and parameters."""

    id: int
    return_type: int
    params: tuple[Param, ...]
    name: str = ""
    kind: Kind = Kind.FUNC_PROTO


@dataclass(frozen=True, slots=True)
class Var:
    """``BTF_KIND_VAR``: a global variable; ``linkage`` is ``VAR_*``."""

    id: int
    name: str
    type: int
    linkage: int
    kind: Kind = Kind.VAR


class VarSecinfo(NamedTuple):
    """One DATASEC entry: the VAR (or FUNC, for ``.ksyms``) id, byte offset and byte size."""

    type: int
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class Datasec:
    """``BTF_KIND_DATASEC``: an ELF data section's variables; ``size`` in bytes."""

    id: int
    name: str
    size: int
    vars: tuple[VarSecinfo, ...]
    kind: Kind = Kind.DATASEC


@dataclass(frozen=True, slots=True)
class Float:
    """``BTF_KIND_FLOAT``: ``size`` bytes."""

    id: int
    name: str
    size: int
    kind: Kind = Kind.FLOAT


@dataclass(frozen=True, slots=True)
class DeclTag:
    """``BTF_KIND_DECL_TAG``: tag ``name`` on ``type``; ``component_idx`` -1 for the whole
    type, else a member or parameter index."""

    id: int
    name: str
    type: int
    component_idx: int
    kind: Kind = Kind.DECL_TAG


BtfType = (
    Void
    | Int
    | Ref
    | Array
    | Composite
    | Enum
    | Fwd
    | Func
    | FuncProto
    | Var
    | Datasec
    | Float
    | DeclTag
)
"""Any decoded BTF type."""


def essential_name(name: str) -> str:
    """The name CO-RE matches on: ``name`` without its last ``___flavour`` suffix.

    A flavour separator is ``X___Y`` with X and Y not underscores, searched from the end
    (the rule of libbpf's ``bpf_core_essential_name_len``): ``task_struct___v2`` ->
    ``task_struct``; ``foo___v2___compat`` -> ``foo___v2``; ``__x___`` is unchanged.
    """
    if "___" not in name:
        return name  # most names: no separator to search for
    for i in range(len(name) - 5, -1, -1):
        if name[i] != "_" and name[i + 1 : i + 4] == "___" and name[i + 4] != "_":
            return name[: i + 1]
    return name
