"""The client side of the daemon's socket protocol, in the standard library alone.

``schedswitch-run`` stands on a game's launch line, so every millisecond it spends starting
delays the game, and ``schedswitchctl status`` is what a person (or a panel applet, once a
second) runs to see what happens. The full protocol module (:mod:`schedswitchd.daemon.protocol`)
builds pydantic models on import, more than the commands' whole start budget
(docs/performance.md, "Launch line"); this module speaks
the same JSON-lines protocol (one UTF-8 object a line, ``"v": 1``) with ``json`` and
``socket`` and checks only the reply's envelope (version, ``ok``, ``op``): what the daemon
sends is its own pydantic model's JSON, and the commands read the fields they show.

It is the one place of the names both sides must agree on without pydantic: the error
codes a client tells apart (:data:`DENIED`, :data:`LIMIT`, :data:`SHUTTING_DOWN`), the
pattern of workload and scheduler names and the bounds of request fields, which the
protocol and configuration models import from here. The tests check that what it sends
parses as the protocol's requests and that it reads the real server's replies.
"""

from __future__ import annotations

import os

# json's, socket's and struct's C cores instead of the modules, and no typing at run time: the
# start of a client has a time budget (docs/performance.md, "Launch line").
from schedswitchd.cpython_internals import (
    JSON_SCANNER,
    SCM_RIGHTS,
    SO_SNDTIMEO,
    SOL_SOCKET,
    TYPE_CHECKING,
    json_quote,
    struct_pack,
    unix_stream_socket,
)
from schedswitchd.errors import ProtocolError, SchedSwitchError

if TYPE_CHECKING:
    import _socket
    from collections.abc import Iterator
    from types import TracebackType
    from typing import Any, ClassVar, Final, Self

#: Where the daemon listens unless told otherwise (the socket unit's ``ListenStream=``).
DEFAULT_SOCKET = "/run/schedswitchd.sock"
#: Cap on one reply line a launcher reads, bytes (a hint reply is well under 4 KiB).
MAX_LAUNCHER_REPLY_BYTES = 1 << 16
#: Cap a client applies to one reply line, bytes (history and list replies can be long).
MAX_REPLY_BYTES = 1 << 20

#: A scheduler's, workload's or hint rule's name (config keys, request fields).
NAME_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,31}$"
#: Between a scheduler's name and a mode in the name of a mode variant (``lavd@gaming``):
#: not a character of :data:`NAME_PATTERN`, so a variant never collides with a configured name.
MODE_SEPARATOR: Final = "@"
#: Largest pid Linux can hand out (``PID_MAX_LIMIT`` on 64-bit, ``include/linux/threads.h``).
PID_MAX_LIMIT: Final = 4 * 1024 * 1024
#: Bounds of request fields: a hint's ``ttl_s`` (ten years), a ``prepare`` intent's
#: ``ttl_s``, seconds; ``history``'s ``limit``; a lease id's length, characters.
MAX_HINT_TTL_S: Final = 10 * 365 * 86400
MAX_PREPARE_TTL_S: Final = 3600
MAX_HISTORY_LIMIT: Final = 10000
MAX_LEASE_ID_CHARS: Final = 64

#: Every request the daemon answers, by ``op``, and who may send it (``"admin"``: only
#: ``[auth]``'s admins; ``"anyone"``: any caller, within the server's own rules, such as
#: ``[auth]``'s hint rules for ``hint``): the one table of the protocol's requests.
#: The protocol's request models, its unknown-``op`` error, the server's admin check and
#: ``schedswitchctl``'s daemon commands are derived from it; the server's dispatch and the
#: protocol's documentation are checked against it (``tests/daemon/test_request_table.py``).
#: In ``schedswitchctl --help``'s order.
REQUESTS: Final = {
    "status": "anyone",
    "list": "anyone",
    "history": "anyone",
    "hint": "anyone",
    "prepare": "anyone",
    "release": "anyone",
    "switch": "admin",
    "stop": "admin",
    "reload": "admin",
    "watch": "anyone",
}

