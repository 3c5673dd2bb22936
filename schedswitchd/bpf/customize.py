"""Pre-load edits of an :class:`~schedswitchd.bpf.spec.ObjectSpec` (never of the file).

What user space does between open and load with libbpf skeletons: set ``.rodata``
tunables and ``.data``/``.bss`` initial values (``skel->rodata->nr_cpus = 8``), set
struct_ops scalar members (``skel->struct_ops.ops->flags``, ``timeout_ms``,
``exit_dump_len``, ``hotplug_seq``), and resize a ``.data.NAME`` array section (scx's
``RESIZE_ARRAY``, libbpf's ``bpf_map__set_value_size`` with ``map_btf_datasec_resize``).
Every function returns a new spec; values are encoded little endian through the BTF type
of the target (kernel doc ``Documentation/bpf/btf.rst``). Anything that does not fit raises
:class:`~schedswitchd.errors.CustomizationError` naming the variable or member.

Accepted Python values by BTF type (after modifiers and typedefs): ``INT`` -- ``int`` in the
type's range (``bool`` for a ``_Bool``); ``ENUM``/``ENUM64`` -- ``int`` in range or an
enumerator name; ``FLOAT`` -- ``float``; ``ARRAY`` of 1-byte ints -- ``str``/``bytes`` of at
most ``nelems`` bytes (NUL padded); other ``ARRAY`` -- a sequence of at most ``nelems``
element values (the rest zero); ``STRUCT``/``UNION`` -- a ``dict`` of member values (others
kept); any type -- ``bytes`` of exactly its size. Pointers cannot be set.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import replace

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import (
    INT_BOOL,
    Array,
    Composite,
    Datasec,
    Enum,
    Float,
    Int,
    Kind,
    Var,
)
from schedswitchd.bpf.spec import (
    MAX_ARRAY_VALUE_SIZE,
    MapKind,
    MapSpec,
    ObjectSpec,
    StructOpsSpec,
    VariableSpec,
)
from schedswitchd.errors import BtfError, CustomizationError

__all__ = ["encode_value", "resize_array_section", "set_struct_ops_member", "set_variable"]

_DATA_KINDS = (MapKind.DATA, MapKind.RODATA, MapKind.BSS)
_MAX_DEPTH = 32


def encode_value(btf: Btf, type_id: int, value: object, current: bytes, what: str) -> bytes:
    """Encode ``value`` as BTF type ``type_id`` over ``current`` (its present bytes, which
    give the size and the untouched parts of composites). Raises ``CustomizationError``."""
    try:
        out = _encode(btf, type_id, value, current, what, 0)
    except BtfError as exc:
        raise CustomizationError(f"{what}: its BTF type cannot be used: {exc}") from exc
    if len(out) != len(current):
        # A DATASEC entry (or struct_ops member) larger than its type, which the kernel
        # accepts: which bytes the value should fill is not ours to guess.
        raise CustomizationError(
            f"{what}: its BTF type is {len(out)} bytes, not {len(current)} as its place"
        )
    return out


def _encode(btf: Btf, type_id: int, value: object, cur: bytes, what: str, depth: int) -> bytes:
    if depth > _MAX_DEPTH:
        raise CustomizationError(f"{what}: type nesting is too deep")
    size = len(cur)
    if isinstance(value, bytes | bytearray) and len(value) == size:
        tid0 = btf.skip_mods_and_typedefs(type_id)
        t0 = btf.type(tid0)
        if not (isinstance(t0, Array) and _is_byte(btf, t0.type)):
            return bytes(value)
    tid = btf.skip_mods_and_typedefs(type_id)
    t = btf.type(tid)
    if isinstance(t, Int):
        if t.offset or t.bits != 8 * t.size:
            raise CustomizationError(f"{what}: bit-sized integers cannot be set")
        if t.encoding & INT_BOOL:
            if not isinstance(value, bool) and value not in (0, 1):
                raise CustomizationError(f"{what}: expected a bool, got {value!r}")
            return bytes([int(bool(value))]) + bytes(size - 1)
        return _int_bytes(value, t.size, t.signed, what)
    if isinstance(t, Enum):
        if isinstance(value, str):
            for ev in t.values:
                if ev.name == value:
                    value = ev.value
                    break
            else:
                raise CustomizationError(f"{what}: {value!r} is not an enumerator of {t.name!r}")
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0 and not t.signed:
                return _int_bytes(value, t.size, True, what)
            return _int_bytes(value, t.size, t.signed, what)
        raise CustomizationError(f"{what}: expected an int or enumerator name, got {value!r}")
    if isinstance(t, Float):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise CustomizationError(f"{what}: expected a float, got {value!r}")
        if t.size == 4:
            return struct.pack("<f", float(value))
        if t.size == 8:
            return struct.pack("<d", float(value))
        raise CustomizationError(f"{what}: {t.size}-byte floats are not supported")
    if isinstance(t, Array):
        return _encode_array(btf, t, value, cur, what, depth)
    if isinstance(t, Composite):
        if not isinstance(value, Mapping):
            raise CustomizationError(f"{what}: expected a dict of members, got {value!r}")
        buf = bytearray(cur)
        names = {m.name: m for m in t.members if m.name}
        for key, v in value.items():
            m = names.get(str(key))
            if m is None:
                raise CustomizationError(f"{what}: {t.name or 'struct'} has no member {key!r}")
            if m.bitfield_size or m.bit_offset % 8:
                raise CustomizationError(f"{what}.{key}: bitfields cannot be set")
            off = m.bit_offset // 8
            msize = btf.size_of(m.type)
            if off + msize > size:
                raise CustomizationError(f"{what}.{key}: member lies outside the value")
            buf[off : off + msize] = _encode(
                btf, m.type, v, bytes(buf[off : off + msize]), f"{what}.{key}", depth + 1
            )
        return bytes(buf)
    if t.kind == Kind.PTR:
        raise CustomizationError(f"{what}: pointers cannot be set from user space")
    raise CustomizationError(f"{what}: values of BTF kind {t.kind.name} cannot be set")


def _is_byte(btf: Btf, type_id: int) -> bool:
    t = btf.type(btf.skip_mods_and_typedefs(type_id))
    return isinstance(t, Int) and t.size == 1


def _encode_array(btf: Btf, t: Array, value: object, cur: bytes, what: str, depth: int) -> bytes:
    if _is_byte(btf, t.type) and isinstance(value, str | bytes | bytearray):
        raw = value.encode() if isinstance(value, str) else bytes(value)
        if len(raw) > t.nelems:
            raise CustomizationError(f"{what}: {len(raw)} bytes do not fit char[{t.nelems}]")
        return raw + bytes(t.nelems - len(raw))
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, Sequence):
        raise CustomizationError(f"{what}: expected a sequence for an array, got {value!r}")
    if len(value) > t.nelems:
        raise CustomizationError(f"{what}: {len(value)} values do not fit [{t.nelems}]")
    esize = btf.size_of(t.type)
    if esize * t.nelems != len(cur):
        raise CustomizationError(f"{what}: array size does not match its storage")
    out = bytearray(len(cur))
    for i, v in enumerate(value):
        out[i * esize : (i + 1) * esize] = _encode(
            btf, t.type, v, cur[i * esize : (i + 1) * esize], f"{what}[{i}]", depth + 1
        )
    return bytes(out)


def _int_bytes(value: object, size: int, signed: bool, what: str) -> bytes:
    if not isinstance(value, int):
        raise CustomizationError(f"{what}: expected an int, got {value!r}")
    bits = 8 * size
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not lo <= value <= hi:
        kind = "s" if signed else "u"
        raise CustomizationError(f"{what}: {value} is out of range for {kind}{bits} [{lo}, {hi}]")
    return int(value).to_bytes(size, "little", signed=signed)


def _find_variable(spec: ObjectSpec, name: str, section: str | None) -> tuple[int, VariableSpec]:
    hits = [
        (i, v)
        for i, m in enumerate(spec.maps)
        if m.kind in _DATA_KINDS and (section is None or m.name == section)
        for v in m.variables
        if v.name == name
    ]
    if not hits:
        where = f" in {section!r}" if section else ""
        raise CustomizationError(f"no global variable {name!r}{where} in object {spec.name!r}")
    if len(hits) > 1:
        secs = ", ".join(spec.maps[i].name for i, _ in hits)
        raise CustomizationError(f"variable {name!r} is in several sections ({secs}); name one")
    return hits[0]


def _replace_map(spec: ObjectSpec, index: int, new: MapSpec) -> ObjectSpec:
    maps = list(spec.maps)
    maps[index] = new
    return replace(spec, maps=tuple(maps))


def set_variable(
    spec: ObjectSpec, name: str, value: object, *, section: str | None = None
) -> ObjectSpec:
    """A copy of ``spec`` with global variable ``name`` (in ``.rodata*``, ``.data*`` or
    ``.bss*``; ``section`` disambiguates) initialised to ``value``; ``name`` joins
    ``spec.assigned``, so loader defaults (enum-variable fill) leave it alone.

    Raises ``CustomizationError`` for an unknown or static variable, a value of the wrong
    type or out of range, or an object without BTF.
    """
    if spec.btf is None:
        raise CustomizationError(f"object {spec.name!r} has no BTF: variables are untyped")
    idx, var = _find_variable(spec, name, section)
    if var.static:
        raise CustomizationError(f"variable {name!r} is static (or hidden) and cannot be set")
    m = spec.maps[idx]
    end = var.offset + var.size
    if end > m.value_size:
        raise CustomizationError(f"variable {name!r} lies outside {m.name!r}")
    # ``data`` may be a prefix (zeros after it, see MapSpec.data): it grows to the end of
    # this variable, not to the map's size (a .bss of gigabytes is never materialised)
    data = m.data or b""
    if len(data) < end:
        data += bytes(end - len(data))
    new = encode_value(spec.btf, var.type_id, value, data[var.offset : end], name)
    data = data[: var.offset] + new + data[end:]
    spec = _replace_map(spec, idx, replace(m, data=data))
    return replace(spec, assigned=spec.assigned | {name})


def set_struct_ops_member(
    spec: ObjectSpec, map_name: str, member: str, value: object
) -> ObjectSpec:
    """A copy of ``spec`` with scalar ``member`` of struct_ops variable ``map_name`` set
    (``flags``, ``timeout_ms``, ``exit_dump_len``, ``hotplug_seq``, ``name``, ...).

    Raises ``CustomizationError`` for an unknown map or member, a function-pointer member
    (those are bound to programs), or a value that does not fit the member's type.
    """
    if spec.btf is None:
        raise CustomizationError(f"object {spec.name!r} has no BTF")
    idx = next(
        (i for i, m in enumerate(spec.maps) if m.name == map_name and m.struct_ops is not None),
        None,
    )
    if idx is None:
        raise CustomizationError(f"no struct_ops variable {map_name!r} in object {spec.name!r}")
    m = spec.maps[idx]
    ops = m.struct_ops
    assert ops is not None
    mem = ops.member(member)
    if mem is None:
        raise CustomizationError(f"struct {ops.type_name} has no member {member!r}")
    if mem.is_func_ptr:
        raise CustomizationError(f"{map_name}.{member} is a function pointer, bound to a program")
    cur = ops.data[mem.offset : mem.offset + mem.size]
    new = encode_value(spec.btf, mem.type_id, value, cur, f"{map_name}.{member}")
    data = ops.data[: mem.offset] + new + ops.data[mem.offset + mem.size :]
    new_ops: StructOpsSpec = replace(ops, data=data)
    return _replace_map(spec, idx, replace(m, struct_ops=new_ops))


def resize_array_section(spec: ObjectSpec, section: str, nelems: int) -> ObjectSpec:
    """A copy of ``spec`` whose data section ``section`` (e.g. ``".data.cpu_loads"``) ends
    with an array of ``nelems`` elements (scx ``RESIZE_ARRAY``).

    The section's last variable must be an array; the map's value size becomes that
    variable's offset plus ``nelems`` elements, the data is zero-extended or truncated, and
    the object BTF gets a new ARRAY type for the variable and a new DATASEC size (libbpf's
    ``map_btf_datasec_resize``). Only ``.data.*``, ``.bss.*`` and ``.rodata.*`` sections
    can be resized. Raises ``CustomizationError``.
    """
    if not any(section.startswith(p + ".") for p in (".data", ".bss", ".rodata")):
        raise CustomizationError(
            f"only .data.NAME/.bss.NAME/.rodata.NAME sections resize, not {section!r}"
        )
    if isinstance(nelems, bool) or not isinstance(nelems, int) or not 1 <= nelems < 1 << 32:
        raise CustomizationError(
            f"{section}: element count must be a positive int below 2**32 (BTF ARRAY nelems is a "
            f"u32), got {nelems!r}"
        )
    btf = spec.btf
    idx = next((i for i, m in enumerate(spec.maps) if m.name == section), None)
    if idx is None:
        raise CustomizationError(f"no data section {section!r} in object {spec.name!r}")
    m = spec.maps[idx]
    if btf is None or not m.value_type_id or not m.variables:
        raise CustomizationError(f"{section}: no BTF describes the section's variables")
    last = max(m.variables, key=lambda v: v.offset)
    arr = btf.type(btf.skip_mods_and_typedefs(last.type_id))
    if not isinstance(arr, Array):
        raise CustomizationError(f"{section}: last variable {last.name!r} is not an array")
    esize = btf.size_of(arr.type)
    new_var_size = esize * nelems
    new_size = last.offset + new_var_size
    if new_size > MAX_ARRAY_VALUE_SIZE:
        raise CustomizationError(
            f"{section}: {nelems} elements make a {new_size}-byte value; the kernel refuses "
            f"array map values over {MAX_ARRAY_VALUE_SIZE} bytes"
        )
    new_btf = _btf_resize(btf, m.value_type_id, last.name, arr, nelems, new_size, new_var_size)
    data = m.data
    if data is not None:  # a prefix stays one (zeros after it); None stays None
        data = data[:new_size]
    variables = tuple(
        replace(v, size=new_var_size, type_id=new_btf.end_id - 1) if v is last else v
        for v in m.variables
    )
    new_map = replace(m, value_size=new_size, data=data, variables=variables)
    return replace(_replace_map(spec, idx, new_map), btf=new_btf)


def _btf_resize(
    btf: Btf, ds_id: int, var_name: str, arr: Array, nelems: int, size: int, var_size: int
) -> Btf:
    raw = bytes(btf.raw)
    _, _, _, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<HBBIIIII", raw)
    types = bytearray(raw[hdr_len + type_off : hdr_len + type_off + type_len])
    strings = raw[hdr_len + str_off : hdr_len + str_off + str_len]
    tbase = hdr_len + type_off
    new_id = btf.end_id
    ds = btf.type(ds_id)
    if not isinstance(ds, Datasec):
        raise CustomizationError(f"type {ds_id} is not a DATASEC")
    var_id = None
    ds_off = btf.type_offset(ds_id) - tbase
    for i, vsi in enumerate(ds.vars):
        v = btf.type(vsi.type)
        if isinstance(v, Var) and v.name == var_name:
            var_id = vsi.type
            struct.pack_into("<I", types, ds_off + 12 + 12 * i + 8, var_size)
    if var_id is None:
        raise CustomizationError(f"variable {var_name!r} is not in DATASEC {ds.name!r}")
    struct.pack_into("<I", types, ds_off + 8, size)
    struct.pack_into("<I", types, btf.type_offset(var_id) - tbase + 8, new_id)
    types += struct.pack("<IIIIII", 0, int(Kind.ARRAY) << 24, 0, arr.type, arr.index_type, nelems)
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return Btf.from_bytes(header + bytes(types) + strings, name=btf.name)
