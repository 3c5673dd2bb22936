"""CO-RE compatibility rules between a local and a target type.

Three relations, each following libbpf ``src/relo_core.c`` (read for the semantics; this is
an independent implementation):

- :func:`fields_are_compat` (``bpf_core_fields_are_compat``): can a local member's type be
  relocated onto a target member's type? Used for every named step of a field access.
- :func:`types_are_compat` (``__bpf_core_types_are_compat``): the looser structural check
  behind TYPE_EXISTS / TYPE_SIZE / TYPE_ID_TARGET.
- :func:`types_match` (``__bpf_core_types_match``): the stricter check behind
  TYPE_MATCHES (member names, int size and signedness, enum variant names, array lengths).

All return ``bool``; a recursion deeper than libbpf's limits raises ``CoreError`` (libbpf
fails the relocation with ``-EINVAL`` there too).
"""

from __future__ import annotations

from schedswitchd.bpf.btf.types import (
    Array,
    BtfType,
    Composite,
    Enum,
    FuncProto,
    Fwd,
    Int,
    Kind,
    Ref,
    essential_name,
)
from schedswitchd.bpf.core.access import BtfView, skip_mods_and_typedefs, type_of
from schedswitchd.errors import CoreError

#: libbpf's recursion limits: ``depth`` for tail loops, ``level`` for nested calls.
MAX_DEPTH = 32
MAX_LEVEL = 32

_ANY_ENUM = (Kind.ENUM, Kind.ENUM64)


def kinds_core_compat(a: BtfType, b: BtfType) -> bool:
    """Same BTF kind, except that ENUM and ENUM64 are interchangeable."""
    return a.kind == b.kind or (a.kind in _ANY_ENUM and b.kind in _ANY_ENUM)


def _int_offset_zero(a: BtfType, b: BtfType) -> bool:
    # Ints with a non-zero bit offset are the deprecated bitfield encoding; CO-RE rejects them.
    return isinstance(a, Int) and isinstance(b, Int) and a.offset == 0 and b.offset == 0


def fields_are_compat(local: BtfView, local_id: int, targ: BtfView, targ_id: int) -> bool:
    """``bpf_core_fields_are_compat``: any two composites match; PTRs and FLOATs match;
    FWD/ENUM(64) need equal essential names unless one is anonymous; INTs match unless
    one uses a bit offset; ARRAYs recurse into element types (lengths ignored)."""
    for _ in range(MAX_DEPTH):
        local_id, lt = skip_mods_and_typedefs(local, local_id)
        targ_id, tt = skip_mods_and_typedefs(targ, targ_id)
        if isinstance(lt, Composite) and isinstance(tt, Composite):
            return True
        if not kinds_core_compat(lt, tt):
            return False
        if lt.kind in (Kind.PTR, Kind.FLOAT):
            return True
        if lt.kind in (Kind.FWD, Kind.ENUM, Kind.ENUM64):
            ln, tn = essential_name(lt.name), essential_name(tt.name)
            return not ln or not tn or ln == tn
        if lt.kind == Kind.INT:
            return _int_offset_zero(lt, tt)
        if isinstance(lt, Array) and isinstance(tt, Array):
            local_id, targ_id = lt.type, tt.type
            continue
        return False
    raise CoreError(f"array nesting deeper than {MAX_DEPTH} comparing [{local_id}]/[{targ_id}]")


def types_are_compat(
    local: BtfView, local_id: int, targ: BtfView, targ_id: int, level: int = MAX_LEVEL
) -> bool:
    """``__bpf_core_types_are_compat``: kinds must agree (ENUM ~ ENUM64) at the root and
    after skipping modifiers; STRUCT/UNION/ENUM/FWD/void are compatible whatever their
    contents; INTs unless bit-offset encoded; PTR/ARRAY recurse; FUNC_PROTOs need the same
    parameter count and compatible parameter and return types. Names below the root are
    ignored (the caller matched the root names)."""
    if not kinds_core_compat(type_of(local, local_id), type_of(targ, targ_id)):
        return False
    for _ in range(MAX_DEPTH):
        local_id, lt = skip_mods_and_typedefs(local, local_id)
        targ_id, tt = skip_mods_and_typedefs(targ, targ_id)
        if not kinds_core_compat(lt, tt):
            return False
        if lt.kind in (Kind.UNKN, Kind.STRUCT, Kind.UNION, Kind.ENUM, Kind.ENUM64, Kind.FWD):
            return True
        if lt.kind == Kind.INT:
            return _int_offset_zero(lt, tt)
        if isinstance(lt, Ref) and isinstance(tt, Ref):  # PTR (modifiers were skipped)
            local_id, targ_id = lt.type, tt.type
            continue
        if isinstance(lt, Array) and isinstance(tt, Array):
            local_id, targ_id = lt.type, tt.type
            continue
        if isinstance(lt, FuncProto) and isinstance(tt, FuncProto):
            if len(lt.params) != len(tt.params):
                return False
            for lp, tp in zip(lt.params, tt.params, strict=True):
                if level <= 0:
                    raise CoreError("function prototype nesting too deep for CO-RE")
                lp_id, _ = skip_mods_and_typedefs(local, lp.type)
                tp_id, _ = skip_mods_and_typedefs(targ, tp.type)
                if not types_are_compat(local, lp_id, targ, tp_id, level - 1):
                    return False
            local_id, targ_id = lt.return_type, tt.return_type
            continue
        return False
    raise CoreError(f"type nesting deeper than {MAX_DEPTH} comparing [{local_id}]/[{targ_id}]")


