"""Watching sched_ext for the kernel backend, and keeping quiet during a switch.

:meth:`SchedExtWatch.watch` calls the daemon back on every sched_ext uevent (``SCXOPS``)
and whenever a sysfs check sees ``state``/``ops``/``enable_seq`` change; its uevent
listener also keeps the BTF registry's module generation true (which a standby's
freshness check trusts). :meth:`SchedExtWatch.switch_window` holds the watch quiet (and
RCU grace periods expedited) while the daemon itself switches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

from schedswitchd.daemon.kernel_stats import BackendStats
from schedswitchd.daemon.protocol import KernelInfo
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.sched_ext.rcu_expedite import RcuExpediter
from schedswitchd.kernel.uevents import Uevent, UeventListener

log = logging.getLogger("schedswitchd.backend")

#: Interval of the sysfs check behind the uevents in :meth:`SchedExtWatch.watch` (s).
WATCH_POLL_S = 0.25


class _SwitchWindow:
    """:meth:`SchedExtWatch.switch_window`'s context manager (one use): the watch hushed,
    then the RCU expediter's window, undone in the reverse order."""

    __slots__ = ("_rcu", "_watch")

    def __init__(self, watch: SchedExtWatch) -> None:
        self._watch = watch
        self._rcu: AbstractContextManager[bool] | None = None

    def __enter__(self) -> bool:
        watch = self._watch
        watch.hush()
        if watch.rcu is None:
            return False
        try:
            rcu = watch.rcu.expedited()
            took = rcu.__enter__()
        except BaseException:
            watch.unhush()
            raise
        self._rcu = rcu
        return took

    def __exit__(self, *exc: object) -> None:
        rcu, self._rcu = self._rcu, None
        try:
            if rcu is not None:
                rcu.__exit__(None, None, None)
        finally:
            self._watch.unhush()


class SchedExtWatch:
    """The kernel backend's watch of sched_ext. ``kernel_state``: reads what the kernel
    runs (the backend's, thread-safe, never raising); ``registry``: the BTF registry the
    uevent listener keeps true; ``rcu``: what :meth:`switch_window` holds (``None``:
    nothing); ``stats``: where ``sched_ext_uevents`` and ``watch_checks_held`` are counted.
    Thread-safe."""

    def __init__(
        self,
        kernel_state: Callable[[], KernelInfo],
        registry: KernelBtfRegistry,
        rcu: RcuExpediter | None,
        stats: BackendStats,
    ) -> None:
        self.kernel_state = kernel_state
        self.registry = registry
        self.rcu = rcu
        self.stats = stats
        self._lock = threading.Lock()
        #: True while the uevent listener feeds the registry (see :attr:`module_events`).
        self.module_events = False
        #: Switch windows open now (:meth:`switch_window`): the watch reads nothing then.
        self.quiet = 0
        #: The watch's uevent listener (paused during a switch window), when it runs.
        self.listener: UeventListener | None = None

    def switch_window(self) -> AbstractContextManager[bool]:
        """Held by the switcher from before the old scheduler's detach until the new one
        runs and the waiting replies are written: expedited RCU grace periods (see
        :mod:`schedswitchd.kernel.sched_ext.rcu_expedite`; yields whether they took effect), and a
        quiet :meth:`watch`. The switch's own sched_ext uevents and state changes would
        otherwise wake the watch's threads right inside the no-scheduler gap and on the
        way to the reply, where every Python instruction is time taken from the kernel's
        work (docs/performance.md, standby hit), and the daemon's passes they kick find
        nothing the switch does not already know. So
        the uevent reader does not read during the window (the kernel's datagrams wait in
        its socket and are dispatched in order once it ends: an ejection's event is
        delivered then) and the sysfs check skips its reads (its next one, at most
        :data:`WATCH_POLL_S` s after the window, compares with its last look as always).
        Windows may nest (the watch is quiet until the outermost ends). A plain context
        manager, not a generator's (on a standby hit's path before ``BPF_LINK_DETACH``)."""
        return _SwitchWindow(self)

    def hush(self) -> None:
        """Open a switch window: the watch reads nothing until the outermost one ends."""
        with self._lock:
            self.quiet += 1
            listener = self.listener if self.quiet == 1 else None
        if listener is not None:
            listener.pause()

    def unhush(self) -> None:
        """Close a switch window opened by :meth:`hush`."""
        with self._lock:
            self.quiet -= 1
            listener = self.listener if self.quiet == 0 else None
        if listener is not None:
            listener.resume()

    def watch(self, notify: Callable[[], None]) -> Callable[[], None]:
        """Call ``notify()`` on every sched_ext uevent (``SCXOPS``) and whenever a sysfs
        check (every :data:`WATCH_POLL_S` s) sees ``state``/``ops``/``enable_seq`` change,
        so an ejection is noticed well within 1 s even if an event is lost. The uevent
        listener also keeps the BTF registry's module cache true. Returns ``stop``."""
        listener: UeventListener | None = UeventListener()
        subs = []
        try:
            assert listener is not None
            listener.start()
        except (OSError, TimeoutError) as exc:
            log.warning("no uevents (%s); relying on the sysfs check", exc)
            listener = None
        if listener is not None:

            def on_scx(ev: Uevent) -> None:
                self.stats.count("sched_ext_uevents")
                notify()

            subs.append(listener.subscribe_sched_ext(on_scx))
            subs.append(self.registry.attach(listener))
            self.module_events = True
            with self._lock:
                self.listener = listener
                if self.quiet:  # a switch window is open already
                    listener.pause()
        stop_event = threading.Event()

        def poll() -> None:
            last = self.kernel_state()
            while not stop_event.wait(WATCH_POLL_S):
                if self.quiet:  # our own switch (switch_window): look after it
                    self.stats.count("watch_checks_held")
                    continue
                now = self.kernel_state()
                if now != last:
                    last = now
                    notify()

        thread = threading.Thread(target=poll, name="scx-watch", daemon=True)
        thread.start()

        def stop() -> None:
            self.module_events = False
            with self._lock:
                if self.listener is listener:
                    self.listener = None
            stop_event.set()
            for sub in subs:
                sub.cancel()
            if listener is not None:
                listener.stop()
            thread.join(2.0)

        return stop
