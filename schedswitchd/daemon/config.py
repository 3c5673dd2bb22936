"""The daemon's configuration: pydantic v2 models for ``schedswitchd.toml``.

Loaded with :mod:`tomllib` (TOML 1.0). Every table forbids unknown keys; every value is
checked strictly (no silent string-to-int coercion), so a typo is an error, not a default.
Any problem becomes one :class:`~schedswitchd.errors.ConfigError` whose message names the
file, the dotted key and the reason, one line per problem.

Names used on the wire (scheduler and workload names) are short lowercase identifiers; the
names ``kernel`` (the kernel's own scheduler) and ``auto`` (back to lease-driven policy) are
reserved. Relative object paths are resolved against the directory holding the file.

:func:`load_config` also merges the drop-ins of ``conf.d/`` beside the file over it
(:mod:`schedswitchd.daemon.config_dropins`: name order, tables key by key, a later value
replaces); a problem names the file that set the key, a relative ``object`` path resolves
against the directory of the file that names it.
"""

from __future__ import annotations

import grp
import re
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from schedswitchd.bpf.ops_flags import OpsFlag
from schedswitchd.daemon.config_dropins import Layers, load_layers, read_toml
from schedswitchd.daemon.launcher_wire import MODE_SEPARATOR, NAME_PATTERN
from schedswitchd.errors import ConfigError

#: The default value for ``default``: no BPF scheduler, the kernel's own (EEVDF).
KERNEL = "kernel"
#: Admin ``switch auto``: drop an admin override and follow the leases again.
AUTO = "auto"
RESERVED_NAMES = frozenset({KERNEL, AUTO})

#: A profile mode's name (``[modes.NAME]`` of a profile; ``mode = "..."`` in this file).
MODE_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
# NAME_PATTERN and MODE_SEPARATOR (a mode variant's ``lavd@gaming``) live in launcher_wire:
# schedswitchctl checks names with them without importing this module.
_NAME_RE = re.compile(NAME_PATTERN)
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

#: ``struct sched_ext_ops`` scalar members a config may set (kernel
#: ``include/linux/sched/ext.h``); ``name`` comes from the object and ``hotplug_seq`` has its
#: own switch because its value is read from ``/sys/kernel/sched_ext/hotplug_seq`` at load.
STRUCT_OPS_FIELDS = frozenset({"flags", "timeout_ms", "exit_dump_len", "dispatch_max_batch"})

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Id = Annotated[int, Field(ge=0, le=0xFFFF_FFFE)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SocketConfig(_Model):
    """Where the daemon listens when it creates its own socket (not socket-activated)."""

    path: str = Field(default="/run/schedswitchd.sock", description="Unix socket path.")
    mode: int = Field(default=0o660, ge=0, le=0o777, description="Permission bits, e.g. 0o660.")
    group: str | Id | None = Field(
        default=None, description="Group owning the socket (name or gid)."
    )

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must be an absolute path")
        if len(value.encode()) > 107:  # sun_path is 108 bytes including the NUL
            raise ValueError("is longer than a Unix socket path may be (107 bytes)")
        return value


class AuthConfig(_Model):
    """Who may do what. Callers are identified by ``SO_PEERCRED``/``SO_PEERGROUPS``.

    Anyone who can connect may read (``status``, ``list``, ``history``). Hints need a uid
    in ``hint_uids`` or a group in ``hint_gids``; admin actions (``switch``, ``stop``,
    ``reload``, hinting another user's pid) need ``admin_uids``/``admin_gids``. Admins may
    also hint. Groups are names or numbers; names are resolved when the file is loaded.
    """

    hint_uids: list[Id] = Field(default_factory=list)
    hint_gids: list[str | Id] = Field(default_factory=list)
    admin_uids: list[Id] = Field(default_factory=lambda: [0])
    admin_gids: list[str | Id] = Field(default_factory=list)

    @field_validator("hint_gids", "admin_gids")
    @classmethod
    def _groups(cls, value: list[str | int]) -> list[str | int]:
        for item in value:
            if isinstance(item, str):
                _resolve_group(item)
        return value

    def hint_gid_set(self) -> frozenset[int]:
        """``hint_gids`` as numbers."""
        return frozenset(_resolve_group(g) for g in self.hint_gids)

    def admin_gid_set(self) -> frozenset[int]:
        """``admin_gids`` as numbers."""
        return frozenset(_resolve_group(g) for g in self.admin_gids)


class LimitsConfig(_Model):
    """Bounds that keep one client from hurting the others."""

    max_message_bytes: int = Field(
        default=4096, ge=256, le=1 << 20, description="Request line cap."
    )
    read_timeout_s: float = Field(
        default=5.0, gt=0, le=300, description="Time allowed to finish a request once begun."
    )
    idle_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=86400,
        description="Idle time before closing a connection with no lease.",
    )
    max_connections: int = Field(default=256, ge=1, le=65536)
    max_connections_per_uid: int = Field(default=32, ge=1, le=65536)
    admin_reserve: int = Field(
        default=4,
        ge=0,
        le=1024,
        description="Connections an admin may open beyond max_connections and "
        "max_connections_per_uid, so that status and stop work under a flood.",
    )
    max_leases_per_uid: int = Field(default=8, ge=1, le=65536)
    max_ttl_s: float = Field(
        default=7 * 86400.0, gt=0, description="Longest TTL a hint may ask for."
    )
    switch_timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="Wait for sched_ext to reach enabled/disabled."
    )