# Error codes a client tells apart (the protocol module has the full list).
DENIED: Final = "denied"
LIMIT: Final = "limit"
SHUTTING_DOWN: Final = "shutting_down"


def socket_path(explicit: str | None = None) -> str:
    """``explicit``, else ``$SCHEDSWITCHD_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    return explicit or os.environ.get("SCHEDSWITCHD_SOCKET") or DEFAULT_SOCKET


def loads(line: bytes) -> Any:
    """``json.loads(line)``: the same value, or the same exception.

    A line of UTF-8 JSON with nothing around the value (what the daemon writes) is read by
    json's C scanner set up as ``json.loads`` sets it up, without importing :mod:`json`.
    Whatever that does not read whole (another encoding, whitespace around the value, an
    error, whose message is json's) is given to ``json.loads`` itself.
    """
    if JSON_SCANNER is not None:
        try:
            text = line.decode()
            value, end = JSON_SCANNER(text, 0)
        # SystemError: the C scanner raises json.decoder's JSONDecodeError only if that
        # module is loaded; json.loads below loads it and raises the error.
        except (StopIteration, ValueError, RecursionError, SystemError):
            pass
        else:
            if end == len(text):
                return value
    import json

    return json.loads(line)


#: How ``json.dumps`` writes a value of each of these exact types besides ``str``.
_LITERALS: dict[type, Any] = {
    int: int.__repr__,
    bool: lambda value: "true" if value else "false",
    type(None): lambda _: "null",
}


def dumps(request: dict[str, Any]) -> bytes:
    """``json.dumps(request, separators=(",", ":")).encode()``, byte for byte.

    An object of string keys whose values are strings, integers, booleans and ``None`` (a
    request of the launcher or of ``schedswitchctl status``) is written with json's C
    string quoting (ASCII, as ``ensure_ascii``), without importing :mod:`json`; anything
    else (a float, a list) is given to ``json.dumps``.
    """
    members = []
    for key, value in request.items():
        if type(key) is not str:
            break
        if type(value) is str:
            text = json_quote(value)
        elif type(value) in _LITERALS:
            text = _LITERALS[type(value)](value)
        else:
            break
        members.append(f"{json_quote(key)}:{text}")
    else:
        return ("{" + ",".join(members) + "}").encode()
    import json

    return json.dumps(request, separators=(",", ":")).encode()


class DaemonUnavailable(SchedSwitchError):
    """The daemon's socket cannot be reached (not running, no permission), or the
    connection broke."""

    code = "unavailable"


class DaemonError(SchedSwitchError):
    """The daemon answered with an error reply: ``code`` (its stable name, e.g.
    ``unknown_workload``), the message, and ``verifier_log`` when a program load failed."""

    def __init__(self, code: str, message: str, verifier_log: str | None = None) -> None:
        self.code = code
        self.verifier_log = verifier_log
        super().__init__(message)


class LineConnection:
    """One blocking connection to the daemon's socket, read a JSON line at a time: what the
    launcher's :class:`LauncherConnection`, ``schedswitchctl``'s daemon commands
    (:class:`ControlConnection`) and the pydantic
    :class:`~schedswitchd.daemon.client.DaemonClient` share.

    ``path`` as :func:`socket_path`; ``timeout_s`` bounds the connect, each send and each
    reply wait, seconds. A subclass may name the error it raises when the socket cannot be
    reached (``unavailable``) and sets the longest reply line it reads
    (``max_reply_bytes``, bytes; a longer one raises
    :class:`~schedswitchd.errors.ProtocolError`). Use as a context manager or call
    :meth:`close`.
    """

    unavailable: ClassVar[type[SchedSwitchError]] = DaemonUnavailable
    max_reply_bytes: ClassVar[int]

    def __init__(self, path: str | None = None, timeout_s: float = 60.0) -> None:
        self.path = socket_path(path)
        self.sock = unix_stream_socket()
        try:
            self._connect(timeout_s)
        except OSError as exc:
            self.sock.close()
            raise self.unavailable(f"cannot connect to {self.path}: {exc.strerror}") from None
        self.sock.settimeout(timeout_s)
        self._buffer = b""

    def _connect(self, timeout_s: float) -> None:
        """A blocking ``connect``, bounded by ``SO_SNDTIMEO``. When the daemon's accept
        queue is full (a flood of clients), a Unix stream socket's blocking connect waits
        in the kernel until the daemon accepts one (``unix_stream_connect``), woken by the
        accept itself, while a non-blocking one (what a socket with a Python timeout is)
        fails at once with ``EAGAIN``. Past ``timeout_s`` seconds it fails with ``EAGAIN``
        too."""
        whole = int(timeout_s)
        timeval = struct_pack("ll", whole, int((timeout_s - whole) * 1e6))
        self.sock.setsockopt(SOL_SOCKET, SO_SNDTIMEO, timeval)
        self.sock.connect(self.path)
        # Sends use the Python timeout from here on; no kernel send timeout besides it.
        self.sock.setsockopt(SOL_SOCKET, SO_SNDTIMEO, struct_pack("ll", 0, 0))

    def _read_line(self) -> bytes | None:
        """The next reply line without its newline; ``None`` when the daemon closed."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > self.max_reply_bytes:
                raise ProtocolError("reply from the daemon is too long")
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def exchange_line(
        self, request: dict[str, Any], fds: tuple[int, ...] = ()
    ) -> tuple[dict[str, Any], bytes]:
        """Send ``request`` (``v`` is added) and return the reply object and its line as
        received (without the newline). ``fds`` go with the request's bytes as
        ``SCM_RIGHTS`` (``unix(7)``): a hint's pidfd (``"pidfd": true``).

        Raises :class:`DaemonError` for an error reply (``ok: false``),
        :class:`DaemonUnavailable` when the connection fails or closes, and
        :class:`~schedswitchd.errors.ProtocolError` for a reply that is not a JSON object of
        protocol version 1 answering ``request["op"]``.
        """
        line = dumps({"v": 1, **request}) + b"\n"
        try:
            if fds:
                send_with_fds(self.sock, line, fds)
            else:
                self.sock.sendall(line)
            raw = self._read_line()
        except (OSError, TimeoutError) as exc:
            raise DaemonUnavailable(f"{self.path}: {exc}") from None
        if raw is None:
            raise DaemonUnavailable(f"{self.path}: the daemon closed the connection")
        return check_reply(raw, request.get("op")), raw

    def exchange(self, request: dict[str, Any], fds: tuple[int, ...] = ()) -> dict[str, Any]:
        """:meth:`exchange_line`'s reply object alone."""
        return self.exchange_line(request, fds)[0]

    def close(self) -> None:
        """Close the connection, which ends the leases it holds."""
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def send_with_fds(sock: _socket.socket, data: bytes, fds: tuple[int, ...]) -> None:
    """Send all of ``data`` on the connected Unix stream socket ``sock``, ``fds`` passed as
    ``SCM_RIGHTS`` on its first bytes (the daemon keeps them with what it reads there).
    Raises ``OSError`` as ``sendmsg(2)`` and ``send(2)`` do."""
    rights = struct_pack(f"{len(fds)}i", *fds)
    sent = sock.sendmsg([data], [(SOL_SOCKET, SCM_RIGHTS, rights)])
    if sent < len(data):
        sock.sendall(data[sent:])


def check_reply(raw: bytes, op: object) -> dict[str, Any]:
    """The reply line ``raw`` as an object, once its envelope is checked: a JSON object with
    ``"v": 1`` that answers ``op`` with ``"ok": true``.

    Raises :class:`DaemonError` for an error reply (``ok: false`` with an ``error`` object)
    and :class:`~schedswitchd.errors.ProtocolError` for anything else that is not such a
    reply.
    """
    try:
        reply = loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"reply from the daemon is not JSON: {exc}") from None
    if not isinstance(reply, dict) or reply.get("v") != 1:
        raise ProtocolError("reply from the daemon is not a version-1 object")
    if reply.get("ok") is False:
        error = reply.get("error")
        if not isinstance(error, dict):
            raise ProtocolError("error reply without an error object")
        log = error.get("verifier_log")
        raise DaemonError(
            str(error.get("code")), str(error.get("message")), log if isinstance(log, str) else None
        )
    if reply.get("ok") is not True or reply.get("op") != op:
        raise ProtocolError(f"reply does not answer {op!r}")
    return reply


