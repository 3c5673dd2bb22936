"""``schedswitch-gamemode`` between real peers: a private session bus, the real gamemoded
(follow mode) or none (the agent serves its name), the real ``gamemoderun`` and busctl,
and the real server on a real socket (the daemon tests' fake backend behind it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.daemon.harness import Running
from tests.desktop.buses import PrivateBus, program

GAMEMODE = ("com.feralinteractive.GameMode", "/com/feralinteractive/GameMode")
GAMEMODERUN = "/usr/games/gamemoderun"


def _gamemoderun() -> str:
    if not os.access(GAMEMODERUN, os.X_OK):
        program("gamemoded")  # skips (fails in the full suite) naming the package
        pytest.skip(f"{GAMEMODERUN} is missing: install Debian's gamemode (make deps)")
    return GAMEMODERUN


@contextmanager
def _agent(
    bus: PrivateBus, srv: Running, *options: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    argv = [sys.executable, "-m", "schedswitchd.desktop.gamemode", "--socket", srv.path]
    agent = subprocess.Popen([*argv, *options], env=env or bus.env())
    try:
        yield agent
    finally:
        agent.terminate()
        assert agent.wait(10) == 0


@contextmanager
def _gamemoded(bus: PrivateBus) -> Iterator[None]:
    daemon = subprocess.Popen(
        [program("gamemoded")], env=bus.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        bus.wait_for_name(GAMEMODE[0])
        yield
    finally:
        daemon.terminate()
        daemon.wait(10)


def _leases(srv: Running) -> list[tuple[str, int | None]]:
    return srv.read(lambda s: [(lease.workload, lease.pid) for lease in s.policy.leases.values()])


def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _game_holds_its_hint(bus: PrivateBus, srv: Running) -> None:
    """``gamemoderun sleep 2``: a gaming lease bound to its pid while it runs, none after."""
    game = subprocess.Popen([_gamemoderun(), "sleep", "2"], env=bus.env())
    try:
        _until(lambda: _leases(srv) == [("gaming", game.pid)])
        # The lease is in before the pass that switches for it has run.
        srv.wait_for(lambda s: s.switcher.active == "gaming")
        assert game.poll() is None
        assert game.wait(10) == 0
        _until(lambda: not _leases(srv))
        srv.wait_for(lambda s: s.switcher.active == "kernel")
    finally:
        game.kill()
        game.wait()


def _call(bus: PrivateBus, method: str, signature: str = "", *args: object) -> str:
    """``busctl call`` of gamemode's ``method``; its reply's data (``i 0``)."""
    out = subprocess.run(
        [program("busctl"), f"--address={bus.address}", "call", *GAMEMODE, GAMEMODE[0], method]
        + ([signature, *map(str, args)] if signature else []),
        capture_output=True,
        text=True,
        check=True,
        timeout=20,
    )
    return out.stdout.strip()


def test_the_agent_follows_gamemoded(session_bus: PrivateBus, srv: Running) -> None:
    _gamemoderun()
    with _gamemoded(session_bus):
        early = subprocess.Popen([GAMEMODERUN, "sleep", "30"], env=session_bus.env())
        try:
            pids = (early.pid, early.pid)
            _until(lambda: _call(session_bus, "QueryStatusByPID", "ii", *pids) == "i 2")
            # auto: gamemoded owns the name, so the agent follows it and leaves it the name
            with _agent(session_bus, srv):
                # a game registered before the agent came is taken from ListGames
                _until(lambda: _leases(srv) == [("gaming", early.pid)])
                early.terminate()
                early.wait()
                _until(lambda: not _leases(srv))
                _game_holds_its_hint(session_bus, srv)
                # a game that unregisters while it runs ends its hint at once
                game = subprocess.Popen(["sleep", "30"])
                try:
                    assert _call(session_bus, "RegisterGame", "i", game.pid) == "i 0"
                    _until(lambda: _leases(srv) == [("gaming", game.pid)])
                    assert _call(session_bus, "UnregisterGame", "i", game.pid) == "i 0"
                    _until(lambda: not _leases(srv))
                finally:
                    game.kill()
                    game.wait()
        finally:
            early.kill()
            early.wait()


def test_the_agent_serves_gamemodes_name(session_bus: PrivateBus, srv: Running) -> None:
    _gamemoderun()
    # auto without a gamemoded on $PATH: the agent owns the name
    with _agent(session_bus, srv, env=session_bus.env() | {"PATH": "/nonexistent"}) as agent:
        session_bus.wait_for_name(GAMEMODE[0])
        fds = f"/proc/{agent.pid}/fd"
        # RegisterGameByPIDFd and UnregisterGameByPIDFd pass 2 pidfds each: the agent's
        # descriptors do not grow with the games (the last call's message may keep its own)
        subprocess.run([_gamemoderun(), "true"], env=session_bus.env(), check=True)
        time.sleep(1)  # the first call's own set-up (sd-bus, asyncio) settles
        before = len(os.listdir(fds))
        for _ in range(3):
            subprocess.run([_gamemoderun(), "true"], env=session_bus.env(), check=True)
        _until(lambda: len(os.listdir(fds)) <= before)
        monitor = subprocess.Popen(
            [program("busctl"), f"--address={session_bus.address}", "monitor", GAMEMODE[0]],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            _game_holds_its_hint(session_bus, srv)
            game = subprocess.Popen(["sleep", "30"])
            other = subprocess.Popen(["sleep", "30"])
            try:
                assert _call(session_bus, "QueryStatus", "i", game.pid) == "i 0"
                assert _call(session_bus, "RegisterGame", "i", game.pid) == "i 0"
                assert _leases(srv) == [("gaming", game.pid)]
                assert _call(session_bus, "RegisterGame", "i", game.pid) == "i -1"
                assert _call(session_bus, "QueryStatus", "i", game.pid) == "i 2"
                assert _call(session_bus, "QueryStatusByPID", "ii", 1, other.pid) == "i 1"
                assert _call(session_bus, "RegisterGameByPID", "ii", 1, other.pid) == "i 0"
                listed = _call(session_bus, "ListGames")
                for pid in sorted((game.pid, other.pid)):
                    assert f'{pid} "/com/feralinteractive/GameMode/Games/{pid}"' in listed
                count = subprocess.run(
                    [program("busctl"), f"--address={session_bus.address}", "get-property",
                     *GAMEMODE, GAMEMODE[0], "ClientCount"],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                assert count.stdout.strip() == "i 2"
                assert _call(session_bus, "UnregisterGame", "i", game.pid) == "i 0"
                assert _call(session_bus, "UnregisterGame", "i", game.pid) == "i -1"
                assert _leases(srv) == [("gaming", other.pid)]
                # a game that exits without unregistering: its hint ends, the signal says so
                other.kill()
                other.wait()
                _until(lambda: not _leases(srv))
                _until(lambda: _call(session_bus, "QueryStatus", "i", other.pid) == "i 0")
                assert _call(session_bus, "RegisterGame", "i", other.pid) == "i -1"  # gone
            finally:
                for proc in (game, other):
                    proc.kill()
                    proc.wait()
        finally:
            time.sleep(0.5)
            monitor.terminate()
            seen, _ = monitor.communicate(timeout=10)
    for member, pid in [
        ("GameRegistered", game.pid),
        ("GameUnregistered", game.pid),
        ("GameRegistered", other.pid),
        ("GameUnregistered", other.pid),
    ]:
        assert f"Member={member}" in seen
        assert f"INT32 {pid};" in seen or f"INT32 {pid}\n" in seen, (member, pid)


def test_a_refused_hint_is_a_failed_registration(session_bus: PrivateBus, srv: Running) -> None:
    """The daemon refuses the hint (no rule for the workload): RegisterGame says -1, and no
    game is registered."""
    with _agent(session_bus, srv, "--mode", "serve", "--workload", "nope"):
        session_bus.wait_for_name(GAMEMODE[0])
        game = subprocess.Popen(["sleep", "30"])
        try:
            assert _call(session_bus, "RegisterGame", "i", game.pid) == "i -1"
            assert _call(session_bus, "QueryStatus", "i", game.pid) == "i 0"
        finally:
            game.kill()
            game.wait()


def test_the_agent_hints_again_after_the_daemon_restarts(session_bus: PrivateBus) -> None:
    """The daemon stops under a live agent while a registered game runs (its leases go with
    it) and comes back on the same socket: the agent hints for the game again by itself,
    the game stays registered, and its lease ends when it exits."""
    srv = Running()
    game = subprocess.Popen(["sleep", "60"])
    try:
        with _agent(session_bus, srv, "--mode", "serve"):
            session_bus.wait_for_name(GAMEMODE[0])
            assert _call(session_bus, "RegisterGame", "i", game.pid) == "i 0"
            _until(lambda: _leases(srv) == [("gaming", game.pid)])
            directory = srv.dir
            srv.stop()  # its lease ends with it; the socket is gone
            time.sleep(1)  # the agent tries a closed socket meanwhile
            assert _call(session_bus, "QueryStatus", "i", game.pid) == "i 2"
            srv = Running(directory=directory)
            _until(lambda: _leases(srv) == [("gaming", game.pid)])
            srv.wait_for(lambda s: s.switcher.active == "gaming")
            assert _call(session_bus, "QueryStatus", "i", game.pid) == "i 2"
            game.kill()
            game.wait()
            _until(lambda: not _leases(srv))
            _until(lambda: _call(session_bus, "QueryStatus", "i", game.pid) == "i 0")
    finally:
        game.kill()
        game.wait()
        if not srv.loop.is_closed():  # not the one stopped above
            srv.stop()


def test_a_game_registered_while_the_daemon_is_down_is_hinted_once_it_is_back(
    session_bus: PrivateBus,
) -> None:
    """No daemon on the agent's socket when a game registers (``gamemoderun``, then
    ``RegisterGame``): both registrations succeed, and once the daemon starts on that
    socket each game holds its hint, which ends when the game exits."""
    _gamemoderun()
    srv = Running()
    directory = srv.dir
    srv.stop()  # the socket's path, with nothing listening there
    game = subprocess.Popen(["sleep", "60"])
    try:
        with _agent(session_bus, srv, "--mode", "serve"):
            session_bus.wait_for_name(GAMEMODE[0])
            launched = subprocess.Popen(
                [_gamemoderun(), "sleep", "60"], env=session_bus.env(), stderr=subprocess.PIPE
            )
            try:
                assert _call(session_bus, "RegisterGame", "i", game.pid) == "i 0"
                _until(lambda: _call(session_bus, "QueryStatus", "i", launched.pid) == "i 2")
                assert _call(session_bus, "QueryStatus", "i", game.pid) == "i 2"
                srv = Running(directory=directory)
                _until(
                    lambda: (
                        sorted(_leases(srv), key=str)
                        == sorted([("gaming", game.pid), ("gaming", launched.pid)], key=str)
                    )
                )
                srv.wait_for(lambda s: s.switcher.active == "gaming")
                game.kill()
                game.wait()
                _until(lambda: _leases(srv) == [("gaming", launched.pid)])
                _until(lambda: _call(session_bus, "QueryStatus", "i", game.pid) != "i 2")
            finally:
                launched.kill()
                _, err = launched.communicate(timeout=10)
            # libgamemode prints a refused registration as "gamemodeauto: ..." on stderr
            assert b"gamemodeauto" not in err, err
            _until(lambda: not _leases(srv))
    finally:
        game.kill()
        game.wait()
        if not srv.loop.is_closed():  # not the one stopped above
            srv.stop()


def test_a_game_gamemoded_registers_while_the_daemon_is_down_is_hinted_later(
    session_bus: PrivateBus,
) -> None:
    """Following the real gamemoded with no daemon on the socket: the game ``gamemoderun``
    registers gets its hint once the daemon starts, and it ends when the game exits."""
    _gamemoderun()
    srv = Running()
    directory = srv.dir
    srv.stop()
    with _gamemoded(session_bus), _agent(session_bus, srv, "--mode", "follow"):
        game = subprocess.Popen([GAMEMODERUN, "sleep", "60"], env=session_bus.env())
        try:
            pids = (game.pid, game.pid)
            _until(lambda: _call(session_bus, "QueryStatusByPID", "ii", *pids) == "i 2")
            time.sleep(0.5)  # the agent tries the missing socket meanwhile
            srv = Running(directory=directory)
            _until(lambda: _leases(srv) == [("gaming", game.pid)])
            game.kill()
            game.wait()
            _until(lambda: not _leases(srv))
        finally:
            game.kill()
            game.wait()
            if not srv.loop.is_closed():
                srv.stop()


def _agent_logging(
    bus: PrivateBus, srv: Running, log: Path, *options: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "schedswitchd.desktop.gamemode", "--socket", srv.path]
    with log.open("wb") as out:
        return subprocess.Popen([*argv, *options], env=env or bus.env(), stderr=out)


def _stop(agent: subprocess.Popen[bytes]) -> None:
    agent.terminate()
    assert agent.wait(10) == 0


def test_the_agent_logs_why_a_games_scheduler_does_not_run(
    session_bus: PrivateBus, srv: Running, tmp_path: Path
) -> None:
    """A lease whose switch failed: the agent's log line says why, as schedswitch-run does."""
    srv.backend.verifier_reject.add("broken")
    log = tmp_path / "agent.log"
    agent = _agent_logging(session_bus, srv, log, "--mode", "serve", "--workload", "broken")
    game = subprocess.Popen(["sleep", "30"])
    try:
        session_bus.wait_for_name(GAMEMODE[0])
        assert _call(session_bus, "RegisterGame", "i", game.pid) == "i 0"
        _until(lambda: f"game {game.pid}: lease " in log.read_text())
        line = next(x for x in log.read_text().splitlines() if f"game {game.pid}: lease " in x)
        assert "broken -> running kernel (switch to broken failed: " in line, line
    finally:
        game.kill()
        game.wait()
        _stop(agent)


def test_the_agent_warns_when_gamemoded_never_comes(
    session_bus: PrivateBus, srv: Running, tmp_path: Path
) -> None:
    """auto with a ``gamemoded`` on ``$PATH`` that neither runs nor is activatable on the
    bus: the agent follows, and warns once the wait for gamemoded is over."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "gamemoded").write_text("#!/bin/sh\nexit 1\n")
    (fake / "gamemoded").chmod(0o755)
    log = tmp_path / "agent.log"
    env = session_bus.env() | {"PATH": f"{fake}:{os.environ['PATH']}"}
    agent = _agent_logging(session_bus, srv, log, env=env)
    try:
        _until(lambda: "gamemoded has not appeared" in log.read_text(), timeout_s=30)
        text = log.read_text()
        assert "following gamemoded's games" in text
        assert "--mode serve serves com.feralinteractive.GameMode instead" in text, text
    finally:
        _stop(agent)
