"""Kernel-side struct_ops types and the mapping of an object's struct_ops variable onto them.

A struct_ops map (e.g. ``sched_ext_ops``, ``tcp_congestion_ops``) is created with the id of
the kernel's *value type* ``struct bpf_struct_ops_<name>`` (``btf_vmlinux_value_type_id``),
whose ``data`` member is the kernel's ``struct <name>``. Its single value (key 0) is that
value type laid out by the kernel's BTF, with a program fd in each function-pointer member
and scalars copied from the object's local struct. Members are matched by name, as libbpf's
``bpf_map__init_kern_struct_ops`` does (``tools/lib/bpf/libbpf.c``); kernel behaviour in
``kernel/bpf/bpf_struct_ops.c``. Programs for a function-pointer member are loaded with
``attach_btf_id`` = the kernel struct's id and ``expected_attach_type`` = the member index.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Composite, Kind, Member, essential_name
from schedswitchd.errors import BtfError, LoadError

VALUE_PREFIX = "bpf_struct_ops_"


@dataclass(frozen=True, slots=True)
class StructOpsKernelType:
    """The kernel's view of struct_ops type ``name`` in ``btf`` (vmlinux or a module):
    the struct ``<name>`` (``type_id``), the value type ``bpf_struct_ops_<name>``
    (``value_type_id``, ``value_size`` bytes) and the byte offset of its data member."""

    btf: Btf
    name: str
    type_id: int
    type: Composite
    value_type_id: int
    value_type: Composite
    data_member: Member
    data_offset: int

    @property
    def value_size(self) -> int:
        """Bytes of the kernel's value type (``bpf_struct_ops_<name>``), from its BTF."""
        return self.value_type.size


def find_struct_ops_kernel_type(btf: Btf, name: str) -> StructOpsKernelType | None:
    """Look up struct_ops type ``name`` (its essential name, so ``tcp_congestion_ops___v2``
    works) among ``btf``'s own types. ``None`` when the struct or its value type is absent
    (the caller may try module BTFs); :class:`LoadError` when present but unusable."""
    tname = essential_name(name)
    type_ids = btf.find_ids(tname, Kind.STRUCT)
    value_ids = btf.find_ids(VALUE_PREFIX + tname, Kind.STRUCT)
    if not type_ids or not value_ids:
        return None
    type_id, value_id = type_ids[0], value_ids[0]
    kt, vt = btf.type(type_id), btf.type(value_id)
    if not isinstance(kt, Composite) or not isinstance(vt, Composite):
        raise LoadError(f"struct_ops {tname}: kernel BTF types are not structs")
    for member in vt.members:
        if btf.skip_modifiers(member.type) == type_id:
            if member.bit_offset % 8:
                raise LoadError(f"struct_ops {tname}: data member is not byte aligned")
            return StructOpsKernelType(
                btf, tname, type_id, kt, value_id, vt, member, member.bit_offset // 8
            )
    raise LoadError(f"struct_ops {tname}: {VALUE_PREFIX}{tname} has no member of type {tname}")


@dataclass(frozen=True, slots=True)
class MemberPlan:
    """One local member that goes into the kernel value.

    ``local_offset`` bytes into the local struct; ``kern_index`` the kernel member's index
    (a program's ``expected_attach_type``); ``value_offset`` bytes into the kernel *value*
    (data offset included); ``size`` bytes; ``is_func_ptr`` for program slots."""

    name: str
    local_offset: int
    kern_index: int
    value_offset: int
    size: int
    is_func_ptr: bool


@dataclass(frozen=True, slots=True)
class StructOpsPlan:
    """How to build the kernel value from the local struct. ``skipped`` names local
    members the kernel lacks whose value was zero; programs assigned to them must not be
    loaded."""

    kernel: StructOpsKernelType
    members: tuple[MemberPlan, ...]
    skipped: tuple[str, ...]

    def member(self, name: str) -> MemberPlan:
        """The plan of member ``name``; ``KeyError`` if it is not transferred."""
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(name)


