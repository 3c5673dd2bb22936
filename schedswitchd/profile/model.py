"""Scheduler profiles: TOML -> a validated :class:`Profile` (pydantic v2), and modes.

A profile describes, as data, what a scheduler's own user space does around loading its
BPF object (the format is documented in ``docs/profiles.md``): global variables before
load, sizes of resizable sections, ``sched_ext_ops`` members and flags, variable writes
and map updates after load, ``SEC("syscall")`` programs to run, the CPU to attach from,
counters to show, and named modes (overlays on the base tables).

Values are TOML literals or ``{ expr = "..." }`` expressions (:mod:`schedswitchd.profile.
expr`), nested in tables (struct members) and arrays (array elements). Every table
forbids unknown keys and every value is checked strictly; a problem becomes one
:class:`~schedswitchd.errors.ProfileError` naming the file and the dotted key, one line
per problem.

Profiles are found by :func:`find_profile`: a path (anything with a ``/`` or ending in
``.toml``), else a name looked up in the installed directory
(``/etc/schedswitchd/profiles/NAME.toml``) and then in the shipped one
(``config/profiles/NAME.toml`` of the source tree).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from schedswitchd.errors import ProfileError, unreadable
from schedswitchd.profile.expr import CompiledExpr, ExprError, compile_expr

__all__ = [
    "FOR_EACH_KINDS",
    "INSTALLED_DIR",
    "SHIPPED_DIR",
    "Expr",
    "MapUpdate",
    "Mode",
    "PerfEvent",
    "Profile",
    "Run",
    "Stat",
    "find_profile",
    "load_profile",
    "parse_profile",
    "profile_search_path",
]

#: Where administrators install profiles of their own.
INSTALLED_DIR = Path("/etc/schedswitchd/profiles")
#: The profiles shipped in the source tree (``config/profiles``).
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "config" / "profiles"

#: What a profile path must hold, said when it cannot be read (docs/profiles.md).
PROFILE_FILE = "a scheduler profile's .toml file"
FOR_EACH_KINDS = ("cpu", "online_cpu", "smt_pair", "core", "llc", "node")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_SECTION = re.compile(r"^\.(data|bss|rodata)\.[A-Za-z0-9_.]{1,120}$")
_FLAG = re.compile(r"^[A-Z][A-Z0-9_]{0,127}$")
_MAX_VALUE_DEPTH = 16


@dataclass(frozen=True, slots=True)
class Expr:
    """A value computed at resolution time: ``{ expr = "..." }`` in the TOML."""

    compiled: CompiledExpr

    @property
    def source(self) -> str:
        """The expression's text."""
        return self.compiled.source

    def __repr__(self) -> str:
        return f"{{expr = {self.source!r}}}"


def _value(v: Any, path: str = "", depth: int = 0) -> Any:
    """A TOML value with every ``{expr = "..."}`` table compiled to an :class:`Expr`."""
    where = f" at {path}" if path else ""
    if depth > _MAX_VALUE_DEPTH:
        raise ValueError(f"value nested too deeply{where}")
    if isinstance(v, Expr):
        return v
    if isinstance(v, dict):
        if "expr" in v:
            if set(v) != {"expr"}:
                extra = ", ".join(sorted(set(v) - {"expr"}))
                raise ValueError(f"an expression table has only 'expr', not {extra}{where}")
            try:
                return Expr(compile_expr(v["expr"]))
            except ExprError as exc:
                raise ValueError(f"{exc}{where}") from None
        return {
            str(k): _value(x, f"{path}.{k}" if path else str(k), depth + 1) for k, x in v.items()
        }
    if isinstance(v, list):
        return [_value(x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v)]
    if isinstance(v, bool | int | float | str):
        return v
    raise ValueError(f"{type(v).__name__} values are not supported{where} (TOML dates?)")


