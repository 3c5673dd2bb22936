"""A scheduler's own executable as a supervised child process.

scx's schedulers are programs: they open and load their BPF object, attach its struct_ops
link, then serve (some do periodic work in user space: load balancing, a user-space
dispatcher) until ``SIGINT``/``SIGTERM``, when they detach and exit. scx_loader runs them
that way (``tokio::process::Command`` with stdin from ``/dev/null``, ``SIGINT`` to stop,
then an unbounded wait). :class:`ChildScheduler` does the same with a bound: ``SIGKILL``
once ``stop_timeout_s`` passed after ``SIGINT`` (the kernel then detaches the struct_ops
link as the process's last file descriptor to it closes).

The child's stdout and stderr go to the journal under the scheduler's name as
``SYSLOG_IDENTIFIER`` (``systemd.journal.stream``, systemd-python) when the daemon runs
under systemd (``JOURNAL_STREAM`` set, as systemd sets it for a service whose output goes to
the journal), else to the daemon's own stderr. The child is its own session leader, so a
signal meant for the daemon's terminal group (a ``^C``) does not reach it unasked.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import IO

from schedswitchd.errors import ExecutableError

log = logging.getLogger("schedswitchd")


def _journal_stream(identifier: str) -> IO[str] | None:
    """A stream into the journal for ``identifier``, or ``None`` when the daemon does not
    log to the journal or the journal cannot be reached."""
    if not os.environ.get("JOURNAL_STREAM"):
        return None
    try:
        from systemd import journal  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        stream: IO[str] = journal.stream(identifier)
    except OSError as exc:
        log.warning(
            "cannot open a journal stream for %s (%s): its output goes to stderr", identifier, exc
        )
        return None
    return stream


def describe_status(returncode: int) -> str:
    """``Popen.returncode`` in words: ``exit status 1``, ``signal SIGKILL``."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


class ChildScheduler:
    """One run of a scheduler's executable. ``argv``: the program and its arguments;
    ``identifier``: the journal's ``SYSLOG_IDENTIFIER`` for its output (the configured
    scheduler's name). Not thread-safe: one switch at a time drives it (the switcher's
    worker), while :attr:`pid` and :meth:`alive` may be read from any thread."""

    def __init__(self, argv: Sequence[str], identifier: str) -> None:
        self.argv = list(argv)
        self.identifier = identifier
        self._proc: subprocess.Popen[bytes] | None = None
        #: ``time.monotonic_ns()`` when the child was started, 0 before.
        self.started_ns = 0
        #: How the child ended (``Popen.returncode``), once reaped.
        self.returncode: int | None = None
        #: Whether :meth:`stop` had to send ``SIGKILL``.
        self.killed = False

    @property
    def pid(self) -> int | None:
        """The running child's pid, ``None`` before it started or once it was reaped."""
        proc = self._proc
        return proc.pid if proc is not None and self.returncode is None else None

    def start(self) -> None:
        """Start the program. Raises :class:`ExecutableError` when it cannot be executed
        (missing, not executable, not a program this machine runs)."""
        stream = _journal_stream(self.identifier)
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=stream,
                stderr=stream if stream is not None else None,
                close_fds=True,
                start_new_session=True,
            )
        except OSError as exc:
            raise ExecutableError(
                f"{self.identifier}: cannot start {self.argv[0]}: "
                f"{exc.strerror or type(exc).__name__}"
            ) from None
        finally:
            if stream is not None:
                stream.close()  # the child holds its own copy of the socket
        self.started_ns = time.monotonic_ns()
        self.returncode = None
        self.killed = False
        log.info("%s: started %s (pid %d)", self.identifier, " ".join(self.argv), self._proc.pid)

    def alive(self) -> bool:
        """Whether the child runs (reaps it, recording :attr:`returncode`, once it ended)."""
        proc = self._proc
        if proc is None or self.returncode is not None:
            return False
        code = proc.poll()
        if code is None:
            return True
        self.returncode = code
        return False

    def stop(self, stop_timeout_s: float) -> int | None:
        """End the child as scx_loader does, bounded: ``SIGINT``, then ``SIGKILL`` after
        ``stop_timeout_s`` seconds. Returns its ``returncode`` (``None``: never started).
        Never raises."""
        proc = self._proc
        if proc is None:
            return None
        if self.alive():
            try:
                proc.send_signal(signal.SIGINT)
                proc.wait(stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.killed = True
                log.warning(
                    "%s (pid %d) did not exit within %.1f s of SIGINT: SIGKILL",
                    self.identifier,
                    proc.pid,
                    stop_timeout_s,
                )
                proc.kill()
                proc.wait()
            self.returncode = proc.returncode
            log.info(
                "%s (pid %d) ended: %s", self.identifier, proc.pid, describe_status(proc.returncode)
            )
        return self.returncode
