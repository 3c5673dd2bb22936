"""The process a hint's lease follows: pinned with a pidfd, and only one the caller may name.

A hint may name a pid (``pid``): it must be the caller or a descendant of it unless the
caller is admin; it is pinned with a pidfd (``pidfd_open(2)``) before the ancestry check
and confirmed alive after it, so pid reuse cannot redirect a lease. A launcher that is not
the game's ancestor passes a pidfd of it instead (``pidfd: true``, ``SCM_RIGHTS`` on the
request's bytes, :mod:`schedswitchd.daemon.passed_fds`), of a process of its own uid
(admins: any). Either way the lease ends when the pidfd becomes readable (the process
exited). Refusals are :class:`~schedswitchd.daemon.protocol.RequestError` (``bad_pid``,
``denied``); no descriptor is left open on an error.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.launcher_wire import DENIED
from schedswitchd.daemon.passed_fds import NotAPidfd, PassingSocket, pidfd_target
from schedswitchd.daemon.peer import is_descendant


def pin_pid(pid: int, caller_pid: int, admin: Callable[[], bool]) -> int:
    """A pidfd for ``pid`` once the caller (process ``caller_pid``; ``admin()`` says
    whether it is an admin, asked first) may name it. Raises RequestError (``bad_pid``: no
    such process, or it exited meanwhile; ``denied``: neither the caller nor its
    descendant)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise proto.RequestError(proto.BAD_PID, f"no process {pid}") from None
    except OSError as exc:
        raise proto.RequestError(proto.BAD_PID, f"pid {pid}: {exc.strerror}") from None
    try:
        if not admin() and not is_descendant(pid, caller_pid):
            raise proto.RequestError(DENIED, f"pid {pid} is neither the caller nor its descendant")
        # Still the same process (the pidfd pins its identity, not its pid number)?
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        os.close(pidfd)
        raise proto.RequestError(proto.BAD_PID, f"process {pid} exited") from None
    except BaseException:
        os.close(pidfd)
        raise
    return pidfd


def take_passed_pidfd(
    passed: PassingSocket | None, caller_uid: int, admin: Callable[[], bool]
) -> tuple[int, int]:
    """The pidfd the client passed with its request (kept by its connection's socket
    ``passed``), and its process's pid, once the caller (uid ``caller_uid``; ``admin()``
    asked only for another uid's process) may name that process: one of its own uid
    (admins: any). Raises RequestError (``bad_pid``: none passed, not a pidfd, exited;
    ``denied``)."""
    pidfd = passed.take_fd() if passed is not None else None
    if pidfd is None:
        raise proto.RequestError(
            proto.BAD_PID,
            "pidfd: true, but no descriptor came with the request (pass a pidfd as "
            "SCM_RIGHTS on the request's bytes)",
        )
    try:
        pid, uid = pidfd_target(pidfd)
        if uid != caller_uid and not admin():
            raise proto.RequestError(
                DENIED, f"process {pid} belongs to uid {uid}, not to the caller"
            )
    except NotAPidfd as exc:
        os.close(pidfd)
        raise proto.RequestError(proto.BAD_PID, f"passed pidfd: {exc}") from None
    except BaseException:
        os.close(pidfd)
        raise
    return pidfd, pid
