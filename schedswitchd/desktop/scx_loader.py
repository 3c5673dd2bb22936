"""``org.scx.Loader`` on the system bus: scx_loader's D-Bus API, served by the daemon.

The interface is scx_loader's (sched-ext/scx-loader, ``configs/org.scx.Loader.xml``):
bus name and interface ``org.scx.Loader``, object ``/org/scx/Loader``; methods
``StartScheduler(su)``, ``SwitchScheduler(su)``, ``StartSchedulerWithArgs(sas)``,
``SwitchSchedulerWithArgs(sas)``, ``StopScheduler()``, ``RestartScheduler()``,
``RestoreDefault()``; read-only properties ``CurrentScheduler s``, ``SchedulerMode u``,
``CurrentSchedulerArgs as``, ``SupportedSchedulers as``, ``DefaultScheduler s``,
``DefaultMode u``. Modes: 0 auto, 1 gaming, 2 powersave, 3 lowlatency, 4 server
(:data:`~schedswitchd.daemon.config.SCX_MODES`).

What a call means here:

- ``Start``/``SwitchScheduler(name, mode)``: an admin override (as ``schedswitchctl switch
  NAME@MODE``) to the configured scheduler ``[dbus.scx_names]`` maps ``name`` to, in that
  profile mode (0: as configured). It returns once the kernel runs it; a failure is
  ``org.freedesktop.DBus.Error.Failed`` with the reason (the verifier's, the kernel's), and
  what ran before runs on.
- ``...WithArgs(name, argv)``: a scheduler run as its own executable
  (``docs/executables.md``) runs its program with ``argv`` after it instead of its
  configured ``args`` (:meth:`~schedswitchd.daemon.control.DaemonControl.switch_args`); for
  one the daemon loads, accepted only when ``argv`` is exactly the flags a mode of the
  scheduler's profile documents (``argv`` of ``[modes.X]``), refused otherwise, never
  ignored. Empty: as configured.
- ``StopScheduler``: the kernel's own scheduler (an override). ``RestoreDefault``: the
  override ends, and hints and the default rule again. ``RestartScheduler``: the running
  scheduler loaded again.

Properties are read from the kernel when asked (``/sys/kernel/sched_ext``: nothing
enabled reads ``unknown``, whatever the last call said), and ``PropertiesChanged`` is sent
whenever one of them changes with a change of the daemon's (:mod:`schedswitchd.daemon.feed`),
the kernel's ejections included.

Authorisation: the polkit action ``org.scx.loader.manage-schedulers`` (scx_loader's id, so
existing polkit rules apply), checked with ``CheckAuthorization`` for the caller's unique bus
name (``system-bus-name`` subject, interaction allowed: an agent may ask for a password);
root and ``[auth]``'s admins pass without polkit. Reading properties needs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, NamedTuple

import sdbus
from sdbus import (
    DbusFailedError,
    DbusInterfaceCommonAsync,
    DbusPropertyEmitsChangeFlag,
    DbusUnprivilegedFlag,
    dbus_method_async,
    dbus_property_async,
    get_current_message,
)

from schedswitchd.daemon.config import KERNEL, SCX_MODES, Config
from schedswitchd.daemon.control import ARGS_MODE, DaemonControl
from schedswitchd.daemon.launcher_wire import MODE_SEPARATOR
from schedswitchd.desktop.bus import Buses, caller_of, request_name
from schedswitchd.errors import SchedSwitchError

log = logging.getLogger("schedswitchd")

NAME = "org.scx.Loader"
PATH = "/org/scx/Loader"
INTERFACE = "org.scx.Loader"
#: scx_loader's polkit action.
ACTION = "org.scx.loader.manage-schedulers"
#: ``CurrentScheduler`` and ``DefaultScheduler`` when there is none (scx_loader's word).
UNKNOWN = "unknown"

POLKIT_NAME = "org.freedesktop.PolicyKit1"
POLKIT_PATH = "/org/freedesktop/PolicyKit1/Authority"
POLKIT_INTERFACE = "org.freedesktop.PolicyKit1.Authority"
#: ``CheckAuthorizationFlags``: AllowUserInteraction (an agent may authenticate the user).
POLKIT_ALLOW_INTERACTION = 1

_MODE_NUMBERS = {mode: number for number, mode in SCX_MODES.items() if mode is not None}


class Refused(Exception):
    """A call this face refuses before driving the daemon: the D-Bus error's message."""


