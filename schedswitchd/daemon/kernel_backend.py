"""The real :class:`~schedswitchd.daemon.backend.SchedulerBackend`: our loader, the kernel
BTF registry, ``/sys/kernel/sched_ext`` and bpffs pins.

:class:`KernelBackend` is the facade the daemon drives; its parts, each in a module named
for what it holds:

- :mod:`~schedswitchd.daemon.kernel_prepare`: ``prepare`` does all heavy work while the
  previous scheduler still runs (open, build the spec, module BTFs, CO-RE, maps, programs,
  the struct_ops value); ``fresh`` tells whether a standby is still what a prepare would
  make now; ``preopen``;
- :mod:`~schedswitchd.daemon.kernel_attach`: ``attach`` attaches the object's other
  programs (``fentry/bpf_scx_reg`` and tracing hooks, as a libbpf skeleton's attach),
  creates the struct_ops link and confirms ``state`` = ``enabled`` with the scheduler's
  ops name; ``pin``, which the switcher calls after the switch has replied, pins the link
  (and the data map holding the exit record, and the program links); ``detach`` detaches
  the link in the kernel (``BPF_LINK_DETACH``) and leaves removing its pin and closing its
  fd to ``discard`` (or the handle's next ``attach``);
- :mod:`~schedswitchd.daemon.kernel_adopt`: ``adopt`` takes over what a previous daemon
  pinned;
- :mod:`~schedswitchd.daemon.kernel_exit`: a scheduler's exit record;
- :mod:`~schedswitchd.daemon.kernel_stats`: counters for ``status``;
- :mod:`~schedswitchd.daemon.kernel_watch`: the watch of sched_ext and the switch window;
- :mod:`~schedswitchd.daemon.kernel_handle`: the handle, :class:`KernelPrepared`.

Every handle records per-phase timings in ns (``KernelPrepared.timings_ns``); the latest
ones also appear in :meth:`KernelBackend.counters` as ``prepare.<phase>_ns``,
``attach.<phase>_ns`` and ``detach.<phase>_ns``.

Kernel references: ``Documentation/scheduler/sched-ext.rst`` (states, ops name, exit
kinds), ``include/uapi/linux/bpf.h`` (``BPF_LINK_CREATE``, ``BPF_OBJ_PIN``/``GET``,
``BPF_LINK_GET_INFO``), and libbpf's ``bpf_object__load`` for the load order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import cast

from schedswitchd.bpf.scheduler import SCHED_EXT_OPS
from schedswitchd.daemon.backend import Prepared
from schedswitchd.daemon.config import Config, SchedulerConfig
from schedswitchd.daemon.kernel_adopt import Adoption
from schedswitchd.daemon.kernel_attach import Attacher
from schedswitchd.daemon.kernel_exit import exit_recorded, read_exit_info
from schedswitchd.daemon.kernel_handle import KernelPrepared
from schedswitchd.daemon.kernel_prepare import Preparer
from schedswitchd.daemon.kernel_stats import BackendStats, backend_counters
from schedswitchd.daemon.kernel_watch import SchedExtWatch
from schedswitchd.daemon.protocol import ExitInfo, KernelInfo
from schedswitchd.errors import SchedSwitchError
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.sched_ext import sysfs as scx
from schedswitchd.kernel.sched_ext.rcu_expedite import RcuExpediter
from schedswitchd.kernel.sched_ext.scheduler_pins import PinDir, PinError
from schedswitchd.kernel.spec_cache import SpecCache
from schedswitchd.kernel.struct_ops.link import KERNEL_LINKS, StructOpsLinkCalls
from schedswitchd.profile.topology import OnlineFile

__all__ = ["KernelBackend", "create_backend"]

log = logging.getLogger("schedswitchd.backend")


class KernelBackend:
    """sched_ext through our loader. Thread-safety: ``prepare``/``attach``/``detach``/
    ``discard``/``adopt``/``exit_info`` from one worker thread at a time (the switcher's);
    ``kernel_state``/``counters``/``watch`` from any thread.

    ``pin_dir``: bpffs directory for pins; ``registry``: the kernel BTF registry (default: a
    new one on ``/sys/kernel/btf`` with ``btf_max_entries``/``btf_max_bytes``);
    ``sched_ext_root``: ``/sys/kernel/sched_ext`` (a parameter for tests); ``ops_type``: the
    struct_ops type that makes an object a scheduler (another type only in host tests,
    which have no sched_ext); ``rcu``: what :meth:`switch_window` holds (default: nothing);
    ``sysfs_root``: the sysfs tree a scheduler profile's topology is read from (``/sys``;
    another tree only in tests); ``links``: the ``BPF_LINK_CREATE``/``BPF_LINK_DETACH``
    of struct_ops links (:mod:`schedswitchd.kernel.struct_ops.link`; the kernel's by
    default, a model of sched_ext's answers to them only in host tests).
    """

    def __init__(
        self,
        *,
        pin_dir: str | Path = "/sys/fs/bpf/schedswitchd",
        registry: KernelBtfRegistry | None = None,
        btf_max_entries: int = 16,
        btf_max_bytes: int = 64 << 20,
        sched_ext_root: Path = scx.SCHED_EXT_ROOT,
        specs: SpecCache | None = None,
        ops_type: str = SCHED_EXT_OPS,
        rcu: RcuExpediter | None = None,
        sysfs_root: str | Path = "/sys",
        links: StructOpsLinkCalls = KERNEL_LINKS,
    ) -> None:
        self.ops_type = ops_type
        self.links = links
        self.sysfs_root = Path(sysfs_root)
        #: The online CPU list, which a standby hit's quick freshness check compares.
        self.online_file = OnlineFile(self.sysfs_root)
        self.rcu = rcu
        self.pins = PinDir(pin_dir)
        self.registry = registry or KernelBtfRegistry(
            max_entries=btf_max_entries, max_bytes=btf_max_bytes
        )
        self.root = sched_ext_root
        #: ``state``/``enable_seq``/``hotplug_seq`` held open, read with one pread(2) each.
        self.scx_files = scx.StateFiles(sched_ext_root)
        self.specs = specs or SpecCache()
        self.stats = BackendStats()
        #: The watch and the switch window; its uevent listener keeps the registry's module
        #: generation true (see :meth:`fresh`).
        self.watcher = SchedExtWatch(self.kernel_state, self.registry, rcu, self.stats)
        self.preparer = Preparer(
            specs=self.specs,
            registry=self.registry,
            pins=self.pins,
            root=self.root,
            scx_files=self.scx_files,
            sysfs_root=self.sysfs_root,
            online_file=self.online_file,
            ops_type=ops_type,
            links=links,
            stats=self.stats,
            module_events=lambda: self.watcher.module_events,
        )
        self.attacher = Attacher(
            scx_files=self.scx_files,
            kernel_state=self.kernel_state,
            pins=self.pins,
            enable_helpers=self.preparer.enable_helpers,
            stats=self.stats,
        )
        self.adoption = Adoption(
            self.pins, self.specs, lambda: self.registry.vmlinux, ops_type, links, self.stats
        )

    # --- status ------------------------------------------------------------------------------

    def counters(self) -> Mapping[str, int]:
        """Registry, spec-cache and backend counters plus the latest phase timings (ns)
        (:func:`~schedswitchd.daemon.kernel_stats.backend_counters`)."""
        return backend_counters(self.registry, self.specs, self.stats)

    def profile_stats(self) -> dict[str, int]:
        """The attached scheduler's profile counters, as ``profile.<name>``
        (:meth:`~schedswitchd.daemon.kernel_stats.BackendStats.profile_stats`)."""
        return self.stats.profile_stats()

    def kernel_state(self) -> KernelInfo:
        """``/sys/kernel/sched_ext`` now; ``unavailable`` when absent or unreadable. Reads
        the three files a :class:`KernelInfo` holds (``state``, ``root/ops``,
        ``enable_seq``), not the whole status: the switcher's confirm and the watch poll
        call it on every switch."""
        files = self.scx_files
        try:
            state = files.state()
            return KernelInfo(state=str(state), ops=files.ops(), enable_seq=files.enable_seq())
        except SchedSwitchError:
            return KernelInfo(state="unavailable")

    # --- prepare -----------------------------------------------------------------------------

    def prepare(self, name: str, spec: SchedulerConfig) -> KernelPrepared:
        """Open, customise and load scheduler ``name``; never attaches
        (:meth:`Preparer.prepare <schedswitchd.daemon.kernel_prepare.Preparer.prepare>`:
        what it raises)."""
        return self.preparer.prepare(name, spec)

    def fresh(self, prepared: Prepared, spec: SchedulerConfig, *, quick: bool = False) -> bool:
        """Whether ``prepared`` is what :meth:`prepare` would make from ``spec`` now
        (:meth:`Preparer.fresh <schedswitchd.daemon.kernel_prepare.Preparer.fresh>`)."""
        return self.preparer.fresh(prepared, spec, quick=quick)

    def preopen(self, schedulers: Mapping[str, SchedulerConfig]) -> None:
        """Open every configured object into the spec cache and warm vmlinux for it; logs
        what fails (:meth:`Preparer.preopen
        <schedswitchd.daemon.kernel_prepare.Preparer.preopen>`)."""
        self.preparer.preopen(schedulers)

    def kernel_bytes(self, prepared: Prepared) -> int:
        """Kernel memory ``prepared`` holds, bytes (``memlock`` of its maps and programs; 0
        for an adopted handle)."""
        return self.preparer.kernel_bytes(prepared)

    # --- attach / detach ---------------------------------------------------------------------

    def attach(self, prepared: Prepared, timeout_s: float) -> int:
        """Create the struct_ops link and confirm the kernel runs the scheduler; returns the
        ``time.monotonic_ns()`` at which ``BPF_LINK_CREATE`` returned (:meth:`Attacher.attach
        <schedswitchd.daemon.kernel_attach.Attacher.attach>`: what it raises)."""
        return self.attacher.attach(prepared, timeout_s)

    def pin(self, prepared: Prepared) -> None:
        """Pin the attached handle's link, exit map and program links (:meth:`Attacher.pin
        <schedswitchd.daemon.kernel_attach.Attacher.pin>`). Raises ``PinError`` or
        ``LoadError``."""
        self.attacher.pin(prepared)

    def detach(self, prepared: Prepared, timeout_s: float) -> None:
        """Detach the link in the kernel (``BPF_LINK_DETACH``; :meth:`Attacher.detach
        <schedswitchd.daemon.kernel_attach.Attacher.detach>`). Raises ``SchedExtError`` on
        timeout, ``PinError`` (both in the fallback without ``BPF_LINK_DETACH`` only)."""
        self.attacher.detach(prepared, timeout_s)

    def discard(self, prepared: Prepared) -> None:
        """Free the handle (detaching first if attached). Idempotent; never raises."""
        self.attacher.discard(prepared)

    # --- exit records ------------------------------------------------------------------------

    def exit_info(self, prepared: Prepared) -> ExitInfo | None:
        """The scheduler's exit record from its data map (``uei``), or ``None``
        (:func:`~schedswitchd.daemon.kernel_exit.read_exit_info`)."""
        return read_exit_info(cast(KernelPrepared, prepared))

    def exit_recorded(self, prepared: Prepared) -> bool:
        """Whether the handle keeps an exit record :meth:`exit_info` can read. Reads
        nothing."""
        return exit_recorded(cast(KernelPrepared, prepared))

    # --- adopt -------------------------------------------------------------------------------

    def adopt(self, schedulers: Mapping[str, SchedulerConfig]) -> KernelPrepared | None:
        """Take over a scheduler pinned by a previous daemon if the kernel still runs it
        (``enabled`` and ``root/ops`` equal to its ops name) and it is configured; remove
        every other pin (stale). ``None`` when nothing was adopted."""
        try:
            st: scx.SchedExtStatus | None = scx.read_status(self.root)
        except SchedSwitchError:
            st = None
        adopted = self.adoption.adopt(schedulers, st)
        if adopted is not None:
            self.attacher.pin_owner[adopted.name] = adopted
        return adopted

    # --- watching ----------------------------------------------------------------------------

    @property
    def module_events(self) -> bool:
        """True while a :meth:`watch` runs with its uevent listener attached to the BTF
        registry, so the registry's module generation follows every module add and remove
        (and :meth:`fresh` trusts it); False without a watch, or when no uevent socket
        could be opened and the watch relies on its sysfs check."""
        return self.watcher.module_events

    def watch(self, notify: Callable[[], None]) -> Callable[[], None]:
        """Call ``notify()`` whenever sched_ext's state may have changed; returns ``stop``
        (:meth:`SchedExtWatch.watch <schedswitchd.daemon.kernel_watch.SchedExtWatch.watch>`)."""
        return self.watcher.watch(notify)

    def switch_window(self) -> AbstractContextManager[bool]:
        """Expedited RCU and a quiet watch from before the old scheduler's detach until the
        new one runs; yields whether RCU was expedited (:meth:`SchedExtWatch.switch_window
        <schedswitchd.daemon.kernel_watch.SchedExtWatch.switch_window>`)."""
        return self.watcher.switch_window()


def create_backend(config: Config) -> KernelBackend:
    """The daemon's backend factory (what :func:`schedswitchd.daemon.service.main` uses
    unless a caller passes another)."""
    rcu = RcuExpediter(
        Path("/sys"),
        Path(config.switch.runtime_dir) / "rcu_expedited.ours",
        enabled=config.switch.expedite_rcu,
    )
    rcu.recover()  # a previous daemon may have died mid-switch with the value set
    backend = KernelBackend(
        pin_dir=config.daemon.pin_dir,
        btf_max_entries=config.btf_cache.max_entries,
        btf_max_bytes=config.btf_cache.max_bytes,
        rcu=rcu,
    )
    if scx.available(backend.root):
        try:
            backend.pins.check()
        except PinError as exc:  # each switch is refused with it too (prepare)
            log.error("%s; every switch to a scheduler is refused until then", exc)
    return backend