def _expr_only(v: Any) -> Any:
    if isinstance(v, str):  # a bare string where only an expression makes sense
        v = {"expr": v}
    out = _value(v)
    if not isinstance(out, Expr):
        raise ValueError('must be an expression: a string or { expr = "..." }')
    return out


#: A TOML value, with expressions compiled (int, float, bool, str, list, dict or Expr).
Value = Annotated[Any, BeforeValidator(_value)]
#: An expression (a string or ``{ expr = "..." }``).
ExprValue = Annotated[Any, BeforeValidator(_expr_only)]
Ident = Annotated[str, Field(pattern=_IDENT.pattern)]
When = Literal["before_attach", "after_attach"]


def _for_each(v: Any) -> Any:
    if isinstance(v, str):
        if v not in FOR_EACH_KINDS:
            raise ValueError(f"{v!r} is not one of {', '.join(FOR_EACH_KINDS)} (or an expr)")
        return v
    return _expr_only(v)


ForEach = Annotated[Any, BeforeValidator(_for_each)]


def _flag_entry(v: Any) -> Any:
    if isinstance(v, dict):
        return _expr_only(v)
    if not isinstance(v, str) or not _FLAG.match(v):
        raise ValueError(f"{v!r} is not an SCX_OPS_* flag name or {{ expr = ... }}")
    return v


def _flag_list(v: Any) -> Any:
    if not isinstance(v, list):
        raise ValueError('must be a list of flag names or { expr = "..." } entries')
    return [_flag_entry(x) for x in v]


def _flags(v: Any) -> Any:
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    if isinstance(v, dict):
        return _expr_only(v)
    return _flag_list(v)


#: ``flags``: an int, a list of names (entries may be expressions), or an expression.
FlagsValue = Annotated[Any, BeforeValidator(_flags)]
#: ``add_flags``/``remove_flags``: names or ``{ expr = "..." }`` entries giving a name or a
#: list of names.
FlagList = Annotated[list[Any], BeforeValidator(_flag_list)]

#: Names every expression already has (a ``[let]`` name may not hide one).
RESERVED_NAMES = frozenset(
    {"topo", "mode", "i", "cpu", "pair", "core", "llc", "node", "item"}
    | {"kernel_enum", "kernel_has"}
)


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, arbitrary_types_allowed=True
    )


class ProfileInfo(_Model):
    """The ``[profile]`` table: who the profile is for and where its facts come from.

    ``userspace`` is ``"none"`` or a sentence naming periodic user-space work the daemon
    cannot do (then the scheduler is refused with that sentence)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    ops_name: str | None = None
    summary: str = ""
    source: str = ""
    userspace: str = "none"
    min_cpus: int = Field(default=1, ge=1, le=8192)

    @property
    def runnable(self) -> bool:
        """True when the daemon can do everything the scheduler's user space does."""
        return self.userspace.strip().lower() == "none"


class StructOps(_Model):
    """``[struct_ops]``: ``sched_ext_ops`` scalar members by name (in ``members``, given
    as plain keys in the TOML), ``flags`` (replaces the object's flags; ``SCX_OPS_*`` names
    or an int, or an expression giving either), ``add_flags``/``remove_flags`` (edit the
    object's flags instead; an entry may be an expression giving a name or a list of
    names) and ``required_flags`` (refused when the kernel lacks one, where others are
    dropped)."""

    members: dict[str, Value] = Field(default_factory=dict)
    flags: FlagsValue = None
    add_flags: FlagList = Field(default_factory=list)
    remove_flags: FlagList = Field(default_factory=list)
    required_flags: list[Annotated[str, Field(pattern=_FLAG.pattern)]] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "members" in data:
            if isinstance(data, dict) and "members" in data:
                raise ValueError("'members' is not a sched_ext_ops member; write members as keys")
            return data
        special = {"flags", "add_flags", "remove_flags", "required_flags"}
        out: dict[str, Any] = {k: v for k, v in data.items() if k in special}
        members = {k: v for k, v in data.items() if k not in special}
        for k in members:
            if not _IDENT.match(k):
                raise ValueError(f"{k!r} is not a C identifier")
            if k == "name":
                raise ValueError("'name' comes from the object (profile.ops_name checks it)")
        out["members"] = members
        return out

    def merged(self, over: StructOps) -> StructOps:
        """This table with ``over`` (a mode's) on top."""
        return self.model_copy(
            update={
                "members": {**self.members, **over.members},
                "flags": over.flags if over.flags is not None else self.flags,
                "add_flags": [*self.add_flags, *over.add_flags],
                "remove_flags": [*self.remove_flags, *over.remove_flags],
                "required_flags": [*self.required_flags, *over.required_flags],
            }
        )