def resolve(config: Config, scx_name: str, mode: int) -> str:
    """The configured scheduler (or its mode variant ``NAME@MODE``) an ``org.scx.Loader``
    call names. Raises :class:`Refused` for a name not offered, a mode number scx_loader
    does not have, or a mode the scheduler's profile lacks."""
    names = config.dbus.scx_names if config.dbus is not None else {}
    base = names.get(scx_name)
    if base is None:
        offered = ", ".join(sorted(names)) or "none"
        raise Refused(f"{scx_name} is not offered here (supported: {offered})")
    if mode not in SCX_MODES:
        raise Refused(f"mode {mode} is not one of scx_loader's (0-{max(SCX_MODES)})")
    name = SCX_MODES[mode]
    if name is None or name == config.schedulers[base].mode:
        return base
    variant = f"{base}{MODE_SEPARATOR}{name}"
    if variant not in config.schedulers:
        raise Refused(
            f"{scx_name} has no {name} mode (its profile's modes: {_modes(config, base)})"
        )
    return variant


class WithArgs(NamedTuple):
    """A scheduler run as its own executable, to run with ``argv`` after its program."""

    scheduler: str
    argv: list[str]


def resolve_args(config: Config, scx_name: str, argv: list[str]) -> str | WithArgs:
    """What a ``...WithArgs`` call runs: for a scheduler run as its own executable, that
    program with ``argv`` (:class:`WithArgs`); for one the daemon loads, the configured
    scheduler or mode variant whose documented flags are exactly ``argv`` (the profile's
    ``[modes.X] argv``). An empty ``argv``: the scheduler as configured. Raises
    :class:`Refused` for other flags of a scheduler the daemon loads."""
    base = resolve(config, scx_name, 0)
    if not argv:
        return base
    if config.schedulers[base].runs_executable:
        return WithArgs(base, list(argv))
    from pathlib import Path

    from schedswitchd.profile.model import load_profile

    path = config.schedulers[base].profile_path
    modes = load_profile(Path(path)).modes if path is not None else {}
    documented = {m: mode.argv for m, mode in modes.items() if mode.argv is not None}
    for mode_name in (m for m in SCX_MODES.values() if m is not None):
        if documented.get(mode_name) == argv:
            return resolve(config, scx_name, _MODE_NUMBERS[mode_name])
    known = "; ".join(f"{m}: {' '.join(a) or '(none)'}" for m, a in documented.items()) or "none"
    raise Refused(
        f"{scx_name} with {' '.join(argv)!r}: not the flags of any of its modes ({known}); "
        "the daemon loads it itself, so only those flags mean something; any flags are "
        "passed to a scheduler run as its own executable (docs/executables.md)"
    )


def _modes(config: Config, base: str) -> str:
    prefix = f"{base}{MODE_SEPARATOR}"
    own = config.schedulers[base].mode
    modes = [n.removeprefix(prefix) for n in config.schedulers if n.startswith(prefix)]
    return ", ".join([*([own] if own else []), *modes]) or "none"


class LoaderState:
    """What the properties say, from the kernel's state and the daemon's configuration."""

    def __init__(self, control: DaemonControl) -> None:
        self.control = control
        #: (target, argv) of the last ``...WithArgs`` call that switched.
        self.args: tuple[str, list[str]] | None = None

    def _scx_name(self, config: Config, name: str) -> str | None:
        base = name.partition(MODE_SEPARATOR)[0]
        names = config.dbus.scx_names if config.dbus is not None else {}
        return next((scx for scx, b in names.items() if b == base), None)

    def _mode(self, config: Config, name: str) -> int:
        _, sep, mode = name.partition(MODE_SEPARATOR)
        return _MODE_NUMBERS.get(mode, 0) if sep else 0

    def snapshot(self, state: str) -> dict[str, tuple[str, Any]]:
        """Every property as ``{name: (signature, value)}``, for the kernel's ``state``
        (the ``/sys/kernel/sched_ext/state`` word)."""
        control = self.control
        config = control.config
        active = control.active
        running = state == "enabled" and active != KERNEL
        current = UNKNOWN
        mode = 0
        args: list[str] = []
        scx_name = self._scx_name(config, active) if running else None
        # A scheduler without an scx name reads as none scx_loader knows: clients (scxctl)
        # parse the value as one of scx_loader's scheduler names.
        if scx_name is not None:
            current = scx_name
            mode = self._mode(config, active)
            if self.args is not None and self.args[0] == active:
                args = list(self.args[1])
        default = config.default
        default_scx = self._scx_name(config, default) if default != KERNEL else None
        names = config.dbus.scx_names if config.dbus is not None else {}
        return {
            "CurrentScheduler": ("s", current),
            "SchedulerMode": ("u", mode),
            "CurrentSchedulerArgs": ("as", args),
            "SupportedSchedulers": ("as", sorted(names)),
            "DefaultScheduler": ("s", default_scx or UNKNOWN),
            "DefaultMode": ("u", self._mode(config, default) if default_scx else 0),
        }

    def now(self) -> dict[str, tuple[str, Any]]:
        """:meth:`snapshot` for the kernel's state read now (a sysfs read, on the loop:
        a property ``Get`` answers what the kernel says at that moment)."""
        return self.snapshot(self.control.kernel_state_now().state)


