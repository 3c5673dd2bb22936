"""What the three commands (``schedswitchd``, ``schedswitchctl``, ``schedswitch-run``) share
at their entry points: a closed output pipe ends them quietly.

Python ignores ``SIGPIPE``, so writing to a pipe whose reader has gone (``schedswitchd
--print-schema | head``) raises :class:`BrokenPipeError`, from ``print`` or from the final
flush at interpreter exit, and prints a traceback. :func:`run_entry` catches it anywhere
in the command (argument parsing and ``--help`` included), points stdout and stderr at
``/dev/null`` so the interpreter's own last flush cannot fail again, and returns
:data:`EXIT_BROKEN_PIPE`, the status a program killed by ``SIGPIPE`` reports in a shell.
"""

from __future__ import annotations

import os
import sys

# signal's C core instead of the module, and no typing at run time: the commands' start has
# a time budget (docs/performance.md, "Launch line").
from schedswitchd.cpython_internals import SIGPIPE, TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

#: 128 + SIGPIPE: what ``sh`` reports for a command that ``SIGPIPE`` ended.
EXIT_BROKEN_PIPE: int = 128 + SIGPIPE


def _silence(stream_fd: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream_fd)
    finally:
        os.close(devnull)


def run_entry(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None) -> int:
    """``main(argv)`` with its output flushed inside the call; a reader that went away
    (stdout or stderr) gives :data:`EXIT_BROKEN_PIPE` and no traceback. Other exceptions,
    and ``SystemExit`` from argparse, pass through unchanged."""
    try:
        status = main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        sys.stderr.flush()
        return status
    except BrokenPipeError:
        for stream in (sys.stdout, sys.stderr):
            # Not contextlib.suppress: contextlib stays off the launch line (docs/performance.md).
            try:  # noqa: SIM105
                _silence(stream.fileno())
            except (OSError, ValueError):  # ValueError: no real fd (capture)
                pass
        return EXIT_BROKEN_PIPE
