"""``schedswitchd --check-config``: validate the file and vet every scheduler it names.

Two depths, and the report says which one ran for each scheduler:

- ``object``: no kernel involved. The object is opened with the loader's own
  :func:`~schedswitchd.bpf.object.open_object` (a ``.bpf.o``, or an executable embedding
  one: the report says which embedded object), its one ``sched_ext_ops`` struct_ops map
  found, its profile (if any) resolved for this machine's topology (or ``--sysfs``'s) and
  applied, then the configured ``rodata``/``struct_ops`` keys on top -- the kernel
  backend's own step before loading
  (:func:`~schedswitchd.daemon.scheduler_spec.build_scheduler_spec`), so an unknown variable,
  program, map or member, a value of the wrong type or out of range, an unknown mode, a
  profile refused for its user space, or a flag the kernel lacks (a note, or a problem when
  required) is found here. ``SCX_OPS_*`` flags and ``kernel_enum()`` are resolved from the
  running kernel's BTF when it has one (``/sys/kernel/btf/vmlinux``), read as a file, or
  from a target kernel's BTF given with ``--vmlinux``. Each profile is also checked in
  every mode (named by a hint or not) on this machine and the bundled sysfs trees
  (:mod:`schedswitchd.profile.check`), once per object and profile, every problem listed.
- ``prepared``: additionally :meth:`SchedulerBackend.prepare` (open, CO-RE against the
  running kernel, maps and programs loaded, the profile's steps before attach; never
  attached), then ``discard``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.object import open_object_noted
from schedswitchd.bpf.scheduler import ops_name_of, sched_ext_map
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.daemon.backend import UNAVAILABLE, SchedulerBackend
from schedswitchd.daemon.config import Config, SchedulerConfig, exec_argv
from schedswitchd.daemon.prepare_guard import prepare_checked
from schedswitchd.daemon.scheduler_spec import ProfileFile, build_scheduler_spec, read_profile_file
from schedswitchd.daemon.switcher import NO_SCHED_EXT
from schedswitchd.errors import ObjectError, SchedSwitchError
from schedswitchd.kernel.spec_cache import OpenedSpec, SpecKey
from schedswitchd.profile.apply import ProfiledSpec
from schedswitchd.profile.check import check_profile, machines
from schedswitchd.profile.model import Profile, load_profile
from schedswitchd.profile.topology import Topology, read_topology

#: The running kernel's BTF, read as a file (no bpf(2) needed).
VMLINUX = Path("/sys/kernel/btf/vmlinux")


@dataclass
class CheckResult:
    """Outcome for one scheduler. ``depth``: ``object`` or ``prepared`` (see module doc), or
    ``executable`` for a scheduler run as its own program (nothing loaded to check);
    ``ok``; ``problems``: one line each; ``notes``: facts found (kmods, timings)."""

    name: str
    object: str
    depth: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class TargetBtfError(SchedSwitchError):
    """The kernel BTF file given to check against (``--vmlinux``) cannot be read or is not
    BTF; the message names it and why."""


def kernel_btf(path: Path = VMLINUX) -> Btf | None:
    """The kernel's BTF from ``path`` (a raw BTF file: ``/sys/kernel/btf/vmlinux`` or
    ``bpftool btf dump file ... format raw``'s input), or ``None`` when it cannot be
    read."""
    try:
        return Btf.from_file(path, name="vmlinux") if path.exists() else None
    except SchedSwitchError:
        return None


def inspect_object(
    spec: SchedulerConfig,
    *,
    topology: Topology | None = None,
    vmlinux: Btf | None = None,
) -> tuple[list[str], list[str]]:
    """Static checks of one scheduler (see the module docstring) -> (problems, notes).
    ``topology``: the machine the profile is resolved for (default: ``/sys``);
    ``vmlinux``: the kernel BTF flags and enumerators come from (``None``: unresolved, so
    named flags are dropped with a note). Never raises for bad files or profiles."""
    problems: list[str] = []
    notes: list[str] = []
    try:
        obj, embedded = open_object_noted(spec.object)
        obj.link_programs()  # its programs' code is checked too, as the daemon's open does
        if embedded:
            notes.append(embedded)
        notes.append(f"ops name {ops_name_of(obj, sched_ext_map(obj))!r}")
        if obj.kmod_btfs is not None:
            notes.append(f".kmod_btfs declares: {', '.join(obj.kmod_btfs) or '(none)'}")
        profile: ProfileFile | None = None
        topo: Topology | None = None
        if spec.profile_path is not None:
            profile = read_profile_file(spec.profile_path)
            topo = topology if topology is not None else read_topology("/sys")

        def profiled(profile: Profile, applied: ProfiledSpec) -> None:
            plan = applied.plan
            mode = f" mode {spec.mode}" if spec.mode else ""
            notes.append(
                f"profile {profile.name}{mode} ({spec.profile_path}) for "
                f"{applied.topology.describe()}: {len(plan.after_load)} after-load writes, "
                f"{len(plan.map_updates)} map updates, {len(plan.runs)} program runs"
                + (f", attach from CPU {plan.attach_cpu}" if plan.attach_cpu is not None else "")
            )
            notes.extend(f"profile note: {n}" for n in plan.notes)

        built = build_scheduler_spec(
            _opened(spec.object, obj, embedded),
            spec,
            topology=topo,
            vmlinux=vmlinux,
            profile=profile,
            on_profile=profiled,
        )
        notes.extend(built.flag_notes)
    except SchedSwitchError as exc:
        problems.extend(_path_dropped(str(exc), spec.object).splitlines())
    return problems, notes


def _opened(path: str, obj: ObjectSpec, note: str | None) -> OpenedSpec:
    """``obj``, opened from ``path`` just now, as the spec cache answers a prepare."""
    key = SpecKey.of_path(path)
    if key is None:
        raise ObjectError(f"cannot read BPF object {path!r}: it went away while checked")
    return OpenedSpec(obj, key, cached=False, open_ns=0, note=note)


def profile_across_machines(
    spec: SchedulerConfig,
    *,
    sysfs_root: str | os.PathLike[str] = "/sys",
    vmlinux: Btf | None = None,
) -> tuple[list[str], list[str]]:
    """``spec``'s profile checked in every mode on ``sysfs_root``'s machine and the bundled
    ones, applied to its object (:func:`~schedswitchd.profile.check.check_profile`) ->
    (problems, notes). Never raises for bad files or profiles."""
    if spec.profile_path is None:
        return [], []
    try:
        obj, _ = open_object_noted(spec.object)
        profile = load_profile(spec.profile_path)
        topos, problems = machines(sysfs_root)
        result = check_profile(
            profile, topos, spec=obj, vmlinux=vmlinux, ops_map=sched_ext_map(obj)
        )
    except SchedSwitchError as exc:
        return [_path_dropped(str(exc), spec.object)], []
    notes = [
        f"profile {profile.name}: every mode checked on {', '.join(n for n, _ in topos)} "
        f"({result.checked} mode x machine checks)"
    ]
    notes.extend(f"profile {profile.name}: {n}" for n in result.notes if "dropped" not in n)
    return problems + result.problems, notes


def _path_dropped(message: str, path: str) -> str:
    """``message`` without the object's path where it leads: the report's line for the
    scheduler names the path already (``fifo: FAILED [object] PATH``), so its problem
    lines need not say it again. Other paths (a profile's, a module's) stay."""
    for prefix, instead in (
        (f"{path}: ", ""),
        (f"cannot read BPF object {path!r}: ", "cannot read: "),
    ):
        if message.startswith(prefix):
            return instead + message.removeprefix(prefix)
    return message


def check_config(
    config: Config,
    backend: SchedulerBackend | None,
    *,
    sysfs_root: str | os.PathLike[str] = "/sys",
    vmlinux: Path | None = None,
) -> list[CheckResult]:
    """Check every scheduler of an already validated ``config``; see the module docstring.
    On a kernel without sched_ext (see :func:`sched_ext_missing`) only the static checks
    run: preparing would fail on the first sched_ext kfunc for every scheduler alike.
    ``sysfs_root``: the topology profiles are resolved for; ``vmlinux``: a raw BTF file,
    the target kernel's, which flags and ``kernel_enum()`` come from in the static checks
    (``None``: the running kernel's, :data:`VMLINUX`, when it has one). Raises
    :class:`TargetBtfError` when a ``vmlinux`` given cannot be read or is not BTF."""
    results = []
    prepare = backend is not None and not sched_ext_missing(backend)
    if vmlinux is None:
        btf = kernel_btf()
    else:
        try:
            btf = Btf.from_file(vmlinux, name="vmlinux")
        except (SchedSwitchError, OSError) as exc:
            raise TargetBtfError(f"{vmlinux}: {exc}") from None
    across: dict[tuple[str, str], str] = {}
    topology: Topology | None = None
    topo_problem: str | None = None
    try:
        topology = read_topology(sysfs_root)
    except SchedSwitchError as exc:
        topo_problem = f"cannot read the topology: {exc}"
    for name, spec in config.schedulers.items():
        if spec.runs_executable:
            # Its program loads what it loads; the configuration checked that it can run.
            argv = " ".join(exec_argv(spec))
            note = f"runs as its executable (docs/executables.md): {argv}"
            results.append(CheckResult(name, spec.executable or "", "executable", True, [], [note]))
            continue
        if spec.profile_path is not None and topology is None:
            problems: list[str] = [topo_problem or "no topology"]
            notes: list[str] = []
        else:
            problems, notes = inspect_object(spec, topology=topology, vmlinux=btf)
        if spec.profile_path is not None and topology is not None:
            key = (spec.object, str(spec.profile_path))
            if key in across:
                notes.append(f"profile: every mode checked across machines with {across[key]}")
            else:
                across[key] = name
                more, more_notes = profile_across_machines(spec, sysfs_root=sysfs_root, vmlinux=btf)
                # the configured mode on this machine failed above already
                problems.extend(m for m in more if not any(m.endswith(p) for p in problems))
                notes.extend(more_notes)
        depth = "object"
        if backend is not None and prepare and not problems:
            depth = "prepared"
            start = time.monotonic_ns()
            try:
                prepared = prepare_checked(backend, name, spec)
            except SchedSwitchError as exc:
                problems.append(f"prepare failed ({exc.code}): {exc}")
                log = exc.verifier_log
                if log:
                    notes.append("verifier log:\n" + log)
            else:
                notes.append(
                    f"prepared in {(time.monotonic_ns() - start) / 1e6:.1f} ms, "
                    f"ops name {prepared.ops_name!r}"
                )
                backend.discard(prepared)
        results.append(CheckResult(name, spec.object, depth, not problems, problems, notes))
    return results


def sched_ext_missing(backend: SchedulerBackend) -> bool:
    """True if ``backend`` reports a kernel without sched_ext."""
    return backend.kernel_state().state == UNAVAILABLE


def config_warnings(config: Config) -> list[str]:
    """What in an otherwise valid ``config`` cannot work as it is meant to, one sentence each
    (``--check-config`` prints them; not errors: the daemon runs). So far: ``[dbus]`` serving
    ``org.scx.Loader`` with no scheduler to offer (no ``[dbus.scx_names]`` and no scheduler
    with a profile), where ``SupportedSchedulers`` is empty and every ``SwitchScheduler``
    fails."""
    warnings = []
    if config.dbus is not None and config.dbus.scx_loader and not config.dbus.scx_names:
        warnings.append(
            "[dbus] serves org.scx.Loader (scx_loader = true) but offers no scheduler: its "
            "SupportedSchedulers is empty and every SwitchScheduler fails. Add "
            '[dbus.scx_names] (e.g. scx_bpfland = "bpfland", naming a configured scheduler), '
            'or give a scheduler a profile (profile = "bpfland") to offer it as scx_<profile>; '
            "or set scx_loader = false"
        )
    return warnings


def format_report(
    config: Config,
    results: list[CheckResult],
    backend_name: str | None,
    *,
    no_sched_ext: bool = False,
    vmlinux: Path | None = None,
) -> str:
    """The text ``--check-config`` prints: the file (its syntax and keys are valid by now,
    the schedulers not yet vetted), what was checked and against which kernel BTF
    (``vmlinux``: the one given, else the running kernel's), one block per scheduler, then
    the verdict over them all as the last line, with the config's warnings
    (:func:`config_warnings`) before it. ``no_sched_ext``: the kernel has no sched_ext,
    said first."""
    lines = [f"{config.source}: configuration file is valid; checking schedulers..."]
    static = (
        "checked: each object opened and customised as the loader does, without a kernel "
        "(its sched_ext_ops, profile and mode, rodata and struct_ops keys against its BTF)"
    )
    if no_sched_ext:
        lines.insert(0, f"NOTE: {NO_SCHED_EXT}")
        lines.append(f"{static}; NOT checked: CO-RE and loading, which need sched_ext")
    elif backend_name is None:
        lines.append(
            f"{static}; NOT checked: CO-RE against the running kernel and loading "
            "(no kernel backend available)"
        )
    else:
        lines.append(f"{static}, then prepared with {backend_name}")
    if vmlinux is not None:
        lines.append(f"kernel BTF: {vmlinux} (given)")
    elif VMLINUX.exists():
        lines.append(f"kernel BTF: {VMLINUX} (the running kernel's)")
    else:
        lines.append(f"kernel BTF: none ({VMLINUX} is absent; --vmlinux gives a kernel's)")
    for result in results:
        verdict = "ok" if result.ok else "FAILED"
        lines.append(f"  {result.name}: {verdict} [{result.depth}] {result.object}")
        lines.extend(f"    problem: {problem}" for problem in result.problems)
        lines.extend(f"    {note}" for note in result.notes)
    if not results:
        lines.append("  (no schedulers configured)")
    warnings = config_warnings(config)
    lines.extend(f"WARNING: {warning}" for warning in warnings)
    failed = [result.name for result in results if not result.ok]
    if failed:
        lines.append(
            f"{config.source}: FAILED: {len(failed)} of {len(results)} schedulers "
            f"have problems ({', '.join(failed)})"
        )
    else:
        more = f" ({len(warnings)} warning{'s' * (len(warnings) > 1)} above)" if warnings else ""
        lines.append(f"{config.source}: ok: all {len(results)} schedulers checked fine{more}")
    return "\n".join(lines)
