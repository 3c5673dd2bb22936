"""Attaching and detaching a prepared scheduler for the kernel backend, the confirmation
that the kernel runs it, and its pins.

The no-scheduler gap of a switch is ``detach`` of the old scheduler plus ``attach`` of the
new one up to the confirmation, so both do only what safety needs there. Both syscalls are
synchronous in the kernel (``kernel/sched/ext/ext.c``, 7.x): ``BPF_LINK_DETACH`` on a
struct_ops link calls ``bpf_scx_unreg()`` (``scx_disable()`` then
``scx_flush_disable_work()``) before it returns, and ``BPF_LINK_CREATE`` calls
``bpf_scx_reg()``, which queues ``scx_root_enable_workfn()`` on the ``scx_enable_helper``
kthread and flushes it, returning after the state went to ``enabled`` (or, when the
enable failed, after the disable work ran: ``state`` then reads ``disabled``). So no sysfs
read sits between the two (``BPF_LINK_CREATE`` itself refuses with ``EBUSY`` unless sched_ext
is ``disabled``), no wait sleeps, and one read of ``state`` plus ``root/ops`` right after
``BPF_LINK_CREATE`` confirms that the scheduler was enabled when the call returned -- the
end of the gap; the confirmation itself follows it, and the pinning the switch's reply.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple, cast

from schedswitchd.daemon.backend import Prepared
from schedswitchd.daemon.kernel_exit import KEY0, ejected_at_enable, writes_exit_record
from schedswitchd.daemon.kernel_handle import KernelPrepared
from schedswitchd.daemon.kernel_stats import BackendStats
from schedswitchd.daemon.protocol import KernelInfo
from schedswitchd.errors import BpfSyscallError, LoadError, SchedExtError, SchedSwitchError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.sched_ext import sysfs as scx
from schedswitchd.kernel.sched_ext.profile_steps import attach_from_cpu, run_after_attach
from schedswitchd.kernel.sched_ext.scheduler_pins import PinDir, PinError

log = logging.getLogger("schedswitchd.backend")


class _StateOps(NamedTuple):
    """What the attach/detach waits look at."""

    state: scx.ScxState
    ops: str | None


def _fmt_ms(t: Mapping[str, int]) -> str:
    """``phase 1.23 ms, ...`` of phase durations in ns, for the log."""
    return ", ".join(f"{k} {v / 1e6:.2f} ms" for k, v in t.items())


class Attacher:
    """The kernel backend's attach, pin, detach and discard of its handles (one worker
    thread at a time). ``scx_files``: ``/sys/kernel/sched_ext``'s held-open files (the
    confirmation's reads); ``kernel_state``: the backend's read of what runs (for the
    error of a refused attach); ``pins``: the pin directory; ``enable_helpers``: the
    kernel's ``scx_enable_helper`` pids (the preparer's list, refilled in place by prepare;
    for an attach CPU);
    ``stats``: counters, phase timings and the handle attached now."""

    def __init__(
        self,
        *,
        scx_files: scx.StateFiles,
        kernel_state: Callable[[], KernelInfo],
        pins: PinDir,
        enable_helpers: list[int],
        stats: BackendStats,
    ) -> None:
        self.scx_files = scx_files
        self.kernel_state = kernel_state
        self.pins = pins
        self.enable_helpers = enable_helpers
        self.stats = stats
        #: False once ``BPF_LINK_DETACH`` answered ``EOPNOTSUPP`` (kernels before 6.10).
        self.link_detach_works = True
        #: Which handle's link each pin name holds: a reload's switch of a running
        #: scheduler to its new form attaches a second handle of the same name, whose pin
        #: replaces the old one's; discarding the old handle must not remove it.
        self.pin_owner: dict[str, KernelPrepared] = {}

    def _state_ops(self) -> _StateOps:
        """Only ``state`` and, when enabled, ``root/ops``: these checks sit inside the
        no-scheduler gap, where a full status read (7 files) costs several times more
        (docs/performance.md, standby hit)."""
        state = self.scx_files.state()
        ops = self.scx_files.ops() if state is scx.ScxState.ENABLED else None
        return _StateOps(state, ops)

    def _handle(self, prepared: Prepared) -> KernelPrepared:
        h = cast(KernelPrepared, prepared)
        if not isinstance(h, KernelPrepared):
            raise TypeError(f"not a KernelPrepared: {prepared!r}")
        if h.discarded:
            raise LoadError(f"{h.name}: handle was discarded")
        return h

    def attach(self, prepared: Prepared, timeout_s: float) -> int:
        """Create the struct_ops link and confirm ``enabled`` with the ops name (then a
        profile's after-attach runs); :meth:`pin` follows once the switch has replied.
        Returns the ``time.monotonic_ns()`` at which ``BPF_LINK_CREATE`` returned: the end
        of the no-scheduler gap. The kernel enables the scheduler inside that call
        (``scx_root_enable_workfn()`` sets ``enabled`` before ``bpf_scx_reg()`` returns;
        an enable that failed returns success too, after the disable work ran), and the
        one confirmation that follows -- ``state`` ``enabled`` and ``root/ops`` naming this
        scheduler -- shows it was running by then; the confirmation is outside the gap.
        Raises ``SchedExtError`` (sched_ext not ``disabled`` -- the kernel's ``EBUSY`` --,
        the kernel disabled the scheduler at once, someone else's runs, or it was not
        enabled within ``timeout_s``) or ``BpfSyscallError`` (the kernel refused the link,
        e.g. ``ops.init`` failed); on any failure the link is gone again."""
        h = self._handle(prepared)
        if h.release_pending:  # attached again after a detach (rollback): drop the old link
            self._release(h)
        t: dict[str, int] = {}
        self.stats.count("attaches")
        # Its exit record is still the zeros of its load (see _confirmed_by_exit_record).
        first = not h.was_attached
        h.was_attached = True
        start = time.perf_counter_ns()
        try:
            if h.loaded is not None and not h.loaded.program_links:
                # The object's other programs (fentry/bpf_scx_reg, tracing hooks) go
                # first, as scx's SCX_OPS_ATTACH runs the skeleton attach before it
                # creates the struct_ops link. Not earlier (in prepare): the hooks of a
                # scheduler must not run beside the previous scheduler, whose kfunc
                # calls they could reach. Kept until the handle is discarded.
                h.loaded.attach_programs()
                t["programs"] = time.perf_counter_ns() - start
                start = time.perf_counter_ns()
            if h.plan is not None and h.loaded is not None:
                attach_from_cpu(h.loaded, h.plan, h.create_link, self.enable_helpers)
            else:
                h.create_link()
        except BpfSyscallError as exc:
            self.stats.count("attach_failures")
            if exc.errno == errno.EBUSY:
                raise self._busy(h) from exc
            raise
        except SchedSwitchError:
            self.stats.count("attach_failures")
            raise
        enabled_ns = time.monotonic_ns()
        h.attached = True
        t["link"] = time.perf_counter_ns() - start
        try:
            start = time.perf_counter_ns()
            if not (first and self._confirmed_by_exit_record(h)):
                self._confirm_enabled(h, timeout_s)
            t["confirm"] = time.perf_counter_ns() - start
            if h.plan is not None and h.loaded is not None:
                start = time.perf_counter_ns()
                run_after_attach(h.loaded, h.plan)  # e.g. a timer started once attached
                t["profile.after_attach"] = time.perf_counter_ns() - start
        except SchedSwitchError:
            self.stats.count("attach_failures")
            self._undo_attach(h)
            raise
        self.stats.phase_timings(h, "attach", t)
        self.stats.set_attached(h)
        if log.isEnabledFor(logging.DEBUG):  # formatted after the reply, by the switcher
            log.debug("attached %s (ops %s): %s", h.name, h.ops_name, _fmt_ms(t))
        return enabled_ns

    def pin(self, prepared: Prepared) -> None:
        """Pin the attached handle's link, exit map and program links under the pin dir
        (:class:`~schedswitchd.kernel.sched_ext.scheduler_pins.PinDir`), after the switch replied. A
        daemon that dies before this leaves no pin: its link fd closes, which unregisters
        the scheduler, and the kernel falls back to its own scheduler -- the same as a
        daemon stopping without pins; nothing is left behind. Raises ``PinError`` (the
        handle stays attached: the caller decides) or ``LoadError`` (not attached)."""
        h = self._handle(prepared)
        link = h.link()
        if not h.attached or link is None:
            raise LoadError(f"{h.name}: not attached, nothing to pin")
        start = time.perf_counter_ns()
        self.pins.pin(h.name, link, h.exit_map_fd(), h.program_links())
        self.pin_owner[h.name] = h
        t = {"pin": time.perf_counter_ns() - start}
        h.timings_ns["attach.pin"] = t["pin"]
        h.phased.add("attach")
        self.stats.add_timing("attach", "pin", t["pin"])
        log.info(
            "attached %s (ops %s): %s",
            h.name,
            h.ops_name,
            _fmt_ms({k[7:]: v for k, v in h.timings_ns.items() if k.startswith("attach.")}),
        )

    def _busy(self, h: KernelPrepared) -> SchedExtError:
        """The error for ``EBUSY`` from ``BPF_LINK_CREATE``: ``scx_root_enable_workfn()``
        refuses unless sched_ext is ``disabled`` (or while an earlier attachment of the
        same struct_ops map is still being torn down)."""
        st = self.kernel_state()
        if st.state != str(scx.ScxState.DISABLED):
            return SchedExtError(
                f"cannot attach {h.name}: sched_ext is {st.state} (ops {st.ops!r}), not disabled"
            )
        return SchedExtError(
            f"cannot attach {h.name}: the kernel refused with EBUSY (another scheduler was "
            "being enabled or disabled)"
        )

    def _confirmed_by_exit_record(self, h: KernelPrepared) -> bool:
        """Right after ``BPF_LINK_CREATE`` of a handle attached for the first time: True
        when ``state`` reads ``enabled`` and the scheduler's own exit record is still
        empty -- then the scheduler the kernel runs is this one. The kernel calls
        ``ops.exit`` once per enabled-or-failed scheduler instance, and an enable that
        failed (``ops.init``, a stale ``hotplug_seq``, an error during it) returns from
        ``BPF_LINK_CREATE`` only after its disable work ran (``scx_root_enable_workfn()``
        then ``scx_root_disable()`` on the ``scx_enable_helper`` kthread, flushed by
        ``bpf_scx_reg()``; ``kernel/sched/ext/ext.c``), so a failed enable has written its
        record by now; so has an ejection right after the enable. One ``pread(2)`` of the
        held ``state`` descriptor and the record read in place from the handle's mapping
        of its data map (:attr:`KernelPrepared.exit_view`, made by prepare; without one,
        a ``BPF_MAP_LOOKUP_ELEM``) instead of opening ``root/ops`` (an ``open(2)`` of
        sysfs costs about two reads: docs/performance.md). Raises
        ``SchedExtError`` when the record shows the exit. False (nothing decided: the
        caller confirms from sysfs) when the handle keeps no record its ``ops.exit``
        writes, or the state or record cannot be read, or ``state`` is not ``enabled``."""
        view = h.exit_view
        if view is not None:
            # The same two facts, the record read in place (no bpf(2) call, no buffers).
            try:
                if self.scx_files.state() is not scx.ScxState.ENABLED:
                    return False
                if view.empty():
                    return True
                rec = view.record()
            except (SchedSwitchError, ValueError):
                return False
            if rec is None:
                return True
            raise ejected_at_enable(h, rec.kind, rec.reason)
        if not writes_exit_record(h):
            return False
        assert h.uei is not None and h.spec is not None
        fd = h.exit_map_fd()
        if fd is None:
            return False
        try:
            if self.scx_files.state() is not scx.ScxState.ENABLED:
                return False
            value = syscall.map_lookup_elem(fd, KEY0, h.spec.map(h.uei.map_name).value_size)
            rec = h.uei.decode(value) if value is not None else None
        except (SchedSwitchError, ValueError, KeyError):
            return False
        if value is None:
            return False
        if rec is not None:
            raise ejected_at_enable(h, rec.kind, rec.reason)
        return True

    def _confirm_enabled(self, h: KernelPrepared, timeout_s: float) -> None:
        # BPF_LINK_CREATE returns once scx_root_enable_workfn() finished: "enabled" then,
        # or "disabled"/"disabling" when the kernel threw the scheduler out (its exit record
        # says why) -- fail at once. Only a transitional "enabling" (someone else's enable
        # after ours ended) is waited for.
        deadline: float | None = None
        while True:
            st = self._state_ops()
            if st.state is scx.ScxState.ENABLED:
                if st.ops == h.ops_name:
                    return
                raise SchedExtError(
                    f"after attaching {h.name} the kernel runs {st.ops!r}, not {h.ops_name!r}"
                )
            if st.state in (scx.ScxState.DISABLED, scx.ScxState.DISABLING):
                raise SchedExtError(
                    f"{h.name} ({h.ops_name}) was disabled by the kernel right after attach"
                )
            if deadline is None:
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() >= deadline:
                raise SchedExtError(
                    f"{h.name} not enabled within {timeout_s * 1000:.0f} ms (state {st.state})"
                )
            time.sleep(0.002)

    def _undo_attach(self, h: KernelPrepared) -> None:
        detached = self._detach_in_kernel(h)  # synchronous: nothing to wait for after it
        h.attached = False
        self._release(h)
        if detached:
            return
        try:
            self._wait_disabled(h, 2.0)
        except SchedSwitchError as exc:
            log.warning("after a failed attach of %s: %s", h.name, exc)

    def _release(self, h: KernelPrepared) -> None:
        """Remove the handle's pins and close its link fd (the link is already detached in
        the kernel, or closing it is what unregisters the scheduler). A pin of the same
        name that another handle made since is left alone."""
        if self.pin_owner.get(h.name, h) is h:
            self.pin_owner.pop(h.name, None)
            try:
                self.pins.unpin(h.name)
            except PinError as exc:
                log.warning("%s", exc)
        h.close_link()
        h.release_pending = False

    def _detach_in_kernel(self, h: KernelPrepared) -> bool:
        """``BPF_LINK_DETACH`` on the handle's link: the kernel unregisters the scheduler
        before the call returns, whatever else (pins, other processes) still holds the
        link. False when it could not be used (kernels before 6.10 answer ``EOPNOTSUPP``
        for struct_ops links), so the caller falls back to dropping every reference."""
        link = h.link()
        if link is None or not self.link_detach_works:
            return False
        try:
            h.links.detach(link)
        except BpfSyscallError as exc:
            if exc.errno == errno.EOPNOTSUPP:
                self.link_detach_works = False
            log.warning("BPF_LINK_DETACH of %s failed (%s); closing the link instead", h.name, exc)
            return False
        return True

    def _wait_disabled(self, h: KernelPrepared, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            st = self._state_ops()
            if st.state is scx.ScxState.DISABLED:
                return
            if st.state is scx.ScxState.ENABLED and st.ops != h.ops_name:
                return  # someone else's scheduler: ours is gone
            if time.monotonic() >= deadline:
                raise SchedExtError(
                    f"{h.name} ({h.ops_name}) still {st.state} {timeout_s * 1000:.0f} ms "
                    "after its link was closed"
                )
            time.sleep(0.002)

    def detach(self, prepared: Prepared, timeout_s: float) -> None:
        """Detach the link in the kernel (``BPF_LINK_DETACH``: the scheduler is disabled
        when the call returns); its pin and fd are released by :meth:`discard` or the
        handle's next :meth:`attach`, after the new scheduler runs. On kernels without
        ``BPF_LINK_DETACH`` for struct_ops links: unpin and close the link, then wait for
        ``disabled``. The maps stay readable until :meth:`discard`. A no-op for a handle
        that is not attached. Raises ``SchedExtError`` on timeout (fallback only),
        ``PinError`` when the pin cannot be removed (fallback only)."""
        h = self._handle(prepared)
        self.stats.clear_attached(h)
        if not h.attached:
            return
        self.stats.count("detaches")
        t: dict[str, int] = {}
        start = time.perf_counter_ns()
        if self._detach_in_kernel(h):
            t["link_detach"] = time.perf_counter_ns() - start
            h.attached = False
            h.release_pending = True
        else:
            start = time.perf_counter_ns()
            if self.pin_owner.get(h.name, h) is h:
                self.pin_owner.pop(h.name, None)
                self.pins.unpin(h.name)
            t["unpin"] = time.perf_counter_ns() - start
            start = time.perf_counter_ns()
            h.close_link()
            h.attached = False
            t["link_close"] = time.perf_counter_ns() - start
            start = time.perf_counter_ns()
            self._wait_disabled(h, timeout_s)
            t["disable_wait"] = time.perf_counter_ns() - start
        self.stats.phase_timings(h, "detach", t)
        # Debug only: this line would be formatted and written inside the no-scheduler gap
        # (the daemon's own "switched A -> B" line reports the switch once it is over).
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "detached %s: %s",
                h.name,
                ", ".join(f"{k} {v / 1e6:.2f} ms" for k, v in t.items()),
            )

    def discard(self, prepared: Prepared) -> None:
        """Free the handle (detaching first if attached). Idempotent; never raises."""
        h = cast(KernelPrepared, prepared)
        if h.discarded:
            return
        if h.attached:
            try:
                self.detach(h, 5.0)
            except SchedSwitchError as exc:
                log.warning("discarding %s: %s", h.name, exc)
                h.attached = False
        if h.release_pending:
            self._release(h)
        with self.stats.attached_lock:  # not while status reads its maps
            if self.stats.attached is h:
                self.stats.attached = None
            h.close()
            h.discarded = True
