"""``schedswitch-run WORKLOAD -- CMD [ARGS...]``: run a command while holding a hint.

What a game launcher adds to a launch line. The hint is taken before the command starts
(so the scheduler is in place when it does) and is bound to this process's connection:
it ends when the command ends, whoever kills whom. If the daemon is unreachable or refuses
the hint, a warning is printed and the command runs anyway: a missing scheduler must never
stop a game from starting. If the daemon restarts while the command runs, the hint is
taken again. Exit status: the command's (128+N if killed by signal N).

It sits on the game's launch path, so it imports the standard library and
:mod:`schedswitchd.daemon.launcher_wire` only (no pydantic, no asyncio, not even
``subprocess`` or ``typing``), and before the command starts, on the usual launch line,
not even ``argparse``, ``signal``, ``socket``, ``json`` or ``threading`` (with them ``enum``,
``re``, ``functools`` and ``collections``): its start to the command's exec has a time budget
(docs/performance.md). The command is started with ``posix_spawnp``,
as a shell's ``exec`` would leave it: it inherits the wrapper's environment and open file
descriptors (a launcher may pass some on; the daemon connection is close-on-exec), with
``SIGPIPE`` and ``SIGXFSZ`` back at their defaults (Python ignores them).
"""

from __future__ import annotations

import os
import sys

from schedswitchd import __version__
from schedswitchd.cpython_internals import (
    SIGHUP,
    SIGINT,
    SIGPIPE,
    SIGQUIT,
    SIGTERM,
    SIGXFSZ,
    TYPE_CHECKING,
    set_signal_handler,
)
from schedswitchd.daemon.launcher_wire import (
    DEFAULT_SOCKET,
    DaemonError,
    LauncherConnection,
    hint_summary,
)
from schedswitchd.entry import run_entry
from schedswitchd.errors import SchedSwitchError, unreadable

# Neither argparse nor typing is imported on the usual launch line (see _quick_parse and
# docs/performance.md, "Launch line"); annotations are strings (PEP 563).
if TYPE_CHECKING:
    import argparse
    import threading
    from collections.abc import Sequence

#: Signals passed on to the command (``signal.SIGINT``, ``SIGTERM``, ``SIGHUP``, ``SIGQUIT``).
FORWARDED: tuple[int, ...] = (SIGINT, SIGTERM, SIGHUP, SIGQUIT)


class HintHolder:
    """Holds (and re-takes after a daemon restart) one hint on a background thread."""

    def __init__(self, workload: str, socket: str | None, quiet: bool) -> None:
        self.workload, self.socket, self.quiet = workload, socket, quiet
        self.client: LauncherConnection | None = None
        #: Set to end the holding thread; made by :meth:`start`.
        self.done: threading.Event | None = None

    def say(self, text: str) -> None:
        """Print ``text`` to stderr after ``schedswitch-run:``, unless ``quiet``; a stderr that
        cannot be written turns ``quiet`` on instead of raising."""
        if self.quiet:
            return
        try:
            print(f"schedswitch-run: {text}", file=sys.stderr, flush=True)
        except OSError:
            # stderr closed or its reader gone (``2>&1 | head``): the command must run on.
            self.quiet = True

    def take(self) -> bool:
        """Connect and hint; True on success (warns and returns False otherwise)."""
        try:
            client = LauncherConnection(self.socket, timeout_s=60.0)
        except SchedSwitchError as exc:
            self.say(f"no hint ({exc}); running without it")
            return False
        try:
            reply = client.exchange({"op": "hint", "workload": self.workload})
        except DaemonError as exc:
            client.close()
            self.say(f"hint {self.workload!r} refused ({exc.code}: {exc}); running without it")
            return False
        except SchedSwitchError as exc:
            client.close()
            self.say(f"no hint ({exc}); running without it")
            return False
        self.client = client
        self.say(hint_summary(self.workload, reply))
        return True

    def start(self) -> None:
        """Start the holding thread (threading is imported here, once the command runs)."""
        import threading

        self.done = threading.Event()
        threading.Thread(target=self._hold, args=(self.done,), daemon=True).start()

    def _hold(self, done: threading.Event) -> None:
        while not done.is_set():
            client = self.client
            if client is not None:
                client.wait_closed()
                if done.is_set():
                    return
                self.client = None
                self.say("the daemon went away; will hint again when it is back")
            if done.wait(1.0):
                return
            try:
                LauncherConnection(self.socket, timeout_s=1.0).close()
            except SchedSwitchError:
                continue
            self.take()

    def release(self) -> None:
        """Stop the holding thread and close the connection, which ends the lease."""
        if self.done is not None:
            self.done.set()
        if self.client is not None:
            self.client.close()  # closing the connection ends the lease


