"""A test per trick of :mod:`schedswitchd.cpython_internals`: each fails, naming the trick and
what moved, when this CPython no longer gives the trick what it leans on (its fallback runs),
or when the launch line or ``status`` imports the public module the trick keeps out.

The two command lines run in fresh interpreters (``python -S -X importtime``, this checkout
first on ``sys.path``: a regular install's start, without the development venv's import
hooks) against a live server with a fake backend; ``-X importtime`` names who imported a
module that should not be there.
"""

from __future__ import annotations

import _json
import asyncio
import inspect
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schedswitchd import cpython_internals as internals
from tests.daemon.fakes import FakeBackend
from tests.daemon.harness import Running

REPO = Path(__file__).resolve().parents[1]
PAGE = "docs/performance.md"


@dataclass(frozen=True)
class Line:
    """One command line's run: what ``sys.modules`` held at its end and ``-X importtime``'s
    lines (``(depth, module)`` in the order printed: a module after what it imported)."""

    name: str
    modules: frozenset[str]
    imports: tuple[tuple[int, str], ...]

    def importer_chain(self, module: str) -> str:
        """``module <- its importer <- ...``, up to the import at the top of the run."""
        for i, (depth, name) in enumerate(self.imports):
            if name != module:
                continue
            chain = [name]
            for later_depth, later in self.imports[i + 1 :]:
                if later_depth < depth:
                    chain.append(later)
                    depth = later_depth
            if len(chain) == 1:
                chain.append("a function's own import, at run time")
            return " <- ".join(chain)
        return f"{module} (not in -X importtime's lines)"


def _run_line(name: str, module: str, argv: list[str]) -> Line:
    probe = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        f"from schedswitchd.cli import {module}\n"
        f"code = {module}.main(sys.argv[1:])\n"
        "print('modules:' + ','.join(sorted(sys.modules)), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-X", "importtime", "-c", probe, *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"{name} failed: {out.stderr}"
    lines = out.stderr.splitlines()
    modules = next(x for x in reversed(lines) if x.startswith("modules:"))
    imports = []
    for text in lines:
        if text.startswith("import time:") and "|" in text and "imported package" not in text:
            field = text.rsplit("|", 1)[1]
            stripped = field.lstrip(" ")
            imports.append(((len(field) - len(stripped) - 1) // 2, stripped))
    return Line(name, frozenset(modules.removeprefix("modules:").split(",")), tuple(imports))


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Line, Line]]:
    """The launch line (a hint taken, its reply read, the command run) and ``status``."""
    srv = Running(FakeBackend())
    try:
        marker = tmp_path_factory.mktemp("launch") / "ran"
        launch = _run_line(
            "the launch line (schedswitch-run)",
            "run",
            ["--socket", srv.path, "gaming", "--", "touch", str(marker)],
        )
        assert marker.exists()
        status = _run_line("schedswitchctl status", "ctl", ["--socket", srv.path, "status"])
        yield launch, status
    finally:
        srv.stop()


def _kept_out(trick: str, lines: tuple[Line, Line]) -> None:
    module = internals.KEPT_OUT[trick]
    for line in lines:
        assert module not in line.modules, (
            f"{line.name} imported {module} ({line.importer_chain(module)}) on Python "
            f"{sys.version.split()[0]}: the {trick!r} trick of schedswitchd/cpython_internals.py "
            f"keeps it out for the start's budget ({PAGE}); find what imports it"
        )


def _no_fallback(trick: str) -> None:
    assert trick not in internals.FALLBACKS, (
        f"the {trick!r} trick of schedswitchd/cpython_internals.py runs its fallback on Python "
        f"{sys.version.split()[0]}: {internals.FALLBACKS.get(trick)}. The commands stay "
        f"correct but start slower than their budgets ({PAGE}) were measured with"
    )


def test_typing_stays_out(lines: tuple[Line, Line]) -> None:
    """``TYPE_CHECKING`` is ``False`` at run time, and neither line imports ``typing``."""
    assert internals.TYPE_CHECKING is False
    _kept_out("typing", lines)


#: ``json.decoder.JSONDecoder()``'s attributes that are its own Python-side machinery, not
#: settings the C scanner reads (``Lib/json/decoder.py``).
_DECODER_OWN = {"parse_object", "parse_array", "parse_string", "memo", "scan_once"}