class MapUpdate(_Model):
    """``[[map_updates]]``: one ``BPF_MAP_UPDATE_ELEM`` (per iteration of ``for_each``),
    key and value laid out from the map's BTF; ``only_if`` skips an iteration when false;
    ``flags`` as ``bpf_map_update_elem``'s (``any``/``noexist``/``exist``)."""

    map: Ident
    key: Value = 0
    value: Value
    for_each: ForEach | None = None
    only_if: ExprValue | None = None
    when: When = "before_attach"
    flags: Literal["any", "noexist", "exist"] = "any"


class Run(_Model):
    """``[[run]]``: a ``SEC("syscall")`` program run with ``BPF_PROG_RUN``; ``args`` by
    member name of its context struct; ``cpu`` runs it on that CPU
    (``BPF_F_TEST_RUN_ON_CPU``); ``expect_retval`` (``None``: any) is checked per
    iteration."""

    program: Ident
    args: dict[str, Value] = Field(default_factory=dict)
    for_each: ForEach | None = None
    only_if: ExprValue | None = None
    when: When = "before_attach"
    cpu: Value | None = None
    expect_retval: int | None = 0
    before_base: bool = False


class PerfEvent(_Model):
    """``[[perf_events]]``: ``perf_event_open(2)`` of one counting event (``type`` and
    ``config`` of ``struct perf_event_attr``, e.g. 0/1 for ``PERF_TYPE_HARDWARE``/
    ``PERF_COUNT_HW_INSTRUCTIONS``) on ``cpu`` for every task (pid -1), per iteration of
    ``for_each``; its fd stored at ``key`` (default: the CPU) of ``map``, a
    ``BPF_MAP_TYPE_PERF_EVENT_ARRAY``, which keeps the event open. ``on_error``: ``"fail"``
    refuses the load when an event cannot be opened, ``"skip"`` notes it and goes on
    (scx_cosmos runs without counters on a machine without the PMU event)."""

    map: Ident
    type: Value
    config: Value
    cpu: Value
    key: Value | None = None
    for_each: ForEach | None = None
    only_if: ExprValue | None = None
    on_error: Literal["fail", "skip"] = "fail"


class Attach(_Model):
    """``[attach]``: ``cpu`` -- the CPU the loader thread is bound to while it creates the
    struct_ops link (scx_central's ``central_cpu``)."""

    cpu: Value | None = None