class ScxLoaderInterface(DbusInterfaceCommonAsync, interface_name=INTERFACE):
    """The exported object; see the module docstring. Its methods are marked unprivileged
    (``SD_BUS_VTABLE_UNPRIVILEGED``): sd-bus would otherwise refuse every caller without
    ``CAP_SYS_ADMIN`` itself, before polkit could be asked."""

    def __init__(self, face: ScxLoaderFace) -> None:
        super().__init__()
        self._face = face

    # --- properties (read-only; from the kernel when asked) -------------------------------

    @dbus_property_async("s", property_name="CurrentScheduler", flags=DbusPropertyEmitsChangeFlag)
    def current_scheduler(self) -> str:
        """``CurrentScheduler`` (``s``): the scx_loader name of the scheduler the kernel runs
        now; :data:`UNKNOWN` when sched_ext is not enabled, the kernel's own scheduler runs,
        or what runs has no scx name in ``[dbus.scx_names]`` (as scx_loader says when it
        runs nothing it knows)."""
        return str(self._face.state.now()["CurrentScheduler"][1])

    @dbus_property_async("u", property_name="SchedulerMode", flags=DbusPropertyEmitsChangeFlag)
    def scheduler_mode(self) -> int:
        """``SchedulerMode`` (``u``): scx_loader's mode number of the running scheduler
        (:data:`~schedswitchd.daemon.config.SCX_MODES`); 0 when it runs as configured or
        none runs."""
        return int(self._face.state.now()["SchedulerMode"][1])

    @dbus_property_async(
        "as", property_name="CurrentSchedulerArgs", flags=DbusPropertyEmitsChangeFlag
    )
    def current_scheduler_args(self) -> list[str]:
        """``CurrentSchedulerArgs`` (``as``): the flags the ``...WithArgs`` call that started
        the running scheduler gave; empty when another call started it or none runs."""
        return list(self._face.state.now()["CurrentSchedulerArgs"][1])

    @dbus_property_async(
        "as", property_name="SupportedSchedulers", flags=DbusPropertyEmitsChangeFlag
    )
    def supported_schedulers(self) -> list[str]:
        """``SupportedSchedulers`` (``as``): the scx_loader names ``[dbus.scx_names]`` offers,
        sorted; from the configuration, not the kernel."""
        return list(self._face.state.snapshot("")["SupportedSchedulers"][1])

    @dbus_property_async("s", property_name="DefaultScheduler", flags=DbusPropertyEmitsChangeFlag)
    def default_scheduler(self) -> str:
        """``DefaultScheduler`` (``s``): the scx_loader name of the configured default;
        :data:`UNKNOWN` when the default is the kernel's own scheduler or has no scx_loader
        name."""
        return str(self._face.state.snapshot("")["DefaultScheduler"][1])

    @dbus_property_async("u", property_name="DefaultMode", flags=DbusPropertyEmitsChangeFlag)
    def default_mode(self) -> int:
        """``DefaultMode`` (``u``): the default's mode number (0 when it runs as configured or
        has no scx_loader name)."""
        return int(self._face.state.snapshot("")["DefaultMode"][1])

    # --- methods (polkit) --------------------------------------------------------------------

    @dbus_method_async(
        input_signature="su",
        input_args_names=("scx_name", "sched_mode"),
        method_name="StartScheduler",
        flags=DbusUnprivilegedFlag,
    )
    async def start_scheduler(self, scx_name: str, sched_mode: int) -> None:
        """``StartScheduler(su)``: an admin override to the scheduler ``scx_name`` names, in
        scx_loader mode ``sched_mode`` (0: as configured; :func:`resolve`); returns once the
        kernel runs it. Raises :class:`DbusFailedError` (``org.freedesktop.DBus.Error.Failed``)
        when the caller is not authorised, the name or mode is not offered, or the switch
        failed; what ran before runs on."""
        await self._face.call("StartScheduler", lambda c: resolve(c, scx_name, sched_mode))

    @dbus_method_async(
        input_signature="su",
        input_args_names=("scx_name", "sched_mode"),
        method_name="SwitchScheduler",
        flags=DbusUnprivilegedFlag,
    )
    async def switch_scheduler(self, scx_name: str, sched_mode: int) -> None:
        """``SwitchScheduler(su)``: the same as :meth:`start_scheduler` (the daemon replaces
        whatever runs either way); the same errors."""
        await self._face.call("SwitchScheduler", lambda c: resolve(c, scx_name, sched_mode))

    @dbus_method_async(
        input_signature="sas",
        input_args_names=("scx_name", "scx_args"),
        method_name="StartSchedulerWithArgs",
        flags=DbusUnprivilegedFlag,
    )
    async def start_scheduler_with_args(self, scx_name: str, scx_args: list[str]) -> None:
        """``StartSchedulerWithArgs(sas)``: :meth:`start_scheduler` of the mode of ``scx_name``
        whose documented flags are exactly ``scx_args`` (:func:`resolve_args`; empty: as
        configured). Raises :class:`DbusFailedError` for any other flags, and as
        :meth:`start_scheduler` does."""
        await self._face.call(
            "StartSchedulerWithArgs", lambda c: resolve_args(c, scx_name, scx_args), scx_args
        )

    @dbus_method_async(
        input_signature="sas",
        input_args_names=("scx_name", "scx_args"),
        method_name="SwitchSchedulerWithArgs",
        flags=DbusUnprivilegedFlag,
    )
    async def switch_scheduler_with_args(self, scx_name: str, scx_args: list[str]) -> None:
        """``SwitchSchedulerWithArgs(sas)``: the same as :meth:`start_scheduler_with_args`;
        the same errors."""
        await self._face.call(
            "SwitchSchedulerWithArgs", lambda c: resolve_args(c, scx_name, scx_args), scx_args
        )

    @dbus_method_async(method_name="StopScheduler", flags=DbusUnprivilegedFlag)
    async def stop_scheduler(self) -> None:
        """``StopScheduler()``: an admin override to the kernel's own scheduler (sched_ext
        disabled). Raises :class:`DbusFailedError` when the caller is not authorised or the
        switch failed."""
        await self._face.call("StopScheduler", lambda c: KERNEL)

    @dbus_method_async(method_name="RestartScheduler", flags=DbusUnprivilegedFlag)
    async def restart_scheduler(self) -> None:
        """``RestartScheduler()``: the running scheduler loaded again from its file and
        configuration as they are now (the kernel's own runs in between). Raises
        :class:`DbusFailedError` when the caller is not authorised, no scheduler of the
        daemon's runs, or the new load failed (the kernel's own then runs on)."""
        await self._face.call("RestartScheduler", None)

    @dbus_method_async(method_name="RestoreDefault", flags=DbusUnprivilegedFlag)
    async def restore_default(self) -> None:
        """``RestoreDefault()``: the admin override ends, and hints and the default rule choose
        the scheduler again. Raises :class:`DbusFailedError` when the caller is not
        authorised or the switch failed."""
        await self._face.call("RestoreDefault", lambda c: "auto")


