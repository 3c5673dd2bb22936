"""``schedswitchd``: the service entry point (configuration, systemd glue, main loop)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from schedswitchd import __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="schedswitchd", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.parse_args(argv)
    print("schedswitchd: the service is not built yet (issue 7)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
