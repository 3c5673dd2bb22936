"""Where the daemon's socket is, and a launcher's hint exchange without pydantic.

``schedswitch-run`` stands on a game's launch line, so every millisecond it spends starting
delays the game. The full protocol module (:mod:`schedswitchd.daemon.protocol`) builds
pydantic models on import (~150 ms on a busy 2-core host); this module speaks the same
JSON-lines protocol (one UTF-8 object a line, ``"v": 1``) with the standard library alone and
reads only the reply fields a launcher uses. The tests check that what it sends parses as the
protocol's ``HintRequest`` / ``PrepareRequest`` and that it reads the real server's replies.
"""

from __future__ import annotations

import json
import os
import socket
from types import TracebackType
from typing import ClassVar, Self

from schedswitchd.errors import ProtocolError, SchedSwitchError

#: Where the daemon listens unless told otherwise (the socket unit's ``ListenStream=``).
DEFAULT_SOCKET = "/run/schedswitchd.sock"
#: Cap on one reply line a launcher reads, bytes (a hint reply is well under 4 KiB).
MAX_LAUNCHER_REPLY_BYTES = 1 << 16


def socket_path(explicit: str | None = None) -> str:
    """``explicit``, else ``$SCHEDSWITCHD_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    return explicit or os.environ.get("SCHEDSWITCHD_SOCKET") or DEFAULT_SOCKET


class LauncherUnavailable(SchedSwitchError):
    """The daemon's socket cannot be reached, or the connection broke."""

    code = "unavailable"


class LauncherRefused(SchedSwitchError):
    """The daemon answered with an error reply; ``code`` is its error code."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


class LineConnection:
    """One blocking connection to the daemon's socket, read a JSON line at a time: what the
    launcher's :class:`LauncherConnection` and ``schedswitchctl``'s
    :class:`~schedswitchd.daemon.client.DaemonClient` share.

    ``path`` as :func:`socket_path`; ``timeout_s`` bounds the connect, each send and each
    reply wait, seconds. A subclass names the error it raises when the socket cannot be
    reached (``unavailable``) and the longest reply line it reads (``max_reply_bytes``,
    bytes; a longer one raises :class:`~schedswitchd.errors.ProtocolError`). Use as a
    context manager or call :meth:`close`.
    """

    unavailable: ClassVar[type[SchedSwitchError]]
    max_reply_bytes: ClassVar[int]

    def __init__(self, path: str | None = None, timeout_s: float = 60.0) -> None:
        self.path = socket_path(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.connect(self.path)
        except OSError as exc:
            self.sock.close()
            raise self.unavailable(f"cannot connect to {self.path}: {exc.strerror}") from None
        self._buffer = b""

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


class LauncherConnection(LineConnection):
    """One connection to the daemon, blocking, for one launcher.

    ``timeout_s`` bounds the connect, each send and each reply wait, seconds (a hint's
    reply waits for the switch it causes, which can take a second or more on a slow
    device). Raises :class:`LauncherUnavailable` when the socket cannot be reached.
    """

    unavailable = LauncherUnavailable
    max_reply_bytes = MAX_LAUNCHER_REPLY_BYTES

    def exchange(self, request: dict[str, object]) -> dict[str, object]:
        """Send ``request`` (``v`` is added) and return the reply object.

        Raises :class:`LauncherRefused` for an error reply (``ok: false``),
        :class:`LauncherUnavailable` when the connection fails or closes, and
        :class:`~schedswitchd.errors.ProtocolError` for a reply that is not a JSON object of
        protocol version 1 answering ``request["op"]``.
        """
        line = json.dumps({"v": 1, **request}, separators=(",", ":")).encode() + b"\n"
        try:
            self.sock.sendall(line)
            raw = self._read_line()
        except (OSError, TimeoutError) as exc:
            raise LauncherUnavailable(f"{self.path}: {exc}") from None
        if raw is None:
            raise LauncherUnavailable(f"{self.path}: the daemon closed the connection")
        try:
            reply = json.loads(raw)
        except ValueError as exc:
            raise ProtocolError(f"reply from the daemon is not JSON: {exc}") from None
        if not isinstance(reply, dict) or reply.get("v") != 1:
            raise ProtocolError("reply from the daemon is not a version-1 object")
        if reply.get("ok") is False:
            error = reply.get("error")
            if not isinstance(error, dict):
                raise ProtocolError("error reply without an error object")
            raise LauncherRefused(str(error.get("code")), str(error.get("message")))
        if reply.get("ok") is not True or reply.get("op") != request.get("op"):
            raise ProtocolError(f"reply does not answer {request.get('op')!r}")
        return reply

    def wait_closed(self) -> None:
        """Block until the daemon closes the connection (it stopped, or the lease ended)."""
        try:
            # close() from another thread may come first: a closed socket is closed enough.
            self.sock.settimeout(None)
            while self.sock.recv(65536):
                pass
        except OSError:
            pass
