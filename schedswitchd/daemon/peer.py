"""Who is on the other end of a connection, per the kernel, and whose process a pid is.

Identity comes from ``SO_PEERCRED`` (pid, uid, gid) and ``SO_PEERGROUPS`` (supplementary
groups) of the connected socket, never from anything the client says (``socket(7)``).
Ancestry comes from ``/proc/<pid>/stat`` (``proc(5)``), read under an injectable ``/proc``
root so tests can describe a process tree without making one.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # asm-generic/socket.h
_CRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
_CRED_UNPACK, _CRED_SIZE = _CRED.unpack, _CRED.size
_SOL_SOCKET, _SO_PEERCRED = socket.SOL_SOCKET, socket.SO_PEERCRED
#: Where the kernel's process table is read.
PROC_ROOT = Path("/proc")


class Peer:
    """Who is on the other end of a connection, per the kernel: ``pid``, ``uid``, ``gid``
    and ``groups`` (the primary gid plus the supplementary groups). Immutable.

    Made by :func:`peer_of`, ``groups`` is read from the socket when first asked, and kept:
    the kernel fixed the peer's credentials at its ``connect(2)``, so a later read says
    what one at the accept would have, and a daemon without ``[auth]`` group rules never
    asks (it reads the uid only: docs/performance.md, standby hit). A socket closed by then
    reads as no supplementary groups (fewer rights, never more)."""

    __slots__ = ("_groups", "_sock", "gid", "pid", "uid")

    pid: int
    uid: int
    gid: int
    _groups: frozenset[int] | None
    _sock: socket.socket | None

    def __init__(self, pid: int, uid: int, gid: int, groups: frozenset[int] | None) -> None:
        """``groups`` as given (a test's), or ``None``: read when asked (:func:`peer_of`)."""
        setter = object.__setattr__
        setter(self, "pid", pid)
        setter(self, "uid", uid)
        setter(self, "gid", gid)
        setter(self, "_groups", groups)
        setter(self, "_sock", None)

    @property
    def groups(self) -> frozenset[int]:
        """The primary gid and the supplementary groups (``SO_PEERGROUPS``)."""
        groups = self._groups
        if groups is None:
            groups = frozenset((self.gid, *_peer_groups(self._sock)))
            object.__setattr__(self, "_groups", groups)
            object.__setattr__(self, "_sock", None)
        return groups

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Peer is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Peer):
            return NotImplemented
        return (self.pid, self.uid, self.gid, self.groups) == (
            other.pid,
            other.uid,
            other.gid,
            other.groups,
        )

    def __hash__(self) -> int:
        return hash((self.pid, self.uid, self.gid))

    def __repr__(self) -> str:
        groups = "(unread)" if self._groups is None else sorted(self._groups)
        return f"Peer(pid={self.pid}, uid={self.uid}, gid={self.gid}, groups={groups})"


def peer_of(sock: socket.socket) -> Peer:
    """``SO_PEERCRED`` of a connected Unix socket, with ``SO_PEERGROUPS`` read from
    ``sock`` when the peer's ``groups`` are first asked (``sock`` must stay open until
    then to tell them). Raises ``OSError`` when the socket has no peer credentials (not
    ``AF_UNIX``, or already gone)."""
    pid, uid, gid = _CRED_UNPACK(sock.getsockopt(_SOL_SOCKET, _SO_PEERCRED, _CRED_SIZE))
    peer = Peer(pid, uid, gid, None)
    object.__setattr__(peer, "_sock", sock)
    return peer


def _peer_groups(sock: socket.socket | None) -> tuple[int, ...]:
    """``SO_PEERGROUPS`` of ``sock``; ``()`` when it cannot be read (closed, no peer)."""
    if sock is None:
        return ()
    for size in (4 * 256, 4 * 65536):  # NGROUPS_MAX is 65536; ERANGE means "bigger buffer"
        try:
            raw = sock.getsockopt(_SOL_SOCKET, SO_PEERGROUPS, size)
        except OSError:
            continue
        return struct.unpack(f"{len(raw) // 4}I", raw)
    return ()


def parent_pid(pid: int, proc_root: Path = PROC_ROOT) -> int | None:
    """The parent of ``pid`` from ``<proc_root>/<pid>/stat`` (``proc(5)``), ``None`` if
    the process is gone or the file unreadable."""
    try:
        stat = (proc_root / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: fields after the last ')' are fixed.
    fields = stat.rpartition(b")")[2].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def is_descendant(pid: int, ancestor: int, proc_root: Path = PROC_ROOT) -> bool:
    """True if ``pid`` is ``ancestor`` or below it in the process tree."""
    for _ in range(4096):  # deeper than any real tree; guards against a /proc race loop
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        parent = parent_pid(pid, proc_root)
        if parent is None:
            return False
        pid = parent
    return False