def test_json_scanner_is_the_c_one_set_up_as_json_loads_does(lines: tuple[Line, Line]) -> None:
    """``_json.make_scanner`` takes :class:`JsonDecoderSettings`; those settings are every one
    ``JSONDecoder()`` gives it, with the same values; the scanner reads what ``json.loads``
    reads; and neither line imports ``json``."""
    _no_fallback("json")
    decoder = json.decoder.JSONDecoder()
    settings = internals.JsonDecoderSettings()
    wanted = set(vars(decoder)) - _DECODER_OWN
    missing = sorted(wanted - set(dir(settings)))
    assert not missing, (
        f"json.decoder.JSONDecoder() on Python {sys.version.split()[0]} sets {missing}, which "
        "the C scanner may read: add them to JsonDecoderSettings in "
        "schedswitchd/cpython_internals.py with JSONDecoder's defaults"
    )
    for name in sorted(wanted - {"parse_constant"}):
        assert getattr(settings, name) == getattr(decoder, name), (
            f"JsonDecoderSettings.{name} is not JSONDecoder()'s default"
        )
    for constant in ("NaN", "Infinity", "-Infinity"):
        assert repr(settings.parse_constant(constant)) == repr(decoder.parse_constant(constant))
    scan = internals.JSON_SCANNER
    assert scan is not None
    for text in ('{"v":1,"ok":true,"x":[1.5,null,"\\u00e9",NaN,-2]}', '"a\\tb"', "[]", "1e400"):
        assert repr(scan(text, 0)) == repr((json.loads(text), len(text))), text
    _kept_out("json", lines)


def test_json_quote_is_the_c_one() -> None:
    _no_fallback("json")
    assert internals.json_quote is _json.encode_basestring_ascii
    for text in ("", "plain", 'q"\\', "\x00\n\u00e9\U0001f600"):
        assert internals.json_quote(text) == json.dumps(text)


def test_socket_core_has_what_a_client_uses(lines: tuple[Line, Line]) -> None:
    """The client's socket is ``_socket.socket`` (not the module's subclass), with the
    constants of ``socket(7)``/``unix(7)``, and neither line imports ``socket``."""
    _no_fallback("socket")
    sock = internals.unix_stream_socket()
    try:
        assert type(sock) is socket.SocketType  # socket.SocketType is _socket.socket
        assert (sock.family, sock.type) == (socket.AF_UNIX, socket.SOCK_STREAM)
    finally:
        sock.close()
    assert (internals.SOL_SOCKET, internals.SO_SNDTIMEO, internals.SCM_RIGHTS) == (
        socket.SOL_SOCKET, socket.SO_SNDTIMEO, socket.SCM_RIGHTS
    )  # fmt: skip
    _kept_out("socket", lines)


def test_struct_pack_is_the_c_one(lines: tuple[Line, Line]) -> None:
    """``struct_pack`` is ``_struct.pack`` (what ``struct.pack`` re-exports), and neither
    line imports ``struct``."""
    _no_fallback("struct")
    assert internals.struct_pack is struct.pack
    assert internals.struct_pack("ll", 1, -2) == struct.pack("ll", 1, -2)
    _kept_out("struct", lines)


def test_signal_core_has_the_names(lines: tuple[Line, Line]) -> None:
    """``_signal`` has every name the launcher uses, with ``signal``'s values, and neither
    line imports ``signal``."""
    _no_fallback("signal")
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGPIPE", "SIGXFSZ"):
        assert getattr(internals, name) == getattr(signal, name).value, name
    _kept_out("signal", lines)


def test_set_signal_handler_installs_the_handler() -> None:
    def handler(signum: int, frame: object) -> None:
        del signum, frame

    before = signal.getsignal(signal.SIGHUP)
    try:
        internals.set_signal_handler(internals.SIGHUP, handler)
        assert signal.getsignal(signal.SIGHUP) is handler
    finally:
        signal.signal(signal.SIGHUP, before)