class BackoffConfig(_Model):
    """Exponential hold-back of a scheduler the kernel ejected or that failed to load."""

    base_s: float = Field(default=5.0, gt=0, description="Hold after the first failure.")
    max_s: float = Field(default=600.0, gt=0, description="Cap on the hold.")
    stable_s: float = Field(
        default=300.0,
        gt=0,
        description="A scheduler that ran this long before failing starts over.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> BackoffConfig:
        if self.max_s < self.base_s:
            raise ValueError("max_s must be >= base_s")
        return self


class BtfCacheConfig(_Model):
    """Bounds of the parsed module-BTF LRU cache (vmlinux BTF is kept outside it)."""

    max_entries: int = Field(default=16, ge=0, le=4096)
    max_bytes: int = Field(default=64 << 20, ge=0, le=1 << 34)


class LoggingConfig(_Model):
    """``journal``: ``auto`` uses the journal when started by systemd, else plain stderr."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    journal: Literal["auto", "yes", "no"] = "auto"


class SwitchConfig(_Model):
    """How a switch is made."""

    expedite_rcu: bool = Field(
        default=True,
        description="Expedite RCU grace periods (/sys/kernel/rcu_expedited = 1) during the "
        "detach/attach pair, restored after; left alone if it is already non-zero (an "
        "admin's). Shortens the no-scheduler gap where the file exists and is writable.",
    )
    runtime_dir: str = Field(
        default="/run/schedswitchd",
        description="Directory for state that must survive the daemon but not a reboot "
        "(the marker saying the daemon set rcu_expedited).",
    )


class StandbyConfig(_Model):
    """Prepared standbys: schedulers loaded ahead of need (everything but the link), so a
    switch to one is the kernel's part alone. Held, most wanted first: schedulers a launcher
    announced (``prepare`` requests), the configured ``default``, the most recent hint's."""

    max: int = Field(default=1, ge=0, le=8, description="Standbys held at most (0: none).")
    max_kernel_bytes: int = Field(
        default=64 << 20,
        ge=0,
        description="Kernel memory all standbys may hold together, bytes (maps' and "
        "programs' memlock as the kernel reports it in fdinfo).",
    )
    recent: bool = Field(
        default=True, description="Also hold the scheduler of the most recent hint."
    )


class DaemonConfig(_Model):
    """Behaviour of the daemon itself."""

    adopt_grace_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="After re-adopting a pinned scheduler on start, keep it this long "
        "(seconds, counted from when the socket serves) without leases so that clients "
        "can reconnect and hint again.",
    )
    history_size: int = Field(default=64, ge=1, le=10000)
    pin_dir: str = Field(
        default="/sys/fs/bpf/schedswitchd", description="bpffs directory for pins."
    )


RodataValue = bool | int
#: A ``sched_ext_ops`` flag name, as the kernel's ``enum scx_ops_flags`` spells it.
OpsFlagName = Annotated[str, Field(pattern=r"^SCX_OPS_[A-Z0-9_]{1,120}$")]


class OpsFlagEntry(_Model):
    """A ``sched_ext_ops`` flag by name in ``struct_ops.flags``; ``required``: refuse to load
    on a kernel whose ``enum scx_ops_flags`` lacks it (else it is dropped with a warning)."""

    name: OpsFlagName
    required: bool = False


