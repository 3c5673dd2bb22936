"""``sched_ext_ops.flags`` given by name (``SCX_OPS_*``), resolved from the kernel's BTF.

The one resolver behind every way of naming flags: ``schedswitchctl object load
--ops-flag/--require-ops-flag``, the daemon configuration's ``struct_ops.flags = [...]``
(through :func:`schedswitchd.bpf.scheduler.apply_tunables`) and a profile's ``[struct_ops]
flags/add_flags/remove_flags/required_flags`` (:mod:`schedswitchd.profile.apply`).

The values are the enumerators of the kernel's ``enum scx_ops_flags``
(``kernel/sched/ext_internal.h``; ``include/linux/sched/ext.h`` before 6.17), which reach
user space only through vmlinux BTF (an ``ENUM64`` in the VM's 7.2 kernel). A scheduler's own
user space never hard-codes them: scx's ``compat.h`` reads each with
``__COMPAT_ENUM_OR_ZERO("scx_ops_flags", name)`` (``SCX_OPS_FLAG()``), and Rust's
``scx_utils::compat`` likewise, so a flag the running kernel lacks becomes 0 -- dropped --
while a scheduler that cannot work without one checks for it and refuses to start. Here a
flag the kernel lacks is dropped with a note, or, when required, refused with a
:class:`~schedswitchd.errors.CustomizationError` naming it and what the kernel has.

Pure: the kernel's flags are an argument (:func:`ops_flags_table` of the registry's vmlinux).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Enum, Kind
from schedswitchd.bpf.customize import set_struct_ops_member
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.errors import CustomizationError

__all__ = [
    "OPS_FLAGS_ENUM",
    "OpsFlag",
    "OpsFlags",
    "ops_flags_table",
    "resolve_ops_flags",
    "set_ops_flags",
]

#: The kernel enum holding the flag values.
OPS_FLAGS_ENUM = "scx_ops_flags"


def ops_flags_table(btf: Btf, enum_name: str = OPS_FLAGS_ENUM) -> dict[str, int]:
    """Enumerator name -> value of ``enum <enum_name>`` (``ENUM`` or ``ENUM64``) in ``btf``:
    empty when the BTF has no such enum (a kernel without sched_ext). Names starting with
    ``__`` (the kernel's internal masks) are left out. Raises ``BtfError`` on bad BTF."""
    out: dict[str, int] = {}
    for tid in btf.find_ids(enum_name, Kind.ENUM) + btf.find_ids(enum_name, Kind.ENUM64):
        t = btf.type(tid)
        if isinstance(t, Enum):
            for ev in t.values:
                if not ev.name.startswith("__"):
                    out.setdefault(ev.name, ev.value)
    return out


@dataclass(frozen=True, slots=True)
class OpsFlag:
    """A flag asked for by name; ``required``: refuse the load if the kernel lacks it."""

    name: str
    required: bool = False


@dataclass(frozen=True, slots=True)
class OpsFlags:
    """Resolved flags: ``value`` (the OR of the found ones, a u64), ``found`` (name, value)
    in the order asked, ``dropped`` (names the kernel lacks, not required), ``notes`` (one
    line per dropped name, prefixed with where it was asked for)."""

    value: int
    found: tuple[tuple[str, int], ...]
    dropped: tuple[str, ...]
    notes: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        """JSON shape: ``{"value": int, "set": {name: value}, "dropped": [name]}``."""
        return {"value": self.value, "set": dict(self.found), "dropped": list(self.dropped)}


def resolve_ops_flags(
    kernel: Mapping[str, int] | None,
    flags: Iterable[OpsFlag | str],
    *,
    where: str = "sched_ext_ops.flags",
    enum_name: str = OPS_FLAGS_ENUM,
) -> OpsFlags:
    """Look every flag up in ``kernel`` (:func:`ops_flags_table`; ``None``: no kernel BTF
    at hand, so nothing resolves). A plain ``str`` is an optional flag. Raises
    :class:`CustomizationError` prefixed with ``where`` for a required flag the kernel
    lacks (also when it has no ``enum <enum_name>`` at all: no sched_ext), naming the
    enumerators it has."""
    found: list[tuple[str, int]] = []
    dropped: list[str] = []
    notes: list[str] = []
    value = 0
    for f in flags:
        flag = f if isinstance(f, OpsFlag) else OpsFlag(f)
        v = kernel.get(flag.name) if kernel is not None else None
        if v is not None:
            if (flag.name, v) not in found:
                found.append((flag.name, v))
            value |= v
            continue
        if kernel is None:
            why = "no kernel BTF to resolve it"
        elif not kernel:
            why = f"the kernel has no enum {enum_name} (no sched_ext)"
        else:
            why = "the kernel lacks it"
        if flag.required:
            has = f" (it has {', '.join(sorted(kernel))})" if kernel else ""
            raise CustomizationError(f"{where}: required flag {flag.name}: {why}{has}")
        if flag.name not in dropped:
            dropped.append(flag.name)
            notes.append(f"{where}: flag {flag.name} dropped: {why}")
    return OpsFlags(value, tuple(found), tuple(dropped), tuple(notes))


def set_ops_flags(
    spec: ObjectSpec,
    ops_map: str,
    kernel: Mapping[str, int] | None,
    flags: Iterable[OpsFlag | str],
    *,
    where: str = "sched_ext_ops.flags",
) -> tuple[ObjectSpec, OpsFlags]:
    """``spec`` with struct_ops variable ``ops_map``'s ``flags`` member *replaced* by the
    resolved value (as a skeleton's ``skel->struct_ops.ops->flags = ...`` does: name the
    object's compiled-in flags too to keep them), and the resolution. Raises
    :class:`CustomizationError` (a required flag missing, no such map or member)."""
    res = resolve_ops_flags(kernel, flags, where=where)
    return set_struct_ops_member(spec, ops_map, "flags", res.value), res
