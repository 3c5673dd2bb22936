"""A blocking client of the daemon's socket, for ``schedswitchctl`` and ``schedswitch-run``.

Speaks the JSON-lines protocol of :mod:`schedswitchd.daemon.protocol`; an error reply
becomes :class:`DaemonError`, an unreachable daemon :class:`DaemonUnavailable`.
"""

from __future__ import annotations

import contextlib
import socket
from types import TracebackType

from pydantic import BaseModel

from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.launcher_wire import DEFAULT_SOCKET, socket_path
from schedswitchd.errors import ProtocolError, SchedSwitchError

__all__ = ["DEFAULT_SOCKET", "DaemonClient", "DaemonError", "DaemonUnavailable", "socket_path"]


class DaemonUnavailable(SchedSwitchError):
    """The daemon's socket cannot be reached (not running, no permission, went away)."""

    code = "unavailable"


class DaemonError(SchedSwitchError):
    """The daemon answered with an error reply; ``code``, ``verifier_log`` as sent."""

    def __init__(self, body: proto.ErrorBody) -> None:
        self.code = body.code
        self.verifier_log = body.verifier_log
        super().__init__(body.message)


class DaemonClient:
    """One connection. ``timeout_s`` bounds each send and each reply wait (a switch can
    take seconds, so the default is generous). Use as a context manager or ``close()``."""

    def __init__(self, path: str | None = None, timeout_s: float = 60.0) -> None:
        self.path = socket_path(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.connect(self.path)
        except OSError as exc:
            self.sock.close()
            raise DaemonUnavailable(f"cannot connect to {self.path}: {exc.strerror}") from None
        self._buffer = b""

    def request(self, message: BaseModel) -> proto.OkReply:
        """Send one request, return its reply. Raises :class:`DaemonError` for an error
        reply, :class:`DaemonUnavailable` if the connection fails, :class:`ProtocolError`
        for a malformed reply."""
        try:
            self.sock.sendall(proto.encode(message))
            line = self._read_line()
        except (OSError, TimeoutError) as exc:
            raise DaemonUnavailable(f"{self.path}: {exc}") from None
        if line is None:
            raise DaemonUnavailable(f"{self.path}: the daemon closed the connection")
        reply = proto.parse_reply(line)
        if isinstance(reply, proto.ErrorReply):
            raise DaemonError(reply.error)
        return reply

    def _read_line(self) -> bytes | None:
        while b"\n" not in self._buffer:
            if len(self._buffer) > proto.MAX_REPLY_BYTES:
                raise ProtocolError("reply from the daemon is too long")
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def wait_closed(self) -> proto.LeaseEnded | None:
        """Block until the daemon closes the connection (it stopped, or the connection's
        last lease ended on its own). Returns the daemon's final
        :class:`~schedswitchd.daemon.protocol.LeaseEnded` line if it sent one."""
        self.sock.settimeout(None)
        final: proto.LeaseEnded | None = None
        try:
            while (line := self._read_line()) is not None:
                with contextlib.suppress(ProtocolError):
                    reply = proto.parse_reply(line)
                    if isinstance(reply, proto.LeaseEnded):
                        final = reply
        except OSError:
            pass
        return final

    def close(self) -> None:
        """Close the connection (which ends the leases it holds)."""
        self.sock.close()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