def test_the_usual_lines_are_read_without_argparse(lines: tuple[Line, Line]) -> None:
    """The hand argv readers (``cli/run.py``'s and ``cli/ctl.py``'s ``_quick_parse``) take
    both lines: neither imports ``argparse`` (that they read what argparse reads:
    ``tests/daemon/test_cli_light.py``)."""
    _kept_out("argv", lines)


# --- the daemon's accept and its replies ---------------------------------------------------

ASYNCIO_MOVED = (
    "CPython {version}: asyncio's BaseSelectorEventLoop._make_socket_transport {what}; "
    "schedswitchd.cpython_internals.make_socket_transport makes the transport of an accepted "
    "socket with it (CPython's asyncio/selector_events.py): adapt that one function"
)


class _Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.BaseTransport | None = None
        self.data = b""
        self.got = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data
        if b"\n" in self.data and not self.got.done():
            self.got.set_result(self.data)


def test_asyncio_makes_a_transport_for_an_accepted_socket() -> None:
    version = sys.version.split()[0]
    from asyncio import selector_events

    base = selector_events.BaseSelectorEventLoop
    make = vars(base).get("_make_socket_transport")
    assert make is not None, ASYNCIO_MOVED.format(version=version, what="is gone")
    params = inspect.signature(make).parameters
    for name in ("sock", "protocol", "waiter", "extra"):
        assert name in params, ASYNCIO_MOVED.format(
            version=version, what=f"takes no {name!r} any more ({list(params)})"
        )

    async def exchange() -> tuple[bytes, object, bool]:
        loop = asyncio.get_running_loop()
        assert internals.has_socket_transport(loop), ASYNCIO_MOVED.format(
            version=version, what=f"is not on the running loop ({type(loop).__name__})"
        )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        protocol = _Recorder()
        transport = internals.make_socket_transport(loop, ours, protocol, "peer")
        try:
            theirs.sendall(b"ping\n")
            got = await asyncio.wait_for(protocol.got, 5)
            transport.write(b"pong\n")
            await asyncio.sleep(0)
            theirs.settimeout(5)
            reply = theirs.recv(16)
            assert reply == b"pong\n", ASYNCIO_MOVED.format(
                version=version, what=f"made a transport that wrote {reply!r}"
            )
            return got, transport.get_extra_info("peername"), protocol.transport is transport
        finally:
            transport.close()
            await asyncio.sleep(0)
            theirs.close()

    got, peername, made = asyncio.run(exchange())
    assert got == b"ping\n", ASYNCIO_MOVED.format(
        version=version, what=f"made a transport that read {got!r}"
    )
    assert peername == "peer", ASYNCIO_MOVED.format(
        version=version, what="dropped extra={'peername'}"
    )
    assert made, ASYNCIO_MOVED.format(version=version, what="did not call connection_made")


class _Releasing(asyncio.Protocol):
    """A protocol that releases its transport when its connection is lost, or not."""

    def __init__(self, release: bool) -> None:
        self.release = release
        self.transport: asyncio.BaseTransport | None = None
        self.data = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        if self.release:
            internals.release_transport(self.transport)


def test_release_transport_frees_a_closed_transport_without_the_collector() -> None:
    """A closed selector transport whose protocol calls ``release_transport`` in its
    ``connection_lost`` is freed by reference counting (the collector off); one that does
    not call it is not, as long as CPython's transport keeps its read callback as a bound
    method of its own: when that stops, this says the trick can go. On a live transport
    the call changes nothing: it reads on."""
    import gc
    import weakref

    version = sys.version.split()[0]

    async def closed_transport(release: bool) -> weakref.ref[asyncio.BaseTransport]:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        protocol = _Releasing(release)
        transport = internals.make_socket_transport(loop, ours, protocol, "peer")
        await asyncio.sleep(0)  # connection_made, the reader added
        internals.release_transport(transport)  # live: left as it is
        theirs.sendall(b"ping\n")
        for _ in range(5):
            await asyncio.sleep(0)
        assert protocol.data == b"ping\n", "release_transport stopped a live transport's reads"
        ref = weakref.ref(transport)
        theirs.close()  # the transport reads the end and closes
        for _ in range(5):
            await asyncio.sleep(0)
        assert transport.is_closing()
        del transport, protocol, ours
        return ref

    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        released = asyncio.run(closed_transport(True))
        kept = asyncio.run(closed_transport(False))
        assert released() is None, (
            f"CPython {version}'s selector transport stays in a reference cycle after "
            "schedswitchd.cpython_internals.release_transport (it clears _read_ready_cb, "
            "CPython's asyncio/selector_events.py): closed connections wait for the collector"
        )
        assert kept() is not None, (
            f"CPython {version}'s selector transport no longer keeps itself in a cycle: "
            'release_transport can go (docs/performance.md, "Memory")'
        )
    finally:
        gc.collect()
        if was_enabled:
            gc.enable()


