"""A scheduler's prepare whose failure is always a typed error.

The backend's ``prepare`` raises :class:`~schedswitchd.errors.SchedSwitchError` for every
failure it knows of (the contract of
:class:`~schedswitchd.daemon.backend.SchedulerBackend`); anything else is a defect of the
loader that some object provoked. Such a prepare is still a failed prepare of that one
scheduler: its switch is recorded failed and the scheduler backed off, a standby of it is
not held, ``--check-config`` reports it; the traceback goes to the log.
"""

from __future__ import annotations

import logging

from schedswitchd.daemon.backend import Prepared, SchedulerBackend
from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.errors import SchedSwitchError

log = logging.getLogger("schedswitchd")


class PrepareDefect(SchedSwitchError):
    """The backend's prepare of a scheduler raised an exception that is not one of the
    project's errors (a loader defect; the traceback is logged). Code ``internal``."""

    code = "internal"


def prepare_checked(backend: SchedulerBackend, name: str, spec: SchedulerConfig) -> Prepared:
    """``backend.prepare(name, spec)``. Raises what it raises if that is a
    :class:`~schedswitchd.errors.SchedSwitchError`, else :class:`PrepareDefect` naming the
    scheduler, its object and the exception (logged with its traceback). A
    ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``,
    ``SystemExit``) passes through."""
    try:
        return backend.prepare(name, spec)
    except SchedSwitchError:
        raise
    except Exception as exc:
        log.exception("preparing %s (%s) raised an unexpected error", name, spec.object)
        raise PrepareDefect(
            f"{name}: preparing {spec.object} failed unexpectedly "
            f"({type(exc).__name__}: {exc}); see the daemon's log"
        ) from exc