StructOpsValue = int | list[OpsFlagName | OpsFlagEntry]


#: An argv element passed to a scheduler's executable (no NUL: ``execve(2)`` cannot pass one).
ArgvItem = Annotated[str, Field(max_length=4096, pattern=r"^[^\x00]*$")]


class ExecModeConfig(_Model):
    """``[schedulers.NAME.modes.MODE]``: the argv a scheduler run as its own executable gets
    in mode ``MODE`` (after the program's name; replaces the scheduler's ``args``), as
    scx_loader's ``MODE_mode`` lists of a scheduler do."""

    args: list[ArgvItem] = Field(default_factory=list, max_length=256)


class SchedulerConfig(_Model):
    """One scheduler: a sched_ext BPF object and its load-time customisation, or a
    scheduler's own executable that the daemon runs as a supervised child.

    ``object``: path of the ELF BPF object (absolute after loading). ``kmods``: extra module
    names whose BTF to consult, for objects without a ``.kmod_btfs`` section. ``rodata``:
    ``.rodata`` variable name -> value (ints and bools). ``struct_ops``: scalar
    ``sched_ext_ops`` members to set (``flags``, ``timeout_ms``, ``exit_dump_len``,
    ``dispatch_max_batch``); ``flags`` may instead list flag names (``"SCX_OPS_ENQ_LAST"``
    or ``{ name = "SCX_OPS_...", required = true }``), resolved from the kernel's BTF at
    load (:mod:`schedswitchd.bpf.ops_flags`) and replacing the object's value: a name the
    kernel lacks is dropped with a warning, or refused when required. ``hotplug_seq``: set
    ``ops.hotplug_seq`` from ``/sys/kernel/sched_ext/hotplug_seq`` at load, so a CPU
    hotplug during the load makes the kernel refuse the attach instead of running with a
    stale CPU view. ``fill_enums``:
    set the object's ``__SCX_*`` enum variables from the kernel's BTF at load, as the
    scheduler's own user space would (``rodata`` values win). ``profile``: a scheduler
    profile (``docs/profiles.md``) applied before the keys above, which win over it;
    ``mode``: the profile's mode used unless a hint picks another. ``profile_path`` and
    ``profile_name`` are not keys: :func:`parse_config` sets them to the profile file it
    found and that file's ``[profile] name``.

    ``executable``: the scheduler's own program (absolute after loading; relative: to this
    file), run as a child of the daemon (``docs/executables.md``) when the scheduler has no
    ``object``, or when its profile (in the mode asked for) says its user space does work
    the daemon cannot do (``userspace`` not ``"none"``). ``args``: its argv after the
    program's name; ``modes``: a mode's own ``args``; ``stop_timeout_s``: how long a child
    has after ``SIGINT`` before ``SIGKILL``. ``runs_executable`` is not a key:
    :func:`parse_config` sets it for every entry (mode variants included) that runs as
    the executable.
    """

    # "" (the default, never a value a file may give): none, the scheduler runs as its
    # executable; kept a str so that every loader of objects reads it as before.
    object: Annotated[str, Field(min_length=1)] = Field(
        default="", description="The BPF ELF object; omitted: the executable alone."
    )
    executable: str | None = Field(
        default=None,
        description="The scheduler's own program, run as a supervised child (docs/executables.md).",
    )
    args: list[ArgvItem] = Field(
        default_factory=list,
        max_length=256,
        description="The executable's argv after the program's name.",
    )
    modes: dict[Annotated[str, Field(pattern=MODE_PATTERN)], ExecModeConfig] = Field(
        default_factory=dict, description="A mode's own args for the executable."
    )
    stop_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="Time a child scheduler has to exit after SIGINT before SIGKILL.",
    )
    #: Whether this entry runs as its executable (set by :func:`parse_config`, not a key).
    runs_executable: bool = Field(default=False, exclude=True)
    description: str = ""
    profile: str | None = Field(
        default=None,
        description="A scheduler profile: a shipped or installed name, or a .toml path "
        "(relative: to this file). See docs/profiles.md.",
    )
    mode: Annotated[str, Field(pattern=MODE_PATTERN)] | None = Field(
        default=None, description="The profile's mode used unless a hint picks another."
    )
    #: The profile file found for ``profile`` (set by :func:`parse_config`, not a key).
    profile_path: str | None = Field(default=None, exclude=True)
    #: That file's ``[profile] name`` (set with ``profile_path``, not a key).
    profile_name: str | None = Field(default=None, exclude=True)
    kmods: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,55}$")]] = Field(
        default_factory=list
    )
    rodata: dict[str, RodataValue] = Field(default_factory=dict)
    struct_ops: dict[str, StructOpsValue] = Field(default_factory=dict)
    hotplug_seq: bool = True
    fill_enums: bool = True

    @model_validator(mode="before")
    @classmethod
    def _no_profile_path(cls, data: Any) -> Any:
        for key in ("profile_path", "profile_name", "runs_executable"):
            if isinstance(data, dict) and key in data:
                raise ValueError(f"{key!r} is not a configuration key")
        return data

    @model_validator(mode="after")
    def _object_or_executable(self) -> SchedulerConfig:
        if not self.object and self.executable is None:
            raise ValueError("needs an 'object' (a BPF object) or an 'executable' (its program)")
        if self.executable is None:
            for key in ("args", "modes"):
                if getattr(self, key):
                    raise ValueError(f"{key!r} is for an 'executable', and none is given")
        elif self.object and self.profile is None:
            # Without a profile nothing says the object's user space does work after attach,
            # so the object always runs natively and the executable would never start.
            raise ValueError(
                "both 'object' and 'executable' without a 'profile': the object always runs "
                "natively; give one of them (or a profile whose userspace needs the program)"
            )
        elif not self.object:
            for key in ("profile", "kmods", "rodata", "struct_ops"):
                if getattr(self, key):
                    raise ValueError(
                        f"{key!r} customises a BPF object, and this scheduler runs as its "
                        "executable only (no 'object')"
                    )
        return self

    @field_validator("rodata")
    @classmethod
    def _rodata_names(cls, value: dict[str, RodataValue]) -> dict[str, RodataValue]:
        for key in value:
            if not _IDENT_RE.match(key):
                raise ValueError(f"{key!r} is not a C identifier")
        return value

    @field_validator("struct_ops")
    @classmethod
    def _ops_names(cls, value: dict[str, StructOpsValue]) -> dict[str, StructOpsValue]:
        for key, number in value.items():
            if key not in STRUCT_OPS_FIELDS:
                raise ValueError(
                    f"{key!r} is not a settable sched_ext_ops field "
                    f"(one of {', '.join(sorted(STRUCT_OPS_FIELDS))})"
                )
            if isinstance(number, list):
                if key != "flags":
                    raise ValueError(f"{key}: only 'flags' takes a list (of SCX_OPS_* names)")
                continue
            if not 0 <= number < 1 << 64:
                raise ValueError(f"{key} = {number} does not fit an unsigned 64-bit field")
        return value


