"""Maps of an object: BTF-defined maps in ``.maps`` and the internal data-section maps.

BTF-defined maps (libbpf's ``parse_btf_map_def``): each ``.maps`` variable is a struct
whose members encode attributes by their *types*: ``__uint(name, N)`` is ``int (*name)[N]``
(a pointer to an array of N elements), ``__ulong(name, N)`` (libbpf 1.4+, for 64-bit
attributes; only ``map_extra`` takes it, as in libbpf) is an anonymous enum-typed member
whose single enumerator is N (ENUM64 when N needs 64 bits), ``__type(name, T)`` is
``T *name``, and
``__array(values, struct inner)`` is ``struct inner *values[]`` (the inner map's definition,
with the ``.values`` initialiser given by ``R_BPF_64_ABS64`` relocations in ``.maps``).

Internal maps: one ARRAY map (4-byte key, one entry, value = section size) per non-empty
``.data*``, ``.rodata*`` and ``.bss*`` section, in section order; then ``.kconfig``.
Kernel-visible names follow libbpf's ``internal_map_name``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import (
    VAR_STATIC,
    Array,
    Composite,
    Datasec,
    Enum,
    FuncProto,
    Kind,
    Ref,
    Var,
)
from schedswitchd.bpf.elf import STT_FUNC, ElfObject, Section
from schedswitchd.bpf.spec import (
    F_MMAPABLE,
    F_RDONLY_PROG,
    MAP_TYPE_ARENA,
    MAP_TYPE_ARRAY,
    MAP_TYPE_ARRAY_OF_MAPS,
    MAP_TYPE_HASH_OF_MAPS,
    MAP_TYPE_PROG_ARRAY,
    MAX_ARRAY_VALUE_SIZE,
    PIN_BY_NAME,
    PIN_NONE,
    MapKind,
    MapSpec,
    VariableSpec,
)
from schedswitchd.errors import BtfError, ObjectError

MAPS_SEC = ".maps"
BPF_OBJ_NAME_LEN = 16
_BTF_MAP_ATTRS = frozenset(
    {
        "type",
        "max_entries",
        "map_flags",
        "numa_node",
        "map_extra",
        "pinning",
        "key_size",
        "value_size",
        "key",
        "value",
        "values",
    }
)


def sanitize_name(name: str) -> str:
    """Characters the kernel refuses in object names become ``_``; at most 15 bytes."""
    return _REFUSED_IN_NAMES.sub("_", name)[: BPF_OBJ_NAME_LEN - 1]


#: What the kernel refuses in object names (``bpf_obj_name_cpy``: ASCII letters and digits,
#: ``_`` and ``.`` pass), one character a match.
_REFUSED_IN_NAMES = re.compile(r"[^A-Za-z0-9_.]")


def internal_map_name(obj_name: str, section: str) -> str:
    """libbpf's kernel name for a data map: up to 8 characters of the object name then the
    section name (``maps.rodata``), or only the section name for ``.data.NAME``-style ones."""
    sfx_len = min(max(7, len(section)), BPF_OBJ_NAME_LEN - 1)
    pfx_len = 0 if "." in section[1:] else min(BPF_OBJ_NAME_LEN - sfx_len - 1, len(obj_name))
    return sanitize_name(obj_name[:pfx_len] + section[:sfx_len])


def data_section_kind(name: str) -> MapKind | None:
    """The internal map kind of an ELF section name, or ``None`` if it is not global data."""
    for prefix, kind in (
        (".data", MapKind.DATA),
        (".rodata", MapKind.RODATA),
        (".bss", MapKind.BSS),
    ):
        if name == prefix or name.startswith(prefix + "."):
            return kind
    return None


@dataclass
class _MapDef:
    type: int = 0
    max_entries: int = 0
    flags: int = 0
    numa_node: int = 0
    map_extra: int = 0
    pinning: int = 0
    key_size: int | None = None
    value_size: int | None = None
    key_type_id: int = 0
    value_type_id: int = 0
    inner: MapSpec | None = None
    values_offset: int = -1  # byte offset of the `values` member inside the map struct
    values_is_prog: bool = False


def _uint_attr(btf: Btf, map_name: str, attr: str, type_id: int) -> int:
    t = btf.type(btf.skip_mods_and_typedefs(type_id))
    if not isinstance(t, Ref) or t.kind != Kind.PTR:
        raise ObjectError(f"map {map_name!r}: attribute {attr!r} is not a __uint() pointer")
    arr = btf.type(t.type)
    if not isinstance(arr, Array):
        raise ObjectError(f"map {map_name!r}: attribute {attr!r} does not point to an array")
    return arr.nelems


def _ulong_attr(btf: Btf, map_name: str, attr: str, type_id: int) -> int:
    """A 64-bit attribute: ``__uint()``'s pointer-to-array, or ``__ulong()``'s enum of one
    enumerator (``enum { __unique_valueN = N } name`` in libbpf's ``bpf_helpers.h``)."""
    t = btf.type(btf.skip_mods_and_typedefs(type_id))
    if isinstance(t, Ref) and t.kind == Kind.PTR:
        return _uint_attr(btf, map_name, attr, type_id)
    if not isinstance(t, Enum):
        raise ObjectError(
            f"map {map_name!r}: attribute {attr!r} is neither a __uint() pointer nor a "
            f"__ulong() enum (BTF kind {t.kind.name})"
        )
    if len(t.values) != 1:
        raise ObjectError(
            f"map {map_name!r}: __ulong() attribute {attr!r} is an enum of "
            f"{len(t.values)} enumerators, not 1"
        )
    # a negative (signed) enumerator stands for its 64-bit two's complement, as in libbpf
    return t.values[0].value & ((1 << 64) - 1)


def _parse_def(btf: Btf, map_name: str, struct_id: int, *, inner: bool) -> _MapDef:
    t = btf.type(btf.skip_mods_and_typedefs(struct_id))
    if not isinstance(t, Composite) or t.kind != Kind.STRUCT:
        raise ObjectError(f"map {map_name!r}: definition is not a struct")
    d = _MapDef()
    for idx, m in enumerate(t.members):
        if m.name not in _BTF_MAP_ATTRS:
            raise ObjectError(f"map {map_name!r}: unknown attribute {m.name!r}")
        if m.name in ("type", "max_entries", "map_flags", "numa_node", "map_extra", "pinning"):
            if m.name == "map_extra":
                val = _ulong_attr(btf, map_name, m.name, m.type)
            else:
                val = _uint_attr(btf, map_name, m.name, m.type)
            if m.name == "type":
                d.type = val
            elif m.name == "max_entries":
                d.max_entries = val
            elif m.name == "map_flags":
                d.flags = val
            elif m.name == "numa_node":
                d.numa_node = val
            elif m.name == "map_extra":
                d.map_extra = val
            else:
                if val not in (PIN_NONE, PIN_BY_NAME):
                    raise ObjectError(f"map {map_name!r}: pinning {val} is not supported")
                d.pinning = val
        elif m.name in ("key_size", "value_size"):
            val = _uint_attr(btf, map_name, m.name, m.type)
            old = d.key_size if m.name == "key_size" else d.value_size
            if old is not None and old != val:
                raise ObjectError(f"map {map_name!r}: conflicting {m.name} {old} and {val}")
            if m.name == "key_size":
                d.key_size = val
            else:
                d.value_size = val
        elif m.name in ("key", "value"):
            p = btf.type(btf.skip_mods_and_typedefs(m.type))
            if not isinstance(p, Ref) or p.kind != Kind.PTR:
                raise ObjectError(f"map {map_name!r}: {m.name!r} is not a __type() pointer")
            size = btf.size_of(p.type)
            attr = "key_size" if m.name == "key" else "value_size"
            old = d.key_size if m.name == "key" else d.value_size
            if old is not None and old != size:
                raise ObjectError(f"map {map_name!r}: conflicting {attr} {old} and {size}")
            if m.name == "key":
                d.key_size, d.key_type_id = size, p.type
            else:
                d.value_size, d.value_type_id = size, p.type
        else:  # values
            if inner:
                raise ObjectError(f"map {map_name!r}: an inner map cannot have 'values'")
            if idx != len(t.members) - 1:
                raise ObjectError(f"map {map_name!r}: 'values' must be the last attribute")
            arr = btf.type(btf.skip_mods_and_typedefs(m.type))
            if not isinstance(arr, Array) or arr.nelems != 0:
                raise ObjectError(f"map {map_name!r}: 'values' is not a flexible array")
            ptr = btf.type(btf.skip_mods_and_typedefs(arr.type))
            if not isinstance(ptr, Ref) or ptr.kind != Kind.PTR:
                raise ObjectError(f"map {map_name!r}: 'values' elements are not pointers")
            target = btf.type(btf.skip_mods_and_typedefs(ptr.type))
            if d.value_size not in (None, 4):
                raise ObjectError(f"map {map_name!r}: 'values' needs a 4-byte value")
            d.value_size = 4
            d.values_offset = m.bit_offset // 8
            if d.type in (MAP_TYPE_ARRAY_OF_MAPS, MAP_TYPE_HASH_OF_MAPS):
                if not isinstance(target, Composite):
                    raise ObjectError(f"map {map_name!r}: inner map definition is not a struct")
                idef = _parse_def(btf, f"{map_name}.inner", ptr.type, inner=True)
                d.inner = _to_spec(f"{map_name}.inner", idef, MapKind.DECLARED)
            elif d.type == MAP_TYPE_PROG_ARRAY:
                if not isinstance(target, FuncProto):
                    raise ObjectError(f"map {map_name!r}: prog array 'values' must be functions")
                d.values_is_prog = True
            else:
                raise ObjectError(f"map {map_name!r}: map type {d.type} cannot have 'values'")
    return d


def _to_spec(name: str, d: _MapDef, kind: MapKind) -> MapSpec:
    return MapSpec(
        name=name,
        kernel_name=sanitize_name(name),
        kind=kind,
        type=d.type,
        key_size=d.key_size or 0,
        value_size=d.value_size or 0,
        max_entries=d.max_entries,
        flags=d.flags,
        map_extra=d.map_extra,
        numa_node=d.numa_node,
        key_type_id=d.key_type_id,
        value_type_id=d.value_type_id,
        pinning=d.pinning,
        inner=d.inner,
    )


# Map types by how the kernel sizes them (``enum bpf_map_type`` values, UAPI bpf.h).
_ARRAYS = frozenset({2, 3, 4, 6, 8, 12})  # ARRAY, PROG/PERF_EVENT/PERCPU/CGROUP_ARRAY, OF_MAPS
_HASHES = frozenset({1, 5, 9, 10, 13})  # HASH, PERCPU_HASH, LRU_HASH, LRU_PERCPU_HASH, OF_MAPS
_PER_CPU = frozenset({5, 6, 10})  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH
#: ``PCPU_MIN_UNIT_SIZE`` (include/linux/percpu.h): the largest per-CPU value
PCPU_MIN_UNIT_SIZE = 32 << 10
#: the most entries a hash map may have (``htab_map_alloc``: ``max_entries > 1UL << 31``)
MAX_HASH_ENTRIES = 1 << 31


def check_kernel_limits(m: MapSpec) -> None:
    """Raise :class:`ObjectError` when the kernel would refuse map ``m`` for its size with
    ``E2BIG`` whatever the machine (``array_map_alloc_check`` in kernel/bpf/arraymap.c,
    ``htab_map_alloc_check``/``htab_map_alloc`` in kernel/bpf/hashtab.c): an array value
    over ``INT_MAX`` bytes, a per-CPU value over ``PCPU_MIN_UNIT_SIZE`` once rounded up to
    8 bytes, a hash map of more than 2**31 entries. Checked at open, before anything is
    loaded or allocated for the object."""
    why = ""
    if m.type in _ARRAYS and m.value_size > MAX_ARRAY_VALUE_SIZE:
        why = f"a value of {m.value_size} bytes is over the array limit {MAX_ARRAY_VALUE_SIZE}"
    elif m.type in _PER_CPU and (m.value_size + 7) // 8 * 8 > PCPU_MIN_UNIT_SIZE:
        why = f"a per-CPU value of {m.value_size} bytes is over {PCPU_MIN_UNIT_SIZE}"
    elif m.type in _HASHES and m.max_entries > MAX_HASH_ENTRIES:
        why = f"{m.max_entries} entries are over the hash map limit {MAX_HASH_ENTRIES}"
    if why:
        raise ObjectError(f"map {m.name!r}: the kernel refuses it (E2BIG): {why}")


def declared_maps(elf: ElfObject, btf: Btf | None) -> list[tuple[MapSpec, int]]:
    """BTF-defined maps of ``.maps`` in offset order, each with its byte offset in the
    section. ``btf`` must already be fixed up (DATASEC offsets from symbols)."""
    if elf.section_by_name("maps") is not None:
        raise ObjectError("legacy 'maps' section is not supported; use BTF-defined .maps")
    sec = elf.section_by_name(MAPS_SEC)
    if sec is None:
        return []
    if btf is None:
        raise ObjectError(".maps needs BTF, but the object has no .BTF")
    ds_id = btf.find(MAPS_SEC, Kind.DATASEC)
    if ds_id is None:
        raise ObjectError(".maps section has no DATASEC in the BTF")
    ds = btf.type(ds_id)
    assert isinstance(ds, Datasec)
    out: list[tuple[MapSpec, int]] = []
    for vsi in ds.vars:
        var = btf.type(vsi.type)
        if not isinstance(var, Var):
            raise ObjectError(f".maps DATASEC entry {vsi.type} is not a variable")
        d = _parse_def(btf, var.name, var.type, inner=False)
        kind = MapKind.ARENA if d.type == MAP_TYPE_ARENA else MapKind.DECLARED
        spec = _to_spec(var.name, d, kind)
        check_kernel_limits(spec)
        if spec.inner is not None:
            check_kernel_limits(spec.inner)
        if d.values_offset >= 0:
            spec = _with_slots(elf, sec, spec, vsi.offset, vsi.size, d)
        out.append((spec, vsi.offset))
    if sum(1 for m, _ in out if m.kind is MapKind.ARENA) > 1:
        raise ObjectError("an object can declare at most one arena map")
    return out


def _with_slots(
    elf: ElfObject, sec: Section, spec: MapSpec, var_off: int, var_size: int, d: _MapDef
) -> MapSpec:
    from dataclasses import replace

    slots: list[tuple[int, str]] = []
    start = var_off + d.values_offset
    for rel in elf.relocs.get(sec.index, ()):
        if not var_off <= rel.offset < var_off + var_size:
            continue
        if rel.offset < start or (rel.offset - start) % 8:
            raise ObjectError(
                f"map {spec.name!r}: relocation at {rel.offset} is not a 'values' slot"
            )
        idx = (rel.offset - start) // 8
        if spec.max_entries and idx >= spec.max_entries:
            raise ObjectError(
                f"map {spec.name!r}: 'values' slot {idx} exceeds max_entries {spec.max_entries}"
            )
        sym = elf.symbol(rel.sym)
        if d.values_is_prog:
            if sym.type != STT_FUNC:
                raise ObjectError(f"map {spec.name!r}: slot {idx} does not name a program")
        elif sym.shndx != sec.index:
            raise ObjectError(f"map {spec.name!r}: slot {idx} does not name a map in .maps")
        slots.append((idx, sym.name))
    return replace(spec, init_slots=tuple(sorted(slots)))


def datasec_variables(btf: Btf | None, section: str) -> tuple[int, tuple[VariableSpec, ...]]:
    """(DATASEC id or 0, variables) of a data section from the fixed-up BTF."""
    if btf is None:
        return 0, ()
    ds_id = btf.find(section, Kind.DATASEC)
    if ds_id is None:
        return 0, ()
    ds = btf.type(ds_id)
    assert isinstance(ds, Datasec)
    out = []
    for vsi in ds.vars:
        var = btf.type(vsi.type)
        if isinstance(var, Var):
            out.append(
                VariableSpec(
                    var.name, section, vsi.offset, vsi.size, var.type, var.linkage == VAR_STATIC
                )
            )
    return ds_id, tuple(out)


def data_maps(elf: ElfObject, btf: Btf | None, obj_name: str) -> list[MapSpec]:
    """One internal ARRAY map per non-empty global data section, in section order."""
    out = []
    for sec in elf.sections:
        kind = data_section_kind(sec.name)
        if kind is None or sec.size == 0:
            continue
        ds_id, variables = datasec_variables(btf, sec.name)
        flags = F_RDONLY_PROG if kind is MapKind.RODATA else 0
        if any(not v.static for v in variables):
            flags |= F_MMAPABLE
        if sec.size > MAX_ARRAY_VALUE_SIZE:
            raise ObjectError(
                f"section {sec.name!r} is {sec.size} bytes: the kernel refuses array map "
                f"values over {MAX_ARRAY_VALUE_SIZE} bytes (E2BIG)"
            )
        # .bss (NOBITS) is all zeros and not in the file: None, never bytes(sec.size).
        data = None if kind is MapKind.BSS else sec.data
        if data is not None and len(data) != sec.size:
            raise ObjectError(f"section {sec.name!r} data is truncated")
        out.append(
            MapSpec(
                name=sec.name,
                kernel_name=internal_map_name(obj_name, sec.name),
                kind=kind,
                type=MAP_TYPE_ARRAY,
                key_size=4,
                value_size=sec.size,
                max_entries=1,
                flags=flags,
                value_type_id=ds_id,
                data=data,
                variables=variables,
                section=sec.name,
                section_index=sec.index,
            )
        )
    return out


def kconfig_map(
    btf: Btf | None, obj_name: str, size: int, variables: tuple[VariableSpec, ...]
) -> MapSpec:
    """The ``.kconfig`` map (read-only for programs, filled by the loader); ``size`` in bytes
    is at most :data:`~schedswitchd.bpf.spec.MAX_ARRAY_VALUE_SIZE` (checked by
    :func:`~schedswitchd.bpf.externs.collect_externs`)."""
    ds_id = 0
    if btf is not None:
        ds_id = btf.find(".kconfig", Kind.DATASEC) or 0
    return MapSpec(
        name=".kconfig",
        kernel_name=internal_map_name(obj_name, ".kconfig"),
        kind=MapKind.KCONFIG,
        type=MAP_TYPE_ARRAY,
        key_size=4,
        value_size=size,
        max_entries=1,
        flags=F_RDONLY_PROG | (F_MMAPABLE if ds_id else 0),
        value_type_id=ds_id,
        data=None,  # zeros until the loader writes the kernel's values
        variables=variables,
        section=".kconfig",
    )


def wrap_btf_error(exc: BtfError) -> ObjectError:
    """An ObjectError for malformed BTF met while reading maps."""
    return ObjectError(f"malformed BTF in map definitions: {exc}")
