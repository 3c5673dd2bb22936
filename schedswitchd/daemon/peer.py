"""Who is on the other end of a connection, per the kernel, and whose process a pid is.

Identity comes from ``SO_PEERCRED`` (pid, uid, gid) and ``SO_PEERGROUPS`` (supplementary
groups) of the connected socket, never from anything the client says (``socket(7)``).
Ancestry comes from ``/proc/<pid>/stat`` (``proc(5)``), read under an injectable ``/proc``
root so tests can describe a process tree without making one.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from pathlib import Path

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # asm-generic/socket.h
_CRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
#: Where the kernel's process table is read.
PROC_ROOT = Path("/proc")


@dataclass(frozen=True)
class Peer:
    """Who is on the other end of a connection, per the kernel: ``pid``, ``uid``, ``gid``
    and ``groups`` (the primary gid plus the supplementary groups)."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int]


def peer_of(sock: socket.socket) -> Peer:
    """``SO_PEERCRED`` + ``SO_PEERGROUPS`` of a connected Unix socket. Raises ``OSError``
    when the socket has no peer credentials (not ``AF_UNIX``, or already gone)."""
    pid, uid, gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    groups: tuple[int, ...] = ()
    for size in (4 * 256, 4 * 65536):  # NGROUPS_MAX is 65536; ERANGE means "bigger buffer"
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size)
        except OSError:
            continue
        groups = struct.unpack(f"{len(raw) // 4}I", raw)
        break
    return Peer(pid, uid, gid, frozenset((gid, *groups)))


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