class Stat(_Model):
    """``[[stats]]``: a counter shown by ``schedswitchctl status``: a global ``variable``,
    or a ``map`` element at ``key`` (its ``field`` member; per-CPU maps are summed)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: str = ""
    variable: Ident | None = None
    map: Ident | None = None
    key: Value = 0
    field: str | None = None

    @model_validator(mode="after")
    def _source(self) -> Stat:
        if (self.variable is None) == (self.map is None):
            raise ValueError("give exactly one of 'variable' and 'map'")
        return self


class _Tables(_Model):
    """The tables a base profile and a mode share."""

    variables: dict[str, Value] = Field(default_factory=dict)
    resize: dict[str, Value] = Field(default_factory=dict)
    struct_ops: StructOps = Field(default_factory=StructOps)
    after_load: dict[str, Value] = Field(default_factory=dict)
    map_updates: list[MapUpdate] = Field(default_factory=list)
    run: list[Run] = Field(default_factory=list)
    perf_events: list[PerfEvent] = Field(default_factory=list)
    attach: Attach = Field(default_factory=Attach)
    let: dict[str, ExprValue] = Field(default_factory=dict)

    @field_validator("variables", "after_load")
    @classmethod
    def _names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not _IDENT.match(key):
                raise ValueError(f"{key!r} is not a C identifier")
        return value

    @field_validator("let")
    @classmethod
    def _let_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        from schedswitchd.profile.expr import FUNCTIONS

        for key in value:
            if not _IDENT.match(key) or key.startswith("_"):
                raise ValueError(f"{key!r} is not a name (letters, digits, _; not leading _)")
            if key in RESERVED_NAMES or key in FUNCTIONS:
                raise ValueError(f"{key!r} would hide a name every expression has")
        return value

    @field_validator("resize")
    @classmethod
    def _sections(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not _SECTION.match(key):
                raise ValueError(f"{key!r} is not a .data.NAME/.bss.NAME/.rodata.NAME section")
        return value


class Mode(_Tables):
    """``[modes.NAME]``: an overlay. ``variables``, ``resize``, ``after_load``, ``let``
    and ``struct_ops`` members replace the base's keys; ``map_updates``,
    ``perf_events`` and ``run`` are appended (a ``run`` with ``before_base = true`` goes
    before the base's runs instead); ``attach.cpu`` replaces the base's when given;
    ``userspace`` (a sentence, or ``"none"``) replaces ``profile.userspace`` for the
    mode."""

    summary: str = ""
    userspace: str | None = None
    #: The scheduler's own command-line flags this mode stands for (its program's argv
    #: after the program name, e.g. ``["-m", "performance", "-w"]``), as its summary
    #: documents them; ``None``: none documented. ``org.scx.Loader``'s ``...WithArgs``
    #: calls are matched against it (``docs/desktop.md``).
    argv: list[Annotated[str, Field(max_length=128)]] | None = Field(default=None, max_length=64)


class Profile(_Tables):
    """A whole profile file. ``path`` is where it was read from (set by the loader)."""

    profile: ProfileInfo
    stats: list[Stat] = Field(default_factory=list)
    modes: dict[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")], Mode] = Field(
        default_factory=dict
    )
    path: str | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _no_path(cls, data: Any) -> Any:
        if isinstance(data, dict) and "path" in data:
            raise ValueError("'path' is not a profile key")
        return data

    @field_validator("run")
    @classmethod
    def _base_runs(cls, value: list[Run]) -> list[Run]:
        for n, r in enumerate(value):
            if r.before_base:
                raise ValueError(f"run[{n}]: before_base is for a mode's runs, not the base's")
        return value

    @property
    def name(self) -> str:
        """``profile.name``."""
        return self.profile.name

    def with_mode(self, mode: str | None) -> Profile:
        """The profile with mode ``mode`` merged in (``None``/``""``: the base). Raises
        :class:`ProfileError` for a mode the profile lacks."""
        if not mode:
            return self
        over = self.modes.get(mode)
        if over is None:
            known = ", ".join(sorted(self.modes)) or "none"
            raise ProfileError(
                f"{self.path or self.name}: profile {self.name!r} has no mode {mode!r} "
                f"(modes: {known})"
            )
        attach = over.attach if over.attach.cpu is not None else self.attach
        info = self.profile
        if over.userspace is not None:
            info = info.model_copy(update={"userspace": over.userspace})
        return self.model_copy(
            update={
                "profile": info,
                "let": {**self.let, **over.let},
                "variables": {**self.variables, **over.variables},
                "resize": {**self.resize, **over.resize},
                "struct_ops": self.struct_ops.merged(over.struct_ops),
                "after_load": {**self.after_load, **over.after_load},
                "map_updates": [*self.map_updates, *over.map_updates],
                "run": [
                    *(r for r in over.run if r.before_base),
                    *self.run,
                    *(r for r in over.run if not r.before_base),
                ],
                "perf_events": [*self.perf_events, *over.perf_events],
                "attach": attach,
            }
        )


def _format_errors(path: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        # pydantic names the validator's branch for union types: drop those parts.
        loc = [
            p
            for p in loc
            if p not in ("int", "str", "float", "bool", "none")
            and not p.startswith(("function-", "list[", "dict[", "constrained-"))
        ]
        key = ".".join(loc)
        reason = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            reason = "unknown key"
        lines.append(f"{path}: {key}: {reason}" if key else f"{path}: {reason}")
    return "\n".join(dict.fromkeys(lines))


def parse_profile(data: bytes | str, path: str = "<profile>") -> Profile:
    """Validate profile TOML. Raises :class:`ProfileError` (``path: dotted.key: reason``
    per line) for TOML syntax errors, unknown keys, bad values and bad expressions."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        raw = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: (syntax): {exc}") from None
    try:
        prof = Profile.model_validate(raw)
    except ValidationError as exc:
        raise ProfileError(_format_errors(path, exc)) from None
    stem = Path(path).name.removesuffix(".toml")
    if path != "<profile>" and stem != prof.profile.name:
        raise ProfileError(f"{path}: profile.name: {prof.profile.name!r} is not the file stem")
    return prof.model_copy(update={"path": path})


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file. Raises :class:`ProfileError` (also for I/O)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {unreadable(exc, PROFILE_FILE)}") from None
    return parse_profile(data, str(path))


