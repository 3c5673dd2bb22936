"""The D-Bus connections the faces share, and what they ask the bus itself.

sdbus opens the system bus at ``$DBUS_SYSTEM_BUS_ADDRESS`` (else the standard socket)
and the session bus at ``$DBUS_SESSION_BUS_ADDRESS``, as every D-Bus program does
(``sd_bus_open_system(3)``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

import sdbus
from sdbus.exceptions import SdBusRequestNameExistsError

from schedswitchd.errors import BusUnavailableError

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
        """The system bus connection. Raises :class:`BusUnavailableError` when there is
        none to connect to (:func:`open_bus`)."""
        if self._system is None:
            self._system = open_bus("system")
        return self._system

    def close(self) -> None:
        """Close the system bus connection if one was opened (its names go with it); the
        next :attr:`system` opens a new one."""
        if self._system is not None:
            self._system.close()
            self._system = None


#: The environment variable that gives each bus's address (``sd_bus_open_system(3)``).
_ADDRESS_VARIABLE = {"system": "DBUS_SYSTEM_BUS_ADDRESS", "session": "DBUS_SESSION_BUS_ADDRESS"}
#: How sdbus reports a failed libsystemd call: the negated errno, at the end of its text.
_SDBUS_ERRNO = re.compile(r"returned error number: (\d+)")


def open_bus(kind: Literal["system", "session"]) -> sdbus.SdBus:
    """A new connection to the ``system`` or ``session`` bus, at the address its variable
    gives (``$DBUS_SYSTEM_BUS_ADDRESS``, ``$DBUS_SESSION_BUS_ADDRESS``) or libsystemd's
    default. Raises :class:`~schedswitchd.errors.BusUnavailableError` naming the address and
    the reason (``strerror`` of the errno sdbus reports) when there is no bus there:
    ``cannot connect to the system bus at unix:path=/x: No such file or directory``."""
    try:
        return sdbus.sd_bus_open_system() if kind == "system" else sdbus.sd_bus_open_user()
    except sdbus.SdBusLibraryError as exc:
        variable = _ADDRESS_VARIABLE[kind]
        address = os.environ.get(variable)
        where = f"at {address}" if address else f"at the default address (${variable} unset)"
        found = _SDBUS_ERRNO.search(str(exc))
        reason = os.strerror(int(found.group(1))) if found else str(exc)
        raise BusUnavailableError(f"cannot connect to the {kind} bus {where}: {reason}") from None


async def request_name(bus: sdbus.SdBus, name: str, hint: str) -> None:
    """Own the well-known ``name`` on ``bus`` (no queueing, no replacing). Raises
    :class:`~schedswitchd.errors.BusUnavailableError` when another connection owns it,
    naming that owner and ending with ``hint`` (what to check):
    ``org.scx.Loader is owned by :1.4 (pid 812, scx_loader); is scx_loader still running?``.
    Other refusals of the bus (a policy that denies the name) raise
    :class:`sdbus.SdBusBaseError` as sdbus does."""
    try:
        await bus.request_name_async(name, 0)
    except SdBusRequestNameExistsError:
        owner = await describe_owner(bus, name)
        raise BusUnavailableError(f"{name} is owned by {owner}; {hint}") from None


async def describe_owner(bus: sdbus.SdBus, name: str) -> str:
    """Who owns ``name`` on ``bus``, as the bus says (``GetNameOwner``,
    ``GetConnectionUnixProcessID``) and ``/proc/PID/comm`` names the process:
    ``":1.4 (pid 812, scx_loader)"``; less when the bus or ``/proc`` cannot tell
    (another pid namespace, an owner gone meanwhile)."""
    try:
        unique = await _ask_bus(bus, "GetNameOwner", name)
    except sdbus.SdBusBaseError:
        return "another connection"
    try:
        pid = await _ask_bus(bus, "GetConnectionUnixProcessID", str(unique))
    except sdbus.SdBusBaseError:
        return str(unique)
    try:
        with open(f"/proc/{pid}/comm") as comm:
            command = comm.read().strip()
    except OSError:
        return f"{unique} (pid {pid})"
    return f"{unique} (pid {pid}, {command})"


async def _ask_bus(bus: sdbus.SdBus, method: str, name: str) -> object:
    """The one value of the bus's ``method(s)`` for ``name``."""
    message = bus.new_method_call_message(DBUS_NAME, DBUS_PATH, DBUS_NAME, method)
    message.append_data("s", name)
    reply = await bus.call_async(message)
    return reply.get_contents()


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

    @sdbus.dbus_method_async("", "as", method_name="ListActivatableNames")
    async def list_activatable_names(self) -> list[str]:
        """``ListActivatableNames() -> as``: the names the bus can start a service for (its
        ``.service`` files). Raises :class:`sdbus.SdBusBaseError` when the bus refuses."""
        raise NotImplementedError  # a proxy's: the bus answers

    @sdbus.dbus_signal_async("sss", signal_name="NameOwnerChanged")
    def name_owner_changed(self) -> tuple[str, str, str]:
        """``NameOwnerChanged(sss)``: ``(name, old owner, new owner)``, the owners as unique
        names, empty for none; iterate ``.catch()`` to receive them."""
        raise NotImplementedError


def bus_daemon(bus: sdbus.SdBus) -> BusDaemon:
    """A :class:`BusDaemon` proxy on ``bus``."""
    return BusDaemon.new_proxy(DBUS_NAME, DBUS_PATH, bus)
