"""A blocking client of the daemon's socket, for ``schedswitchctl`` and ``schedswitch-run``.

Speaks the JSON-lines protocol of :mod:`schedswitchd.daemon.protocol`; an error reply
becomes :class:`DaemonError`, an unreachable daemon :class:`DaemonUnavailable`.
"""

from __future__ import annotations

import contextlib

from pydantic import BaseModel

from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.launcher_wire import DEFAULT_SOCKET, LineConnection, socket_path
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


class DaemonClient(LineConnection):
    """One connection. ``timeout_s`` bounds each send and each reply wait (a switch can
    take seconds, so the default is generous). Use as a context manager or ``close()``.
    Raises :class:`DaemonUnavailable` when the socket cannot be reached."""

    unavailable = DaemonUnavailable
    max_reply_bytes = proto.MAX_REPLY_BYTES

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
