"""File descriptors a client passes over the daemon's socket, and the pidfds among them.

A launcher that is not the game's parent (the per-user GameMode agent: the game is
started by Steam or ``gamemoderun``, not by it) cannot name the game by a pid the daemon
checks by ancestry. It passes a pidfd of the game instead, as ``SCM_RIGHTS`` ancillary
data on the bytes of its request line (``unix(7)``): the pidfd refers to that process and
no other, so a pid number recycled meanwhile cannot redirect the lease, and it becomes
readable when the process exits (``pidfd_open(2)``), which ends the lease.

An accepted connection's socket is a :class:`PassingSocket`, whose ``recv`` (what the
server's accept step and asyncio's transport both read with) is a ``recvmsg(2)`` that also
keeps the descriptors that came with the bytes read, a few per connection at most (the rest
are closed at once, so a client cannot fill the daemon's descriptor table). A plain
``recv(2)`` would have the kernel close them unseen. What a request did not claim is
closed with the socket.

:func:`pidfd_target` reads which process a pidfd stands for and whose it is.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
from pathlib import Path

from schedswitchd.cpython_internals import accept_fd

#: Descriptors kept per connection until a request claims them; more are closed at once.
MAX_PASSED = 2
_FD = struct.Struct("i")
#: Room for the descriptors of one message (more than that: the kernel closes the rest
#: and sets ``MSG_CTRUNC``).
_ANCILLARY_BYTES = socket.CMSG_SPACE(MAX_PASSED * _FD.size)
#: A plain int: ``socket.MSG_CMSG_CLOEXEC`` is a ``MsgFlag``, whose ``|`` runs the enum's
#: Python code on every read.
_RECV_FLAGS = int(socket.MSG_CMSG_CLOEXEC)
_SOL_SOCKET, _SCM_RIGHTS = socket.SOL_SOCKET, socket.SCM_RIGHTS
#: Where the daemon reads its own descriptors' ``fdinfo`` and the processes' ``status``.
PROC_ROOT = Path("/proc")


class PassingSocket(socket.socket):
    """An accepted ``AF_UNIX`` stream socket that keeps the descriptors its peer passes
    (``SCM_RIGHTS``), at most :data:`MAX_PASSED` unclaimed at a time, in arrival order;
    :meth:`take_fd` hands the oldest over. Closing the socket closes what is left."""

    __slots__ = ("_passed",)

    def __init__(self, family: int, type: int, proto: int, fileno: int) -> None:
        super().__init__(family, type, proto, fileno)
        self._passed: list[int] = []

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        """``recv(2)`` as ``socket.recv`` does it, through ``recvmsg(2)`` so that passed
        descriptors are kept rather than closed by the kernel unseen."""
        data, ancillary, _, _ = self.recvmsg(bufsize, _ANCILLARY_BYTES, flags | _RECV_FLAGS)
        if ancillary:
            self._keep(ancillary)
        return data

    def _keep(self, ancillary: list[tuple[int, int, bytes]]) -> None:
        for level, kind, raw in ancillary:
            if level != _SOL_SOCKET or kind != _SCM_RIGHTS:
                continue
            usable = len(raw) - len(raw) % _FD.size
            for (fd,) in _FD.iter_unpack(raw[:usable]):
                if len(self._passed) < MAX_PASSED:
                    self._passed.append(fd)
                else:
                    os.close(fd)

    def take_fd(self) -> int | None:
        """The oldest passed descriptor not claimed yet (the caller closes it), or ``None``."""
        return self._passed.pop(0) if self._passed else None

    def close(self) -> None:
        """Close the socket and the descriptors no request claimed."""
        passed, self._passed = self._passed, []
        for fd in passed:
            os.close(fd)
        super().close()


def accept_passing(listener: socket.socket) -> tuple[PassingSocket, object]:
    """``listener.accept()`` of a listening ``AF_UNIX`` stream socket, with the connection
    as a :class:`PassingSocket` (in blocking mode; the caller sets what it needs). Raises
    what ``accept(2)`` raises. The descriptor is taken as it is accepted
    (:func:`~schedswitchd.cpython_internals.accept_fd`), not from the socket object
    ``accept`` makes of it first, on a standby hit's path (docs/performance.md, "Standby
    hit")."""
    fd, addr = accept_fd(listener)
    return PassingSocket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fd), addr


class NotAPidfd(ValueError):
    """A passed descriptor that is not a pidfd, or whose process has exited."""


def pidfd_target(pidfd: int, proc_root: Path = PROC_ROOT) -> tuple[int, int]:
    """``(pid, real uid)`` of the live process ``pidfd`` refers to, in the daemon's pid
    namespace: the pid from ``<proc_root>/self/fdinfo/<pidfd>``'s ``Pid:`` line (a pidfd's,
    ``Documentation/filesystems/proc.rst``; -1 once the process exited), the uid from the
    first field of ``<proc_root>/<pid>/status``'s ``Uid:`` line (``proc(5)``), and then
    ``pidfd_send_signal(2)`` with signal 0 confirms the pidfd's process still lives: it
    did all along, so the pid number read was still its own. Raises :class:`NotAPidfd`
    for any other descriptor, an exited process, or one outside the daemon's namespace."""
    try:
        info = (proc_root / "self" / "fdinfo" / str(pidfd)).read_text()
    except OSError as exc:
        raise NotAPidfd(f"descriptor unreadable: {exc.strerror}") from None
    pid = _field(info, "Pid:")
    if pid is None:
        raise NotAPidfd("the passed descriptor is not a pidfd")
    if pid <= 0:
        where = "exited" if pid < 0 else "is in another pid namespace"
        raise NotAPidfd(f"the process {where}")
    try:
        status = (proc_root / str(pid) / "status").read_text()
    except OSError:
        status = ""
    uid = _field(status, "Uid:")
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        raise NotAPidfd("the process exited") from None
    except OSError as exc:
        raise NotAPidfd(f"the passed descriptor is not a usable pidfd: {exc.strerror}") from None
    if uid is None:
        raise NotAPidfd(f"the owner of process {pid} cannot be read")
    return pid, uid


def _field(text: str, name: str) -> int | None:
    """The first number after ``name`` at the start of a line of ``text``, or ``None``."""
    for line in text.splitlines():
        if line.startswith(name):
            parts = line[len(name) :].split()
            try:
                return int(parts[0])
            except (IndexError, ValueError):
                return None
    return None
