"""Checking a profile before a user runs it: every mode against a set of machines.

A profile resolves differently on each machine: a ``for_each = "smt_pair"`` step runs zero
times without SMT, an ``only_if`` may skip every CPU, a NUMA flag is added only with two
nodes. Checked on one machine, a mistake in a step that machine skips would wait for the
first user whose machine runs it. So a profile is checked

- against this machine's sysfs tree (or another given) and the bundled trees of
  :data:`BUNDLED_DIR` (``smt``, ``hybrid`` big/LITTLE, ``numa`` with a CPU-less third
  node, ``amd_prefcore``, ``one_cpu``), in every mode and the base: each resolved
  (:func:`~schedswitchd.profile.resolve.resolve_profile`) and, given the object, applied
  (:func:`~schedswitchd.profile.apply.profile_spec`, the loader's own code);
- structurally, without iterations (:func:`static_step_problems`): every step's program or
  map exists and every member it names (``args``, a struct ``key``/``value``) is a member
  of its BTF type, whether or not any machine iterates the step.

Every problem is reported, not the first: one line each, naming the mode and machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Composite
from schedswitchd.bpf.spec import MapKind, MapSpec, ObjectSpec
from schedswitchd.errors import BtfError, CustomizationError, SchedSwitchError
from schedswitchd.profile.apply import (
    MAP_PERF_EVENT_ARRAY,
    check_runnable,
    find_map,
    profile_spec,
    syscall_ctx_type,
)
from schedswitchd.profile.model import Expr, Profile
from schedswitchd.profile.resolve import NO_KERNEL, KernelFacts, resolve_profile
from schedswitchd.profile.topology import Topology, read_topology

__all__ = [
    "BUNDLED_DIR",
    "ProfileCheck",
    "bundled_machines",
    "check_profile",
    "machines",
    "static_step_problems",
]

#: The bundled sysfs trees, one directory per machine (package data).
BUNDLED_DIR = Path(__file__).resolve().parent / "machines"


def bundled_machines() -> dict[str, Path]:
    """Name -> sysfs root of every bundled tree, sorted by name."""
    if not BUNDLED_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(BUNDLED_DIR.iterdir()) if (p / "devices").is_dir()}


def machines(
    sysfs_root: str | os.PathLike[str] | None = "/sys", *, bundled: bool = True
) -> tuple[list[tuple[str, Topology]], list[str]]:
    """The machines to check against: ``sysfs_root``'s (named ``this machine``, or the
    path when it is not ``/sys``; ``None``: none) then the bundled ones -> (machines,
    problems reading them). Never raises for a tree that does not read."""
    out: list[tuple[str, Topology]] = []
    problems: list[str] = []
    roots: list[tuple[str, str | os.PathLike[str]]] = []
    if sysfs_root is not None:
        label = "this machine" if str(sysfs_root) == "/sys" else str(sysfs_root)
        roots.append((label, sysfs_root))
    if bundled:
        roots.extend((f"bundled {n}", p) for n, p in bundled_machines().items())
    for label, root in roots:
        try:
            out.append((label, read_topology(root)))
        except SchedSwitchError as exc:
            problems.append(f"{label}: cannot read the topology: {exc}")
    return out, problems


def _member_problems(btf: Btf, type_id: int, value: Any, where: str, depth: int = 0) -> list[str]:
    """Names in ``value`` (a table of members, nested) that are not members of BTF type
    ``type_id``; expressions and non-table values are left to the encoder."""
    if not isinstance(value, Mapping) or isinstance(value, Expr) or depth > 16:
        return []
    try:
        tid = btf.skip_mods_and_typedefs(type_id)
        t = btf.type(tid)
    except BtfError as exc:
        return [f"{where}: bad BTF: {exc}"]
    if not isinstance(t, Composite):
        return [f"{where}: a table of members, but the type is not a struct or union"]
    out: list[str] = []
    for name, sub in value.items():
        hit = btf.find_member(tid, name)
        if hit is None:
            out.append(f"{where}: {t.name or 'the struct'} has no member {name!r}")
            continue
        out.extend(_member_problems(btf, hit[1].type, sub, f"{where}.{name}", depth + 1))
    return out


def static_step_problems(spec: ObjectSpec, profile: Profile, mode: str | None = None) -> list[str]:
    """Problems of every step of ``profile`` (``mode`` merged in) that do not depend on
    the machine: programs that are not ``SEC("syscall")`` programs of ``spec``, maps it
    lacks, members named in ``args`` or a struct key/value that the BTF type lacks. Checked
    once per step, so a step no machine iterates is checked too."""
    p = profile.with_mode(mode)
    btf = spec.btf
    out: list[str] = []
    for n, r in enumerate(p.run):
        where = f"run[{n}] {r.program}"
        try:
            tid, _ = syscall_ctx_type(spec, r.program, where)
        except CustomizationError as exc:
            out.append(str(exc))
            continue
        if tid and btf is not None:
            out.extend(_member_problems(btf, tid, r.args, f"{where}: args"))
        elif r.args:
            out.append(f"{where}: {r.program!r} takes no context struct, but args are given")

    def find(name: str, where: str) -> MapSpec | None:
        try:
            return find_map(spec, name, where)
        except CustomizationError as exc:
            out.append(str(exc))
            return None

    for n, mu in enumerate(p.map_updates):
        where = f"map_updates[{n}] {mu.map}"
        m = find(mu.map, where)
        if m is None:
            continue
        if m.kind is not MapKind.DECLARED:
            out.append(f"{where}: map {mu.map!r} is a {m.kind.value} map")
        elif btf is not None:
            if m.key_type_id:
                out.extend(_member_problems(btf, m.key_type_id, mu.key, f"{where}: key"))
            if m.value_type_id:
                out.extend(_member_problems(btf, m.value_type_id, mu.value, f"{where}: value"))
    for n, pe in enumerate(p.perf_events):
        where = f"perf_events[{n}] {pe.map}"
        m = find(pe.map, where)
        if m is not None and m.type != MAP_PERF_EVENT_ARRAY:
            out.append(f"{where}: map {pe.map!r} is not a BPF_MAP_TYPE_PERF_EVENT_ARRAY")
    return out


@dataclass
class ProfileCheck:
    """The outcome of :func:`check_profile`: ``problems`` (one line each, naming mode and
    machine), ``notes`` (refused modes, machines skipped for ``min_cpus``, dropped flags),
    ``checked`` (how many mode x machine resolutions ran)."""

    profile: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: int = 0

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def _facts(vmlinux: Btf | None, kernel: KernelFacts | None) -> KernelFacts:
    if vmlinux is not None:
        from schedswitchd.profile.apply import btf_facts

        return btf_facts(vmlinux)
    return kernel or NO_KERNEL


def _dedup(lines: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def check_profile(
    profile: Profile,
    topologies: list[tuple[str, Topology]],
    *,
    spec: ObjectSpec | None = None,
    vmlinux: Btf | None = None,
    kernel: KernelFacts | None = None,
    ops_map: str | None = None,
    modes: Iterable[str | None] | None = None,
) -> ProfileCheck:
    """Check ``profile`` in ``modes`` (default: the base and every mode) on every machine
    of ``topologies`` (name, topology); see the module docstring. ``spec``: the object, to
    apply to (``None``: resolve only); ``vmlinux``: the target kernel's BTF for flags and
    ``kernel_enum()`` (``kernel``: other facts when there is no BTF). Never raises for a
    bad profile: everything found is in the result."""
    out = ProfileCheck(profile.name)
    wanted = list(modes) if modes is not None else [None, *profile.modes]
    if spec is not None:
        for mode in wanted:
            tag = f"mode {mode}: " if mode else ""
            try:
                out.problems.extend(tag + p for p in static_step_problems(spec, profile, mode))
            except SchedSwitchError as exc:
                out.problems.append(f"{tag}{exc}")
    for mode in wanted:
        label = f"mode {mode}" if mode else "base"
        try:
            check_runnable(profile, mode)
        except SchedSwitchError as exc:
            out.notes.append(f"{label}: refused: {exc}")
            continue
        for mname, topo in topologies:
            if topo.nr_cpus < profile.with_mode(mode).profile.min_cpus:
                out.notes.append(f"{label} on {mname}: skipped (min_cpus)")
                continue
            out.checked += 1
            where = f"{label} on {mname}: "
            # First every key that fails to resolve (each listed), then, when all
            # resolve, every key the object refuses (each listed too).
            failed: list[str] = []
            try:
                resolve_profile(
                    profile, topo, mode=mode, kernel=_facts(vmlinux, kernel), problems=failed
                )
            except SchedSwitchError as exc:
                failed.extend(str(exc).splitlines())
            if failed:
                out.problems.extend(where + line for line in failed)
                continue
            try:
                if spec is not None:
                    refused: list[str] = []
                    ps = profile_spec(
                        spec,
                        profile,
                        topo,
                        mode=mode,
                        kernel_btf=vmlinux,
                        ops_map=ops_map,
                        problems=refused,
                    )
                    out.problems.extend(where + line for line in refused)
                    out.notes.extend(ps.plan.notes)
            except SchedSwitchError as exc:
                out.problems.extend(where + line for line in str(exc).splitlines())
    out.problems = _dedup(out.problems)
    out.notes = _dedup(out.notes)
    return out
