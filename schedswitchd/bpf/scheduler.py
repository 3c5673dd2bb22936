"""What makes an :class:`~schedswitchd.bpf.spec.ObjectSpec` a sched_ext scheduler, and its
configured form: the one ``struct sched_ext_ops`` struct_ops map, the ops name the kernel
will show in ``/sys/kernel/sched_ext/root/ops``, and the configuration's tunables applied
(``.rodata`` variables, ``sched_ext_ops`` scalars, ``flags`` by ``SCX_OPS_*`` name,
``hotplug_seq``).

Pure functions of the spec (no kernel), so the loader's backend and ``--check-config`` read
an object the same way. Struct and member names: ``include/linux/sched/ext.h``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from schedswitchd.bpf.customize import set_struct_ops_member, set_variable
from schedswitchd.bpf.ops_flags import OpsFlag, set_ops_flags
from schedswitchd.bpf.spec import MapKind, ObjectSpec
from schedswitchd.errors import CustomizationError, LoadError

#: The struct_ops type of a sched_ext scheduler.
SCHED_EXT_OPS = "sched_ext_ops"


def sched_ext_map(spec: ObjectSpec, ops_type: str = SCHED_EXT_OPS) -> str:
    """Name of the one ``ops_type`` (``sched_ext_ops``) struct_ops map of ``spec`` that is
    created. Raises :class:`LoadError` when there is none (not a scheduler) or several."""
    names = [
        m.name
        for m in spec.struct_ops_maps
        if m.struct_ops is not None and m.struct_ops.type_name == ops_type and m.autocreate
    ]
    if not names:
        raise LoadError(f"object {spec.name!r} has no struct {ops_type}: not a scheduler")
    if len(names) > 1:
        raise LoadError(f"object {spec.name!r} defines several schedulers: {', '.join(names)}")
    return names[0]


def ops_name_of(spec: ObjectSpec, map_name: str) -> str:
    """The ``name`` member of struct_ops variable ``map_name`` (what ``root/ops`` reads
    while it runs). Raises :class:`LoadError` when it is missing or empty (the kernel
    refuses those)."""
    so = spec.map(map_name).struct_ops
    mem = so.member("name") if so is not None else None
    if so is None or mem is None:
        raise LoadError(f"{spec.name}: {map_name} has no 'name' member")
    raw = so.data[mem.offset : mem.offset + mem.size].split(b"\0", 1)[0]
    name = raw.decode("utf-8", errors="replace")
    if not name:
        raise LoadError(f"{spec.name}: {map_name}.name is empty; sched_ext requires a name")
    return name


def apply_tunables(
    spec: ObjectSpec,
    ops_map: str,
    rodata: Mapping[str, bool | int],
    struct_ops: Mapping[str, int | Sequence[OpsFlag | str]],
    hotplug_seq: int | None = None,
    *,
    ops_flags: Mapping[str, int] | None = None,
    notes: list[str] | None = None,
) -> ObjectSpec:
    """``spec`` with ``rodata`` (``.rodata`` variable -> value) set in the first read-only
    data section that has the variable, ``struct_ops`` (member -> number) set in struct_ops
    map ``ops_map``, and ``hotplug_seq`` when given. ``struct_ops["flags"]`` may instead be
    a list of flag names, resolved in ``ops_flags`` (the kernel's ``enum scx_ops_flags``,
    :func:`~schedswitchd.bpf.ops_flags.ops_flags_table`; ``None``: no kernel BTF) and
    replacing the object's flags; a name the kernel lacks is dropped with a line appended
    to ``notes``, or refused when required. Raises :class:`CustomizationError` naming the
    key."""
    for key, value in rodata.items():
        sections = [
            m.name for m in spec.maps if m.kind is MapKind.RODATA and m.variable(key) is not None
        ]
        if not sections:
            raise CustomizationError(
                f"{spec.name}: rodata.{key}: no such .rodata variable in the object"
            )
        spec = set_variable(spec, key, value, section=sections[0])
    for key, number in struct_ops.items():
        if isinstance(number, int):
            spec = set_struct_ops_member(spec, ops_map, key, number)
            continue
        if key != "flags":
            raise CustomizationError(f"{spec.name}: struct_ops.{key}: only flags take names")
        spec, res = set_ops_flags(
            spec, ops_map, ops_flags, number, where=f"{spec.name}: struct_ops.flags"
        )
        if notes is not None:
            notes.extend(res.notes)
    if hotplug_seq is not None:
        spec = set_struct_ops_member(spec, ops_map, "hotplug_seq", hotplug_seq)
    return spec


def flags_by_name(struct_ops: Mapping[str, int | Sequence[OpsFlag | str]]) -> bool:
    """True when ``struct_ops`` (as :func:`apply_tunables` takes it) names flags, so the
    caller must look the kernel's ``enum scx_ops_flags`` up."""
    return any(not isinstance(v, int) for v in struct_ops.values())
