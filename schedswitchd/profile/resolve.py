"""Resolving a profile for one machine: every expression evaluated, every ``for_each``
expanded, into a :class:`ResolvedProfile` of plain values (pure; no kernel).

Names an expression sees: ``topo`` (the :class:`~schedswitchd.profile.topology.Topology`),
``mode`` (the mode's name, ``""`` for the base), the functions of
:data:`schedswitchd.profile.expr.FUNCTIONS`, ``kernel_enum(NAME)`` and
``kernel_has(NAME)`` (an enumerator of the kernel's BTF: its value, or whether it
exists; given by the caller through :class:`KernelFacts`), and inside a ``for_each``:
``i`` (the iteration index) and ``cpu`` (a ``Cpu``; ``cpu``/``online_cpu``), ``pair``
(``SmtPair``; ``smt_pair``), ``core``/``llc``/``node`` (``CpuGroup``) or ``item`` (an
element of an expression's list).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from schedswitchd.errors import ProfileError
from schedswitchd.profile.expr import ExprError, check_plain, evaluate, show
from schedswitchd.profile.model import _FLAG, Expr, Profile, Stat
from schedswitchd.profile.topology import Topology

__all__ = [
    "KernelFacts",
    "ResolvedMapUpdate",
    "ResolvedPerfEvent",
    "ResolvedProfile",
    "ResolvedRun",
    "resolve_profile",
    "resolve_value",
]


@dataclass(frozen=True)
class KernelFacts:
    """What expressions may ask of the kernel: ``enum(name)`` -> the value of an
    enumerator of the kernel's BTF or ``None`` when absent. ``source`` says where the facts
    come from (for messages). ``NO_KERNEL`` answers every question with an error."""

    enum: Callable[[str], int | None]
    source: str = "kernel BTF"

    def kernel_enum(self, name: object) -> int:
        """The value of enumerator ``name``. Raises :class:`ExprError` when absent."""
        if not isinstance(name, str):
            raise ExprError(f"kernel_enum: expected a name, got {name!r}")
        v = self.enum(name)
        if v is None:
            raise ExprError(f"kernel_enum: {self.source} has no enumerator {name!r}")
        return v

    def kernel_has(self, name: object) -> bool:
        """Whether enumerator ``name`` exists."""
        if not isinstance(name, str):
            raise ExprError(f"kernel_has: expected a name, got {name!r}")
        return self.enum(name) is not None


def _no_kernel(name: str) -> int | None:
    raise ExprError(f"{name!r}: no kernel BTF was given to look enumerators up in")


NO_KERNEL = KernelFacts(_no_kernel, "no kernel")


@dataclass(frozen=True, slots=True)
class ResolvedMapUpdate:
    """One map element to write: ``key``/``value`` as Python values for the map's BTF
    types; ``label`` names the step and iteration for messages
    (``map_updates[0] (cpu 3)``)."""

    map: str
    key: Any
    value: Any
    when: str
    flags: str
    label: str


@dataclass(frozen=True, slots=True)
class ResolvedRun:
    """One ``BPF_PROG_RUN`` of ``program`` with ``args`` (context members by name), on
    ``cpu`` when not ``None``; ``expect_retval`` ``None`` accepts any."""

    program: str
    args: dict[str, Any]
    cpu: int | None
    expect_retval: int | None
    when: str
    label: str


@dataclass(frozen=True, slots=True)
class ResolvedPerfEvent:
    """One ``perf_event_open(2)`` of event ``type``/``config`` on ``cpu``, its fd stored
    at ``key`` of ``map``; ``on_error`` ``"skip"`` lets a failed open be noted and
    passed over."""

    map: str
    type: int
    config: int
    cpu: int
    key: Any
    on_error: str
    label: str


@dataclass
class ResolvedProfile:
    """A profile evaluated for one machine and mode (see the module docstring)."""

    name: str
    mode: str
    path: str | None
    ops_name: str | None
    userspace: str
    variables: dict[str, Any] = field(default_factory=dict)
    resize: dict[str, int] = field(default_factory=dict)
    struct_ops: dict[str, Any] = field(default_factory=dict)
    flags: list[str] | int | None = None
    add_flags: list[str] = field(default_factory=list)
    remove_flags: list[str] = field(default_factory=list)
    required_flags: list[str] = field(default_factory=list)
    after_load: dict[str, Any] = field(default_factory=dict)
    map_updates: list[ResolvedMapUpdate] = field(default_factory=list)
    runs: list[ResolvedRun] = field(default_factory=list)
    perf_events: list[ResolvedPerfEvent] = field(default_factory=list)
    let: dict[str, Any] = field(default_factory=dict)
    #: ``map_updates[n] MAP`` / ``run[n] PROGRAM`` / ``perf_events[n] MAP`` -> how many
    #: times the step runs on this machine (0: a step this machine skips entirely).
    iterations: dict[str, int] = field(default_factory=dict)
    attach_cpu: int | None = None
    stats: list[Stat] = field(default_factory=list)
    stat_keys: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view (bytes as lists of ints)."""

        def js(v: Any) -> Any:
            if isinstance(v, bytes):
                return list(v)
            if isinstance(v, dict):
                return {k: js(x) for k, x in v.items()}
            if isinstance(v, list | tuple):
                return [js(x) for x in v]
            return v

        return {
            "name": self.name,
            "mode": self.mode,
            "path": self.path,
            "ops_name": self.ops_name,
            "userspace": self.userspace,
            "variables": js(self.variables),
            "resize": self.resize,
            "struct_ops": js(self.struct_ops),
            "flags": self.flags,
            "add_flags": self.add_flags,
            "remove_flags": self.remove_flags,
            "required_flags": self.required_flags,
            "after_load": js(self.after_load),
            "map_updates": [js(asdict(u)) for u in self.map_updates],
            "run": [js(asdict(r)) for r in self.runs],
            "perf_events": [js(asdict(e)) for e in self.perf_events],
            "let": js(self.let),
            "iterations": self.iterations,
            "attach_cpu": self.attach_cpu,
            "stats": [s.name for s in self.stats],
        }


