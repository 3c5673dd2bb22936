"""``schedswitchctl``'s exit statuses and its ``--json`` error document.

==========  =====================================================================
status      meaning
==========  =====================================================================
0           success
1           the request failed: the daemon answered with an error (unknown
            scheduler, failed switch, ...) or a local operation failed (a BPF
            object that does not open or load, a file that cannot be read)
2           bad usage: unknown command or option, an argument value that does not
            validate (checked before anything is sent)
3           the daemon is unreachable: no socket, connection refused or lost, a
            daemon shutting down (``shutting_down``)
4           the daemon refused the request: ``denied`` (not allowed for this uid)
            or ``limit`` (a per-uid connection or lease limit)
130         ``hint`` interrupted (Ctrl-C or ``SIGTERM``) before the daemon answered,
            as for a ``SIGINT`` death; once answered, ending the hold so is success
141         the output pipe was closed (``| head``), as for a ``SIGPIPE`` death
==========  =====================================================================

It imports the standard library and :mod:`schedswitchd.daemon.launcher_wire` only, and
:mod:`json` only for an error document: every command loads it, ``status`` among them (see
:mod:`schedswitchd.cli.daemon_cmds`).

With ``--json`` every error is also one JSON document on stdout, shaped like the
daemon's error replies (``schedswitchd.daemon.protocol.ErrorBody``) inside an ``error``
key, as ``bpftool --json`` does: ``{"error": {"code": "...", "message": "...",
"verifier_log": null}}``; the one-line text stays on stderr. ``code`` is the daemon's
error code, ``unavailable`` for an unreachable daemon, ``usage`` for bad usage, the
:class:`~schedswitchd.errors.SchedSwitchError` branch's ``code`` for local errors
(``object``, ``btf``, ``load``, ...), ``os_error`` for an OS error.
"""

from __future__ import annotations

from schedswitchd.cpython_internals import TYPE_CHECKING
from schedswitchd.daemon.launcher_wire import (
    DENIED,
    LIMIT,
    SHUTTING_DOWN,
    DaemonError,
    DaemonUnavailable,
)
from schedswitchd.entry import EXIT_BROKEN_PIPE
from schedswitchd.errors import ProtocolError

# typing is not imported at run time: the start of this command has a time budget
# (docs/performance.md, "`schedswitchctl status`"); annotations are strings (PEP 563).
if TYPE_CHECKING:
    from typing import Any, Final

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_REFUSED: Final = 4
EXIT_INTERRUPTED: Final = 130
__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "HELP_TEXT",
    "UsageError",
    "error_document",
    "exit_status",
]

#: The table above for ``--help`` (users read this, not the docstring).
HELP_TEXT: Final = (
    "Exit status: 0 success; 1 the request failed (an error reply, or a local error);\n"
    "2 bad usage; 3 the daemon is unreachable (or shutting down); 4 the daemon refused\n"
    "(denied, limit); 130 a hint interrupted before the daemon answered; 141 the output\n"
    "pipe was closed. With --json an error is also printed on stdout as\n"
    '{"error": {"code": ..., "message": ..., "verifier_log": ...}}.'
)

_REFUSED = frozenset({DENIED, LIMIT})
_UNREACHABLE = frozenset({SHUTTING_DOWN})


class UsageError(ProtocolError):
    """An argument that does not validate, found before anything is sent (exit 2)."""

    code = "usage"


def exit_status(exc: BaseException) -> int:
    """The exit status for an error that ended a command (see the module's table)."""
    if isinstance(exc, UsageError):
        return EXIT_USAGE
    if isinstance(exc, DaemonUnavailable):
        return EXIT_UNREACHABLE
    if isinstance(exc, DaemonError):
        if exc.code in _REFUSED:
            return EXIT_REFUSED
        if exc.code in _UNREACHABLE:
            return EXIT_UNREACHABLE
    return EXIT_FAILED


def error_document(code: str, message: str, verifier_log: str | None = None) -> str:
    """The ``--json`` error line: ``{"error": {"code", "message", "verifier_log"}}``."""
    import json  # an error's path: json (with re and enum) stays off the quick lines' start

    body: dict[str, Any] = {"code": code, "message": message, "verifier_log": verifier_log}
    return json.dumps({"error": body}, sort_keys=True)
