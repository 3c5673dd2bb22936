"""struct_ops variables: ``.struct_ops`` and ``.struct_ops.link`` sections (libbpf's
``init_struct_ops_maps`` and ``bpf_object__collect_st_ops_relos``).

Each variable of such a section becomes one ``BPF_MAP_TYPE_STRUCT_OPS`` map. Its local
struct type (e.g. ``struct sched_ext_ops``) gives member names, offsets and sizes; the
section bytes give scalar values; ``R_BPF_64_ABS64`` relocations at function-pointer members
bind programs (symbols in program sections). A leading ``?`` (``?.struct_ops``) turns
autocreate off, as in libbpf.
"""

from __future__ import annotations

from collections.abc import Callable

from schedswitchd.bpf import spec
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Composite, Datasec, Kind, Var
from schedswitchd.bpf.elf import ElfObject
from schedswitchd.bpf.maps import sanitize_name
from schedswitchd.bpf.spec import MapKind, MapSpec, StructOpsMember, StructOpsSpec
from schedswitchd.errors import ObjectError

SECTIONS = (".struct_ops", ".struct_ops.link", "?.struct_ops", "?.struct_ops.link")


def is_struct_ops_section(name: str) -> bool:
    """Whether ``name`` is one of the struct_ops data sections."""
    return name in SECTIONS


def struct_ops_maps(
    elf: ElfObject,
    btf: Btf | None,
    program_at: Callable[[int, int], str | None],
) -> list[MapSpec]:
    """STRUCT_OPS maps of all struct_ops sections, in section then variable order.

    ``program_at(section index, byte offset)`` names the program starting there (``None``
    if none). ``btf`` must be fixed up. Raises :class:`ObjectError` for a variable that is
    not a struct, a relocation not at a function-pointer member, or a member bound to
    something that is not a struct_ops program.
    """
    out: list[MapSpec] = []
    for sec in elf.sections:
        if not is_struct_ops_section(sec.name):
            continue
        if btf is None:
            raise ObjectError(f"section {sec.name!r} needs BTF, but the object has no .BTF")
        ds_id = btf.find(sec.name, Kind.DATASEC)
        if ds_id is None:
            raise ObjectError(f"section {sec.name!r} has no DATASEC in the BTF")
        ds = btf.type(ds_id)
        assert isinstance(ds, Datasec)
        link = sec.name.endswith(".link")
        relocs = elf.relocs.get(sec.index, ())
        for vsi in ds.vars:
            var = btf.type(vsi.type)
            if not isinstance(var, Var):
                raise ObjectError(f"{sec.name}: DATASEC entry {vsi.type} is not a variable")
            st_id = btf.skip_mods_and_typedefs(var.type)
            st = btf.type(st_id)
            if not isinstance(st, Composite) or st.kind != Kind.STRUCT:
                raise ObjectError(f"{sec.name}: variable {var.name!r} is not a struct")
            if vsi.offset + st.size > len(sec.data):
                raise ObjectError(f"{sec.name}: variable {var.name!r} does not fit the section")
            data = sec.data[vsi.offset : vsi.offset + st.size]
            bound: dict[int, str] = {}
            for rel in relocs:
                if not vsi.offset <= rel.offset < vsi.offset + st.size:
                    continue
                sym = elf.symbol(rel.sym)
                addend = int.from_bytes(sec.data[rel.offset : rel.offset + 8], "little")
                prog = program_at(sym.shndx, sym.value + addend)
                if prog is None:
                    raise ObjectError(
                        f"{sec.name}: {var.name}+{rel.offset - vsi.offset} points to "
                        f"{sym.name!r}, which is not a program"
                    )
                bound[rel.offset - vsi.offset] = prog
            members = []
            for m in st.members:
                off = m.bit_offset // 8
                # a pointer (through typedefs and modifiers) has the pointer size, and is a
                # program's slot when it points to a FUNC_PROTO: decided from the kinds,
                # without size_of's walk for the ~40 function pointers of sched_ext_ops
                is_ptr = btf.kind(btf.skip_mods_and_typedefs(m.type)) is Kind.PTR
                is_fp = is_ptr and btf.is_func_pointer(m.type)
                if m.bitfield_size:
                    size = (m.bitfield_size + 7) // 8
                else:
                    size = btf.pointer_size() if is_ptr else btf.size_of(m.type)
                end_bit = m.bit_offset + (m.bitfield_size or 8 * size)
                if end_bit > 8 * st.size:
                    # the kernel's BTF check refuses it too ("Member exceeds struct_size");
                    # every later edit and the struct_ops value slice the data by it
                    raise ObjectError(
                        f"{sec.name}: member {m.name!r} of {var.name!r} ends at bit {end_bit}, "
                        f"past the end of its {st.size}-byte struct {st.name!r}"
                    )
                prog = bound.pop(off, None) if is_fp else None
                members.append(StructOpsMember(m.name, off, size, m.type, is_fp, prog))
            if bound:
                off = next(iter(bound))
                raise ObjectError(
                    f"{sec.name}: {var.name}+{off} is relocated but is not a function pointer"
                )
            ops = StructOpsSpec(
                var_name=var.name,
                section=sec.name,
                type_name=st.name,
                type_id=st_id,
                data=bytes(data),
                link=link,
                members=tuple(members),
            )
            out.append(
                MapSpec(
                    name=var.name,
                    kernel_name=sanitize_name(var.name),
                    kind=MapKind.STRUCT_OPS,
                    type=spec.MAP_TYPE_STRUCT_OPS,
                    key_size=4,
                    value_size=st.size,
                    max_entries=1,
                    flags=spec.F_LINK if link else 0,
                    value_type_id=st_id,
                    struct_ops=ops,
                    section=sec.name,
                    section_index=sec.index,
                    autocreate=not sec.name.startswith("?"),
                )
            )
    return out
