"""Applying a resolved profile to an object spec: the edits before load, and the plan of
the steps between load and attach (pure; the kernel floor runs the plan:
:mod:`schedswitchd.kernel.sched_ext.profile_steps`).

:func:`apply_profile` does, in this order (each an edit of the
:class:`~schedswitchd.bpf.spec.ObjectSpec` through :mod:`schedswitchd.bpf.customize`):

1. checks ``profile.ops_name`` against the ``name`` member of the struct_ops variable;
2. resizes ``.data.NAME``-style sections (``[resize]``, scx's ``RESIZE_ARRAY``) -- before the
   variables, so a resized array takes a value of its new length;
3. sets global variables by name in whichever data section holds them (``[variables]``);
4. sets struct_ops scalar members (``[struct_ops]``) and ``flags`` by ``SCX_OPS_*`` name,
   resolved through the kernel's ``enum scx_ops_flags`` by the loader's one resolver
   (:mod:`schedswitchd.bpf.ops_flags`); a name the kernel lacks is dropped with a note
   unless it is in ``required_flags`` (then refused);

and then lays out, without a kernel, everything the later phases write: ``[after_load]``
variables (bytes of each variable), map updates (key and value bytes from the map's BTF
key/value types; a per-CPU map's value repeated for every possible CPU, each rounded up
to 8 bytes, as ``BPF_MAP_UPDATE_ELEM`` expects), and ``SEC("syscall")`` runs (the context
struct from the program's BTF: the pointee of its first argument). Anything that does not
fit raises :class:`~schedswitchd.errors.CustomizationError` naming the profile step.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Composite, Func, FuncProto, Kind, Ref
from schedswitchd.bpf.customize import (
    encode_value,
    resize_array_section,
    set_struct_ops_member,
    set_variable,
)
from schedswitchd.bpf.ops_flags import OpsFlag, ops_flags_table, resolve_ops_flags
from schedswitchd.bpf.spec import (
    PROG_TYPE_SYSCALL,
    MapKind,
    MapSpec,
    ObjectSpec,
)
from schedswitchd.errors import BtfError, CustomizationError
from schedswitchd.profile.kernel_enums import enum_table
from schedswitchd.profile.model import Profile, Stat
from schedswitchd.profile.resolve import KernelFacts, ResolvedProfile, resolve_profile
from schedswitchd.profile.topology import Topology

__all__ = [
    "MAP_PERCPU_TYPES",
    "FlagLookup",
    "PlannedMapUpdate",
    "PlannedPerfEvent",
    "PlannedRun",
    "PlannedStat",
    "ProfilePlan",
    "ProfiledSpec",
    "apply_profile",
    "btf_facts",
    "check_runnable",
    "find_map",
    "ops_flags_table",
    "profile_spec",
    "struct_ops_target",
    "syscall_ctx_type",
]

#: ``BPF_MAP_TYPE_PERCPU_HASH``, ``PERCPU_ARRAY``, ``LRU_PERCPU_HASH``,
#: ``PERCPU_CGROUP_STORAGE`` (``include/uapi/linux/bpf.h``): one value per possible CPU.
MAP_PERCPU_TYPES = frozenset({5, 6, 10, 21})
#: ``BPF_MAP_TYPE_PERF_EVENT_ARRAY``: values are ``perf_event_open(2)`` fds.
MAP_PERF_EVENT_ARRAY = 4
#: ``BPF_ANY``, ``BPF_NOEXIST``, ``BPF_EXIST``.
UPDATE_FLAGS = {"any": 0, "noexist": 1, "exist": 2}

#: ``SCX_OPS_*`` name -> value in the kernel (:func:`ops_flags_table` of its BTF).
FlagLookup = Mapping[str, int]


@dataclass(frozen=True, slots=True)
class PlannedMapUpdate:
    """``BPF_MAP_UPDATE_ELEM`` of ``map`` with ready ``key``/``value`` bytes (``value``
    holds one element; ``percpu`` maps repeat it per possible CPU when written)."""

    map: str
    key: bytes
    value: bytes
    flags: int
    percpu: bool
    when: str
    label: str


@dataclass(frozen=True, slots=True)
class PlannedRun:
    """``BPF_PROG_RUN`` of syscall program ``program`` with context bytes ``ctx``."""

    program: str
    ctx: bytes
    cpu: int | None
    expect_retval: int | None
    when: str
    label: str


@dataclass(frozen=True, slots=True)
class PlannedPerfEvent:
    """``perf_event_open(2)`` of ``type``/``config`` on ``cpu``, the fd written at
    ``key`` bytes of the ``BPF_MAP_TYPE_PERF_EVENT_ARRAY`` ``map``; ``skip_on_error``:
    a failed open is noted, not fatal."""

    map: str
    key: bytes
    type: int
    config: int
    cpu: int
    skip_on_error: bool
    label: str


@dataclass(frozen=True, slots=True)
class PlannedStat:
    """Where a counter lives: a global ``variable`` (decoded as the int of its BTF type),
    or ``map`` at ``key`` bytes, ``offset``/``size`` of ``field`` in the value."""

    name: str
    description: str
    variable: str | None
    map: str | None
    key: bytes
    offset: int
    size: int
    signed: bool
    percpu: bool


@dataclass
class ProfilePlan:
    """What runs between load and attach (and right after attach), in order:
    ``after_load`` writes, ``map_updates`` (``when`` ``before_attach`` first),
    ``perf_events``, ``runs``,
    the link created from ``attach_cpu``, then the ``after_attach`` steps. ``notes`` say
    what was adjusted (dropped flags) for the log and ``--check-config``."""

    profile: str
    mode: str
    after_load: list[tuple[str, bytes]] = field(default_factory=list)
    map_updates: list[PlannedMapUpdate] = field(default_factory=list)
    runs: list[PlannedRun] = field(default_factory=list)
    perf_events: list[PlannedPerfEvent] = field(default_factory=list)
    attach_cpu: int | None = None
    stats: list[PlannedStat] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """True when nothing runs between load and attach."""
        steps = self.after_load or self.map_updates or self.runs or self.perf_events
        return not steps and self.attach_cpu is None


def struct_ops_target(spec: ObjectSpec, preferred: str = "sched_ext_ops") -> str | None:
    """The struct_ops map a profile's ``[struct_ops]`` edits: the one of type
    ``preferred``, else the only struct_ops map; ``None`` when the object has none.
    Raises ``CustomizationError`` when several could be meant."""
    maps = [m for m in spec.struct_ops_maps if m.struct_ops is not None and m.autocreate]
    typed = [m for m in maps if m.struct_ops is not None and m.struct_ops.type_name == preferred]
    pick = typed or maps
    if not pick:
        return None
    if len(pick) > 1:
        names = ", ".join(m.name for m in pick)
        raise CustomizationError(f"object {spec.name!r} has several struct_ops maps ({names})")
    return pick[0].name


def _ops_member_int(spec: ObjectSpec, map_name: str, member: str) -> int:
    so = spec.map(map_name).struct_ops
    mem = so.member(member) if so is not None else None
    if so is None or mem is None:
        raise CustomizationError(f"struct_ops {map_name} has no member {member!r}")
    return int.from_bytes(so.data[mem.offset : mem.offset + mem.size], "little")


def _ops_name(spec: ObjectSpec, map_name: str) -> str:
    so = spec.map(map_name).struct_ops
    mem = so.member("name") if so is not None else None
    if so is None or mem is None:
        return ""
    return so.data[mem.offset : mem.offset + mem.size].split(b"\0", 1)[0].decode(errors="replace")


def _flag_value(
    names: list[str],
    lookup: FlagLookup | None,
    required: set[str],
    where: str,
    notes: list[str],
) -> int:
    res = resolve_ops_flags(lookup, [OpsFlag(n, n in required) for n in names], where=where)
    notes.extend(res.notes)
    return res.value


def _apply_flags(
    spec: ObjectSpec,
    ops_map: str,
    res: ResolvedProfile,
    lookup: FlagLookup | None,
    where: str,
    notes: list[str],
) -> ObjectSpec:
    required = set(res.required_flags)
    # every required flag must exist, also one that only guards (is not set here)
    resolve_ops_flags(lookup, [OpsFlag(n, True) for n in res.required_flags], where=where)
    if res.flags is None and not res.add_flags and not res.remove_flags:
        return spec
    if isinstance(res.flags, int):
        flags = res.flags
    elif res.flags is not None:
        flags = _flag_value(res.flags, lookup, required, f"{where}.flags", notes)
    else:
        flags = _ops_member_int(spec, ops_map, "flags")
    flags |= _flag_value(res.add_flags, lookup, required, f"{where}.add_flags", notes)
    flags &= ~_flag_value(res.remove_flags, lookup, set(), f"{where}.remove_flags", notes)
    return set_struct_ops_member(spec, ops_map, "flags", flags)


def find_map(spec: ObjectSpec, name: str, where: str) -> MapSpec:
    """The map ``name`` (its ELF or kernel name) of ``spec``. Raises
    ``CustomizationError`` naming ``where``."""
    for m in spec.maps:
        if m.name == name or m.kernel_name == name:
            return m
    raise CustomizationError(f"{where}: object {spec.name!r} has no map {name!r}")


def _layout(btf: Btf | None, type_id: int, size: int, value: object, what: str) -> bytes:
    """``value`` as ``size`` bytes of BTF type ``type_id`` (an int or exact bytes when the
    map has no BTF type for it)."""
    if btf is not None and type_id:
        return encode_value(btf, type_id, value, bytes(size), what)
    if isinstance(value, bytes) and len(value) == size:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and size in (1, 2, 4, 8):
        try:
            return value.to_bytes(size, "little", signed=value < 0)
        except OverflowError:
            raise CustomizationError(f"{what}: {value} does not fit {size} bytes") from None
    raise CustomizationError(
        f"{what}: the map has no BTF type here; give an int or exactly {size} bytes"
    )


def syscall_ctx_type(spec: ObjectSpec, prog_name: str, where: str) -> tuple[int, int]:
    """(struct type id, size) of a syscall program's context, or (0, 0) when it takes
    none. From the program's BTF FUNC -> FUNC_PROTO -> first parameter's pointee."""
    btf = spec.btf
    prog = next((p for p in spec.programs if p.name == prog_name), None)
    if prog is None:
        raise CustomizationError(f"{where}: object {spec.name!r} has no program {prog_name!r}")
    if prog.prog_type != PROG_TYPE_SYSCALL:
        raise CustomizationError(
            f'{where}: program {prog_name!r} is in section {prog.section!r}, not SEC("syscall")'
        )
    if btf is None or not prog.btf_func_id:
        raise CustomizationError(f"{where}: program {prog_name!r} has no BTF for its context")
    try:
        func = btf.type(prog.btf_func_id)
        assert isinstance(func, Func)
        proto = btf.type(func.type)
        if not isinstance(proto, FuncProto):
            raise CustomizationError(f"{where}: {prog_name!r} has no FUNC_PROTO")
        if not proto.params:
            return 0, 0
        ptr = btf.type(btf.skip_mods_and_typedefs(proto.params[0].type))
        if not isinstance(ptr, Ref) or ptr.kind != Kind.PTR:
            raise CustomizationError(f"{where}: {prog_name!r}'s argument is not a pointer")
        tid = btf.skip_mods_and_typedefs(ptr.type)
        if tid == 0:
            return 0, 0  # void *ctx: no layout, args must be empty
        return tid, btf.size_of(tid)
    except BtfError as exc:
        raise CustomizationError(f"{where}: {prog_name!r}: bad BTF: {exc}") from exc


def _stat(spec: ObjectSpec, s: Stat, key: object, where: str) -> PlannedStat:
    btf = spec.btf
    if s.variable is not None:
        m = next(
            (m for m in spec.maps if m.kind in (MapKind.DATA, MapKind.BSS, MapKind.RODATA)
             and m.variable(s.variable) is not None),
            None,
        )  # fmt: skip
        if m is None:
            raise CustomizationError(f"{where}: no global variable {s.variable!r}")
        var = m.variable(s.variable)
        assert var is not None
        signed = _int_signed(btf, var.type_id, where) if btf is not None else False
        return PlannedStat(s.name, s.description, s.variable, None, b"", 0, var.size, signed, False)
    assert s.map is not None
    m = find_map(spec, s.map, where)
    kbytes = _layout(btf, m.key_type_id, m.key_size, key, f"{where}.key")
    off, size, signed = 0, m.value_size, False
    if s.field is not None:
        if btf is None or not m.value_type_id:
            raise CustomizationError(f"{where}: map {s.map!r} has no BTF value type for 'field'")
        off, size, signed = _member(btf, m.value_type_id, s.field, where)
    elif btf is not None and m.value_type_id:
        signed = _int_signed(btf, m.value_type_id, where)
    if size not in (1, 2, 4, 8):
        raise CustomizationError(f"{where}: the counter is {size} bytes, not an integer")
    percpu = m.type in MAP_PERCPU_TYPES
    return PlannedStat(s.name, s.description, None, m.name, kbytes, off, size, signed, percpu)


def _int_signed(btf: Btf | None, type_id: int, where: str) -> bool:
    from schedswitchd.bpf.btf.types import Int

    if btf is None or not type_id:
        return False
    t = btf.type(btf.skip_mods_and_typedefs(type_id))
    if not isinstance(t, Int) or t.size not in (1, 2, 4, 8):
        raise CustomizationError(f"{where}: the counter is not an integer ({t.kind.name})")
    return t.signed


def _member(btf: Btf, type_id: int, path: str, where: str) -> tuple[int, int, bool]:
    off = 0
    tid = type_id
    for part in path.split("."):
        t = btf.type(btf.skip_mods_and_typedefs(tid))
        if not isinstance(t, Composite):
            raise CustomizationError(f"{where}: {path!r}: not a struct at {part!r}")
        hit = btf.find_member(t.id, part)
        if hit is None:
            raise CustomizationError(f"{where}: {t.name or 'struct'} has no member {part!r}")
        _, mem = hit
        if mem.bitfield_size:
            raise CustomizationError(f"{where}: {part!r} is a bitfield")
        off += mem.bit_offset // 8
        tid = mem.type
    return off, btf.size_of(tid), _int_signed(btf, tid, where)


def apply_profile(
    spec: ObjectSpec,
    res: ResolvedProfile,
    *,
    flags: FlagLookup | None = None,
    ops_map: str | None = None,
    problems: list[str] | None = None,
) -> tuple[ObjectSpec, ProfilePlan]:
    """``spec`` with ``res``'s pre-load edits, and the plan of its later steps (see the
    module docstring). ``flags``: the kernel's ``SCX_OPS_*`` names -> values
    (:func:`~schedswitchd.bpf.ops_flags.ops_flags_table`; ``None``: no kernel BTF;
    every named flag is then dropped with a note, required ones refused); ``ops_map``
    names the struct_ops map to edit (default :func:`struct_ops_target`). Raises
    :class:`~schedswitchd.errors.CustomizationError` naming the profile and key -- or,
    given ``problems``, appends each such message to it, skips that key and goes on, so
    a check lists every bad key of an object at once (the result is then only good for
    reporting when ``problems`` grew)."""
    tag = f"profile {res.name}" + (f" mode {res.mode}" if res.mode else "")
    plan = ProfilePlan(res.name, res.mode, attach_cpu=res.attach_cpu)
    target = ops_map if ops_map is not None else struct_ops_target(spec)

    def bad(exc: CustomizationError) -> None:
        # Raises unless the caller collects: every step below skips its key after this.
        if problems is None:
            raise exc from None
        problems.append(str(exc))

    def fail(where: str, exc: CustomizationError) -> CustomizationError:
        return CustomizationError(f"{tag}: {where}: {exc}")

    if res.ops_name is not None:
        got = _ops_name(spec, target) if target is not None else ""
        if got != res.ops_name:
            bad(
                CustomizationError(
                    f"{tag}: profile.ops_name is {res.ops_name!r} but object {spec.name!r} "
                    f"registers {got or 'no struct_ops'!r}: wrong object for this profile?"
                )
            )
    for sec, n in res.resize.items():
        try:
            spec = resize_array_section(spec, sec, n)
        except CustomizationError as exc:
            bad(fail(f"resize.{sec!r}", exc))
    for name, value in res.variables.items():
        try:
            spec = set_variable(spec, name, value)
        except CustomizationError as exc:
            bad(fail(f"variables.{name}", exc))
    if res.struct_ops or res.flags is not None or res.add_flags or res.remove_flags:
        if target is None:
            bad(CustomizationError(f"{tag}: struct_ops: object {spec.name!r} has no struct_ops"))
        else:
            for k, v in res.struct_ops.items():
                try:
                    spec = set_struct_ops_member(spec, target, k, v)
                except CustomizationError as exc:
                    bad(fail(f"struct_ops.{k}", exc))
            try:
                spec = _apply_flags(spec, target, res, flags, "struct_ops", plan.notes)
            except CustomizationError as exc:
                bad(CustomizationError(f"{tag}: {exc}"))
    elif res.required_flags:
        try:
            spec = _apply_flags(spec, target or "", res, flags, "struct_ops", plan.notes)
        except CustomizationError as exc:
            bad(exc)

    btf = spec.btf
    for name, value in res.after_load.items():
        where = f"after_load.{name}"
        hits = [
            (m, v)
            for m in spec.maps
            if m.kind in (MapKind.DATA, MapKind.BSS, MapKind.RODATA)
            for v in m.variables
            if v.name == name
        ]
        if not hits:
            bad(CustomizationError(f"{tag}: {where}: no global variable {name!r}"))
            continue
        m, var = hits[0]
        if m.kind is MapKind.RODATA:
            bad(
                CustomizationError(
                    f"{tag}: {where}: {name!r} is in {m.name} (frozen after load); set it in "
                    "[variables] instead"
                )
            )
            continue
        if var.static or btf is None:
            bad(CustomizationError(f"{tag}: {where}: {name!r} is static or has no BTF"))
            continue
        try:
            raw = encode_value(btf, var.type_id, value, bytes(var.size), name)
        except CustomizationError as exc:
            bad(fail(where, exc))
            continue
        plan.after_load.append((name, raw))
    for u in res.map_updates:
        try:
            m = find_map(spec, u.map, f"{tag}: {u.label}")
        except CustomizationError as exc:
            bad(exc)
            continue
        if m.kind not in (MapKind.DECLARED,):
            bad(
                CustomizationError(
                    f"{tag}: {u.label}: map {u.map!r} is a {m.kind.value} map; write "
                    "variables with [after_load]"
                )
            )
            continue
        try:
            key = _layout(btf, m.key_type_id, m.key_size, u.key, f"{u.label} key")
            value = _layout(btf, m.value_type_id, m.value_size, u.value, f"{u.label} value")
        except CustomizationError as exc:
            bad(CustomizationError(f"{tag}: {exc}"))
            continue
        plan.map_updates.append(
            PlannedMapUpdate(
                m.name,
                key,
                value,
                UPDATE_FLAGS[u.flags],
                m.type in MAP_PERCPU_TYPES,
                u.when,
                u.label,
            )
        )
    for e in res.perf_events:
        try:
            m = find_map(spec, e.map, f"{tag}: {e.label}")
        except CustomizationError as exc:
            bad(exc)
            continue
        if m.type != MAP_PERF_EVENT_ARRAY or m.kind is not MapKind.DECLARED:
            bad(
                CustomizationError(
                    f"{tag}: {e.label}: map {e.map!r} is not a BPF_MAP_TYPE_PERF_EVENT_ARRAY"
                )
            )
            continue
        try:
            key = _layout(btf, m.key_type_id, m.key_size, e.key, f"{e.label} key")
        except CustomizationError as exc:
            bad(CustomizationError(f"{tag}: {exc}"))
            continue
        plan.perf_events.append(
            PlannedPerfEvent(m.name, key, e.type, e.config, e.cpu, e.on_error == "skip", e.label)
        )
    ctx_types: dict[str, tuple[int, int]] = {}
    for r in res.runs:
        if r.program not in ctx_types:
            try:
                ctx_types[r.program] = syscall_ctx_type(spec, r.program, f"{tag}: {r.label}")
            except CustomizationError as exc:
                bad(exc)
                continue
        tid, size = ctx_types[r.program]
        if tid == 0:
            if r.args:
                bad(
                    CustomizationError(
                        f"{tag}: {r.label}: {r.program!r} takes no context struct, but args "
                        "are given"
                    )
                )
                continue
            ctx = b""
        else:
            assert btf is not None
            try:
                ctx = encode_value(btf, tid, r.args, bytes(size), f"{r.label} args")
            except CustomizationError as exc:
                bad(CustomizationError(f"{tag}: {exc}"))
                continue
        plan.runs.append(PlannedRun(r.program, ctx, r.cpu, r.expect_retval, r.when, r.label))
    for s in res.stats:
        try:
            plan.stats.append(
                _stat(spec, s, res.stat_keys.get(s.name, 0), f"{tag}: stats.{s.name}")
            )
        except CustomizationError as exc:
            bad(exc)
    return spec, plan


#: Said after a refused ``userspace`` sentence: how such a scheduler can run after all.
NO_EXECUTABLES = (
    "no executable is configured for it: give [schedulers.NAME] the scheduler's own program "
    "as 'executable' to run it that way (docs/executables.md)"
)


def check_runnable(profile: Profile, mode: str | None = None) -> None:
    """Refuse ``profile`` (with ``mode`` merged in: a mode may declare a ``userspace`` of
    its own) when its user space does work after attach that the daemon cannot do.
    Raises :class:`~schedswitchd.errors.ProfileError` quoting the profile's sentence."""
    from schedswitchd.errors import ProfileError

    info = profile.with_mode(mode).profile
    if not info.runnable:
        what = f"{profile.name!r}" + (f" mode {mode}" if mode else "")
        raise ProfileError(
            f"{profile.path or profile.name}: scheduler {what} needs its own user space, "
            f"which the daemon cannot replace: {info.userspace} ({NO_EXECUTABLES})"
        )


