"""The GameMode agent's leases (:mod:`schedswitchd.desktop.game_leases`) and its served
registry (:class:`~schedswitchd.desktop.gamemode.ServedGames`) against a real daemon (its
server over the tests' fake backend), for what the agent's D-Bus tests cannot time: a game
released while the daemon has made its lease but not yet replied."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest

from schedswitchd.desktop.game_leases import GameLeases, Released
from schedswitchd.desktop.gamemode import ERROR, OK, ServedGames
from tests.daemon.fakes import FakeBackend
from tests.daemon.harness import Running


def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _leases(srv: Running) -> list[int | None]:
    return srv.read(lambda s: [lease.pid for lease in s.policy.leases.values()])


@dataclass
class Gated:
    """A real daemon whose hints' switches wait in the fake backend's prepare until
    ``gate`` is set (no reply before that), and a running game process."""

    gate: threading.Event
    backend: FakeBackend
    srv: Running
    game: subprocess.Popen[bytes]


@pytest.fixture
def gated() -> Iterator[Gated]:
    gate = threading.Event()
    backend = FakeBackend(gate=gate)
    srv = Running(backend)
    game = subprocess.Popen(["sleep", "30"])
    try:
        yield Gated(gate, backend, srv, game)
    finally:
        gate.set()
        game.kill()
        game.wait()
        srv.stop()


def test_a_game_released_before_the_reply_leaves_no_lease(gated: Gated) -> None:
    gate, backend, srv, game = gated.gate, gated.backend, gated.srv, gated.game
    pidfd = os.pidfd_open(game.pid)

    async def scenario() -> None:
        leases = GameLeases("gaming", srv.path)
        hold = asyncio.ensure_future(leases.hold(game.pid, pidfd))
        # The daemon made the lease and switches; its reply waits for the switch (the
        # lease is made before the switch's prepare starts).
        await asyncio.to_thread(
            _until, lambda: _leases(srv) == [game.pid] and backend.preparing.is_set()
        )
        assert not hold.done()
        assert leases.holds(game.pid)
        assert leases.release(game.pid)  # the game unregisters now
        assert not leases.release(game.pid)  # once
        gate.set()
        with pytest.raises(Released):
            await hold
        assert not leases.holds(game.pid) and game.pid not in leases.held
        # Its connection closed: the daemon ended the lease, the game still running.
        await asyncio.to_thread(_until, lambda: _leases(srv) == [])
        assert game.poll() is None
        # Registered again, it holds a hint as any game does.
        held = await leases.hold(game.pid, pidfd)
        assert held.lease and _leases(srv) == [game.pid]
        leases.release_all()
        await asyncio.to_thread(_until, lambda: _leases(srv) == [])

    try:
        asyncio.run(scenario())
    finally:
        gate.set()
        os.close(pidfd)


class _Signal:
    def __init__(self, name: str, sent: list[tuple[str, object]]) -> None:
        self.name, self.sent = name, sent

    def emit(self, args: object) -> None:
        self.sent.append((self.name, args))


class _Face:
    """What :class:`ServedGames` emits through its D-Bus face, in order (the face's own
    emission over a real bus is the agent's D-Bus tests')."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []
        self.game_registered = _Signal("GameRegistered", self.sent)
        self.game_unregistered = _Signal("GameUnregistered", self.sent)
        self.properties_changed = _Signal("PropertiesChanged", self.sent)

    def games(self) -> list[tuple[str, object]]:
        return [(name, args) for name, args in self.sent if name != "PropertiesChanged"]


def test_a_game_unregistered_before_the_reply_is_never_announced(gated: Gated) -> None:
    gate, srv, game = gated.gate, gated.srv, gated.game
    path = f"/com/feralinteractive/GameMode/Games/{game.pid}"

    async def scenario() -> None:
        games = ServedGames(GameLeases("gaming", srv.path))
        face = _Face()
        games.face = cast(Any, face)
        register = asyncio.ensure_future(games.register(game.pid))
        await asyncio.to_thread(_until, lambda: _leases(srv) == [game.pid])
        assert not register.done()
        assert await games.register(game.pid) == ERROR  # registered already, on its way
        assert games.unregister(game.pid) == OK
        assert games.unregister(game.pid) == ERROR
        gate.set()
        assert await register == ERROR
        assert face.sent == []  # no GameUnregistered for a game never announced
        await asyncio.to_thread(_until, lambda: _leases(srv) == [])
        # A registration that completes is announced, and so is its end.
        assert await games.register(game.pid) == OK
        assert games.unregister(game.pid) == OK
        assert face.games() == [
            ("GameRegistered", (game.pid, path)),
            ("GameUnregistered", (game.pid, path)),
        ]
        await asyncio.to_thread(_until, lambda: _leases(srv) == [])

    asyncio.run(scenario())