def struct_ops_request(cfg: SchedulerConfig) -> dict[str, int | list[OpsFlag]]:
    """``cfg.struct_ops`` as :func:`schedswitchd.bpf.scheduler.apply_tunables` takes it
    (flag names as :class:`~schedswitchd.bpf.ops_flags.OpsFlag`)."""
    out: dict[str, int | list[OpsFlag]] = {}
    for key, value in cfg.struct_ops.items():
        if isinstance(value, int):
            out[key] = value
        else:
            out[key] = [
                OpsFlag(f) if isinstance(f, str) else OpsFlag(f.name, f.required) for f in value
            ]
    return out


class HintRule(_Model):
    """What a workload hint asks for: a configured scheduler (or ``kernel``) and a priority.

    Higher ``priority`` wins; among equal priorities the newest lease wins. ``mode``
    picks a mode of the scheduler's profile: the hint then runs the variant
    ``SCHEDULER@MODE`` (:data:`MODE_SEPARATOR`), which :func:`parse_config` adds to the
    schedulers (the scheduler's entry with that mode).
    """

    scheduler: str
    priority: int = Field(default=0, ge=-1000, le=1000)
    mode: Annotated[str, Field(pattern=MODE_PATTERN)] | None = Field(
        default=None,
        description="Run the scheduler in this mode of its profile (the variant SCHEDULER@MODE).",
    )


