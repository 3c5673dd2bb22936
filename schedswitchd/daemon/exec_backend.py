"""Schedulers that run as their own executables, behind the same backend contract.

:class:`ExecutableBackend` wraps the real backend (or any
:class:`~schedswitchd.daemon.backend.SchedulerBackend`): a configuration entry with
``runs_executable`` (:mod:`schedswitchd.daemon.config`) is handled here, every other one by
the wrapped backend. So the switcher, standbys, the reconciler's backoff, leases, the admin
override, the D-Bus faces and status treat both kinds alike.

For an executable the four steps of a switch are:

- *prepare*: nothing is started; the program is checked (a regular file this process may
  execute) and its argv fixed (:func:`~schedswitchd.daemon.config.exec_argv`).
- *attach*: the kernel must be ``disabled`` (a scheduler's program cannot attach while
  another scheduler is enabled, so a switch to it detaches ours first and its start, load
  and attach all fall into the no-scheduler gap). The child is started
  (:class:`~schedswitchd.daemon.exec_child.ChildScheduler`) and ``/sys/kernel/sched_ext``
  is read until ``state`` is ``enabled``: the kernel, not the process, says that it runs;
  ``root/ops`` then gives the handle its ``ops_name``. A child that exits first, or a
  kernel that is not enabled within the switch timeout, is a failed attach
  (:class:`~schedswitchd.errors.ExecutableError`, :class:`~schedswitchd.errors.SchedExtError`),
  which the switcher rolls back like any other.
- *detach*: ``SIGINT``, ``SIGKILL`` after the entry's ``stop_timeout_s``, then the kernel
  must read ``disabled``.
- *pin*: nothing (a restarted daemon cannot adopt a child of the previous one).

An exit or ejection of a running child is seen as the kernel's: its ``state`` leaves
``enabled`` (the process's exit closes its struct_ops link), the reconciler's pass records
an ejection and backs the scheduler off. Its exit record lives in the child's maps, which
the daemon does not hold: ``exit_info`` is ``None`` for it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

from schedswitchd.daemon.backend import Prepared, SchedulerBackend
from schedswitchd.daemon.config import SchedulerConfig, exec_argv
from schedswitchd.daemon.exec_child import ChildScheduler, describe_status
from schedswitchd.daemon.protocol import ExitInfo, KernelInfo, RunsInfo
from schedswitchd.errors import ExecutableError, SchedExtError

#: How often the kernel's state is read while a child starts or stops, seconds.
_POLL_S = 0.002


class ExecPrepared:
    """A scheduler run as its executable: its argv and, once attached, its child. ``ops_name``
    is what ``root/ops`` read when the kernel enabled it (empty before)."""

    def __init__(self, name: str, spec: SchedulerConfig) -> None:
        self.name = name
        self.spec = spec
        self.argv = exec_argv(spec)
        self.ops_name = ""
        self.timings_ns: dict[str, int] = {}
        self.child: ChildScheduler | None = None

    @property
    def pid(self) -> int | None:
        """The running child's pid, or ``None``."""
        child = self.child
        return child.pid if child is not None else None


def runs_info(prepared: Prepared | None) -> RunsInfo | None:
    """How the attached scheduler ``prepared`` runs, for ``status``: ``object`` (loaded by
    the daemon) or ``executable`` (with the child's pid and argv); ``None`` for the
    kernel's own scheduler."""
    if prepared is None:
        return None
    if isinstance(prepared, ExecPrepared):
        return RunsInfo(way="executable", pid=prepared.pid, argv=prepared.argv)
    return RunsInfo(way="object")


