"""What the faces say when a bus cannot be used: no bus at the address (a socket that does
not exist), or the name already owned by another connection (a real second owner on a
private bus): the address and errno's text, or the owner's unique name, pid and command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from schedswitchd.desktop.bus import open_bus
from schedswitchd.errors import BusUnavailableError
from tests.desktop.buses import PrivateBus

AGENT = [sys.executable, "-m", "schedswitchd.desktop.gamemode"]
GAMEMODE_NAME = "com.feralinteractive.GameMode"


def test_no_bus_at_the_address_names_it_and_the_errno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"unix:path={tmp_path}/missing"
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", address)
    with pytest.raises(BusUnavailableError) as got:
        open_bus("system")
    assert str(got.value) == (
        f"cannot connect to the system bus at {address}: No such file or directory"
    )
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with pytest.raises(BusUnavailableError, match=r"session bus at the default address "
                       r"\(\$DBUS_SESSION_BUS_ADDRESS unset\): "):  # fmt: skip
        open_bus("session")


def test_the_agent_without_a_session_bus_says_where_it_looked(tmp_path: Path) -> None:
    address = f"unix:path={tmp_path}/missing"
    env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": address}
    out = subprocess.run(
        [*AGENT, "--mode", "serve", "--socket", str(tmp_path / "s.sock")],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert out.returncode == 1
    assert (
        f"cannot connect to the session bus at {address}: No such file or directory" in out.stderr
    ), out.stderr
    assert "sd_bus_internals" not in out.stderr


def test_the_agent_names_who_owns_gamemodes_name(session_bus: PrivateBus, tmp_path: Path) -> None:
    sock = str(tmp_path / "s.sock")
    first = subprocess.Popen(
        [*AGENT, "--mode", "serve", "--socket", sock], env=session_bus.env(),
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        session_bus.wait_for_name(GAMEMODE_NAME)
        out = subprocess.run(
            [*AGENT, "--mode", "serve", "--socket", sock],
            env=session_bus.env(), capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert out.returncode == 1
        comm = Path(f"/proc/{first.pid}/comm").read_text().strip()
        assert f"{GAMEMODE_NAME} is owned by :1." in out.stderr, out.stderr
        assert f" (pid {first.pid}, {comm}); is gamemoded running?" in out.stderr, out.stderr
    finally:
        first.terminate()
        first.wait(10)
