"""The launcher's pydantic-free hint exchange agrees with the protocol and the live server."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.launcher_wire import (
    LauncherConnection,
    LauncherRefused,
    LauncherUnavailable,
)
from schedswitchd.errors import ProtocolError

from .fakes import FakeBackend
from .harness import Running


@pytest.fixture
def srv() -> Iterator[Running]:
    running = Running(FakeBackend())
    yield running
    running.stop()


def test_launcher_path_imports_neither_pydantic_nor_asyncio() -> None:
    code = (
        "import sys, schedswitchd.cli.run; "
        "print(sorted(m for m in ('pydantic', 'pydantic_core', 'asyncio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_hint_through_the_live_server_and_lease_ends_on_close(srv: Running) -> None:
    conn = LauncherConnection(srv.path, timeout_s=10)
    reply = conn.exchange({"op": "hint", "workload": "gaming"})
    assert reply["op"] == "hint" and isinstance(reply["lease"], str)
    assert reply["active"] == "gaming"
    srv.wait_for(lambda s: len(s.policy.leases) == 1)
    conn.close()
    srv.wait_for(lambda s: not s.policy.leases)


def test_refusal_carries_the_servers_code(srv: Running) -> None:
    conn = LauncherConnection(srv.path, timeout_s=10)
    with pytest.raises(LauncherRefused) as err:
        conn.exchange({"op": "hint", "workload": "no-such"})
    assert err.value.code == proto.UNKNOWN_WORKLOAD
    conn.close()


def test_what_it_sends_is_the_protocols_hint_request() -> None:
    a, b = socket.socketpair()
    got: list[bytes] = []

    def answer() -> None:
        line = b.recv(4096)
        got.append(line)
        b.sendall(b'{"v":1,"ok":true,"op":"hint","lease":"1-a","desired":"x","active":"x"}\n')

    t = threading.Thread(target=answer)
    t.start()
    conn = LauncherConnection.__new__(LauncherConnection)
    conn.path, conn.sock, conn._buffer = "pair", a, b""
    conn.exchange({"op": "hint", "workload": "gaming"})
    t.join()
    request = proto.parse_request(got[0])
    assert isinstance(request, proto.HintRequest) and request.workload == "gaming"
    a.close()
    b.close()


def test_a_prepare_intent_is_the_protocols_prepare_request() -> None:
    line = json.dumps({"v": 1, "op": "prepare", "workload": "gaming", "ttl_s": 30.0}).encode()
    request = proto.parse_request(line)
    assert isinstance(request, proto.PrepareRequest) and request.ttl_s == 30.0


@pytest.mark.parametrize(
    "reply",
    [
        b"not json\n",
        b"[1]\n",
        b'{"v":2,"ok":true,"op":"hint"}\n',
        b'{"v":1,"ok":true,"op":"status"}\n',
        b'{"v":1,"ok":false,"error":"x"}\n',
        b"x" * (1 << 17),
    ],
)
def test_malformed_replies_are_protocol_errors(reply: bytes) -> None:
    a, b = socket.socketpair()
    b.sendall(reply)
    conn = LauncherConnection.__new__(LauncherConnection)
    conn.path, conn.sock, conn._buffer = "pair", a, b""
    with pytest.raises(ProtocolError):
        conn.exchange({"op": "hint", "workload": "gaming"})
    a.close()
    b.close()


def test_closed_connection_is_unavailable() -> None:
    a, b = socket.socketpair()
    b.close()
    conn = LauncherConnection.__new__(LauncherConnection)
    conn.path, conn.sock, conn._buffer = "pair", a, b""
    with pytest.raises(LauncherUnavailable):
        conn.exchange({"op": "hint", "workload": "gaming"})
    a.close()


def test_wait_closed_tolerates_a_concurrent_close() -> None:
    a, b = socket.socketpair()
    conn = LauncherConnection.__new__(LauncherConnection)
    conn.path, conn.sock, conn._buffer = "pair", a, b""
    conn.close()
    conn.wait_closed()  # the race schedswitch-run's holder thread can lose: must not raise
    b.close()
