"""``schedswitchctl``: the admin and inspection tool.

Each command family is a module exposing ``register(subparsers)``; the chosen sub-parser's
``handler(args) -> int`` runs and its return value is the exit status. Errors derived from
:class:`~schedswitchd.errors.SchedSwitchError` and OS errors (a missing file, a refused
permission) are printed as one line and give exit 1; a closed output pipe (``| head -1``)
ends the command quietly. ``--socket PATH`` may come before the command (a global
option) or after it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from schedswitchd import __version__
from schedswitchd.daemon.launcher_wire import DEFAULT_SOCKET
from schedswitchd.errors import SchedSwitchError

# --help is for users: the module docstring above is for developers.
_DESCRIPTION = (
    "Query and steer schedswitchd, the daemon that switches sched_ext CPU schedulers,\n"
    "and inspect or load BPF scheduler objects."
)
_EPILOG = (
    "Run 'schedswitchctl COMMAND --help' for a command's options. Errors are printed as one\n"
    "line and give exit status 1. --socket PATH may also be given after the command."
)

# Command-family modules, each with ``register(subparsers)``. Listed here, not discovered,
# so that the CLI's surface is visible in one place.
_FAMILIES: tuple[str, ...] = (
    "schedswitchd.cli.daemon_cmds",
    "schedswitchd.cli.object_cmd",
    "schedswitchd.cli.profile_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    """The full ``schedswitchctl`` argument parser."""
    import importlib

    parser = argparse.ArgumentParser(
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
    for name in _FAMILIES:
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
    """Entry point; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "socket", None) is None and args.global_socket is not None:
        args.socket = args.global_socket
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        status = int(handler(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except BrokenPipeError:
        # The reader went away (``| head -1``): nothing more to say. Point stdout at
        # /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1
    except SchedSwitchError as exc:
        print(f"schedswitchctl: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"schedswitchctl: {_os_error_text(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