class ScxLoaderFace:
    """The running face: the exported object, the bus name, the task that turns the
    daemon's changes into ``PropertiesChanged``."""

    def __init__(self, control: DaemonControl, bus: sdbus.SdBus) -> None:
        self.control = control
        self.bus = bus
        self.state = LoaderState(control)
        self.interface = ScxLoaderInterface(self)
        self._export: Any = None
        self._task: asyncio.Task[None] | None = None
        self._last: dict[str, tuple[str, Any]] = {}

    async def start(self) -> None:
        """Export the object at :data:`PATH`, follow the daemon's changes, then request
        :data:`NAME`. Raises :class:`~schedswitchd.errors.BusUnavailableError` naming the
        owner when the name is taken, :class:`sdbus.SdBusBaseError` for other failures of
        the bus."""
        self._export = self.interface.export_to_dbus(PATH, self.bus)
        self._last = self.state.snapshot((await self.control.kernel_state()).state)
        sub = self.control.subscribe()
        self._task = asyncio.create_task(self._follow(sub))
        # Last: a client that sees the name finds the object and its change signals.
        await request_name(self.bus, NAME, "is scx_loader still running?")
        log.info("serving %s on the system bus", NAME)

    async def close(self) -> None:
        """Stop following the daemon and withdraw the exported object; the name goes with
        the connection (:meth:`~schedswitchd.desktop.bus.Buses.close`)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._export is not None:
            self._export.stop()

    async def _follow(self, sub: Any) -> None:
        """Each change of the daemon's: the properties read again, the changed ones sent
        in one ``PropertiesChanged``."""
        try:
            async for _change in sub:
                self.emit_changes((await self.control.kernel_state()).state)
        finally:
            sub.close()

    def emit_changes(self, state: str) -> None:
        """Send one ``PropertiesChanged`` with every property whose value differs from the
        last sent, for the kernel's ``state`` (the ``/sys/kernel/sched_ext/state`` word);
        nothing when none changed."""
        now = self.state.snapshot(state)
        changed = {k: v for k, v in now.items() if self._last.get(k) != v}
        self._last = now
        if changed:
            self.interface.properties_changed.emit((INTERFACE, changed, []))

    async def call(self, method: str, target: Any, argv: list[str] | None = None) -> None:
        """A method call: authorise the caller, resolve the target (a callable of the
        configuration; ``None``: restart), drive the daemon. Every failure is
        ``org.freedesktop.DBus.Error.Failed`` with the reason."""
        sender = get_current_message().sender
        if sender is None:
            raise DbusFailedError("the call has no sender")
        try:
            try:
                who = await self._authorise(sender)
            except Refused as exc:
                # Granted calls are logged below; a refusal is as much the admin's business.
                log.warning("%s.%s refused: %s", NAME, method, exc)
                raise
            config = self.control.config
            if target is None:
                log.info("%s: restart, asked by %s", NAME, who)
                await self.control.restart()
                return
            name = target(config)
            if isinstance(name, WithArgs):
                log.info("%s.%s: %s %s, asked by %s", NAME, method, name[0], name[1], who)
                await self.control.switch_args(name.scheduler, name.argv)
                name = f"{name.scheduler.split(MODE_SEPARATOR)[0]}{MODE_SEPARATOR}{ARGS_MODE}"
            else:
                log.info("%s.%s: %s, asked by %s", NAME, method, name, who)
                await self.control.switch(name)
            self.state.args = (name, list(argv)) if argv else None
        except Refused as exc:
            raise DbusFailedError(str(exc)) from None
        except SchedSwitchError as exc:
            raise DbusFailedError(str(exc)) from None
        finally:
            # The properties a call changed are sent before its reply goes out.
            self.emit_changes((await self.control.kernel_state()).state)

    async def _authorise(self, sender: str) -> str:
        """Who ``sender`` is, once it may manage schedulers: an admin of ``[auth]`` (root
        by default), or one polkit authorises for :data:`ACTION`. Raises
        :class:`Refused`."""
        caller = await caller_of(self.bus, sender)
        who = f"uid {caller.uid} ({sender})"
        if self.control.is_admin(caller.uid, caller.groups):
            return who
        message = self.bus.new_method_call_message(
            POLKIT_NAME, POLKIT_PATH, POLKIT_INTERFACE, "CheckAuthorization"
        )
        message.append_data(
            "(sa{sv})sa{ss}us",
            ("system-bus-name", {"name": ("s", sender)}),
            ACTION,
            {},
            POLKIT_ALLOW_INTERACTION,
            "",
        )
        try:
            reply = await self.bus.call_async(message)
        except sdbus.SdBusBaseError as exc:
            raise Refused(f"{who} is not authorized: polkit could not be asked ({exc})") from None
        result: Any = reply.get_contents()
        authorized, challenge = bool(result[0]), bool(result[1])
        if not authorized:
            extra = "; authentication was required and not given" if challenge else ""
            raise Refused(f"{who} is not authorized for {ACTION} (polkit){extra}")
        return who


async def start(control: DaemonControl, buses: Buses) -> ScxLoaderFace | None:
    """The face, serving, when ``[dbus] scx_loader`` is on; else ``None``."""
    dbus = control.config.dbus
    if dbus is None or not dbus.scx_loader:
        return None
    face = ScxLoaderFace(control, buses.system)
    try:
        await face.start()
    except BaseException:
        await face.close()
        raise
    return face
