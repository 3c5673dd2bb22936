"""The test buses themselves: a private system bus keeps the system bus's deny-by-default
policy, polkitd answers on it, and leaving the fixtures stops every process they started."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.desktop.buses import Polkitd, PrivateBus, as_nobody, program, system_bus_with_polkit

pytestmark = pytest.mark.root


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_polkitd_answers_on_the_private_system_bus() -> None:
    with PrivateBus("system") as bus, Polkitd(bus) as polkit:
        out = subprocess.run(
            [
                program("busctl"),
                f"--address={bus.address}",
                "get-property",
                Polkitd.NAME,
                "/org/freedesktop/PolicyKit1/Authority",
                "org.freedesktop.PolicyKit1.Authority",
                "BackendName",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        assert out.stdout.startswith('s "js"'), out.stdout
        assert polkit.proc is not None and bus.proc is not None
        pids = polkit.proc.pid, bus.proc.pid
    assert not any(_alive(p) for p in pids)
    assert not bus.dir.exists()


def test_the_system_bus_denies_owning_a_name_no_policy_file_opens() -> None:
    with system_bus_with_polkit() as bus:
        out = subprocess.run(
            as_nobody(
                [
                    program("busctl"),
                    f"--address={bus.address}",
                    "call",
                    "org.freedesktop.DBus",
                    "/org/freedesktop/DBus",
                    "org.freedesktop.DBus",
                    "RequestName",
                    "su",
                    "org.scx.Loader",
                    "0",
                ]
            ),
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        assert out.returncode != 0
        assert "Access denied" in out.stderr, out.stderr


def test_session_bus_lets_anyone_own_a_name(session_bus: PrivateBus) -> None:
    out = subprocess.run(
        [
            program("busctl"),
            f"--address={session_bus.address}",
            "call",
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "RequestName",
            "su",
            "com.example.Test",
            "0",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )
    assert out.stdout.strip() == "u 1"  # DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER
