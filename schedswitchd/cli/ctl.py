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

A line of a command that takes the common options alone (``status``, ``list``, ``stop``,
``reload``) and nothing argparse would read differently is run without argparse (its
import, with ``re``, ``gettext``, ``locale`` and the ``shutil`` its help formatter loads
for the terminal's width, is most of what ``status`` imported): :func:`_quick_parse`.
"""

from __future__ import annotations

import os
import sys

from schedswitchd import __version__
from schedswitchd.cli import exits
from schedswitchd.cpython_internals import TYPE_CHECKING
from schedswitchd.daemon.launcher_wire import DEFAULT_SOCKET, REQUESTS
from schedswitchd.entry import run_entry
from schedswitchd.errors import SchedSwitchError

# Neither argparse nor typing is imported on a quick line (its time budget:
# docs/performance.md, "`schedswitchctl status`"); annotations are strings (PEP 563).
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
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
# (tests/cli/test_cli_entrypoints.py checks this table against what the families register).
# The daemon commands are the protocol's requests, a command per request (their table:
# launcher_wire.REQUESTS).
_FAMILIES: dict[str, tuple[str, ...]] = {
    "schedswitchd.cli.daemon_cmds": tuple(REQUESTS),
    "schedswitchd.cli.object_cmd": ("object",),
    "schedswitchd.cli.profile_cmd": ("profile",),
}
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


#: Whether a usage error also prints the ``--json`` error document: set by :func:`_main`
#: from the command line around ``parse_args``.
_json_errors = False
_PARSER: type[argparse.ArgumentParser] | None = None


def _parser_class() -> type[argparse.ArgumentParser]:
    """argparse's parser, plus the ``--json`` error document for usage errors (sub-parsers
    are made of the same class). Made on first use: argparse is imported only then."""
    global _PARSER
    if _PARSER is None:
        import argparse

        class _Parser(argparse.ArgumentParser):
            def error(self, message: str) -> NoReturn:
                if _json_errors:
                    print(exits.error_document("usage", f"{self.prog}: {message}"), flush=True)
                super().error(message)  # usage and message on stderr, exit 2

        _PARSER = _Parser
    return _PARSER


def build_parser(words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``schedswitchctl`` argument parser: the full one, or given the command line
    ``words``, one with only the chosen command's family registered (see
    :data:`_FAMILIES`)."""
    import argparse
    import importlib

    parser = _parser_class()(
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


class _QuickArgs:
    """What the parser's namespace gives a command of the common options alone."""

    def __init__(self, command: str, socket: str | None, json: bool) -> None:
        self.command, self.socket, self.json = command, socket, json


def _quick_parse(words: list[str]) -> tuple[str, str | None, bool] | None:
    """``[--socket PATH]... COMMAND [--socket PATH | --json]...`` for a COMMAND of
    :data:`schedswitchd.cli.daemon_cmds.PLAIN_COMMANDS`, read without argparse:
    ``(command, socket, json)``, exactly what the parser makes of such a line (the last
    ``--socket`` after the command, else the last one before it). ``None`` for anything
    else (other words or options, ``--socket=PATH``, abbreviations, a value starting with
    ``-``, ``--json`` before the command), which the parser then reads and, if need be,
    explains."""
    from schedswitchd.cli.daemon_cmds import PLAIN_COMMANDS

    command: str | None = None
    global_socket: str | None = None
    socket: str | None = None
    json = False
    rest = iter(words)
    for word in rest:
        if word == "--socket":
            value = next(rest, None)
            if value is None or value.startswith("-"):
                return None
            if command is None:
                global_socket = value
            else:
                socket = value
        elif word == "--json" and command is not None:
            json = True
        elif command is None and word in PLAIN_COMMANDS:
            command = word
        else:
            return None
    if command is None:
        return None
    return command, socket if socket is not None else global_socket, json


def _main(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    quick = _quick_parse(words)
    if quick is not None:
        from schedswitchd.cli.daemon_cmds import PLAIN_COMMANDS

        return _run(PLAIN_COMMANDS[quick[0]][1], _QuickArgs(*quick), as_json=quick[2])
    global _json_errors
    parser = build_parser(words)
    _json_errors = "--json" in words
    try:
        args = parser.parse_args(words)
    finally:
        _json_errors = False
    if getattr(args, "socket", None) is None and args.global_socket is not None:
        args.socket = args.global_socket
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return exits.EXIT_USAGE
    return _run(handler, args, as_json=bool(getattr(args, "json", False)))


def _run(handler: Callable[..., int], args: object, *, as_json: bool) -> int:
    """``handler(args)``'s exit status; an error it raises printed (see the module
    docstring) and turned into its status."""
    try:
        return int(handler(args))
    except SchedSwitchError as exc:
        text, code = str(exc), exc.code
        log = exc.verifier_log
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
