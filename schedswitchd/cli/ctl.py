"""``schedswitchctl``: the admin and inspection tool.

Each command family is a module exposing ``register(subparsers)``; the chosen sub-parser's
``handler(args) -> int`` runs and its return value is the exit status. Errors derived from
:class:`~schedswitchd.errors.SchedSwitchError` and OS errors (a missing file, a refused
permission) are printed as one line on stderr; with ``--json`` they are also printed on
stdout as ``{"error": {"code", "message", "verifier_log"}}`` (bpftool's convention), usage
errors included. Exit statuses tell apart a failed request (1), bad usage (2), an
unreachable daemon (3) and a refusal (4): the table is in :mod:`schedswitchd.cli.exits`.
A closed output pipe (``| head -1``) ends the command quietly (141). ``--socket PATH``
may come before the command (a global option) or after it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from schedswitchd import __version__
from schedswitchd.cli import exits
from schedswitchd.daemon.launcher_wire import DEFAULT_SOCKET
from schedswitchd.entry import run_entry
from schedswitchd.errors import SchedSwitchError

# typing is not imported at run time: it costs ~3 ms of the start of a command that
# has a time budget (issue 15); annotations are strings (PEP 563) and mypy reads this block.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

# --help is for users: the module docstring above is for developers.
_DESCRIPTION = (
    "Query and steer schedswitchd, the daemon that switches sched_ext CPU schedulers,\n"
    "and inspect or load BPF scheduler objects."
)
_EPILOG = (
    "Run 'schedswitchctl COMMAND --help' for a command's options. Errors are printed as one\n"
    "line on stderr. --socket PATH may also be given after the command.\n\n" + exits.HELP_TEXT
)

# Command-family modules, each with ``register(subparsers)``, and the commands each
# registers. Listed here, not discovered, so that the CLI's surface is visible in one
# place -- and so that a command imports only its own family: the object family pulls in
# the loader, the profile family the profile engine, which ``status`` never needs
# (tests/test_cli_entrypoints.py checks this table against what the families register).
_FAMILIES: dict[str, tuple[str, ...]] = {
    "schedswitchd.cli.daemon_cmds": (
        "status", "list", "history", "hint", "prepare", "release", "switch", "stop", "reload",
    ),
    "schedswitchd.cli.object_cmd": ("object",),
    "schedswitchd.cli.profile_cmd": ("profile",),
}  # fmt: skip
_OPTIONS_WITH_VALUE = frozenset({"--socket"})


def _family_of(words: Sequence[str]) -> str | None:
    """The family module of the command in ``words`` (the first word that is not a global
    option), or ``None`` when there is none or it is unknown: then every family is
    registered, for the full help or argparse's list of valid commands."""
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word in _OPTIONS_WITH_VALUE:
            skip = True
            continue
        if word.startswith("-"):
            if word in ("-h", "--help"):
                return None
            continue
        for module, commands in _FAMILIES.items():
            if word in commands:
                return module
        return None
    return None


class _Parser(argparse.ArgumentParser):
    """argparse, plus the ``--json`` error document for usage errors (sub-parsers are made
    of the same class). ``json_errors`` is set by :func:`main` from the command line."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if self.json_errors:
            print(exits.error_document("usage", f"{self.prog}: {message}"), flush=True)
        super().error(message)  # usage and message on stderr, exit 2


def build_parser(words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``schedswitchctl`` argument parser: the full one, or given the command line
    ``words``, one with only the chosen command's family registered (see
    :data:`_FAMILIES`)."""
    import importlib

    parser = _Parser(
        prog="schedswitchctl",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    # Its own dest: a sub-parser's default (None) would overwrite a shared one.
    parser.add_argument(
        "--socket",
        dest="global_socket",
        metavar="PATH",
        help="daemon socket path (also accepted after the command; default: "
        f"$SCHEDSWITCHD_SOCKET or {DEFAULT_SOCKET})",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    family = _family_of(words) if words is not None else None
    for name in [family] if family is not None else _FAMILIES:
        importlib.import_module(name).register(sub)
    return parser


def _os_error_text(exc: OSError) -> str:
    """``strerror: filename`` rather than Python's ``[Errno N] ...`` form."""
    text = exc.strerror or str(exc)
    if exc.filename is not None:
        text += f": {os.fsdecode(exc.filename)}"
    if exc.filename2 is not None:
        text += f" -> {os.fsdecode(exc.filename2)}"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status (:mod:`schedswitchd.cli.exits`)."""
    return run_entry(_main, argv)


def _main(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words)
    _Parser.json_errors = "--json" in words
    try:
        args = parser.parse_args(words)
    finally:
        _Parser.json_errors = False
    if getattr(args, "socket", None) is None and args.global_socket is not None:
        args.socket = args.global_socket
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return exits.EXIT_USAGE
    as_json = bool(getattr(args, "json", False))
    try:
        return int(handler(args))
    except SchedSwitchError as exc:
        text, code = str(exc), exc.code
        log = getattr(exc, "verifier_log", None)
        status = exits.exit_status(exc)
    except BrokenPipeError:
        raise  # run_entry ends quietly
    except OSError as exc:
        text, code, log, status = _os_error_text(exc), "os_error", None, exits.EXIT_FAILED
    if as_json:
        print(exits.error_document(code, text, log), flush=True)
    print(f"schedswitchctl: {text}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
