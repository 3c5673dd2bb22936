"""What a backend must do: the kernel side of switching, as the daemon sees it.

:class:`SchedulerBackend` is the one contract between the daemon's switching logic
(:mod:`~schedswitchd.daemon.switcher`, :mod:`~schedswitchd.daemon.standby`,
:mod:`~schedswitchd.daemon.reconcile`) and the kernel. The real backend,
:class:`~schedswitchd.daemon.kernel_backend.KernelBackend`, implements it with the loader,
``/sys/kernel/sched_ext`` and bpffs pins; host tests implement it with a fake
(``tests/daemon/fakes.py``). Its records are the wire protocol's classes, one name each:
what the kernel runs is a :class:`~schedswitchd.daemon.protocol.KernelInfo`, a
scheduler's exit record an :class:`~schedswitchd.daemon.protocol.ExitInfo`, and a switch
(filled in by the switcher) a :class:`~schedswitchd.daemon.protocol.SwitchInfo`.

This module imports nothing of the daemon but the configuration and the protocol's
records, so every module that drives a backend can import it without a circle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Protocol

from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.protocol import ExitInfo, KernelInfo

#: ``KernelInfo.state`` of a kernel without sched_ext (no ``/sys/kernel/sched_ext``).
UNAVAILABLE = "unavailable"


class Prepared(Protocol):
    """A scheduler loaded into the kernel (maps, programs, struct_ops value) but not
    necessarily attached. Opaque to the daemon except for two names."""

    @property
    def name(self) -> str:
        """The configured scheduler name (a key of ``[schedulers]``)."""
        ...

    @property
    def ops_name(self) -> str:
        """``sched_ext_ops.name``: what ``/sys/kernel/sched_ext/root/ops`` reads when it runs."""
        ...

    @property
    def timings_ns(self) -> Mapping[str, int]:
        """Durations in ns of the load's own phases (e.g. ``btf``, ``core``, ``maps``,
        ``prog:<name>``), reported as ``prepare.<phase>`` in switch records, and of the
        latest ``attach.<phase>``/``detach.<phase>``, reported as they are; may be empty."""
        ...


class SchedulerBackend(Protocol):
    """The kernel side of switching. All methods block; errors are
    :class:`~schedswitchd.errors.SchedSwitchError` subclasses (others are treated as bugs).
    Each method says its contract below.
    """

    def prepare(self, name: str, spec: SchedulerConfig) -> Prepared:
        """Open ``spec.object``, apply ``spec``'s rodata/struct_ops/hotplug_seq settings, resolve
        kmod BTFs and CO-RE against the running kernel, create maps and load programs.
        Does not touch the running scheduler. Raises ``LoadError``/``BpfSyscallError``
        (with ``verifier_log``)/``ObjectError``/... on failure, leaving nothing behind."""

    def attach(self, prepared: Prepared, timeout_s: float) -> int | None:
        """Requires sched_ext ``disabled``. Creates the struct_ops link; returns once ``state``
        reads ``enabled`` and ``root/ops`` equals ``prepared.ops_name`` (one
        confirmation: the switcher does not check again). Returns the
        ``time.monotonic_ns()`` by which the kernel was running the scheduler, as the
        confirmation showed (work after that, such as confirming, is outside the no-
        scheduler gap), or ``None`` (the gap then ends when ``attach`` returns). On
        failure or timeout: undoes the link (the kernel is ``disabled`` again) and
        raises ``SchedExtError``/``BpfSyscallError``. Must work again on a handle that
        was attached and detached before (used for rollback)."""

    def pin(self, prepared: Prepared) -> None:
        """Pins an attached handle (so that a restarted daemon can adopt it); called after
        ``attach``, once the switch's waiters were told. Raises ``PinError`` (the handle
        stays attached; the switcher rolls back)."""

    def detach(self, prepared: Prepared, timeout_s: float) -> None:
        """Detaches the link of an attached handle and returns once the kernel no longer runs it
        (``disabled``, unless someone else attached meanwhile); the handle's maps stay
        readable (for ``exit_info``) until ``discard``, and releasing its pin may be
        left to ``discard`` or the next ``attach``. A no-op if the handle is not
        attached (e.g. the kernel already ejected it). Raises ``SchedExtError`` on
        timeout."""

    def discard(self, prepared: Prepared) -> None:
        """Frees everything the handle holds (detaching first if still attached, releasing its
        pin). Idempotent; never raises."""

    def kernel_state(self) -> KernelInfo:
        """Reads ``/sys/kernel/sched_ext``. Thread-safe, cheap, never raises (``unavailable``)."""

    def exit_info(self, prepared: Prepared) -> ExitInfo | None:
        """The exit record the scheduler's ``ops.exit`` wrote to its data map, or ``None`` if it
        has none or it was never written (kind 0)."""

    def exit_recorded(self, prepared: Prepared) -> bool:
        """Whether ``exit_info`` of the handle can tell, after a ``detach``, how it ended: it keeps
        a readable exit record (the ``uei`` variable of its data map). Cheap (no
        syscall); for a standby hit, which then reads the old scheduler's exit after the
        switch instead of the kernel's state before it."""

    def adopt(self, schedulers: Mapping[str, SchedulerConfig]) -> Prepared | None:
        """At daemon start: if a link pinned by a previous daemon is still enabled and names a
        scheduler in ``schedulers``, return an attached handle for it (``detach`` works
        on it; ``exit_info`` may return ``None`` if its data map was not pinned).
        Removes every other (stale) pin. ``None`` if nothing is adopted."""

    def counters(self) -> Mapping[str, int]:
        """Loader/BTF-cache counters for status (e.g. ``btf_cache_hits``). Thread-safe."""

    def watch(self, notify: Callable[[], None]) -> Callable[[], None]:
        """Start calling ``notify()`` (from any thread, without arguments) whenever sched_ext's
        state may have changed (``SCXOPS`` uevents); returns a function that stops it."""

    def switch_window(self) -> AbstractContextManager[bool]:
        """Held from before the old scheduler's detach to after the new one's attach: kernel
        conditions that shorten the no-scheduler gap (expedited RCU grace periods);
        yields whether they took effect (recorded as ``SwitchInfo.expedited``)."""

    def fresh(self, prepared: Prepared, spec: SchedulerConfig, *, quick: bool = False) -> bool:
        """Whether an unattached handle is still what ``prepare(name, spec)`` would make now
        (object file, module set, CPU topology unchanged); cheap. For standbys."""

    def kernel_bytes(self, prepared: Prepared) -> int:
        """Kernel memory the handle holds (bytes, as the kernel accounts it). For standbys."""

    def preopen(self, schedulers: Mapping[str, SchedulerConfig]) -> None:
        """Read and parse every configured object ahead of need (ELF, BTF, relocations), so that
        the first switch to each needs no open; bounded by the backend's spec cache.
        Failures are logged, never raised (the switch itself reports them)."""