def _prepare_only(workload: str, ttl_s: float, socket: str | None, quiet: bool) -> int:
    """Send a ``prepare`` intent; 0 once the daemon holds the scheduler, 1 otherwise."""
    try:
        conn = LauncherConnection(socket, timeout_s=60.0)
    except SchedSwitchError as exc:
        if not quiet:
            print(f"schedswitch-run: not prepared ({exc})", file=sys.stderr)
        return 1
    try:
        reply = conn.exchange({"op": "prepare", "workload": workload, "ttl_s": ttl_s})
    except SchedSwitchError as exc:
        if not quiet:
            print(f"schedswitch-run: {workload!r} not prepared ({exc})", file=sys.stderr)
        return 1
    finally:
        conn.close()
    if not quiet:
        print(
            f"schedswitch-run: {workload} -> {reply.get('scheduler')} prepared for {ttl_s:.0f} s",
            file=sys.stderr,
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``schedswitch-run`` argument parser (also what the man page is generated from)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="schedswitch-run",
        description="Run a command while holding a schedswitchd hint for WORKLOAD; the hint "
        "ends when the command ends. If the daemon is unreachable the command runs anyway.",
        usage="%(prog)s [--socket PATH] [--quiet] WORKLOAD -- CMD [ARGS...]\n"
        "       %(prog)s [--socket PATH] [--quiet] --prepare-only WORKLOAD [--ttl S]",
        epilog="Exit status: the command's (128+N if a signal N killed it); 127 the command "
        "cannot be started; 2 bad usage. With --prepare-only: 0 prepared, 1 not (the daemon "
        "is unreachable, refuses, or cannot prepare the scheduler).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--socket",
        metavar="PATH",
        help=f"daemon socket path (default: $SCHEDSWITCHD_SOCKET or {DEFAULT_SOCKET})",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="no messages on stderr")
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help="only announce WORKLOAD (the user is about to start it): the daemon prepares its "
        "scheduler without switching, so the launch that follows switches at once; exit 1 if "
        "the daemon is unreachable or refuses",
    )
    parser.add_argument(
        "--ttl",
        type=float,
        default=30.0,
        help="with --prepare-only: how long the daemon holds it, seconds (30)",
    )
    parser.add_argument(
        "workload", nargs="?", help="a workload with a hint rule (see `schedswitchctl list`)"
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="the command to run, after '--', and its args"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the command's exit status (127 if it cannot be started; 141 if
    ``--help``/``--version`` met a closed pipe: :func:`schedswitchd.entry.run_entry`)."""
    return run_entry(_main, argv)


def _quick_parse(argv: list[str]) -> tuple[str, str | None, bool, list[str]] | None:
    """The usual launch line, ``[--socket PATH] [-q|--quiet] WORKLOAD -- CMD [ARGS...]``,
    read without argparse (whose import brings ``gettext`` and ``locale``: docs/performance.md,
    "Launch line"): ``(workload, socket, quiet, command)``, exactly what the
    parser makes of such a line. ``None`` for anything else (other options, abbreviations,
    a word starting with ``-`` before ``--``, any word between WORKLOAD and ``--``, no
    command), which the parser then reads and, if need be, explains."""
    if "--" not in argv:
        return None
    cut = argv.index("--")
    command = argv[cut + 1 :]
    if not command:
        return None
    workload: str | None = None
    socket: str | None = None
    quiet = False
    words = iter(argv[:cut])
    for word in words:
        if workload is not None:
            # The parser gives every word after WORKLOAD to the command ("gaming -q -- x"
            # runs "-q -- x"): such a line is its to read.
            return None
        if word in ("-q", "--quiet"):
            quiet = True
        elif word == "--socket":
            value = next(words, None)
            if value is None or value.startswith("-"):
                return None
            socket = value
        elif word.startswith("-"):
            return None
        else:
            workload = word
    if workload is None:
        return None
    return workload, socket, quiet, command


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = _quick_parse(argv)
    if quick is not None:
        return _run(*quick)
    parser = build_parser()
    # argparse would take the first word after a leading "--" as WORKLOAD
    # ("schedswitch-run -- echo hi" would hint "echo" and run "hi"): split at "--" first.
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        if args.workload is None:
            parser.error("WORKLOAD is missing before '--' (WORKLOAD -- CMD [ARGS...])")
        # "WORKLOAD CMD -- X": this "--" belongs to the command.
        command = [*args.command, *argv[cut:]] if args.command else argv[cut + 1 :]
    else:
        args = parser.parse_args(argv)
        command = args.command
    if args.prepare_only:
        if args.workload is None or command:
            parser.error("--prepare-only takes WORKLOAD and no command")
        return _prepare_only(args.workload, args.ttl, args.socket, args.quiet)
    if args.workload is None:
        parser.error("WORKLOAD and a command are required (WORKLOAD -- CMD [ARGS...])")
    if not command:
        parser.error("no command given (WORKLOAD -- CMD [ARGS...])")
    return _run(args.workload, args.socket, args.quiet, command)


def _run(workload: str, socket: str | None, quiet: bool, command: list[str]) -> int:
    """Hold a hint for ``workload`` while ``command`` runs; its exit status."""
    holder = HintHolder(workload, socket, quiet)
    held = holder.take()
    try:
        # posix_spawnp (vfork and exec in glibc) rather than subprocess: subprocess and
        # selectors stay off the launch line (docs/performance.md), and the command should see
        # the file descriptors it would see without the wrapper, not the ones Popen leaves.
        child = os.posix_spawnp(command[0], command, os.environ, setsigdef=(SIGPIPE, SIGXFSZ))
    except OSError as exc:
        holder.release()
        why = unreadable(exc, "an executable: a path, or a name found in $PATH")
        print(f"schedswitch-run: cannot run {command[0]}: {why}", file=sys.stderr)
        return 127
    reaped = False

    def forward(signum: int, _frame: object) -> None:
        # Python runs signal handlers in the main thread, between the waitpid below and
        # the flag's setting or after both.
        if not reaped:  # once reaped, its pid may be another process's
            os.kill(child, signum)

    for sig in FORWARDED:
        set_signal_handler(sig, forward)
    if held:
        holder.start()
    try:
        code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        reaped = True
    finally:
        holder.release()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
