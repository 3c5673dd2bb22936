"""One hint per running game, held on the daemon's socket by the per-user GameMode agent.

A game is named to the daemon by a pidfd passed with the hint (``"pidfd": true``,
``SCM_RIGHTS``; :mod:`schedswitchd.daemon.passed_fds`): the game is not the agent's
descendant, and the pidfd cannot come to stand for another process. The daemon ends the
lease when the game exits (and then closes the connection); the agent ends it sooner by
closing the connection when the game unregisters. Each lease is one connection, read by
asyncio until the daemon closes it.

A connection that closes without the daemon's ``lease_ended`` line while the game still
runs was lost with the daemon (it stopped, restarted or crashed; its leases went with it):
the agent connects again with a growing delay (:data:`RECONNECT_FIRST_S` doubling up to
:data:`RECONNECT_MAX_S`) and hints for the game again, for as long as the game runs and is
registered. It keeps its own copy of the game's pidfd for that. A game that registers
while the daemon cannot be reached at all (not started yet, restarting) is held the same
way: registered now, hinted for once the daemon is back.

Speaks the protocol through :mod:`schedswitchd.daemon.launcher_wire` (no pydantic).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from schedswitchd.daemon.launcher_wire import (
    MAX_LAUNCHER_REPLY_BYTES,
    DaemonError,
    DaemonUnavailable,
    check_reply,
    dumps,
    hint_summary,
    send_with_fds,
    socket_path,
)
from schedswitchd.errors import SchedSwitchError

log = logging.getLogger("schedswitch-gamemode")

#: How long the agent waits for the daemon's reply to a hint, s (it waits for the switch).
HINT_TIMEOUT_S = 30.0

#: The first wait before hinting again after the daemon's connection was lost, s; each
#: failed attempt doubles it up to :data:`RECONNECT_MAX_S`.
RECONNECT_FIRST_S = 0.1
RECONNECT_MAX_S = 5.0


class Released(Exception):
    """:meth:`GameLeases.hold`: the game was released while its hint was on its way."""

    def __init__(self, pid: int) -> None:
        super().__init__(f"game {pid} was released before the daemon's reply")
        self.pid = pid


@dataclass(eq=False)
class Held:
    """A game's lease: the game's ``pid``, the daemon's ``lease`` id, the connection
    that holds it (closing it ends the lease), the task reading that connection and the
    agent's own copy of the game's ``pidfd`` (to hint again after the daemon restarted).
    ``lease`` is empty and ``writer`` ``None`` while the daemon could not be reached yet."""

    pid: int
    lease: str
    writer: asyncio.StreamWriter | None
    pidfd: int = -1
    watcher: asyncio.Task[None] | None = field(default=None)


class GameLeases:
    """The hints held for games, by game pid.

    ``workload``: the hint each game holds (a hint rule of the daemon's configuration);
    ``path``: the daemon's socket (:func:`~schedswitchd.daemon.launcher_wire.socket_path`);
    ``on_end(pid)``: called on the event loop when a game's lease ended without
    :meth:`release` (the daemon saw the game exit, or refused the hint made again after it
    restarted)."""

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
        #: Games whose hint is on its way (:meth:`hold` waits for the daemon's reply), and
        #: those of them released meanwhile: the daemon made the lease before its reply,
        #: so such a game's connection is closed once the reply comes.
        self._hinting: set[int] = set()
        self._dropped: set[int] = set()

    async def hold(self, pid: int, pidfd: int) -> Held:
        """Hint :attr:`workload` for the game ``pid`` named by ``pidfd`` (the caller keeps
        and closes ``pidfd``; the daemon gets its own copy, and so does the agent) and keep
        the lease, hinting again should the daemon restart while the game runs.

        When the daemon cannot be reached (its socket is missing or refuses connections,
        or the connection breaks before the reply), the game is held all the same and its
        hint made once the daemon is back (as after a restart); ``lease`` is then empty.
        Raises :class:`~schedswitchd.daemon.launcher_wire.DaemonError` for a refusal
        (``denied``: ``[auth]``; ``bad_pid``: the game exited; ``unknown_workload``;
        ``exists``: the game is held already), :class:`Released` when the game was released
        (:meth:`release`) while its hint was on its way (its connection is closed, so the
        daemon ends the lease), and :class:`OSError` if the pidfd cannot be copied."""
        if self.holds(pid):
            raise DaemonError("exists", f"game {pid} holds a hint already")
        self._hinting.add(pid)
        try:
            reply, reader, writer = await self._hint(pidfd)
        except DaemonUnavailable as exc:
            unreachable: DaemonUnavailable | None = exc
            reply, reader, writer = {}, None, None
        else:
            unreachable = None
        finally:
            self._hinting.discard(pid)
            dropped = pid in self._dropped
            self._dropped.discard(pid)
        if dropped:
            if writer is not None:
                writer.close()
            log.info("game %d: released before the daemon's reply; its lease ends", pid)
            raise Released(pid)
        held = Held(pid=pid, lease=str(reply.get("lease", "")), writer=writer)
        try:
            held.pidfd = os.dup(pidfd)
        except OSError:
            if writer is not None:
                writer.close()
            raise
        self.held[pid] = held
        loop = asyncio.get_running_loop()
        if reader is None:
            log.warning("game %d: %s; hinting once the daemon is back", pid, unreachable)
            held.watcher = loop.create_task(self._when_back(held))
        else:
            held.watcher = loop.create_task(self._watch(held, reader))
            # The reply's reason when the workload's scheduler is not what runs, as
            # schedswitch-run prints it.
            log.info("game %d: %s", pid, hint_summary(self.workload, reply))
        return held

    async def _when_back(self, held: Held) -> None:
        """For a game held while the daemon could not be reached: its hint once the daemon
        takes it (:meth:`_again`), then its connection read as :meth:`_watch` reads it."""
        reader = await self._again(held)
        if reader is not None:
            await self._watch(held, reader)
        elif self.held.get(held.pid) is held:
            gone = _exited(held.pidfd)
            self._end(held, "the game exited" if gone else "the daemon refused the hint")

    async def _hint(
        self, pidfd: int
    ) -> tuple[dict[str, object], asyncio.StreamReader, asyncio.StreamWriter]:
        """One connection with the hint for ``pidfd`` made on it: the daemon's reply, and
        the connection (its reader and writer). Raises as :meth:`hold`."""
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
        except BaseException:  # cancelled: the socket must not outlive the attempt
            sock.close()
            raise
        reader, writer = await asyncio.open_unix_connection(
            sock=sock, limit=MAX_LAUNCHER_REPLY_BYTES
        )
        try:
            raw = await asyncio.wait_for(reader.readline(), HINT_TIMEOUT_S)
            if not raw.endswith(b"\n"):
                raise DaemonUnavailable(f"{self.path}: the daemon closed the connection")
            reply = check_reply(raw[:-1], "hint")
        except (OSError, TimeoutError, ValueError) as exc:
            writer.close()
            raise DaemonUnavailable(f"{self.path}: no reply to the hint ({exc!r})") from None
        except BaseException:
            writer.close()
            raise
        return reply, reader, writer

    async def _watch(self, held: Held, reader: asyncio.StreamReader) -> None:
        """Read until the daemon closes the connection. With its ``lease_ended`` line, or
        once the game has exited, the lease has ended; else the daemon went away with it:
        hint again (:meth:`_again`) and read the new connection."""
        while True:
            last = b""
            with contextlib.suppress(OSError):
                while line := await reader.readline():
                    last = line
            if self.held.get(held.pid) is not held:
                return
            if held.writer is not None:
                held.writer.close()
            why = _why(last)
            if why is None and not _exited(held.pidfd):
                log.warning(
                    "game %d: the daemon closed the connection of lease %s; hinting again",
                    held.pid,
                    held.lease,
                )
                again = await self._again(held)
                if again is not None:
                    reader = again
                    continue
                why = "the daemon refused the hint again"
            self._end(held, why or "the game exited")
            return

    async def _again(self, held: Held) -> asyncio.StreamReader | None:
        """Hint for ``held``'s game on a new connection, waiting longer after each failed
        attempt, until the daemon takes it (its reader), refuses it, or the game exits or
        is released (``None``)."""
        delay = RECONNECT_FIRST_S
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)
            if self.held.get(held.pid) is not held or _exited(held.pidfd):
                return None
            try:
                reply, reader, writer = await self._hint(held.pidfd)
            except DaemonUnavailable as exc:
                log.info("game %d: the daemon is not back yet: %s", held.pid, exc)
                continue
            except DaemonError as exc:
                log.warning("game %d: the daemon refused the hint again: %s", held.pid, exc)
                return None
            held.lease, held.writer = str(reply.get("lease")), writer
            log.info(
                "game %d: lease %s (%s) again, running %s",
                held.pid,
                held.lease,
                self.workload,
                reply.get("active"),
            )
            return reader

    def _end(self, held: Held, why: str) -> None:
        """``held``'s lease ended without :meth:`release`."""
        if self.held.get(held.pid) is not held:
            return
        del self.held[held.pid]
        if held.writer is not None:
            held.writer.close()
        _close_pidfd(held)
        log.info("game %d: lease %s ended (%s)", held.pid, held.lease, why)
        if self.on_end is not None:
            self.on_end(held.pid)

    def holds(self, pid: int) -> bool:
        """Whether game ``pid`` holds a hint or has one on its way (:meth:`hold`)."""
        return pid in self.held or pid in self._hinting

    def release(self, pid: int) -> bool:
        """End the lease of game ``pid`` (one whose hint is still on its way ends once the
        daemon's reply comes: :meth:`hold`); False if it holds none."""
        held = self.held.pop(pid, None)
        if held is None:
            if pid not in self._hinting or pid in self._dropped:
                return False
            self._dropped.add(pid)
            return True
        if held.watcher is not None:
            held.watcher.cancel()
        if held.writer is not None:
            held.writer.close()
        _close_pidfd(held)
        log.info("game %d: lease %s released", pid, held.lease or "(not made yet)")
        return True

    def release_all(self) -> None:
        """End every lease (the agent stops), those on their way too."""
        for pid in [*self.held, *self._hinting]:
            self.release(pid)


def _close_pidfd(held: Held) -> None:
    if held.pidfd >= 0:
        os.close(held.pidfd)
        held.pidfd = -1


def _exited(pidfd: int) -> bool:
    """Whether the process of ``pidfd`` has exited (a pidfd polls readable then,
    ``pidfd_open(2)``); a closed one counts as exited."""
    if pidfd < 0:
        return True
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _why(line: bytes) -> str | None:
    """The reason in the daemon's last line (``lease_ended``), or ``None`` when it closed
    the connection without one."""
    with contextlib.suppress(SchedSwitchError):
        return str(check_reply(line.rstrip(b"\n"), "lease_ended").get("why"))
    return None