class ExecutableBackend:
    """The wrapped ``inner`` backend, plus schedulers run as their executables (see the
    module docstring). Thread safety as the contract says: ``kernel_state`` and
    ``counters`` from any thread, the rest from the switcher's one thread."""

    def __init__(self, inner: SchedulerBackend) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        # What the wrapped backend has beyond the contract (tests and tools reach for it).
        return getattr(self.inner, name)

    # --- the switch steps ---------------------------------------------------------------------

    def prepare(self, name: str, spec: SchedulerConfig) -> Prepared:
        """An :class:`ExecPrepared` for an entry run as its executable (its program checked,
        nothing started), else the wrapped backend's. Raises :class:`ExecutableError` for a
        program that is gone or not executable."""
        if not spec.runs_executable:
            return self.inner.prepare(name, spec)
        prepared = ExecPrepared(name, spec)
        program = prepared.argv[0]
        if not os.path.isfile(program) or not os.access(program, os.X_OK):
            raise ExecutableError(f"{name}: {program} is not an executable file")
        return prepared

    def attach(self, prepared: Prepared, timeout_s: float) -> int | None:
        """Start the child and wait (at most ``timeout_s``) for the kernel to enable a
        scheduler (see the module docstring); the wrapped backend's attach otherwise."""
        if not isinstance(prepared, ExecPrepared):
            return self.inner.attach(prepared, timeout_s)
        before = self.inner.kernel_state()
        if before.state != "disabled":
            raise SchedExtError(
                f"{prepared.name}: sched_ext is {before.state} ({before.ops or 'no ops'}); "
                "a scheduler's program can attach only while it is disabled"
            )
        child = prepared.child = ChildScheduler(prepared.argv, prepared.name)
        start = time.monotonic_ns()
        child.start()
        prepared.timings_ns["attach.spawn"] = time.monotonic_ns() - start
        deadline = start + int(timeout_s * 1e9)
        while True:
            now = time.monotonic_ns()
            kernel = self.inner.kernel_state()
            if kernel.state == "enabled" and child.alive():
                prepared.ops_name = kernel.ops or ""
                prepared.timings_ns["attach.enable"] = now - start
                return now
            if not child.alive():
                code = child.returncode if child.returncode is not None else 0
                self._wait_disabled(prepared, deadline)
                raise ExecutableError(
                    f"{prepared.name}: {prepared.argv[0]} ended ({describe_status(code)}) "
                    f"{(now - start) / 1e9:.3f} s after its start, before the kernel ran a "
                    "scheduler"
                )
            if now >= deadline:
                child.stop(prepared.spec.stop_timeout_s)
                self._wait_disabled(prepared, time.monotonic_ns() + int(timeout_s * 1e9))
                raise SchedExtError(
                    f"{prepared.name}: the kernel did not enable {prepared.argv[0]}'s "
                    f"scheduler within {timeout_s:.1f} s (state {kernel.state}); stopped it"
                )
            time.sleep(_POLL_S)

    def _wait_disabled(self, prepared: ExecPrepared, deadline_ns: int) -> KernelInfo:
        """Read the kernel's state until it is ``disabled`` (or runs another scheduler)
        or ``deadline_ns`` (``time.monotonic_ns``) passed; the last state read."""
        while True:
            kernel = self.inner.kernel_state()
            if kernel.state in ("disabled", "unavailable"):
                return kernel
            if kernel.state == "enabled" and prepared.ops_name and kernel.ops != prepared.ops_name:
                return kernel
            if time.monotonic_ns() >= deadline_ns:
                return kernel
            time.sleep(_POLL_S)

    def detach(self, prepared: Prepared, timeout_s: float) -> None:
        """Stop the child (``SIGINT``, ``SIGKILL`` after ``stop_timeout_s``) and wait for
        the kernel to leave its scheduler; ``SchedExtError`` if it still runs it after
        ``timeout_s``. The wrapped backend's detach for objects."""
        if not isinstance(prepared, ExecPrepared):
            self.inner.detach(prepared, timeout_s)
            return
        child = prepared.child
        if child is None:
            return
        start = time.monotonic_ns()
        child.stop(prepared.spec.stop_timeout_s)
        stopped = time.monotonic_ns()
        prepared.timings_ns["detach.stop"] = stopped - start
        kernel = self._wait_disabled(prepared, stopped + int(timeout_s * 1e9))
        prepared.timings_ns["detach.disabled"] = time.monotonic_ns() - stopped
        prepared.child = None
        if kernel.state in ("enabling", "disabling") or (
            kernel.state == "enabled" and kernel.ops == prepared.ops_name
        ):
            raise SchedExtError(
                f"{prepared.name}: sched_ext still reads {kernel.state} {timeout_s:.1f} s "
                f"after its program ended ({describe_status(child.returncode or 0)})"
            )

    def pin(self, prepared: Prepared) -> None:
        """Nothing for an executable (see the module docstring); else the wrapped one's."""
        if not isinstance(prepared, ExecPrepared):
            self.inner.pin(prepared)

    def discard(self, prepared: Prepared) -> None:
        """Stop a child still running (never raises); the wrapped one's for objects."""
        if not isinstance(prepared, ExecPrepared):
            self.inner.discard(prepared)
            return
        child, prepared.child = prepared.child, None
        if child is not None:
            child.stop(prepared.spec.stop_timeout_s)

    # --- reads --------------------------------------------------------------------------------

    def kernel_state(self) -> KernelInfo:
        """The wrapped backend's read of ``/sys/kernel/sched_ext``."""
        return self.inner.kernel_state()

    def exit_info(self, prepared: Prepared) -> ExitInfo | None:
        """``None`` for an executable (its exit record is in the child's maps)."""
        if isinstance(prepared, ExecPrepared):
            return None
        return self.inner.exit_info(prepared)

    def exit_recorded(self, prepared: Prepared) -> bool:
        """False for an executable: its ejections are looked for before a switch."""
        if isinstance(prepared, ExecPrepared):
            return False
        return self.inner.exit_recorded(prepared)

    def adopt(self, schedulers: Mapping[str, SchedulerConfig]) -> Prepared | None:
        """The wrapped backend's adoption, among the object schedulers only."""
        return self.inner.adopt(_objects(schedulers))

    def counters(self) -> Mapping[str, int]:
        """The wrapped backend's counters."""
        return self.inner.counters()

    def watch(self, notify: Callable[[], None]) -> Callable[[], None]:
        """The wrapped backend's watch (a child's exit changes sched_ext's state too)."""
        return self.inner.watch(notify)

    def switch_window(self) -> AbstractContextManager[bool]:
        """The wrapped backend's switch window."""
        return self.inner.switch_window()

    def fresh(self, prepared: Prepared, spec: SchedulerConfig, *, quick: bool = False) -> bool:
        """An executable's handle is fresh while its argv and program are unchanged."""
        if isinstance(prepared, ExecPrepared):
            return (
                spec.runs_executable
                and prepared.argv == exec_argv(spec)
                and os.access(prepared.argv[0], os.X_OK)
            )
        if spec.runs_executable:
            return False
        return self.inner.fresh(prepared, spec, quick=quick)

    def kernel_bytes(self, prepared: Prepared) -> int:
        """0 for an executable (it holds nothing until it runs)."""
        if isinstance(prepared, ExecPrepared):
            return 0
        return self.inner.kernel_bytes(prepared)

    def preopen(self, schedulers: Mapping[str, SchedulerConfig]) -> None:
        """The wrapped backend's preopen, of the object schedulers only."""
        self.inner.preopen(_objects(schedulers))


def _objects(schedulers: Mapping[str, SchedulerConfig]) -> dict[str, SchedulerConfig]:
    return {name: spec for name, spec in schedulers.items() if not spec.runs_executable}


def with_executables(backend: SchedulerBackend) -> SchedulerBackend:
    """``backend`` able to run schedulers as their executables too (idempotent)."""
    if isinstance(backend, ExecutableBackend):
        return backend
    return ExecutableBackend(backend)