def profile_search_path(extra: Iterable[Path] = ()) -> list[Path]:
    """Directories searched for a profile name: ``extra`` first, then
    :data:`INSTALLED_DIR`, then :data:`SHIPPED_DIR`."""
    return [*extra, INSTALLED_DIR, SHIPPED_DIR]


def is_profile_path(ref: str) -> bool:
    """True when ``ref`` is a path rather than a profile name."""
    return "/" in ref or ref.endswith(".toml")


def find_profile(
    ref: str, *, base: Path | None = None, search: Sequence[Path] | None = None
) -> Path:
    """The file of profile ``ref``: a path (relative ones against ``base``), or a name
    looked up in ``search`` (default :func:`profile_search_path`). Raises
    :class:`ProfileError` naming the places looked at."""
    if is_profile_path(ref):
        p = Path(ref)
        if not p.is_absolute() and base is not None:
            p = base / p
        if not p.is_file():
            why = "is not a regular file" if p.exists() else "does not exist"
            raise ProfileError(f"profile file {str(p)!r} {why} (expected {PROFILE_FILE})")
        return p.resolve()
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", ref):
        raise ProfileError(f"{ref!r} is neither a profile name nor a path")
    dirs = list(search) if search is not None else profile_search_path()
    for d in dirs:
        p = d / f"{ref}.toml"
        if p.is_file():
            return p.resolve()
    raise ProfileError(f"no profile named {ref!r} (looked in {', '.join(str(d) for d in dirs)})")


def shipped_profiles(search: Sequence[Path] | None = None) -> dict[str, Path]:
    """Every profile name found in the search path -> its file (earlier dirs win)."""
    out: dict[str, Path] = {}
    for d in search if search is not None else profile_search_path():
        if d.is_dir():
            for p in sorted(d.glob("*.toml")):
                out.setdefault(p.stem, p)
    return out


def expressions(value: Any) -> Iterable[Expr]:
    """Every :class:`Expr` inside a value (for checks)."""
    if isinstance(value, Expr):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from expressions(v)
    elif isinstance(value, list):
        for v in value:
            yield from expressions(v)
