"""The power profile face: the desktop's power-saver / balanced / performance switch
(power-profiles-daemon) picks a hint the daemon holds for itself.

power-profiles-daemon publishes ``ActiveProfile`` (``s``) on the system bus as
``org.freedesktop.UPower.PowerProfiles`` at ``/org/freedesktop/UPower/PowerProfiles``
(0.20 on) and as ``net.hadess.PowerProfiles`` at ``/net/hadess/PowerProfiles`` (every
version; Debian 12's 0.12 has only this one), with ``PropertiesChanged`` on each change
(its ``src/power-profiles-daemon.c``). ``[dbus.power_profiles]`` maps a profile to a
workload hint (``power-saver = "battery"``); while the active profile has one, the daemon
holds a lease of that hint (:meth:`~schedswitchd.daemon.control.DaemonControl.hold`),
ranked by the hint rule's priority like any other, so a game's higher-priority hint still
wins. The lease moves with the property, ends when the profile has no hint, and ends when
power-profiles-daemon leaves the bus; when it comes back its profile is read again. The
mapping is read from the configuration in force at each change (reloads apply).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import sdbus

from schedswitchd.daemon.control import DaemonControl
from schedswitchd.desktop.bus import Buses, bus_daemon
from schedswitchd.errors import SchedSwitchError

log = logging.getLogger("schedswitchd")

ACTIVE_PROFILE = "ActiveProfile"
_UPOWER = "org.freedesktop.UPower.PowerProfiles"


class _UPowerProfiles(sdbus.DbusInterfaceCommonAsync, interface_name=_UPOWER):
    @sdbus.dbus_property_async("s", property_name=ACTIVE_PROFILE)
    def active_profile(self) -> str:
        raise NotImplementedError  # a proxy's: power-profiles-daemon answers


class _HadessProfiles(sdbus.DbusInterfaceCommonAsync, interface_name="net.hadess.PowerProfiles"):
    @sdbus.dbus_property_async("s", property_name=ACTIVE_PROFILE)
    def active_profile(self) -> str:
        raise NotImplementedError


#: power-profiles-daemon's names, object paths and interfaces, the newer first.
SERVICES: tuple[tuple[str, str, type[_UPowerProfiles] | type[_HadessProfiles]], ...] = (
    (_UPOWER, "/org/freedesktop/UPower/PowerProfiles", _UPowerProfiles),
    ("net.hadess.PowerProfiles", "/net/hadess/PowerProfiles", _HadessProfiles),
)


class PowerProfiles:
    """The face: follows ``ActiveProfile`` on ``bus`` and holds the mapped hint through
    ``control``. :attr:`profile` is the profile last read (``None``: no
    power-profiles-daemon), :attr:`lease` the lease held for it (``None``: none)."""

    def __init__(self, control: DaemonControl, bus: sdbus.SdBus) -> None:
        self.control = control
        self.bus = bus
        self.profile: str | None = None
        self.lease: str | None = None
        self._workload: str | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def begin(self) -> None:
        """Watch the names and the property, then read the profile as it is now."""
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._owners()))
        for name, path, iface in SERVICES:
            self._tasks.append(
                loop.create_task(self._changes(iface.new_proxy(name, path, self.bus)))
            )
        await self.refresh()

    async def refresh(self) -> None:
        """Read ``ActiveProfile`` from the first name that has an owner and apply it; with
        none, end the lease."""
        daemon = bus_daemon(self.bus)
        for name, path, iface in SERVICES:
            try:
                if not await daemon.name_has_owner(name):
                    continue
                profile = await iface.new_proxy(name, path, self.bus).active_profile.get_async()
            except sdbus.SdBusBaseError as exc:
                log.warning("power profile: reading %s failed: %s", name, exc)
                continue
            self.apply(profile)
            return
        self.apply(None)

    def apply(self, profile: str | None) -> None:
        """Hold the hint ``[dbus.power_profiles]`` maps ``profile`` to (``None``: no
        power-profiles-daemon), ending the one held before if it differs."""
        self.profile = profile
        dbus = self.control.config.dbus
        mapping = dbus.power_profiles if dbus is not None else {}
        workload = mapping.get(profile) if profile is not None else None
        if workload == self._workload and (workload is None or self.lease is not None):
            return
        why = f"power profile {profile}" if profile is not None else "no power-profiles-daemon"
        if self.lease is not None:
            self.control.end(self.lease, why)
            self.lease = None
        self._workload = workload
        if workload is None:
            log.info("power profile: %s, no hint", profile or "none")
            return
        try:
            self.lease = self.control.hold(workload, why=why)
        except SchedSwitchError as exc:
            log.error("power profile %s: %s", profile, exc)

    async def _changes(self, proxy: _UPowerProfiles | _HadessProfiles) -> None:
        async for interface, changed, _ in proxy.properties_changed.catch():
            value = changed.get(ACTIVE_PROFILE)
            if value is not None and isinstance(value[1], str):
                log.debug("power profile: %s says %s", interface, value[1])
                self.apply(value[1])

    async def _owners(self) -> None:
        names = {name for name, _, _ in SERVICES}
        async for name, _, new in bus_daemon(self.bus).name_owner_changed.catch():
            if name in names:
                log.info("power profile: %s %s the bus", name, "joined" if new else "left")
                await self.refresh()

    async def close(self) -> None:
        """Stop following and end the lease."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.lease is not None:
            self.control.end(self.lease, "power profile face closed")
            self.lease = None


async def start(control: DaemonControl, buses: Buses) -> PowerProfiles | None:
    """The face, following the system bus, when ``[dbus.power_profiles]`` maps any
    profile; else ``None``. Raises what opening the system bus raises."""
    dbus = control.config.dbus
    if dbus is None or not dbus.power_profiles:
        return None
    face = PowerProfiles(control, buses.system)
    await face.begin()
    return face
