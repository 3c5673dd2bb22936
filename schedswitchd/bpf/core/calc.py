"""Computing CO-RE relocation values from a local spec and a (possibly absent) target spec.

Follows libbpf ``src/relo_core.c`` (``bpf_core_calc_field_relo``, ``bpf_core_calc_type_relo``,
``bpf_core_calc_enumval_relo``, ``bpf_core_calc_relo``). Values are unsigned 64-bit, as
libbpf keeps them (an ENUM's 32-bit value is sign-extended first, like libbpf's ``__s32``
to ``__u64`` conversion). Bit-shift values assume a little-endian target (x86-64).
"""

from __future__ import annotations

from dataclasses import dataclass

from schedswitchd.bpf.btf.types import Composite, Enum, Int, Kind
from schedswitchd.bpf.core.access import (
    ENUMVAL_KINDS,
    FIELD_KINDS,
    TYPE_KINDS,
    Spec,
    size_of,
    skip_mods_and_typedefs,
    type_of,
)
from schedswitchd.bpf.core.relo import CoreReloKind
from schedswitchd.errors import CoreError

U64_MASK = (1 << 64) - 1
INT_ENCODING_SIGNED = 1


@dataclass(frozen=True, slots=True)
class FieldValue:
    """One side of a relocation. ``mem_size``/``mem_type_id``: for FIELD_BYTE_OFFSET on a
    non-bitfield, the field's size in bytes and type id (for load-size adjustment), else 0.
    ``validate``: whether the instruction's original value must equal the local value."""

    value: int
    mem_size: int = 0
    mem_type_id: int = 0
    validate: bool = True


@dataclass(frozen=True, slots=True)
class Resolution:
    """``struct bpf_core_relo_res``: what to patch. ``poison`` replaces the instruction;
    ``fail_memsz_adjust`` means a load/store may not be resized (poisoned if it is one)."""

    orig_val: int
    new_val: int
    poison: bool
    validate: bool
    orig_sz: int = 0
    new_sz: int = 0
    fail_memsz_adjust: bool = False


class _Poison(Exception):
    """Internal: the target side is missing and the kind cannot express that as a value."""