#: scx_loader's ``SchedulerMode`` values (``org.scx.Loader.xml``: 0 Auto, 1 Gaming,
#: 2 PowerSave, 3 LowLatency, 4 Server) -> the profile mode of that name (``None``: the
#: scheduler as configured, its own ``mode`` if any).
SCX_MODES: dict[int, str | None] = {
    0: None,
    1: "gaming",
    2: "powersave",
    3: "lowlatency",
    4: "server",
}
#: What an scx scheduler's name looks like (``scx_bpfland``): scx_loader's names.
SCX_NAME_PATTERN = r"^scx_[a-z0-9_]{1,40}$"
ScxName = Annotated[str, Field(pattern=SCX_NAME_PATTERN)]
#: The profiles power-profiles-daemon offers (its ``Profiles`` property's ``Profile``
#: values): the only keys ``[dbus.power_profiles]`` may have.
POWER_PROFILES = ("power-saver", "balanced", "performance")


class DbusConfig(_Model):
    """The D-Bus faces (``[dbus]``; the whole table absent: none, and no D-Bus library is
    imported). ``scx_loader``: own ``org.scx.Loader`` on the system bus, as scx_loader
    does (``docs/desktop.md``). ``scx_names``: scx name (``scx_bpfland``) -> configured
    scheduler; without it, each scheduler with a profile is offered under ``scx_`` + its
    profile's name (a profile named ``scx_...`` as it is), and one run as its executable
    under its program's file name when that is an scx name (``scx_rusty``).
    ``power_profiles``: a power profile (``power-saver``, ``balanced``, ``performance``) ->
    the workload hint held while it is active.
    """

    scx_loader: bool = Field(default=True, description="Serve org.scx.Loader on the system bus.")
    scx_names: dict[ScxName, Name] = Field(
        default_factory=dict, description="scx scheduler name -> configured scheduler."
    )
    power_profiles: dict[Annotated[str, Field(pattern=r"^[a-z][a-z-]{0,31}$")], Name] = Field(
        default_factory=dict, description="Power profile -> workload hint held while active."
    )

    @field_validator("power_profiles")
    @classmethod
    def _known_profiles(cls, value: dict[str, str]) -> dict[str, str]:
        # A mistyped profile (powersaver) would never become active: refused, not ignored.
        for key in value:
            if key not in POWER_PROFILES:
                raise ValueError(
                    f"{key!r} is not a power profile (power-profiles-daemon has "
                    f"{', '.join(POWER_PROFILES)})"
                )
        return value