def hint_summary(workload: str, reply: dict[str, Any]) -> str:
    """One line for people on what a hint achieved, from its reply object (the protocol's
    ``HintReply``: ``lease``, ``scheduler``, ``desired``, ``active``, ``switch``,
    ``pending``, ``passed_over``): the lease and the running scheduler and, when it is not
    the workload's, why (the failed switch and its error, the daemon's ``passed_over``
    reason, a switch still in progress). ``schedswitchctl hint`` and ``schedswitch-run``
    print it."""
    text = f"lease {reply.get('lease')}: {workload} -> running {reply.get('active')}"
    wanted = reply.get("scheduler")
    sw = reply.get("switch")
    if isinstance(sw, dict) and sw.get("result") not in ("ok", "adopted"):
        error = sw.get("error")
        cause = f": {error.get('message')}" if isinstance(error, dict) else ""
        text += f" (switch to {sw.get('target')} {sw.get('result')}{cause})"
    elif reply.get("pending"):
        text += f" (switch to {reply.get('desired')} still in progress)"
    elif wanted is not None and reply.get("active") != wanted:
        if reply.get("desired") != wanted:
            why = reply.get("passed_over")
            if not isinstance(why, str):  # a daemon that does not say
                why = "a higher-priority lease, an override or backoff"
            text += f" ({wanted} not chosen: {why})"
        else:
            text += f" (not {wanted}: see `schedswitchctl status`)"
    return text