def _field_value(kind: CoreReloKind, spec: Spec | None) -> FieldValue:
    if kind == CoreReloKind.FIELD_EXISTS:
        return FieldValue(1 if spec is not None else 0)
    if spec is None:
        raise _Poison
    btf = spec.btf
    acc = spec.accessors[-1]
    if acc.name is None:
        # An array element (or the root itself): only offset and size make sense.
        sz = size_of(btf, acc.type_id)
        if kind == CoreReloKind.FIELD_BYTE_OFFSET:
            return FieldValue(spec.bit_offset // 8, sz, acc.type_id)
        if kind == CoreReloKind.FIELD_BYTE_SIZE:
            return FieldValue(sz)
        raise CoreError(f"CO-RE relocation {kind.name} cannot be applied to an array access")

    holder = type_of(btf, acc.type_id)
    assert isinstance(holder, Composite)
    m = holder.members[acc.idx]
    field_type_id, mt = skip_mods_and_typedefs(btf, m.type)
    bit_off = spec.bit_offset
    bit_sz = m.bitfield_size
    bitfield = bit_sz > 0
    if bitfield:
        # The smallest naturally aligned load (of at least the declared type's size)
        # that covers every bit of the bitfield.
        byte_sz = mt.size if isinstance(mt, Int | Enum) else size_of(btf, field_type_id)
        if byte_sz <= 0:
            raise CoreError(f"bitfield {m.name!r} has a type of size {byte_sz}")
        byte_off = bit_off // 8 // byte_sz * byte_sz
        while bit_off + bit_sz - byte_off * 8 > byte_sz * 8:
            if byte_sz >= 8:
                raise CoreError(f"bitfield {m.name!r} cannot be read with one 64-bit load")
            byte_sz *= 2
            byte_off = bit_off // 8 // byte_sz * byte_sz
    else:
        byte_sz = size_of(btf, field_type_id)
        byte_off = bit_off // 8
        bit_sz = byte_sz * 8

    if kind == CoreReloKind.FIELD_BYTE_OFFSET:
        if bitfield:
            return FieldValue(byte_off, validate=False)
        return FieldValue(byte_off, byte_sz, field_type_id, validate=True)
    if kind == CoreReloKind.FIELD_BYTE_SIZE:
        return FieldValue(byte_sz, validate=not bitfield)
    if kind == CoreReloKind.FIELD_SIGNED:
        signed = (isinstance(mt, Enum) and mt.signed) or (isinstance(mt, Int) and mt.signed)
        return FieldValue(int(signed), validate=True)
    if kind == CoreReloKind.FIELD_LSHIFT_U64:
        return FieldValue(64 - (bit_off + bit_sz - byte_off * 8), validate=not bitfield)
    if kind == CoreReloKind.FIELD_RSHIFT_U64:
        return FieldValue(64 - bit_sz, validate=True)
    raise CoreError(f"unknown CO-RE field relocation kind {kind}")


def _type_value(kind: CoreReloKind, spec: Spec | None) -> int:
    if spec is None:
        return 0
    if kind == CoreReloKind.TYPE_ID_TARGET:
        return spec.root_type_id
    if kind in (CoreReloKind.TYPE_EXISTS, CoreReloKind.TYPE_MATCHES):
        return 1
    if kind == CoreReloKind.TYPE_SIZE:
        return size_of(spec.btf, spec.root_type_id)
    raise CoreError(f"CO-RE relocation kind {kind.name} is not computed from a candidate")


def _enumval_value(kind: CoreReloKind, spec: Spec | None) -> int:
    if kind == CoreReloKind.ENUMVAL_EXISTS:
        return 1 if spec is not None else 0
    if spec is None:
        raise _Poison
    acc = spec.accessors[0]
    t = type_of(spec.btf, acc.type_id)
    assert isinstance(t, Enum)
    value = t.values[acc.idx].value
    if t.kind == Kind.ENUM:
        # btf_enum.val is a __s32 that libbpf widens to __u64 with sign extension.
        low = value & 0xFFFFFFFF
        value = low - (1 << 32) if low & 0x80000000 else low
    return value & U64_MASK


def _is_unsigned_int(t: object) -> bool:
    # libbpf's test is "encoding != BTF_INT_SIGNED", so char/bool encodings count as unsigned.
    return isinstance(t, Int) and t.encoding != INT_ENCODING_SIGNED


def calc_relo(kind: CoreReloKind, local_spec: Spec, targ_spec: Spec | None) -> Resolution:
    """Original (local) and new (target) values for one relocation against one candidate
    (``targ_spec`` None: no candidate matched). ``CoreError`` for a kind that does not
    apply to the spec (e.g. FIELD_SIGNED on an array element) or an unreadable bitfield."""
    if kind in FIELD_KINDS:
        orig = _field_value(kind, local_spec)
        try:
            new = _field_value(kind, targ_spec)
        except _Poison:
            return Resolution(orig.value, 0, poison=True, validate=orig.validate)
        fail = False
        if orig.mem_size != new.mem_size:
            assert targ_spec is not None
            ot = type_of(local_spec.btf, orig.mem_type_id)
            nt = type_of(targ_spec.btf, new.mem_type_id)
            both_ptr = ot.kind == Kind.PTR and nt.kind == Kind.PTR
            fail = not (both_ptr or (_is_unsigned_int(ot) and _is_unsigned_int(nt)))
        return Resolution(
            orig.value,
            new.value,
            poison=False,
            validate=orig.validate,
            orig_sz=orig.mem_size,
            new_sz=new.mem_size,
            fail_memsz_adjust=fail,
        )
    if kind in TYPE_KINDS:
        # Type ids may be renumbered by linking, so TYPE_ID_TARGET is not validated.
        validate = kind != CoreReloKind.TYPE_ID_TARGET
        return Resolution(
            _type_value(kind, local_spec), _type_value(kind, targ_spec), False, validate
        )
    if kind in ENUMVAL_KINDS:
        orig_val = _enumval_value(kind, local_spec)
        try:
            new_val = _enumval_value(kind, targ_spec)
        except _Poison:
            return Resolution(orig_val, 0, poison=True, validate=True)
        return Resolution(orig_val, new_val, False, True)
    raise CoreError(f"unknown CO-RE relocation kind {kind}")