class Config(_Model):
    """The whole file. ``source`` is the path it was read from (set by :func:`load_config`)."""

    default: str = Field(
        default=KERNEL, description="Scheduler to run with no live lease, or 'kernel'."
    )
    socket: SocketConfig = Field(default_factory=SocketConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    backoff: BackoffConfig = Field(default_factory=BackoffConfig)
    btf_cache: BtfCacheConfig = Field(default_factory=BtfCacheConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    daemon: DaemonConfig = Field(default_factory=DaemonConfig)
    switch: SwitchConfig = Field(default_factory=SwitchConfig)
    standby: StandbyConfig = Field(default_factory=StandbyConfig)
    schedulers: dict[str, SchedulerConfig] = Field(default_factory=dict)
    hints: dict[str, HintRule] = Field(default_factory=dict)
    dbus: DbusConfig | None = Field(
        default=None, description="The D-Bus faces; absent: none (docs/desktop.md)."
    )
    source: str | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _no_source(cls, data: Any) -> Any:
        if isinstance(data, dict) and "source" in data:
            raise ValueError("'source' is not a configuration key")
        return data

    @field_validator("schedulers", "hints")
    @classmethod
    def _names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not _NAME_RE.match(key):
                raise ValueError(f"{key!r} is not a valid name ({NAME_PATTERN})")
            if key in RESERVED_NAMES:
                raise ValueError(f"{key!r} is reserved")
        return value

    @model_validator(mode="after")
    def _references(self) -> Config:
        if self.default != KERNEL and self.default not in self.schedulers:
            raise ValueError(f"default {self.default!r} is neither 'kernel' nor a scheduler")
        for workload, rule in self.hints.items():
            if rule.scheduler != KERNEL and rule.scheduler not in self.schedulers:
                raise ValueError(
                    f"hints.{workload}.scheduler {rule.scheduler!r} is not a configured scheduler"
                )
        if self.dbus is not None:
            for scx, name in self.dbus.scx_names.items():
                if name not in self.schedulers:
                    raise ValueError(
                        f"dbus.scx_names.{scx}: {name!r} is not a configured scheduler"
                    )
            for profile, workload in self.dbus.power_profiles.items():
                if workload not in self.hints:
                    raise ValueError(f"dbus.power_profiles.{profile}: no hint rule {workload!r}")
        return self


def _resolve_group(group: str | int) -> int:
    if isinstance(group, int):
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"unknown group {group!r}") from None


#: Which file set a key (a pydantic error location): the main file or a drop-in.
Origin = Callable[[Sequence[str | int]], str]


def _format_errors(origin: Origin, whole: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        reason = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            reason = "unknown key"
        # A whole-file check (e.g. a hint naming an unknown scheduler) names its keys itself.
        lines.append(f"{origin(err['loc'])}: {key}: {reason}" if key else f"{whole}: {reason}")
    return "\n".join(lines)


def parse_config(data: bytes | str, path: str = "<config>") -> Config:
    """Validate TOML text; relative object paths resolve against ``path``'s directory.
    Each ``profile`` is found (:func:`profile_search`) and validated, with its ``mode``;
    each hint's ``mode`` becomes a variant scheduler ``SCHEDULER@MODE``.

    Raises :class:`ConfigError` (file, key, reason per line) for TOML syntax errors, unknown
    keys and bad values, a profile that is missing or invalid, a mode it does not have.
    """
    layers = Layers(path)
    layers.merge(read_toml(data, path), path)
    return _validate(layers)


def _validate(layers: Layers) -> Config:
    """The :class:`Config` of ``layers`` (a file and its drop-ins merged), each problem
    naming the file that set its key; :func:`parse_config` for the rest."""
    path, origin = layers.main, layers.origin
    try:
        config = Config.model_validate(layers.raw)
    except ValidationError as exc:
        raise ConfigError(_format_errors(origin, layers.whole(), exc)) from None
    problems: list[str] = []
    schedulers = {}
    for name, sched in config.schedulers.items():
        update_paths: dict[str, str] = {}
        for key in ("object", "executable"):
            value = getattr(sched, key)
            if not value:
                continue
            # beside the file that names it (the main file or a drop-in)
            where = origin(("schedulers", name, key))
            try:
                update_paths[key] = _object_path(_dir_of(where), value)
                if key == "executable":
                    _check_executable(update_paths[key])
            except ValueError as exc:
                problems.append(f"{where}: schedulers.{name}.{key}: {exc}")
        schedulers[name] = sched.model_copy(update=update_paths)
    if problems:
        raise ConfigError("\n".join(problems))
    schedulers, hints = _profiles_and_modes(origin, schedulers, dict(config.hints))
    update: dict[str, Any] = {"hints": hints, "source": path}
    if config.dbus is not None and config.dbus.scx_loader:
        update["dbus"], schedulers = _scx_names_and_modes(config.dbus, schedulers)
    update["schedulers"] = _ways_to_run(origin, schedulers)
    return config.model_copy(update=update)


def _check_executable(path: str) -> None:
    """Refuse (:class:`ValueError` saying why) a scheduler ``executable`` that is not a
    regular file this process may execute."""
    import os
    import stat

    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or type(exc).__name__}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: not a regular file")
    if not os.access(path, os.X_OK):
        raise ValueError(f"{path}: not executable (no execute permission)")


def _ways_to_run(
    origin: Origin, schedulers: dict[str, SchedulerConfig]
) -> dict[str, SchedulerConfig]:
    """Each entry with ``runs_executable`` set: an entry without an object runs as its
    executable; one with an object and an executable runs as the executable exactly when
    its profile in its mode says its user space does work the daemon cannot do. An
    executable that no mode of the profile would ever run is refused (:class:`ConfigError`),
    as is a mode's ``args`` for a mode the profile does not have."""
    from schedswitchd.profile.model import load_profile

    problems: list[str] = []
    out: dict[str, SchedulerConfig] = {}
    for name, sched in schedulers.items():
        runs = sched.executable is not None
        if runs and sched.object and sched.profile_path is not None:
            prof = load_profile(Path(sched.profile_path))
            runs = not prof.with_mode(sched.mode).profile.runnable
            if MODE_SEPARATOR not in name:
                where = f"{origin(('schedulers', name, 'executable'))}: schedulers.{name}"
                natively = [m for m in [None, *prof.modes] if prof.with_mode(m).profile.runnable]
                if len(natively) == len(prof.modes) + 1:
                    problems.append(
                        f"{where}.executable: never run: profile {prof.name!r} runs natively "
                        'in every mode (its userspace is "none")'
                    )
                for mode in sched.modes:
                    if mode not in prof.modes:
                        known = ", ".join(prof.modes) or "none"
                        problems.append(
                            f"{where}.modes.{mode}: profile {prof.name!r} has no mode "
                            f"{mode!r} (modes: {known})"
                        )
        out[name] = sched.model_copy(update={"runs_executable": runs}) if runs else sched
    if problems:
        raise ConfigError("\n".join(problems))
    return out


def exec_argv(spec: SchedulerConfig) -> list[str]:
    """The argv a scheduler run as its executable gets: the program, then its mode's
    ``args`` when ``modes`` has the entry's mode, else ``args``."""
    if spec.executable is None:
        raise ValueError("the scheduler has no executable")
    mode = spec.modes.get(spec.mode) if spec.mode is not None else None
    return [spec.executable, *(mode.args if mode is not None else spec.args)]


def _dir_of(path: str) -> Path:
    """The directory of configuration file ``path``, symlinks resolved where they can be."""
    try:
        return Path(path).resolve().parent
    except (RuntimeError, OSError, ValueError):  # not a file's path (a loop, a NUL byte)
        return Path(path).absolute().parent


def _object_path(base: Path, value: str) -> str:
    """``value`` (a scheduler's ``object``) made absolute against ``base``, symlinks
    resolved as far as they lead (a missing file is the switch's to report). Raises
    :class:`ValueError` saying why for a path no file can have: a NUL byte, a symlink
    loop, one the system refuses to resolve (``ENAMETOOLONG``, ...)."""
    if "\0" in value:
        raise ValueError("the path has a NUL byte")
    try:
        return str((base / value).resolve())
    except RuntimeError:  # pathlib's symlink loop before Python 3.13 (OSError ELOOP after)
        raise ValueError(f"{value!r}: a symlink loop") from None
    except OSError as exc:
        raise ValueError(f"{value!r}: {exc.strerror or type(exc).__name__}") from None


def profile_search(base: Path) -> list[Path]:
    """Where a profile name is looked up for a config file in directory ``base``: its
    ``profiles/`` directory, then the installed (``/etc/schedswitchd/profiles``) and the
    shipped (``config/profiles``) profile directories."""
    from schedswitchd.profile.model import profile_search_path

    out: list[Path] = []
    for d in profile_search_path([base / "profiles"]):
        if d not in out:
            out.append(d)
    return out


def _profiles_and_modes(
    origin: Origin,
    schedulers: dict[str, SchedulerConfig],
    hints: dict[str, HintRule],
) -> tuple[dict[str, SchedulerConfig], dict[str, HintRule]]:
    """Find and validate each scheduler's profile (and mode), and turn each hint's
    ``mode`` into a mode variant ``SCHEDULER@MODE`` of that scheduler (the hint then names
    the variant). Profile names are looked up beside the main file (``origin(())``), paths
    against the directory of the file naming them. Raises :class:`ConfigError` naming the
    file and key, one line per problem."""
    # Imported here: the profile package pulls in the BTF reader, which a client of the
    # config alone (schedswitchctl) does not need.
    from schedswitchd.errors import ProfileError
    from schedswitchd.profile.model import Profile, find_profile, load_profile

    problems: list[str] = []
    profiles: dict[str, Profile] = {}
    out = dict(schedulers)
    search = profile_search(_dir_of(origin(())))
    for name, sched in schedulers.items():
        mode_at = f"{origin(('schedulers', name, 'mode'))}: schedulers.{name}.mode"
        if sched.profile is None:
            if sched.mode is not None and sched.mode not in sched.modes:
                problems.append(
                    f"{mode_at}: needs a profile"
                    if sched.executable is None
                    else f"{mode_at}: {sched.mode!r} is not one of its modes "
                    f"(modes: {', '.join(sched.modes) or 'none'})"
                )
            continue
        profile_from = origin(("schedulers", name, "profile"))
        try:
            found = find_profile(sched.profile, base=_dir_of(profile_from), search=search)
            prof = load_profile(found)
        except ProfileError as exc:
            problems.append(f"{profile_from}: schedulers.{name}.profile: {exc}")
            continue
        profiles[name] = prof
        if sched.mode is not None and sched.mode not in prof.modes:
            known = ", ".join(prof.modes) or "none"
            problems.append(
                f"{mode_at}: profile {prof.name!r} has no mode {sched.mode!r} (modes: {known})"
            )
        out[name] = sched.model_copy(update={"profile_path": str(found), "profile_name": prof.name})
    new_hints = dict(hints)
    for workload, rule in hints.items():
        if rule.mode is None:
            continue
        where = f"{origin(('hints', workload, 'mode'))}: hints.{workload}.mode"
        if rule.scheduler == KERNEL or rule.scheduler not in schedulers:
            problems.append(f"{where}: the kernel's scheduler has no modes")
            continue
        rule_prof = profiles.get(rule.scheduler)
        target = schedulers[rule.scheduler]
        if rule_prof is None and target.profile is None and target.executable is not None:
            if rule.mode not in target.modes:
                known = ", ".join(target.modes) or "none"
                problems.append(
                    f"{where}: scheduler {rule.scheduler!r} has no mode {rule.mode!r} "
                    f"(modes: {known})"
                )
                continue
        elif rule_prof is None:
            if target.profile is None:
                problems.append(f"{where}: scheduler {rule.scheduler!r} has no profile")
            continue  # else its profile's own problem is reported above
        elif rule.mode not in rule_prof.modes:
            known = ", ".join(rule_prof.modes) or "none"
            problems.append(
                f"{where}: profile {rule_prof.name!r} has no mode {rule.mode!r} (modes: {known})"
            )
            continue
        if rule.mode == schedulers[rule.scheduler].mode:
            continue  # the scheduler's own mode: no variant needed
        variant = f"{rule.scheduler}{MODE_SEPARATOR}{rule.mode}"
        out.setdefault(variant, out[rule.scheduler].model_copy(update={"mode": rule.mode}))
        new_hints[workload] = rule.model_copy(update={"scheduler": variant})
    if problems:
        raise ConfigError("\n".join(problems))
    return out, new_hints


def _scx_names_and_modes(
    dbus: DbusConfig, schedulers: dict[str, SchedulerConfig]
) -> tuple[DbusConfig, dict[str, SchedulerConfig]]:
    """``dbus`` with ``scx_names`` filled in when the file gave none (each scheduler with a
    profile under ``scx_`` + the profile file's name, the first of a profile winning), and
    ``schedulers`` with a mode variant ``SCHEDULER@MODE`` for every scx mode
    (:data:`SCX_MODES`) the profile of an offered scheduler has, so that an
    ``org.scx.Loader`` call can name any of them."""
    from schedswitchd.profile.model import load_profile

    names = dict(dbus.scx_names)
    if not names:
        for name, sched in schedulers.items():
            if MODE_SEPARATOR in name:
                continue
            if sched.profile_path is not None:
                stem = Path(sched.profile_path).stem
            elif sched.executable is not None and re.match(
                SCX_NAME_PATTERN, Path(sched.executable).name
            ):
                stem = Path(sched.executable).name  # scx_rusty, as scx_loader calls it
            else:
                continue
            names.setdefault(stem if stem.startswith("scx_") else f"scx_{stem}", name)
    out = dict(schedulers)
    for name in names.values():
        sched = schedulers[name]
        if sched.profile_path is not None:
            modes: Collection[str] = load_profile(Path(sched.profile_path)).modes
        elif sched.executable is not None:
            modes = sched.modes
        else:
            continue
        for mode in SCX_MODES.values():
            if mode is not None and mode in modes and mode != sched.mode:
                out.setdefault(
                    f"{name}{MODE_SEPARATOR}{mode}", sched.model_copy(update={"mode": mode})
                )
    return dbus.model_copy(update={"scx_names": names}), out


def load_config(path: str | Path) -> Config:
    """Read and validate a config file with its drop-ins (``conf.d/*.toml`` beside it,
    :mod:`schedswitchd.daemon.config_dropins`). Raises :class:`ConfigError` (also for I/O
    errors), each problem naming the file that set the key."""
    return _validate(load_layers(path))


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12, as pydantic emits it) of the config file."""
    schema = Config.model_json_schema()
    schema["properties"].pop("source", None)
    return schema