class LauncherConnection(LineConnection):
    """One connection to the daemon, blocking, for one launcher.

    ``timeout_s`` bounds the connect, each send and each reply wait, seconds (a hint's
    reply waits for the switch it causes, which can take a second or more on a slow
    device). Raises :class:`DaemonUnavailable` when the socket cannot be reached.
    """

    max_reply_bytes = MAX_LAUNCHER_REPLY_BYTES

    def wait_closed(self) -> None:
        """Block until the daemon closes the connection (it stopped, or the lease ended)."""
        try:
            # close() from another thread may come first: a closed socket is closed enough.
            self.sock.settimeout(None)
            while self.sock.recv(65536):
                pass
        except OSError:
            pass


class ControlConnection(LineConnection):
    """``schedswitchctl``'s connection: replies up to :data:`MAX_REPLY_BYTES`, and a wait
    for the end of a held hint that returns the daemon's last word."""

    max_reply_bytes = MAX_REPLY_BYTES

    def events(self) -> Iterator[tuple[dict[str, Any], bytes]]:
        """After a ``watch`` reply: each ``event`` object the daemon sends and its line,
        blocking without a timeout, until the daemon closes the connection. Raises
        :class:`DaemonError` for its last line when it dropped this watcher (``limit``),
        :class:`DaemonUnavailable` when the connection fails and
        :class:`~schedswitchd.errors.ProtocolError` for a line that is not an event."""
        self.sock.settimeout(None)
        while True:
            try:
                line = self._read_line()
            except OSError as exc:
                raise DaemonUnavailable(f"{self.path}: {exc}") from None
            if line is None:
                return
            yield check_reply(line, "event"), line

    def wait_closed(self) -> dict[str, Any] | None:
        """Block until the daemon closes the connection (it stopped, or the connection's
        last lease ended on its own). Returns the daemon's final ``lease_ended`` object
        (``lease``, ``why``) if it sent one, else ``None``."""
        self.sock.settimeout(None)
        final: dict[str, Any] | None = None
        try:
            while (line := self._read_line()) is not None:
                try:
                    final = check_reply(line, "lease_ended")
                except SchedSwitchError:
                    continue
        except (OSError, ProtocolError):
            pass
        return final