_FACTS: weakref.WeakKeyDictionary[Btf, dict[str, int]] = weakref.WeakKeyDictionary()


def btf_facts(btf: Btf) -> KernelFacts:
    """:class:`KernelFacts` answering from ``btf``'s enumerators (one scan of the BTF on
    the first question, kept while ``btf`` lives)."""

    def lookup(name: str) -> int | None:
        table = _FACTS.get(btf)
        if table is None:
            table = _FACTS[btf] = enum_table([btf])
        return table.get(name)

    return KernelFacts(lookup, f"{btf.name or 'kernel'} BTF")


@dataclass
class ProfiledSpec:
    """An object spec with a profile applied: the edited ``spec``, the ``plan`` of the
    later phases, the ``resolved`` values and the ``topology`` they were computed for."""

    spec: ObjectSpec
    plan: ProfilePlan
    resolved: ResolvedProfile
    topology: Topology


def profile_spec(
    spec: ObjectSpec,
    profile: Profile,
    topology: Topology,
    *,
    mode: str | None = None,
    kernel_btf: Btf | None = None,
    ops_map: str | None = None,
    problems: list[str] | None = None,
) -> ProfiledSpec:
    """Resolve ``profile`` (and ``mode``) for ``topology`` and apply it to ``spec``:
    expressions' ``kernel_enum()`` and ``SCX_OPS_*`` flags answer from ``kernel_btf``
    (``None``: no kernel; flags are then dropped with a note, required ones refused).
    Refuses a profile or mode whose ``userspace`` is not ``"none"``
    (:func:`check_runnable`). Raises ``ProfileError`` /
    ``CustomizationError`` naming the file and key; with ``problems``, applying the
    resolved values lists every bad key there instead (:func:`apply_profile`)."""

    check_runnable(profile, mode)
    facts = btf_facts(kernel_btf) if kernel_btf is not None else None
    from schedswitchd.profile.resolve import NO_KERNEL

    res = resolve_profile(profile, topology, mode=mode, kernel=facts or NO_KERNEL)
    flags = ops_flags_table(kernel_btf) if kernel_btf is not None else None
    out, plan = apply_profile(spec, res, flags=flags, ops_map=ops_map, problems=problems)
    return ProfiledSpec(out, plan, res, topology)
