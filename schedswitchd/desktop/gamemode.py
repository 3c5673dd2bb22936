"""``schedswitch-gamemode``: GameMode's launchers drive schedswitchd, per user.

Every ``gamemoderun %command%`` in Steam's launch options, Lutris's and Heroic's GameMode
toggles and the programs that link libgamemode register a game with
``com.feralinteractive.GameMode`` on the user's session bus (gamemode's
``daemon/gamemode-dbus.c``; libgamemode's ``lib/client_impl.c`` calls
``RegisterGameByPIDFd`` first and falls back to ``RegisterGame``; Flatpak games go
through the portal, which calls gamemoded's ``ByPID`` methods). This agent turns each
registered game into a hint (``gaming`` unless ``--workload``) held on the daemon's socket
for exactly as long as the game runs (:class:`~schedswitchd.desktop.game_leases.GameLeases`:
the lease is bound to the game's pidfd). Two modes:

- **follow** (gamemoded is installed or owns the name): gamemoded keeps the name and its
  own tweaks; the agent follows its ``GameRegistered`` / ``GameUnregistered`` signals
  (and ``ListGames`` when gamemoded appears, for games registered before).
- **serve** (no gamemoded): the agent owns the name and answers gamemoded's methods with
  gamemoded's return codes, so ``gamemoderun`` and libgamemode work unchanged:
  ``RegisterGame*`` 0, or -1 (already registered, no such process, not a pidfd, or the
  daemon refused the hint; a daemon that cannot be reached is waited for: the game is
  registered and its hint made once the daemon is back); ``UnregisterGame*`` 0 (also for a
  game whose hint is still on its way: it is released, its ``RegisterGame*`` returns -1
  and neither signal is sent for it), or -1 (not registered); ``QueryStatus*`` 0 (no
  game), 1 (games, not this one), 2 (this one);
  ``ListGames`` ``a(io)`` of pid and ``/com/feralinteractive/GameMode/Games/<pid>``;
  ``ClientCount``; the two signals, ``PropertiesChanged`` of ``ClientCount`` with each.

The D-Bus library is sdbus (:mod:`schedswitchd.desktop`), imported by this module only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import shutil
import signal
import sys
from collections.abc import Iterator, Sequence

import sdbus

from schedswitchd import __version__
from schedswitchd.daemon.launcher_wire import DEFAULT_SOCKET, DaemonError
from schedswitchd.daemon.passed_fds import NotAPidfd, pidfd_target
from schedswitchd.desktop.bus import bus_daemon, open_bus, request_name
from schedswitchd.desktop.game_leases import GameLeases, Released
from schedswitchd.errors import SchedSwitchError

log = logging.getLogger("schedswitch-gamemode")

#: gamemoded's bus name, object path and interface (``daemon/gamemode-dbus.c``).
GAMEMODE_NAME = "com.feralinteractive.GameMode"
GAMEMODE_PATH = "/com/feralinteractive/GameMode"
#: A registered game's object path is this prefix, ``/`` and its pid.
GAMES_PATH = GAMEMODE_PATH + "/Games"
#: gamemoded's return codes.
OK, ERROR = 0, -1
#: ``QueryStatus``: no game registered / games, not this one / this one.
INACTIVE, ACTIVE_OTHERS, ACTIVE_THIS = 0, 1, 2


def game_path(pid: int) -> str:
    """The object path gamemoded gives game ``pid`` (``game_object_bus_path``)."""
    return f"{GAMES_PATH}/{pid}"


class ServedGames:
    """The served mode's registry: the games registered with the agent, each holding its
    hint in ``leases``; ``face`` emits the signals."""

    def __init__(self, leases: GameLeases) -> None:
        self.leases = leases
        self.face: GameModeFace | None = None
        leases.on_end = self._ended

    async def register(self, pid: int, pidfd: int | None = None) -> int:
        """Register game ``pid`` (named by ``pidfd`` when the caller passed one, which stays
        the caller's): :data:`OK` once its hint is held, or waits for a daemon that cannot be
        reached (:meth:`GameLeases.hold <schedswitchd.desktop.game_leases.GameLeases.hold>`);
        :data:`ERROR` when the game is not registered."""
        if pid <= 0 or self.leases.holds(pid):
            log.warning("game %d: %s", pid, "already registered" if pid > 0 else "bad pid")
            return ERROR
        opened = None
        try:
            if pidfd is None:
                pidfd = opened = os.pidfd_open(pid)
            await self.leases.hold(pid, pidfd)
        except Released:  # unregistered meanwhile
            return ERROR
        except OSError as exc:
            log.warning("game %d: %s", pid, exc.strerror or exc)
            return ERROR
        except DaemonError as exc:
            log.warning("game %d: the daemon refused the hint: %s", pid, exc)
            return ERROR
        finally:
            if opened is not None:
                os.close(opened)
        self._changed(pid, registered=True)
        return OK

    def unregister(self, pid: int) -> int:
        """End game ``pid``'s hint: :data:`OK`, or :data:`ERROR` if it is not registered.
        A game whose registration is still waiting for the daemon's reply is released too
        (its ``RegisterGame`` then fails), with no ``GameUnregistered``: no
        ``GameRegistered`` was emitted for it."""
        registered = pid in self.leases.held
        if not self.leases.release(pid):
            return ERROR
        if registered:
            self._changed(pid, registered=False)
        return OK

    def status(self, pid: int) -> int:
        """``QueryStatus``: :data:`INACTIVE`, :data:`ACTIVE_OTHERS` or :data:`ACTIVE_THIS`."""
        if not self.leases.held:
            return INACTIVE
        return ACTIVE_THIS if pid in self.leases.held else ACTIVE_OTHERS

    def _ended(self, pid: int) -> None:
        self._changed(pid, registered=False)

    def _changed(self, pid: int, *, registered: bool) -> None:
        face = self.face
        if face is None:
            return
        signal_ = face.game_registered if registered else face.game_unregistered
        signal_.emit((pid, game_path(pid)))
        face.properties_changed.emit(
            (GAMEMODE_NAME, {"ClientCount": ("i", len(self.leases.held))}, [])
        )


def _pid_of(pidfd: int) -> int | None:
    """The pid a pidfd passed on the bus stands for, ``None`` if it is none or exited."""
    try:
        return pidfd_target(pidfd)[0]
    except NotAPidfd as exc:
        log.warning("passed descriptor refused: %s", exc)
        return None


#: How long after a call that passed descriptors the cycle collector runs, s.
COLLECT_AFTER_S = 0.5


@contextlib.contextmanager
def _owned(*fds: int) -> Iterator[None]:
    """Close ``fds`` on the way out: sdbus gives a method the ``h`` arguments' descriptors
    as its own copies. The call's message keeps the bus's copies until it is freed, which
    only the cycle collector does (sdbus's reply task holds it in a cycle): one collection
    is scheduled for after the reply, so a game's start and end leave no descriptor."""
    try:
        yield
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        asyncio.get_running_loop().call_later(COLLECT_AFTER_S, gc.collect)


class GameModeFace(sdbus.DbusInterfaceCommonAsync, interface_name=GAMEMODE_NAME):
    """gamemoded's interface (``daemon/gamemode-dbus.c``): exported in served mode over
    :attr:`games`; as a proxy of gamemoded (follow mode) only its signals are used.
    The ``ByPID`` variants take ``(caller, game)``; the caller is not checked (gamemoded
    checks it only against supervisor lists in its configuration, which this has not)."""

    games: ServedGames

    @sdbus.dbus_method_async("i", "i", method_name="RegisterGame")
    async def register_game(self, pid: int) -> int:
        """``RegisterGame(i) -> i``: register process ``pid`` as a game; :data:`OK` once its
        hint is held, :data:`ERROR` if it is registered already, does not exist, or the
        daemon did not take the hint."""
        return await self.games.register(pid)

    @sdbus.dbus_method_async("i", "i", method_name="UnregisterGame")
    async def unregister_game(self, pid: int) -> int:
        """``UnregisterGame(i) -> i``: end game ``pid``'s hint; :data:`OK`, or :data:`ERROR` if
        it is not registered."""
        return self.games.unregister(pid)

    @sdbus.dbus_method_async("i", "i", method_name="QueryStatus")
    async def query_status(self, pid: int) -> int:
        """``QueryStatus(i) -> i``: :data:`INACTIVE` (no game), :data:`ACTIVE_OTHERS` (games,
        not ``pid``) or :data:`ACTIVE_THIS`."""
        return self.games.status(pid)

    @sdbus.dbus_method_async("ii", "i", method_name="RegisterGameByPID")
    async def register_game_by_pid(self, caller: int, game: int) -> int:
        """``RegisterGameByPID(ii) -> i``: :meth:`register_game` of ``game`` on behalf of
        ``caller`` (the portal's call for sandboxed games; ``caller`` is not checked)."""
        return await self.games.register(game)

    @sdbus.dbus_method_async("ii", "i", method_name="UnregisterGameByPID")
    async def unregister_game_by_pid(self, caller: int, game: int) -> int:
        """``UnregisterGameByPID(ii) -> i``: :meth:`unregister_game` of ``game`` on behalf of
        ``caller`` (not checked)."""
        return self.games.unregister(game)

    @sdbus.dbus_method_async("ii", "i", method_name="QueryStatusByPID")
    async def query_status_by_pid(self, caller: int, game: int) -> int:
        """``QueryStatusByPID(ii) -> i``: :meth:`query_status` of ``game`` on behalf of
        ``caller`` (not checked)."""
        return self.games.status(game)

    @sdbus.dbus_method_async("hh", "i", method_name="RegisterGameByPIDFd")
    async def register_game_by_pidfd(self, game: int, caller: int) -> int:
        """``RegisterGameByPIDFd(hh) -> i``: :meth:`register_game` of the process the pidfd
        ``game`` names (libgamemode's first choice: a pidfd cannot name a reused pid).
        Both descriptors are closed here; :data:`ERROR` also when ``game`` is not a pidfd
        or its process has exited."""
        with _owned(game, caller):
            pid = _pid_of(game)
            return ERROR if pid is None else await self.games.register(pid, game)

    @sdbus.dbus_method_async("hh", "i", method_name="UnregisterGameByPIDFd")
    async def unregister_game_by_pidfd(self, game: int, caller: int) -> int:
        """``UnregisterGameByPIDFd(hh) -> i``: :meth:`unregister_game` of the process the
        pidfd ``game`` names; both descriptors closed here, :data:`ERROR` also for a
        descriptor that is not a live pidfd."""
        with _owned(game, caller):
            pid = _pid_of(game)
            return ERROR if pid is None else self.games.unregister(pid)

    @sdbus.dbus_method_async("hh", "i", method_name="QueryStatusByPIDFd")
    async def query_status_by_pidfd(self, game: int, caller: int) -> int:
        """``QueryStatusByPIDFd(hh) -> i``: :meth:`query_status` of the process the pidfd
        ``game`` names; both descriptors closed here, :data:`ERROR` for a descriptor that is
        not a live pidfd."""
        with _owned(game, caller):
            pid = _pid_of(game)
            return ERROR if pid is None else self.games.status(pid)

    @sdbus.dbus_method_async("", "a(io)", method_name="ListGames")
    async def list_games(self) -> list[tuple[int, str]]:
        """``ListGames() -> a(io)``: each registered game as ``(pid, object path)`` (the path
        from :func:`game_path`), ordered by pid."""
        return [(pid, game_path(pid)) for pid in sorted(self.games.leases.held)]

    @sdbus.dbus_property_async("i", property_name="ClientCount")
    def client_count(self) -> int:
        """``ClientCount`` (``i``, read-only): how many games are registered; changes are sent
        with each ``GameRegistered`` and ``GameUnregistered``."""
        return len(self.games.leases.held)

    @sdbus.dbus_signal_async("io", signal_name="GameRegistered")
    def game_registered(self) -> tuple[int, str]:
        """``GameRegistered(io)``: ``(pid, object path)`` of a game just registered; emitted
        in served mode, received from gamemoded in follow mode."""
        raise NotImplementedError  # emitted, never called

    @sdbus.dbus_signal_async("io", signal_name="GameUnregistered")
    def game_unregistered(self) -> tuple[int, str]:
        """``GameUnregistered(io)``: ``(pid, object path)`` of a game whose registration ended
        (unregistered, or its process exited); emitted in served mode, received from
        gamemoded in follow mode."""
        raise NotImplementedError


async def serve(bus: sdbus.SdBus, leases: GameLeases) -> None:
    """Own :data:`GAMEMODE_NAME` on ``bus`` and answer gamemoded's methods until
    cancelled. Raises :class:`~schedswitchd.errors.BusUnavailableError` naming the owner
    if the name is taken."""
    games = ServedGames(leases)
    face = GameModeFace()
    face.games = games
    games.face = face
    face.export_to_dbus(GAMEMODE_PATH, bus)
    await request_name(bus, GAMEMODE_NAME, "is gamemoded running? (--mode follow follows it)")
    log.info("serving %s: games hold a %r hint", GAMEMODE_NAME, leases.workload)
    try:
        await asyncio.Event().wait()
    finally:
        leases.release_all()


async def follow(bus: sdbus.SdBus, leases: GameLeases) -> None:
    """Follow gamemoded's games on ``bus`` until cancelled: a hint per registered game,
    from its ``GameRegistered`` to its ``GameUnregistered`` (or its exit); all released
    when gamemoded leaves the bus."""
    gamemode = GameModeFace.new_proxy(GAMEMODE_NAME, GAMEMODE_PATH, bus)
    daemon = bus_daemon(bus)
    tasks: set[asyncio.Task[None]] = set()

    def start(pid: int) -> None:
        task = asyncio.get_running_loop().create_task(_hold_followed(leases, pid))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def registered() -> None:
        async for pid, _ in gamemode.game_registered.catch():
            start(pid)

    async def unregistered() -> None:
        async for pid, _ in gamemode.game_unregistered.catch():
            leases.release(pid)

    async def owners() -> None:
        async for name, _, new in daemon.name_owner_changed.catch():
            if name != GAMEMODE_NAME:
                continue
            if new:
                log.info("gamemoded appeared on the bus")
                await catch_up()
            else:
                log.info("gamemoded left the bus: its games' hints end")
                leases.release_all()

    async def catch_up() -> None:
        with contextlib.suppress(sdbus.SdBusBaseError):
            for pid, _ in await gamemode.list_games():
                if not leases.holds(pid):
                    start(pid)

    async def absent() -> None:
        # Installed but neither running nor activatable: games would register with
        # nobody, and the agent would wait silently.
        await asyncio.sleep(GAMEMODED_WAIT_S)
        if not await daemon.name_has_owner(GAMEMODE_NAME):
            log.warning(
                "gamemoded has not appeared on the session bus in %g s and the bus cannot "
                "start it: games get no hint until it runs (--mode serve serves %s instead)",
                GAMEMODED_WAIT_S,
                GAMEMODE_NAME,
            )

    watchers = [asyncio.ensure_future(w()) for w in (registered, unregistered, owners)]
    log.info("following gamemoded's games: each holds a %r hint", leases.workload)
    try:
        if await daemon.name_has_owner(GAMEMODE_NAME):
            await catch_up()
        elif GAMEMODE_NAME not in await daemon.list_activatable_names():
            watchers.append(asyncio.ensure_future(absent()))
        await asyncio.gather(*watchers)
    finally:
        for task in [*watchers, *tasks]:
            task.cancel()
        leases.release_all()


#: How long following waits for gamemoded to own its name before warning, seconds.
GAMEMODED_WAIT_S = 5.0


async def _hold_followed(leases: GameLeases, pid: int) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        log.warning("game %d: %s", pid, exc.strerror or exc)
        return
    try:
        await leases.hold(pid, pidfd)
    except Released:  # unregistered meanwhile
        pass
    except DaemonError as exc:
        log.warning("game %d: the daemon refused the hint: %s", pid, exc)
    except OSError as exc:  # the agent's copy of the pidfd
        log.warning("game %d: %s", pid, exc.strerror or exc)
    finally:
        os.close(pidfd)


def gamemoded_present(has_owner: bool) -> bool:
    """Whether to follow gamemoded: it owns the name now, or it is installed (a
    ``gamemoded`` program on ``$PATH``, which the bus activates for the first game)."""
    return has_owner or shutil.which("gamemoded") is not None


async def run(workload: str, socket: str | None, mode: str) -> None:
    """The agent on the session bus (``$DBUS_SESSION_BUS_ADDRESS``) until cancelled.
    ``mode``: ``auto`` (:func:`gamemoded_present` decides), ``follow`` or ``serve``."""
    bus = open_bus("session")
    leases = GameLeases(workload, socket)
    if mode == "auto":
        daemon = bus_daemon(bus)
        owned = await daemon.name_has_owner(GAMEMODE_NAME)
        mode = "follow" if gamemoded_present(owned) else "serve"
    if mode == "serve":
        await serve(bus, leases)
    else:
        await follow(bus, leases)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``schedswitch-gamemode`` (also its man page's source)."""
    parser = argparse.ArgumentParser(
        prog="schedswitch-gamemode",
        description=(
            "Hold a schedswitchd hint for every game GameMode's launchers (gamemoderun, "
            "libgamemode) register on the session bus, for as long as the game runs: "
            "beside gamemoded, follow its signals; without it, serve its name "
            "com.feralinteractive.GameMode."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--workload", default="gaming", help="the hint each game holds (default: gaming)"
    )
    parser.add_argument(
        "--socket",
        help=f"the daemon's socket (default: $SCHEDSWITCHD_SOCKET or {DEFAULT_SOCKET})",
    )
    parser.add_argument(
        "--mode",
        choices=("auto", "follow", "serve"),
        default="auto",
        help="follow gamemoded's signals, serve its name, or (auto) follow when gamemoded "
        "owns the name or is on $PATH",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: options, logging to stderr (the journal under systemd), run
    until SIGTERM or SIGINT. Exit 0 when stopped, 1 when the bus cannot be used."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)

    async def until_stopped() -> None:
        task = asyncio.ensure_future(run(args.workload, args.socket, args.mode))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        asyncio.run(until_stopped())
    except (sdbus.SdBusBaseError, OSError, SchedSwitchError) as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