def test_unread_bytes_is_siocoutq_on_a_unix_socket() -> None:
    """``unread_bytes`` reads the sender's charge of what its peer has not read yet:
    nonzero while a reply waits unread (also partly read), 0 once read and once closed."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        assert internals.unread_bytes(ours) == 0
        ours.sendall(b'{"v":1,"ok":true}\n')
        # the kernel's charge for the unread reply: its buffer's size, at least its length
        assert internals.unread_bytes(ours) >= 18, "SIOCOUTQ no longer counts unread bytes"
        assert theirs.recv(5) == b'{"v":'
        assert internals.unread_bytes(ours) > 0  # partly read: not taken
        theirs.recv(100)
        assert internals.unread_bytes(ours) == 0
    finally:
        ours.close()
        theirs.close()
    assert internals.unread_bytes(ours) == 0  # closed: nothing to wait for


def test_a_selector_loop_has_its_epoll_where_a_pause_looks() -> None:
    """The uevent reader's pause (schedswitchd.kernel.uevents) sets its socket's epoll events
    from another thread through :func:`loop_epoll`: the running selector loop must expose
    its EpollSelector and the select.epoll under it, holding a reader's fd."""
    version = sys.version.split()[0]
    moved = (
        f"CPython {version}: asyncio's selector loop no longer keeps its selectors.EpollSelector "
        "as ._selector (or that selector its select.epoll as ._selector); "
        "schedswitchd.cpython_internals.loop_epoll reads them (CPython's "
        "asyncio/selector_events.py, Lib/selectors.py): adapt that one function"
    )

    async def look() -> None:
        loop = asyncio.get_running_loop()
        found = internals.loop_epoll(loop)
        assert found is not None, moved
        selector, epoll = found
        ours, theirs = socket.socketpair()
        try:
            loop.add_reader(ours.fileno(), lambda: None)
            assert selector.get_map().get(ours.fileno()) is not None, moved
            epoll.modify(ours.fileno(), 0)  # what a pause does, from any thread
            epoll.modify(ours.fileno(), select.EPOLLIN)
            loop.remove_reader(ours.fileno())
        finally:
            ours.close()
            theirs.close()

    asyncio.run(look())
    assert internals.loop_epoll(object()) is None


def test_accept_fd_is_the_accept_under_socket_accept(tmp_path: Path) -> None:
    """``accept_fd`` is what ``socket.accept`` calls before it makes a socket object: the
    connection's descriptor (close-on-exec) and its peer's address, as ``accept`` gives
    them; nothing waiting raises as ``accept`` does."""
    version = sys.version.split()[0]
    moved = (
        f"CPython {version}: socket.socket._accept {{what}}; "
        "schedswitchd.cpython_internals.accept_fd accepts the daemon's connections with it "
        "(CPython's Modules/socketmodule.c sock_accept, Lib/socket.py socket.accept): adapt "
        "that one function"
    )
    assert callable(getattr(socket.socket, "_accept", None)), moved.format(what="is gone")
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(2)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            internals.accept_fd(listener)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            fd, addr = internals.accept_fd(listener)
            assert type(fd) is int, moved.format(what=f"returns {type(fd).__name__}, not a fd")
            with socket.socket(fileno=fd) as conn:
                assert not os.get_inheritable(fd)
                assert (conn.family, conn.type) == (socket.AF_UNIX, socket.SOCK_STREAM)
                client.sendall(b"ping")
                assert conn.recv(4) == b"ping", moved.format(what="gave another descriptor")
            other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with other:
                other.connect(path)
                sock, public_addr = listener.accept()
                sock.close()
                assert addr == public_addr, moved.format(what=f"gives the address {addr!r}")
