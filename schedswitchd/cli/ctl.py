"""``schedswitchctl``: the admin and inspection tool.

Each command family is a module exposing ``register(subparsers)``; the chosen sub-parser's
``handler(args) -> int`` runs and its return value is the exit status. Errors derived from
:class:`~schedswitchd.errors.SchedSwitchError` are printed as one line and give exit 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from schedswitchd import __version__
from schedswitchd.errors import SchedSwitchError

# Command-family modules, each with ``register(subparsers)``. Listed here, not discovered,
# so that the CLI's surface is visible in one place.
_FAMILIES: tuple[str, ...] = (
    "schedswitchd.cli.daemon_cmds",
    "schedswitchd.cli.object_cmd",
    "schedswitchd.cli.object_cmds",  # adds load/unload to object_cmd's "object" family
)


def build_parser() -> argparse.ArgumentParser:
    """The full ``schedswitchctl`` argument parser."""
    import importlib

    parser = argparse.ArgumentParser(prog="schedswitchctl", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _FAMILIES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args))
    except SchedSwitchError as exc:
        print(f"schedswitchctl: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