def plan_struct_ops(
    local: Btf,
    local_type_id: int,
    local_data: bytes,
    kernel: StructOpsKernelType,
    programs: Collection[str] = (),
) -> StructOpsPlan:
    """Match the local struct ``local_type_id`` (whose bytes are ``local_data``) against
    ``kernel`` by member name. ``programs`` names the members that have a program.

    Raises :class:`LoadError` naming the member when: a member the kernel lacks has a
    non-zero value; a bitfield is involved; kinds differ; a program's kernel member is not
    a function pointer; scalar sizes differ. Pointer members without a program are left 0.
    """
    tname = kernel.name
    try:
        lt = local.type(local.skip_mods_and_typedefs(local_type_id))
        if not isinstance(lt, Composite) or lt.kind != Kind.STRUCT:
            raise LoadError(f"struct_ops {tname}: local type {local_type_id} is not a struct")
        if len(local_data) < lt.size:
            raise LoadError(
                f"struct_ops {tname}: local data is {len(local_data)} bytes, "
                f"the struct is {lt.size}"
            )
        kbtf = kernel.btf
        kern_by_name = {m.name: (i, m) for i, m in enumerate(kernel.type.members) if m.name}
        plans: list[MemberPlan] = []
        skipped: list[str] = []
        for member in lt.members:
            mname = member.name
            if member.bitfield_size or member.bit_offset % 8:
                raise LoadError(f"struct_ops {tname}: bitfield member {mname} is not supported")
            moff = member.bit_offset // 8
            mtype = local.skip_mods_and_typedefs(member.type)
            local_kind = local.kind(mtype)
            msize = 8 if local_kind == Kind.PTR else local.size_of(mtype)
            found = kern_by_name.get(mname)
            if found is None:
                if any(local_data[moff : moff + msize]):
                    raise LoadError(
                        f"struct_ops {tname}: member {mname} is not in the kernel's struct "
                        "and has a non-zero value"
                    )
                skipped.append(mname)
                continue
            kidx, kmember = found
            if kmember.bitfield_size or kmember.bit_offset % 8:
                raise LoadError(f"struct_ops {tname}: kernel member {mname} is a bitfield")
            kmtype = kbtf.skip_mods_and_typedefs(kmember.type)
            if kbtf.kind(kmtype) != local_kind:
                raise LoadError(
                    f"struct_ops {tname}: member {mname} is a {local_kind.name} locally but a "
                    f"{kbtf.kind(kmtype).name} in the kernel"
                )
            value_off = kernel.data_offset + kmember.bit_offset // 8
            if local_kind == Kind.PTR:
                if mname not in programs:
                    continue  # no program: the kernel slot stays NULL
                if not kbtf.is_func_pointer(kmtype):
                    raise LoadError(
                        f"struct_ops {tname}: kernel member {mname} is not a function pointer"
                    )
                plans.append(MemberPlan(mname, moff, kidx, value_off, 8, True))
                continue
            ksize = kbtf.size_of(kmtype)
            if ksize != msize:
                raise LoadError(
                    f"struct_ops {tname}: member {mname} is {msize} bytes locally but "
                    f"{ksize} in the kernel"
                )
            plans.append(MemberPlan(mname, moff, kidx, value_off, msize, False))
    except BtfError as e:
        raise LoadError(f"struct_ops {tname}: {e}") from e
    return StructOpsPlan(kernel, tuple(plans), tuple(skipped))


def build_value(plan: StructOpsPlan, local_data: bytes, prog_fds: Mapping[str, int]) -> bytes:
    """The kernel value (``plan.kernel.value_size`` bytes) for ``BPF_MAP_UPDATE_ELEM``:
    scalars copied from ``local_data``, each function-pointer member holding the fd of its
    program from ``prog_fds`` (member name -> fd). A planned program without an fd raises
    :class:`LoadError`."""
    value = bytearray(plan.kernel.value_size)
    for m in plan.members:
        if m.is_func_ptr:
            fd = prog_fds.get(m.name)
            if fd is None:
                raise LoadError(f"struct_ops {plan.kernel.name}: no program fd for {m.name}")
            struct.pack_into("<Q", value, m.value_offset, fd)
        else:
            value[m.value_offset : m.value_offset + m.size] = local_data[
                m.local_offset : m.local_offset + m.size
            ]
    return bytes(value)
