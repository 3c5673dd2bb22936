"""The launcher's pydantic-free hint exchange agrees with the protocol and the live server."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedswitchd.daemon import launcher_wire as wire
from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.launcher_wire import (
    DaemonError,
    DaemonUnavailable,
    LauncherConnection,
)
from schedswitchd.errors import ProtocolError
from tests import fuzzing

from .harness import Running

REPO = Path(__file__).resolve().parents[2]


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
    with pytest.raises(DaemonError) as err:
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
    with pytest.raises(DaemonUnavailable):
        conn.exchange({"op": "hint", "workload": "gaming"})
    a.close()


def test_wait_closed_tolerates_a_concurrent_close() -> None:
    a, b = socket.socketpair()
    conn = LauncherConnection.__new__(LauncherConnection)
    conn.path, conn.sock, conn._buffer = "pair", a, b""
    conn.close()
    conn.wait_closed()  # the race schedswitch-run's holder thread can lose: must not raise
    b.close()


# --- loads / dumps: json's results without importing json ---------------------------------

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def _outcome(fn: Callable[[], object]) -> tuple[str, str]:
    """What ``fn()`` gives, comparable across NaN: its value as JSON, or its exception."""
    try:
        value = fn()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "value", json.dumps(value)


@settings(max_examples=fuzzing.examples(3000), deadline=None)
@given(
    st.one_of(
        _VALUES.map(lambda v: json.dumps(v, separators=(",", ":")).encode()),
        _VALUES.map(lambda v: json.dumps(v, ensure_ascii=False, indent=1).encode()),
        _VALUES.map(lambda v: json.dumps(v).encode("utf-16")),
        st.binary(max_size=40),
        # raw characters in a string (control characters: strict JSON refuses them)
        st.text(max_size=10).map(lambda t: f'{{"k":"{t}"}}'.encode("utf-8", "surrogatepass")),
        st.text(alphabet='{}[]":,0123456789.eE+-tfnulrsaINy \t\n\\', max_size=30).map(str.encode),
    )
)
def test_loads_is_json_loads(line: bytes) -> None:
    """The same value, or the same exception with the same message, for JSON lines as the
    daemon writes them and for anything else."""
    assert _outcome(lambda: wire.loads(line)) == _outcome(lambda: json.loads(line))


@settings(max_examples=fuzzing.examples(3000), deadline=None)
@given(
    st.one_of(
        st.dictionaries(st.text(max_size=8), _SCALARS, max_size=5),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers()), _VALUES, max_size=3),
    )
)
def test_dumps_is_json_dumps(request: dict[Any, Any]) -> None:
    assert wire.dumps(request) == json.dumps(request, separators=(",", ":")).encode()


def test_a_request_and_a_reply_take_neither_json_nor_re() -> None:
    """In a fresh interpreter (without site, whose import hooks may load re): a request and
    a daemon's reply line pass without importing json, and a line that is not JSON fails
    with json's own error (the C scanner's error path needs json.decoder loaded)."""
    code = (
        "import sys\n"
        "from schedswitchd.daemon import launcher_wire as w\n"
        "assert w.dumps({'v': 1, 'op': 'hint', 'workload': 'g\\u00e9', 'pid': 5}) == "
        'b\'{"v":1,"op":"hint","workload":"g\\\\u00e9","pid":5}\'\n'
        'assert w.loads(b\'{"v":1,"ok":true,"x":[1.5,null,"\\\\u00e9"]}\')[\'x\'] == '
        "[1.5, None, '\\u00e9']\n"
        "print(sorted(m for m in ('json', 're', 'enum') if m in sys.modules))\n"
        "try:\n"
        "    w.loads(b'{\"v\" 1}')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__module__, type(exc).__name__, exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n" + code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines() == [
        "[]",
        "json.decoder JSONDecodeError Expecting ':' delimiter: line 1 column 6 (char 5)",
    ], out.stderr
