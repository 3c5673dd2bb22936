"""One hint per running game, held on the daemon's socket by the per-user GameMode agent.

A game is named to the daemon by a pidfd passed with the hint (``"pidfd": true``,
``SCM_RIGHTS``; :mod:`schedswitchd.daemon.passed_fds`): the game is not the agent's
descendant, and the pidfd cannot come to stand for another process. The daemon ends the
lease when the game exits (and then closes the connection); the agent ends it sooner by
closing the connection when the game unregisters. Each lease is one connection, read by
asyncio until the daemon closes it.

Speaks the protocol through :mod:`schedswitchd.daemon.launcher_wire` (no pydantic).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from schedswitchd.daemon.launcher_wire import (
    MAX_LAUNCHER_REPLY_BYTES,
    DaemonError,
    DaemonUnavailable,
    check_reply,
    dumps,
    send_with_fds,
    socket_path,
)
from schedswitchd.errors import SchedSwitchError

log = logging.getLogger("schedswitch-gamemode")

#: How long the agent waits for the daemon's reply to a hint, s (it waits for the switch).
HINT_TIMEOUT_S = 30.0


@dataclass(eq=False)
class Held:
    """A game's lease: the game's ``pid``, the daemon's ``lease`` id, the connection
    that holds it (closing it ends the lease) and the task reading that connection."""

    pid: int
    lease: str
    writer: asyncio.StreamWriter
    watcher: asyncio.Task[None] | None = field(default=None)


class GameLeases:
    """The hints held for games, by game pid.

    ``workload``: the hint each game holds (a hint rule of the daemon's configuration);
    ``path``: the daemon's socket (:func:`~schedswitchd.daemon.launcher_wire.socket_path`);
    ``on_end(pid)``: called on the event loop when a game's lease ended without
    :meth:`release` (the daemon saw the game exit, or closed the connection)."""

    def __init__(
        self,
        workload: str,
        path: str | None = None,
        on_end: Callable[[int], None] | None = None,
    ) -> None:
        self.workload = workload
        self.path = socket_path(path)
        self.on_end = on_end
        self.held: dict[int, Held] = {}

    async def hold(self, pid: int, pidfd: int) -> Held:
        """Hint :attr:`workload` for the game ``pid`` named by ``pidfd`` (the caller keeps
        and closes ``pidfd``; the daemon gets its own copy) and keep the lease.

        Raises :class:`~schedswitchd.daemon.launcher_wire.DaemonUnavailable` when the
        socket cannot be reached or the connection breaks, and
        :class:`~schedswitchd.daemon.launcher_wire.DaemonError` for a refusal (``denied``:
        ``[auth]``; ``bad_pid``: the game exited; ``unknown_workload``)."""
        if pid in self.held:
            raise DaemonError("exists", f"game {pid} holds a hint already")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, self.path)
            line = dumps({"v": 1, "op": "hint", "workload": self.workload, "pidfd": True})
            sock.setblocking(True)  # a hint line fits the socket's buffer: this does not wait
            send_with_fds(sock, line + b"\n", (pidfd,))
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise DaemonUnavailable(f"cannot hint at {self.path}: {exc.strerror or exc}") from None
        reader, writer = await asyncio.open_unix_connection(
            sock=sock, limit=MAX_LAUNCHER_REPLY_BYTES
        )
        try:
            raw = await asyncio.wait_for(reader.readline(), HINT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            writer.close()
            raise DaemonUnavailable(f"{self.path}: no reply to the hint ({exc!r})") from None
        if not raw.endswith(b"\n"):
            writer.close()
            raise DaemonUnavailable(f"{self.path}: the daemon closed the connection")
        try:
            reply = check_reply(raw[:-1], "hint")
        except SchedSwitchError:
            writer.close()
            raise
        held = Held(pid=pid, lease=str(reply.get("lease")), writer=writer)
        self.held[pid] = held
        held.watcher = asyncio.get_running_loop().create_task(self._watch(held, reader))
        active = reply.get("active")
        log.info("game %d: lease %s (%s), running %s", pid, held.lease, self.workload, active)
        return held

    async def _watch(self, held: Held, reader: asyncio.StreamReader) -> None:
        """Read until the daemon closes the connection: the lease has ended."""
        last = b""
        with contextlib.suppress(OSError):
            while line := await reader.readline():
                last = line
        if self.held.get(held.pid) is held:
            del self.held[held.pid]
            held.writer.close()
            log.info("game %d: lease %s ended (%s)", held.pid, held.lease, _why(last))
            if self.on_end is not None:
                self.on_end(held.pid)

    def release(self, pid: int) -> bool:
        """End the lease of game ``pid``; False if it holds none."""
        held = self.held.pop(pid, None)
        if held is None:
            return False
        if held.watcher is not None:
            held.watcher.cancel()
        held.writer.close()
        log.info("game %d: lease %s released", pid, held.lease)
        return True

    def release_all(self) -> None:
        """End every lease (the agent stops)."""
        for pid in list(self.held):
            self.release(pid)


def _why(line: bytes) -> str:
    """The reason in the daemon's last line (``lease_ended``), or that it closed."""
    with contextlib.suppress(SchedSwitchError):
        return str(check_reply(line.rstrip(b"\n"), "lease_ended").get("why"))
    return "the daemon closed the connection"