def resolve_value(
    value: Any, names: Mapping[str, object], where: str, *, plain: bool = True
) -> Any:
    """``value`` with every :class:`Expr` evaluated under ``names``; with ``plain`` each
    result must be plain data (:func:`~schedswitchd.profile.expr.check_plain`; a
    ``for_each`` list may hold topology records). Raises :class:`ProfileError` naming
    ``where`` (the dotted key)."""
    if isinstance(value, Expr):
        try:
            out = evaluate(value.compiled, names)
            if plain:
                check_plain(out)
        except ExprError as exc:
            raise ProfileError(f"{where}: {exc}") from None
        return bytes(out) if isinstance(out, bytearray) else out
    if isinstance(value, dict):
        return {k: resolve_value(v, names, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_value(v, names, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _iterations(
    for_each: Any, topo: Topology, names: Mapping[str, object], where: str
) -> Iterator[tuple[dict[str, object], str]]:
    """(bindings, label) per iteration of a ``for_each``; one empty binding without."""
    if for_each is None:
        yield {}, ""
        return
    if isinstance(for_each, Expr):
        items = resolve_value(for_each, names, f"{where}.for_each", plain=False)
        if not isinstance(items, list):
            raise ProfileError(f"{where}.for_each: expression gave {show(items)}, not a list")
        for i, item in enumerate(items):
            yield {"item": item, "i": i}, f"item {show(item)}"
        return
    if for_each in ("cpu", "online_cpu"):
        cpus = [c for c in topo.cpus if c.online or (for_each == "cpu" and c.possible)]
        for i, c in enumerate(cpus):
            yield {"cpu": c, "i": i}, f"cpu {c.id}"
    elif for_each == "smt_pair":
        for i, p in enumerate(topo.smt_pairs):
            yield {"pair": p, "i": i}, f"pair {p.cpu},{p.sibling}"
    else:
        groups = {"core": topo.cores, "llc": topo.llcs, "node": topo.nodes}[for_each]
        for i, g in enumerate(groups):
            yield {for_each: g, "i": i}, f"{for_each} {g.id}"


def _flag_names(v: Any, where: str, *, allow_int: bool = False) -> list[str] | int:
    """A resolved flag value: a name or a list of names (an int where ``allow_int``).
    Raises :class:`ProfileError` for anything else."""
    if allow_int and isinstance(v, int) and not isinstance(v, bool):
        return v
    items = v if isinstance(v, list) else [v]
    out: list[str] = []
    for x in items:
        if isinstance(x, list):
            inner = _flag_names(x, where)
            assert isinstance(inner, list)  # allow_int is off
            out.extend(inner)
            continue
        if not isinstance(x, str) or not _FLAG.match(x):
            raise ProfileError(f"{where}: {x!r} is not an SCX_OPS_* flag name")
        out.append(x)
    return out


def _cpu_value(v: Any, topo: Topology, where: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ProfileError(f"{where}: a CPU must be an int, got {show(v)}")
    if v not in topo.online_cpus:
        raise ProfileError(f"{where}: CPU {v} is not online on this machine")
    return v


def resolve_profile(
    profile: Profile,
    topo: Topology,
    *,
    mode: str | None = None,
    kernel: KernelFacts = NO_KERNEL,
    problems: list[str] | None = None,
) -> ResolvedProfile:
    """Evaluate ``profile`` (with ``mode`` merged in) for ``topo``. Raises
    :class:`ProfileError` for an unknown mode, too few CPUs (``min_cpus``) or an
    expression that fails, naming the file and dotted key. With ``problems`` (a list) a
    failing entry (a variable, a flag list, a step) is appended there, one line each, and
    left out, and resolution goes on to the next: every failing key is found at once."""
    p = profile.with_mode(mode)
    file = profile.path or profile.name
    if topo.nr_cpus < p.profile.min_cpus:
        raise ProfileError(
            f"{file}: profile {p.name!r} needs at least {p.profile.min_cpus} online CPUs, "
            f"this machine has {topo.nr_cpus}"
        )
    base: dict[str, object] = {
        "topo": topo,
        "mode": mode or "",
        "kernel_enum": kernel.kernel_enum,
        "kernel_has": kernel.kernel_has,
    }

    def val(v: Any, key: str, names: Mapping[str, object] = base) -> Any:
        return resolve_value(v, names, f"{file}: {key}")

    def guarded(fn: Callable[..., None], *args: Any) -> None:
        if problems is None:
            fn(*args)
            return
        try:
            fn(*args)
        except ProfileError as exc:
            problems.extend(str(exc).splitlines())

    lets: dict[str, Any] = {}

    def let(k: str, v: Any) -> None:
        lets[k] = base[k] = val(v, f"let.{k}")

    for k, v in p.let.items():  # in file order: each sees those before it
        guarded(let, k, v)

    out = ResolvedProfile(
        name=p.name,
        mode=mode or "",
        path=profile.path,
        ops_name=p.profile.ops_name,
        userspace=p.profile.userspace,
    )

    def table(into: dict[str, Any], prefix: str, k: str, v: Any) -> None:
        into[k] = val(v, f"{prefix}.{k}")

    for k, v in p.variables.items():
        guarded(table, out.variables, "variables", k, v)

    def resize(sec: str, v: Any) -> None:
        n = val(v, f"resize.{sec!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ProfileError(f"{file}: resize.{sec!r}: {show(n)} is not a positive element count")
        out.resize[sec] = n

    for sec, v in p.resize.items():
        guarded(resize, sec, v)
    for k, v in p.struct_ops.members.items():
        guarded(table, out.struct_ops, "struct_ops", k, v)
    out.let = lets
    so = p.struct_ops

    def flags_value() -> None:
        flags = val(so.flags, "struct_ops.flags") if isinstance(so.flags, Expr) else so.flags
        out.flags = _flag_names(
            [val(f, "struct_ops.flags", base) for f in flags] if isinstance(flags, list) else flags,
            f"{file}: struct_ops.flags",
            allow_int=True,
        )

    def flag_edits(key: str) -> None:
        entries = [val(f, f"struct_ops.{key}") for f in getattr(so, key)]
        setattr(out, key, _flag_names(entries, f"{file}: struct_ops.{key}"))

    if so.flags is not None:
        guarded(flags_value)
    for key in ("add_flags", "remove_flags"):
        guarded(flag_edits, key)
    out.required_flags = list(p.struct_ops.required_flags)
    for k, v in p.after_load.items():
        guarded(table, out.after_load, "after_load", k, v)

    def expand(where: str, step: Any, into: list[Any], make: Callable[..., Any]) -> int:
        """One item per iteration of ``step`` that ``only_if`` keeps, from
        ``make(names, label)``, appended to ``into``; how many."""
        before = len(into)
        for binding, label in _iterations(step.for_each, topo, base, f"{file}: {where}"):
            names = {**base, **binding}
            if step.only_if is not None and not val(step.only_if, f"{where}.only_if", names):
                continue
            into.append(make(names, f" ({label})" if label else ""))
        return len(into) - before

    def map_update(n: int, mu: Any) -> None:
        where = f"map_updates[{n}]"

        def make(names: Mapping[str, object], label: str) -> ResolvedMapUpdate:
            key = val(mu.key, f"{where}.key", names)
            value = val(mu.value, f"{where}.value", names)
            return ResolvedMapUpdate(
                mu.map, key, value, mu.when, mu.flags, f"{where} {mu.map}{label}"
            )

        out.iterations[f"{where} {mu.map}"] = expand(where, mu, out.map_updates, make)

    def run_step(n: int, run: Any) -> None:
        where = f"run[{n}]"

        def make(names: Mapping[str, object], label: str) -> ResolvedRun:
            args = {k: val(v, f"{where}.args.{k}", names) for k, v in run.args.items()}
            cpu = _cpu_value(val(run.cpu, f"{where}.cpu", names), topo, f"{file}: {where}.cpu")
            return ResolvedRun(
                run.program, args, cpu, run.expect_retval, run.when, f"{where} {run.program}{label}"
            )

        out.iterations[f"{where} {run.program}"] = expand(where, run, out.runs, make)

    def perf_event(n: int, pe: Any) -> None:
        where = f"perf_events[{n}]"

        def make(names: Mapping[str, object], label: str) -> ResolvedPerfEvent:
            nums = {
                k: val(getattr(pe, k), f"{where}.{k}", names) for k in ("type", "config", "cpu")
            }
            for k, x in nums.items():
                bits = 32 if k == "type" else 64
                if isinstance(x, bool) or not isinstance(x, int) or x < 0 or x >= 1 << bits:
                    raise ProfileError(f"{file}: {where}.{k}: {x!r} is not a u{bits}")
            cpu = nums["cpu"]
            if not 0 <= cpu < topo.nr_cpu_ids or not topo.cpus[cpu].possible:
                raise ProfileError(f"{file}: {where}.cpu: {cpu} is not a possible CPU")
            key = cpu if pe.key is None else val(pe.key, f"{where}.key", names)
            return ResolvedPerfEvent(
                pe.map, nums["type"], nums["config"], cpu, key, pe.on_error,
                f"{where} {pe.map}{label}",
            )  # fmt: skip

        out.iterations[f"{where} {pe.map}"] = expand(where, pe, out.perf_events, make)

    for n, mu in enumerate(p.map_updates):
        guarded(map_update, n, mu)
    for n, run in enumerate(p.run):
        guarded(run_step, n, run)
    for n, pe in enumerate(p.perf_events):
        guarded(perf_event, n, pe)

    def attach() -> None:
        out.attach_cpu = _cpu_value(val(p.attach.cpu, "attach.cpu"), topo, f"{file}: attach.cpu")

    guarded(attach)

    def stat_key(name: str, key: Any) -> None:
        out.stat_keys[name] = val(key, f"stats.{name}.key")

    out.stats = list(profile.stats)
    for s in profile.stats:
        if s.map is not None:
            guarded(stat_key, s.name, s.key)
    return out