def names_match(local_name: str, targ_name: str) -> bool:
    """``bpf_core_names_match``: an anonymous target only matches an anonymous local;
    otherwise the essential names (flavour suffix dropped) must be equal."""
    if not targ_name:
        return not local_name
    return essential_name(local_name) == essential_name(targ_name)


def _enums_match(lt: Enum, tt: Enum) -> bool:
    if lt.size != tt.size or len(lt.values) > len(tt.values):
        return False
    return all(any(names_match(lv.name, tv.name) for tv in tt.values) for lv in lt.values)


def _composites_match(
    local: BtfView,
    lt: Composite,
    targ: BtfView,
    tt: Composite,
    behind_ptr: bool,
    level: int,
) -> bool:
    if len(lt.members) > len(tt.members):
        return False
    for lm in lt.members:
        if not any(
            names_match(lm.name, tm.name)
            and types_match(local, lm.type, targ, tm.type, behind_ptr, level - 1)
            for tm in tt.members
        ):
            return False
    return True


def types_match(
    local: BtfView,
    local_id: int,
    targ: BtfView,
    targ_id: int,
    behind_ptr: bool = False,
    level: int = MAX_LEVEL,
) -> bool:
    """``__bpf_core_types_match`` (the TYPE_MATCHES relation).

    After skipping modifiers and typedefs, names must match (essential names), then:
    FWD matches a FWD of the same struct/union flavour, or behind a pointer also the
    struct/union it declares; STRUCT/UNION behind a pointer match the same kind or a FWD of
    it, otherwise every local member needs a same-named target member whose type matches;
    ENUM/ENUM64 need equal size and every local enumerator name present in the target;
    INTs need equal size and signedness; PTRs recurse (then "behind a pointer"); ARRAYs
    need equal length and matching elements; FUNC_PROTOs need equal parameter counts and
    matching parameter and return types.
    """
    if level <= 0:
        raise CoreError("type nesting too deep for CO-RE type matching")
    for _ in range(MAX_DEPTH):
        local_id, lt = skip_mods_and_typedefs(local, local_id)
        targ_id, tt = skip_mods_and_typedefs(targ, targ_id)
        if not names_match(lt.name, tt.name):
            return False
        lk, tk = lt.kind, tt.kind
        if lk == Kind.UNKN:
            return tk == Kind.UNKN
        if isinstance(lt, Fwd):
            if isinstance(tt, Fwd):
                return lt.is_union == tt.is_union
            if behind_ptr:
                return (tk == Kind.STRUCT and not lt.is_union) or (tk == Kind.UNION and lt.is_union)
            return False
        if isinstance(lt, Enum):
            return isinstance(tt, Enum) and _enums_match(lt, tt)
        if isinstance(lt, Composite):
            if behind_ptr:
                if lk == tk:
                    return True
                return isinstance(tt, Fwd) and (lk == Kind.UNION) == tt.is_union
            if lk != tk or not isinstance(tt, Composite):
                return False
            return _composites_match(local, lt, targ, tt, behind_ptr, level)
        if isinstance(lt, Int):
            return isinstance(tt, Int) and lt.size == tt.size and lt.signed == tt.signed
        if lk == Kind.PTR:
            if tk != Kind.PTR:
                return False
            assert isinstance(lt, Ref) and isinstance(tt, Ref)
            behind_ptr = True
            local_id, targ_id = lt.type, tt.type
            continue
        if isinstance(lt, Array):
            if not isinstance(tt, Array) or lt.nelems != tt.nelems:
                return False
            local_id, targ_id = lt.type, tt.type
            continue
        if isinstance(lt, FuncProto):
            if not isinstance(tt, FuncProto) or len(lt.params) != len(tt.params):
                return False
            for lp, tp in zip(lt.params, tt.params, strict=True):
                if not types_match(local, lp.type, targ, tp.type, behind_ptr, level - 1):
                    return False
            local_id, targ_id = lt.return_type, tt.return_type
            continue
        return False
    raise CoreError(f"type nesting deeper than {MAX_DEPTH} comparing [{local_id}]/[{targ_id}]")
