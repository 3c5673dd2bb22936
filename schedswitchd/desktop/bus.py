"""The D-Bus connections the faces share, and what they ask the bus itself.

sdbus opens the system bus at ``$DBUS_SYSTEM_BUS_ADDRESS`` (else the standard socket)
and the session bus at ``$DBUS_SESSION_BUS_ADDRESS``, as every D-Bus program does
(``sd_bus_open_system(3)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import sdbus

#: The message bus itself (the D-Bus specification's ``org.freedesktop.DBus``).
DBUS_NAME = "org.freedesktop.DBus"
DBUS_PATH = "/org/freedesktop/DBus"


@dataclass(frozen=True)
class Caller:
    """Who sent a D-Bus call, per the bus (``GetConnectionCredentials``, which the bus
    takes from the kernel when the connection was made): ``bus_name`` (its unique name,
    ``:1.42``), ``uid``, ``pid`` (``None`` if the bus could not tell) and ``groups`` (the
    gids the bus knows, the primary one included; empty if it could not tell)."""

    bus_name: str
    uid: int
    pid: int | None
    groups: frozenset[int]


class Buses:
    """The daemon's connections, opened when first asked for; :meth:`close` closes them."""

    def __init__(self) -> None:
        self._system: sdbus.SdBus | None = None

    @property
    def system(self) -> sdbus.SdBus:
        """The system bus connection. Raises :class:`sdbus.SdBusBaseError` (or
        ``OSError``) when there is none to connect to."""
        if self._system is None:
            self._system = sdbus.sd_bus_open_system()
        return self._system

    def close(self) -> None:
        """Close the system bus connection if one was opened (its names go with it); the
        next :attr:`system` opens a new one."""
        if self._system is not None:
            self._system.close()
            self._system = None


async def caller_of(bus: sdbus.SdBus, sender: str) -> Caller:
    """The credentials of the connection ``sender`` (a unique bus name) on ``bus``."""
    message = bus.new_method_call_message(
        DBUS_NAME, DBUS_PATH, DBUS_NAME, "GetConnectionCredentials"
    )
    message.append_data("s", sender)
    reply = await bus.call_async(message)
    creds: dict[str, tuple[str, object]] = reply.get_contents()  # type: ignore[assignment]
    uid = creds["UnixUserID"][1]
    pid = creds.get("ProcessID", ("u", None))[1]
    gids = creds.get("UnixGroupIDs", ("au", []))[1]
    assert isinstance(uid, int)
    return Caller(
        bus_name=sender,
        uid=uid,
        pid=pid if isinstance(pid, int) else None,
        groups=frozenset(g for g in gids if isinstance(g, int))
        if isinstance(gids, list)
        else frozenset(),
    )


class BusDaemon(sdbus.DbusInterfaceCommonAsync, interface_name=DBUS_NAME):
    """A proxy of the message bus itself (:data:`DBUS_NAME` at :data:`DBUS_PATH`): whether
    a name has an owner, and the changes of names' owners (``NameOwnerChanged``: name, old
    owner, new owner; an empty owner means none)."""

    @sdbus.dbus_method_async("s", "b", method_name="NameHasOwner")
    async def name_has_owner(self, name: str) -> bool:
        """``NameHasOwner(s) -> b``: whether the bus name ``name`` (well-known or unique) has
        an owner now. Raises :class:`sdbus.SdBusBaseError` when the bus refuses the call."""
        raise NotImplementedError  # a proxy's: the bus answers

    @sdbus.dbus_signal_async("sss", signal_name="NameOwnerChanged")
    def name_owner_changed(self) -> tuple[str, str, str]:
        """``NameOwnerChanged(sss)``: ``(name, old owner, new owner)``, the owners as unique
        names, empty for none; iterate ``.catch()`` to receive them."""
        raise NotImplementedError


def bus_daemon(bus: sdbus.SdBus) -> BusDaemon:
    """A :class:`BusDaemon` proxy on ``bus``."""
    return BusDaemon.new_proxy(DBUS_NAME, DBUS_PATH, bus)
