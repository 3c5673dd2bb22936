"""A blocking client of the daemon's socket that speaks in the protocol's pydantic models,
for tools and benches that build requests as models and read replies as models.

Speaks the JSON-lines protocol of :mod:`schedswitchd.daemon.protocol`; an error reply
becomes :class:`DaemonError`, an unreachable daemon :class:`DaemonUnavailable` (both
defined, without pydantic, in :mod:`schedswitchd.daemon.launcher_wire`, which
``schedswitchctl`` and ``schedswitch-run`` use directly so that they start fast).
"""

from __future__ import annotations

import contextlib

from pydantic import BaseModel

from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.launcher_wire import (
    MAX_REPLY_BYTES,
    DaemonError,
    DaemonUnavailable,
    LineConnection,
)
from schedswitchd.errors import ProtocolError

__all__ = ["DaemonClient"]


class DaemonClient(LineConnection):
    """One connection. ``timeout_s`` bounds each send and each reply wait (a switch can
    take seconds, so the default is generous). Use as a context manager or ``close()``.
    Raises :class:`DaemonUnavailable` when the socket cannot be reached."""

    max_reply_bytes = MAX_REPLY_BYTES

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
            body = reply.error
            raise DaemonError(body.code, body.message, body.verifier_log)
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
