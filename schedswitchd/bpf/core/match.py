"""Matching a local CO-RE spec against one candidate target type.

Follows libbpf ``src/relo_core.c`` (``bpf_core_spec_match``, ``bpf_core_match_member``):
type-based kinds compare whole types (:func:`types_are_compat`, or :func:`types_match` for
TYPE_MATCHES); enum-value kinds look the enumerator up by essential name; field-based kinds
replay the local high-level path on the target, finding each named member by name (through
anonymous members, depth first, in member order) and checking its type with
:func:`fields_are_compat`, and each array index against the target array's bounds.
"""

from __future__ import annotations

from schedswitchd.bpf.btf.types import Array, Composite, Enum, essential_name
from schedswitchd.bpf.core.access import (
    ENUMVAL_KINDS,
    FIELD_KINDS,
    SPEC_MAX_LEN,
    TYPE_KINDS,
    Accessor,
    BtfView,
    Spec,
    is_flex_array,
    size_of,
    skip_mods_and_typedefs,
    type_of,
)
from schedswitchd.bpf.core.compat import fields_are_compat, types_are_compat, types_match
from schedswitchd.bpf.core.relo import CoreReloKind
from schedswitchd.errors import CoreError


def _match_member(
    local: BtfView, local_acc: Accessor, targ: BtfView, targ_id: int, spec: Spec
) -> int | None:
    """Find the member named by ``local_acc`` inside target composite ``targ_id``.

    On success appends to ``spec`` (raw path, accessor, bit offset) and returns the
    member's type id; returns None (``spec`` unchanged) when there is no compatible member.
    """
    targ_id, tt = skip_mods_and_typedefs(targ, targ_id)
    if not isinstance(tt, Composite):
        return None
    lt = type_of(local, local_acc.type_id)
    assert isinstance(lt, Composite)  # parse_spec only records named accessors on composites
    local_member = lt.members[local_acc.idx]
    for i, m in enumerate(tt.members):
        if len(spec.raw) >= SPEC_MAX_LEN:
            raise CoreError(f"target struct/union nesting deeper than {SPEC_MAX_LEN}")
        spec.bit_offset += m.bit_offset
        spec.raw.append(i)
        if not m.name:
            found = _match_member(local, local_acc, targ, m.type, spec)
            if found is not None:
                return found
        elif m.name == local_member.name:
            if fields_are_compat(local, local_member.type, targ, m.type):
                spec.accessors.append(Accessor(targ_id, i, m.name))
                return m.type
            # libbpf gives up on the candidate at the first same-named, incompatible member.
            spec.bit_offset -= m.bit_offset
            spec.raw.pop()
            return None
        spec.bit_offset -= m.bit_offset
        spec.raw.pop()
    return None


def spec_match(local_spec: Spec, targ: BtfView, targ_id: int) -> Spec | None:
    """The target spec for candidate ``targ_id`` of ``targ``, or None if it does not match.

    ``CoreError`` on malformed target BTF (no size where one is needed, too deep nesting).
    """
    spec = Spec(btf=targ, root_type_id=targ_id, kind=local_spec.kind)
    kind = local_spec.kind
    local = local_spec.btf
    if kind in TYPE_KINDS:
        if kind == CoreReloKind.TYPE_MATCHES:
            ok = types_match(local, local_spec.root_type_id, targ, targ_id)
        else:
            ok = types_are_compat(local, local_spec.root_type_id, targ, targ_id)
        return spec if ok else None

    if kind in ENUMVAL_KINDS:
        targ_id, tt = skip_mods_and_typedefs(targ, targ_id)
        if not isinstance(tt, Enum):
            return None
        wanted = local_spec.accessors[0].name or ""
        ess = essential_name(wanted)
        for i, v in enumerate(tt.values):
            if essential_name(v.name) == ess:
                spec.accessors.append(Accessor(targ_id, i, v.name))
                spec.raw.append(i)
                return spec
        return None

    if kind not in FIELD_KINDS:
        raise CoreError(f"unknown CO-RE relocation kind {kind}")
    for i, local_acc in enumerate(local_spec.accessors):
        targ_id, tt = skip_mods_and_typedefs(targ, targ_id)
        if local_acc.name is not None:
            next_id = _match_member(local, local_acc, targ, targ_id, spec)
            if next_id is None:
                return None
            targ_id = next_id
            continue
        if i > 0:
            # The root accessor indexes the root itself; later unnamed ones index arrays.
            if not isinstance(tt, Array):
                return None
            if not is_flex_array(targ, spec.accessors[-1], tt) and local_acc.idx >= tt.nelems:
                return None
            targ_id, _ = skip_mods_and_typedefs(targ, tt.type)
        if len(spec.raw) >= SPEC_MAX_LEN:
            raise CoreError(f"target access path deeper than {SPEC_MAX_LEN}")
        spec.accessors.append(Accessor(targ_id, local_acc.idx, None))
        spec.raw.append(local_acc.idx)
        spec.bit_offset += local_acc.idx * size_of(targ, targ_id) * 8
    return spec
