"""The power profile face between real peers: a private system bus with the real polkitd
and the real power-profiles-daemon (0.12 on Debian 12: ``net.hadess.PowerProfiles``,
placeholder driver), switched by the real ``powerprofilesctl``; the face runs in the real
server's loop (the daemon tests' fake backend behind it) through DaemonControl."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from schedswitchd.daemon.config import DbusConfig
from schedswitchd.daemon.control import DaemonControl
from schedswitchd.desktop import power_profiles
from schedswitchd.desktop.bus import Buses
from tests.daemon.harness import Running
from tests.desktop.buses import PrivateBus, missing_program, program

#: Where Debian installs power-profiles-daemon (not on ``$PATH``).
PPD = "/usr/libexec/power-profiles-daemon"
HADESS = "net.hadess.PowerProfiles"


def _ppd_program() -> str:
    if not os.access(PPD, os.X_OK):
        missing_program("powerprofilesctl")
    return PPD


@contextmanager
def _ppd(bus: PrivateBus) -> Iterator[subprocess.Popen[bytes]]:
    """power-profiles-daemon on ``bus``; it starts at ``balanced`` (it cannot read a saved
    state: ``/var/lib/power-profiles-daemon`` is not there, or was left as it was)."""
    daemon = subprocess.Popen(
        [_ppd_program()], env=bus.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        bus.wait_for_name(HADESS)
        yield daemon
    finally:
        daemon.terminate()
        daemon.wait(10)


def _set(bus: PrivateBus, profile: str) -> None:
    subprocess.run(
        [program("powerprofilesctl"), "set", profile], env=bus.env(), check=True, timeout=20
    )


def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def srv(
    system_bus: PrivateBus,
    monkeypatch: pytest.MonkeyPatch,
    start_server: Callable[..., Running],
) -> Running:
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", system_bus.address)
    running = start_server()
    dbus = DbusConfig(scx_loader=False, power_profiles={"power-saver": "battery"})
    running.read(lambda s: s.apply_config(s.config.model_copy(update={"dbus": dbus})))
    return running


def _leases(srv: Running) -> list[str]:
    return srv.read(lambda s: sorted(lease.workload for lease in s.policy.leases.values()))


def _active(srv: Running) -> str:
    return srv.read(lambda s: s.switcher.active)


def test_the_power_profile_moves_a_low_priority_lease(system_bus: PrivateBus, srv: Running) -> None:
    if os.path.exists("/var/lib/power-profiles-daemon/state.ini"):
        pytest.skip("power-profiles-daemon would start from this host's saved profile")
    buses = Buses()
    control = srv.read(DaemonControl)
    face = srv.run(power_profiles.start(control, buses))
    assert face is not None
    try:
        assert face.profile is None and not _leases(srv)  # no power-profiles-daemon yet
        with _ppd(system_bus):
            _until(lambda: face.profile == "balanced")  # it appeared: read at once
            assert not _leases(srv)
            _set(system_bus, "power-saver")
            _until(lambda: _leases(srv) == ["battery"])
            srv.wait_for(lambda s: s.switcher.active == "fifo")
            # a game's hint (priority 50) wins over the profile's (10), which stays
            game = srv.client()
            assert game.request(op="hint", workload="gaming")["active"] == "gaming"
            assert _leases(srv) == ["battery", "gaming"]
            game.close()
            srv.wait_for(lambda s: s.switcher.active == "fifo")
            _set(system_bus, "balanced")
            _until(lambda: not _leases(srv))
            srv.wait_for(lambda s: s.switcher.active == "kernel")
            _set(system_bus, "power-saver")
            _until(lambda: _leases(srv) == ["battery"])
        # power-profiles-daemon left the bus: the lease ends with it
        _until(lambda: not _leases(srv) and face.profile is None)
        srv.wait_for(lambda s: s.switcher.active == "kernel")
        with _ppd(system_bus):
            _until(lambda: face.profile == "balanced")
            assert not _leases(srv)
    finally:
        srv.run(face.close())
        srv.run(_close(buses))
    assert not _leases(srv)


async def _close(buses: Buses) -> None:
    buses.close()


def test_no_face_without_a_mapping(srv: Running) -> None:
    srv.read(lambda s: s.apply_config(s.config.model_copy(update={"dbus": DbusConfig()})))
    assert srv.run(power_profiles.start(srv.read(DaemonControl), Buses())) is None
