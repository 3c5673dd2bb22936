"""What the code under test does to files below a directory, seen through Python's audit
events (PEP 578: ``open``, ``os.mkdir``, ``os.remove``, ``os.rmdir``, ``os.scandir``,
``os.listdir``, raised by the interpreter for every such call), so a test can say "detach
read no sysfs file" or "nothing was pinned" without replacing the functions that do it.

One audit hook is installed for the process on first use (hooks cannot be removed); it
hands events to the :class:`FileEvents` recorders active at the time, from any thread.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass

_recorders: list[FileEvents] = []
_lock = threading.Lock()
_seen = threading.Condition(_lock)
_installed = False


@dataclass(frozen=True)
class FileEvent:
    """One event: ``event`` (the audit event's name; ``read`` for an ``open`` for reading
    only, ``write`` for any other ``open``), ``path`` relative to the recorder's root,
    ``time_ns`` (``time.monotonic_ns()`` when it was raised)."""

    event: str
    path: str
    time_ns: int


def _hook(event: str, args: tuple[object, ...]) -> None:
    if not _recorders or event not in _EVENTS:
        return
    path = args[0] if args else None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        return  # an fd or None: nothing to place under a root
    if event == "open":
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 else 0
        if isinstance(mode, str):
            reading = not any(c in mode for c in "wax+")
        else:
            reading = isinstance(flags, int) and flags & os.O_ACCMODE == os.O_RDONLY
        event = "read" if reading else "write"
    now = time.monotonic_ns()
    full = os.path.abspath(os.fspath(path))
    with _lock:
        for rec in _recorders:
            rel = os.path.relpath(full, rec.root)
            if rel == "." or not rel.startswith(".."):
                rec.events.append(FileEvent(event, rel, now))
        _seen.notify_all()


_EVENTS = {"open", "os.mkdir", "os.remove", "os.rmdir", "os.scandir", "os.listdir"}


class FileEvents:
    """Record the file events below ``root`` while active (``with FileEvents(root) as
    ev: ...``, or :meth:`start`/:meth:`stop`)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.events: list[FileEvent] = []

    def start(self) -> FileEvents:
        global _installed
        with _lock:
            if not _installed:
                sys.addaudithook(_hook)
                _installed = True
            _recorders.append(self)
        return self

    def stop(self) -> None:
        with _lock:
            if self in _recorders:
                _recorders.remove(self)

    def __enter__(self) -> FileEvents:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def of(self, *events: str) -> list[FileEvent]:
        """The events named ``events`` (all when none given), in order."""
        with _lock:
            return [e for e in self.events if not events or e.event in events]

    def paths(self, *events: str) -> list[str]:
        """The paths of :meth:`of`."""
        return [e.path for e in self.of(*events)]

    def wait_for(self, event: str, path: str, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` s until ``event`` on ``path`` (relative to the root) was
        recorded (while active); False if it was not."""
        with _seen:
            return _seen.wait_for(
                lambda: any(e.event == event and e.path == path for e in self.events),
                timeout_s,
            )

    def clear(self) -> None:
        with _lock:
            self.events.clear()
