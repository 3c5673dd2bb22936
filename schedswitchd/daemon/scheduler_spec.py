"""The one step between opening a scheduler's object and loading it: its customised spec.

:func:`build_scheduler_spec` turns an opened object and a scheduler's configuration into
the spec the loader takes: the scheduler's ``sched_ext_ops`` struct_ops map found, its
profile (if any) resolved for a topology and applied (:mod:`schedswitchd.profile.apply`),
then the configuration's ``rodata`` and ``struct_ops`` keys and ``hotplug_seq`` on top
(:func:`~schedswitchd.bpf.scheduler.apply_tunables`; the configuration wins over the
profile). The kernel backend's prepare and ``--check-config`` both call it, so what the
check vets is what the daemon loads.

It is pure: no syscall, no file read. What it needs from the kernel or the disk arrives as
arguments (the opened object, the profile file as read, the topology read from sysfs, the
kernel's BTF, ``hotplug_seq``). Those arguments, each by its identity (a file by
:class:`~schedswitchd.kernel.spec_cache.SpecKey`, the rest by value), are the
:class:`SpecInputs` the result carries: a standby is still what a prepare would make now
exactly when the inputs read now make the same :class:`SpecInputs`
(:func:`spec_inputs`, which both the build and the backend's freshness check call).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.ops_flags import ops_flags_table
from schedswitchd.bpf.scheduler import (
    SCHED_EXT_OPS,
    apply_tunables,
    flags_by_name,
    ops_name_of,
    sched_ext_map,
)
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.daemon.config import SchedulerConfig, struct_ops_request
from schedswitchd.kernel.spec_cache import OpenedSpec, SpecKey
from schedswitchd.profile.apply import ProfiledSpec, ProfilePlan, profile_spec
from schedswitchd.profile.model import Profile, load_profile
from schedswitchd.profile.topology import Topology


@dataclass(frozen=True, slots=True)
class ProfileFile:
    """A profile file as read: its validated model and the identity of the file it was
    read from (``None`` when the file could not be stat'ed)."""

    profile: Profile
    key: SpecKey | None


def read_profile_file(path: str | os.PathLike[str]) -> ProfileFile:
    """The profile at ``path``, its identity taken before the read (a file replaced after
    the stat reads as changed at the next freshness check, never as unchanged). Raises
    :class:`~schedswitchd.errors.ProfileError` naming the file."""
    key = SpecKey.of_path(path)
    return ProfileFile(load_profile(Path(path)), key)


class SpecInputs(NamedTuple):
    """What a :class:`SchedulerSpec` was built from, each input by its identity: the
    standby's freshness key. Inputs that do not reach the spec are ``None`` (the topology
    and the profile without a profile, ``hotplug_seq`` unless the configuration asks for
    it, the kernel BTF unless a profile or a named ``SCX_OPS_*`` flag reads it), so a
    change of them does not make a held scheduler stale."""

    #: The object file (path, device, inode, size, mtime).
    object: SpecKey | None
    #: The scheduler's configuration entry.
    config: SchedulerConfig
    #: The profile file, as :attr:`object`.
    profile: SpecKey | None
    #: The CPU topology the profile's values were computed for.
    topology: Topology | None
    #: The kernel BTF ``SCX_OPS_*`` flags and ``kernel_enum()`` answer from (compared by
    #: identity: one per kernel in a process).
    vmlinux: Btf | None
    #: ``/sys/kernel/sched_ext/hotplug_seq`` written into the object.
    hotplug_seq: int | None
    #: The struct_ops type that makes the object a scheduler.
    ops_type: str


def needs_kernel_btf(cfg: SchedulerConfig) -> bool:
    """Whether building ``cfg``'s spec reads the kernel's BTF: a profile
    (``kernel_enum()``, flags) or ``SCX_OPS_*`` flags named in ``struct_ops``."""
    return cfg.profile_path is not None or any(
        not isinstance(v, int) for v in cfg.struct_ops.values()
    )


def spec_inputs(
    object_key: SpecKey | None,
    cfg: SchedulerConfig,
    *,
    profile_key: SpecKey | None,
    topology: Topology | None,
    vmlinux: Btf | None,
    hotplug_seq: int | None,
    ops_type: str,
) -> SpecInputs:
    """The :class:`SpecInputs` of a build from these inputs, with those that do not reach
    the spec left out (see the class). Both :func:`build_scheduler_spec` and a freshness
    check (inputs read now) make their key here."""
    profiled = cfg.profile_path is not None
    return SpecInputs(
        object_key,
        cfg,
        profile_key if profiled else None,
        topology if profiled else None,
        vmlinux if needs_kernel_btf(cfg) else None,
        hotplug_seq if cfg.hotplug_seq else None,
        ops_type,
    )


@dataclass(frozen=True, slots=True, eq=False)
class SchedulerSpec:
    """A scheduler's spec ready for the loader.

    ``spec``: the customised object spec; ``ops_map``: its ``ops_type`` struct_ops map;
    ``ops_name``: ``sched_ext_ops.name`` (what ``root/ops`` reads while it runs);
    ``plan``: the profile's steps after load (``None`` without a profile); ``profile``:
    the profile applied and what applying it gave (``None`` without one);
    ``flag_notes``: one line per ``SCX_OPS_*`` flag the kernel lacks, dropped;
    ``inputs``: what it was built from (the standby's freshness key)."""

    spec: ObjectSpec
    ops_map: str
    ops_name: str
    plan: ProfilePlan | None
    profile: tuple[Profile, ProfiledSpec] | None
    flag_notes: tuple[str, ...]
    inputs: SpecInputs


def build_scheduler_spec(
    opened: OpenedSpec,
    cfg: SchedulerConfig,
    *,
    topology: Topology | None,
    vmlinux: Btf | None,
    profile: ProfileFile | None = None,
    hotplug_seq: int | None = None,
    ops_type: str = SCHED_EXT_OPS,
    on_profile: Callable[[Profile, ProfiledSpec], None] | None = None,
) -> SchedulerSpec:
    """``opened``'s spec customised for ``cfg``: its profile (``profile``, read from
    ``cfg.profile_path``; its mode ``cfg.mode``) resolved for ``topology`` and applied,
    then ``cfg.rodata``, ``cfg.struct_ops`` and, when ``cfg.hotplug_seq``,
    ``hotplug_seq`` (the kernel's value; ``None``: left as the object has it).
    ``vmlinux``: the kernel BTF flags and ``kernel_enum()`` answer from (``None``: no
    kernel; named flags are then dropped with a note, required ones refused).
    ``on_profile``: called once the profile is applied, before the configuration's keys,
    which may still fail (``--check-config`` reports the profile's result either way).

    Raises :class:`~schedswitchd.errors.LoadError` (no or several ``ops_type`` maps, no
    ops name), :class:`~schedswitchd.errors.ProfileError`,
    :class:`~schedswitchd.errors.CustomizationError` naming the file and key;
    ``ValueError`` when ``cfg`` names a profile and ``profile`` or ``topology`` is
    missing."""
    spec = opened.spec
    ops_map = sched_ext_map(spec, ops_type)
    plan: ProfilePlan | None = None
    applied: tuple[Profile, ProfiledSpec] | None = None
    if cfg.profile_path is not None:
        if profile is None or topology is None:
            raise ValueError(f"{cfg.object}: a profile needs its file and a topology")
        profiled = profile_spec(
            spec,
            profile.profile,
            topology,
            mode=cfg.mode,
            kernel_btf=vmlinux,
            ops_map=ops_map,
        )
        spec, plan = profiled.spec, profiled.plan
        applied = (profile.profile, profiled)
        if on_profile is not None:
            on_profile(profile.profile, profiled)
    struct_ops = struct_ops_request(cfg)
    kernel_flags = (
        ops_flags_table(vmlinux) if vmlinux is not None and flags_by_name(struct_ops) else None
    )
    notes: list[str] = []
    spec = apply_tunables(
        spec,
        ops_map,
        cfg.rodata,
        struct_ops,
        hotplug_seq if cfg.hotplug_seq else None,
        ops_flags=kernel_flags,
        notes=notes,
    )
    inputs = spec_inputs(
        opened.key,
        cfg,
        profile_key=profile.key if profile is not None else None,
        topology=topology,
        vmlinux=vmlinux,
        hotplug_seq=hotplug_seq,
        ops_type=ops_type,
    )
    return SchedulerSpec(
        spec, ops_map, ops_name_of(spec, ops_map), plan, applied, tuple(notes), inputs
    )
