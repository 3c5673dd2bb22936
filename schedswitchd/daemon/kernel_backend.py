"""The real :class:`~schedswitchd.daemon.backend.SchedulerBackend`: our loader, the kernel
BTF registry, ``/sys/kernel/sched_ext`` and bpffs pins.

``prepare`` does all heavy work while the previous scheduler still runs: open the object
(:class:`~schedswitchd.kernel.spec_cache.SpecCache`, keyed by path, device, inode, size and
mtime), apply the configuration (``.rodata`` tunables, ``sched_ext_ops`` scalars,
``hotplug_seq`` from ``/sys/kernel/sched_ext/hotplug_seq``), read only the module BTFs the
object declares in ``.kmod_btfs`` plus the configured extras (through the registry's bounded
cache), run CO-RE, create maps, load programs and write the ``sched_ext_ops`` struct_ops
value (``BPF_MAP_UPDATE_ELEM``: member checks and one trampoline per program; for a
``BPF_F_LINK`` map it registers nothing). ``attach`` attaches the object's other
programs (``fentry/bpf_scx_reg`` and tracing hooks, as a libbpf skeleton's attach), creates
the struct_ops link and confirms ``state`` = ``enabled`` with the scheduler's ops name;
``pin``, which the switcher calls after the switch has replied, pins the link (and the
data map holding the exit record, and the program links) under the pin directory (the
program links stay until the handle is discarded); ``detach``
detaches the link in the kernel (``BPF_LINK_DETACH``) and leaves removing its pin and
closing its fd to
:meth:`KernelBackend.discard` (or the handle's next ``attach``). ``adopt`` re-opens what a
previous daemon pinned.

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

Every handle records per-phase timings in ns (``KernelPrepared.timings_ns``); the latest
ones also appear in :meth:`KernelBackend.counters` as ``prepare.<phase>_ns``,
``attach.<phase>_ns`` and ``detach.<phase>_ns``.

Kernel references: ``Documentation/scheduler/sched-ext.rst`` (states, ops name, exit
kinds), ``include/uapi/linux/bpf.h`` (``BPF_LINK_CREATE``, ``BPF_OBJ_PIN``/``GET``,
``BPF_LINK_GET_INFO``), and libbpf's ``bpf_object__load`` for the load order.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, cast

from schedswitchd.bpf.core.relocate import CandidateCache
from schedswitchd.bpf.scheduler import (
    SCHED_EXT_OPS,
    ops_name_of,
    sched_ext_map,
)
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.daemon.backend import Prepared
from schedswitchd.daemon.config import Config, SchedulerConfig
from schedswitchd.daemon.protocol import ExitInfo, KernelInfo
from schedswitchd.daemon.scheduler_spec import (
    ProfileFile,
    SpecInputs,
    build_scheduler_spec,
    needs_kernel_btf,
    read_profile_file,
    spec_inputs,
)
from schedswitchd.errors import (
    BpfSyscallError,
    LoadError,
    SchedExtError,
    SchedSwitchError,
)
from schedswitchd.kernel import bpf_uapi, syscall
from schedswitchd.kernel.btf.module_needs import object_module_lookups
from schedswitchd.kernel.btf.registry import KernelBtfRegistry, TargetReport, memo_counters
from schedswitchd.kernel.fd import LinkFd, MapFd
from schedswitchd.kernel.fdinfo import memlock_bytes
from schedswitchd.kernel.loader import LoadedObject, load_object
from schedswitchd.kernel.sched_ext import sysfs as scx
from schedswitchd.kernel.sched_ext.exit_info import UeiLayout, UeiView, uei_layout
from schedswitchd.kernel.sched_ext.profile_steps import (
    attach_from_cpu,
    enable_helper_pids,
    read_stats,
    run_after_attach,
    run_before_attach,
)
from schedswitchd.kernel.sched_ext.rcu_expedite import RcuExpediter
from schedswitchd.kernel.sched_ext.scheduler_pins import PinDir, PinError
from schedswitchd.kernel.spec_cache import SpecCache, SpecKey
from schedswitchd.kernel.struct_ops.link import KERNEL_LINKS, StructOpsLinkCalls
from schedswitchd.kernel.struct_ops.value import find_struct_ops_kernel_type
from schedswitchd.kernel.uevents import Uevent, UeventListener
from schedswitchd.profile.apply import ProfiledSpec, ProfilePlan
from schedswitchd.profile.model import Profile
from schedswitchd.profile.topology import OnlineFile, Topology, read_topology

log = logging.getLogger("schedswitchd.backend")

#: Interval of the sysfs check behind the uevents in :meth:`KernelBackend.watch` (s).
WATCH_POLL_S = 0.25
_KEY0 = b"\0\0\0\0"


class _StateOps(NamedTuple):
    """What the attach/detach waits look at."""

    state: scx.ScxState
    ops: str | None


class _SwitchWindow:
    """:meth:`KernelBackend.switch_window`'s context manager (one use): the watch hushed,
    then the RCU expediter's window, undone in the reverse order."""

    __slots__ = ("_backend", "_rcu")

    def __init__(self, backend: KernelBackend) -> None:
        self._backend = backend
        self._rcu: AbstractContextManager[bool] | None = None

    def __enter__(self) -> bool:
        backend = self._backend
        backend._hush()
        if backend.rcu is None:
            return False
        try:
            rcu = backend.rcu.expedited()
            took = rcu.__enter__()
        except BaseException:
            backend._unhush()
            raise
        self._rcu = rcu
        return took

    def __exit__(self, *exc: object) -> None:
        rcu, self._rcu = self._rcu, None
        try:
            if rcu is not None:
                rcu.__exit__(None, None, None)
        finally:
            self._backend._unhush()


@dataclass(eq=False)
class KernelPrepared:
    """A scheduler loaded by :meth:`KernelBackend.prepare` or taken over by
    :meth:`KernelBackend.adopt`.

    ``name``: configured name; ``ops_name``: ``sched_ext_ops.name``; ``spec``: the
    customised object spec (``None`` for an adopted handle whose object no longer opens);
    ``ops_map``: name of its ``sched_ext_ops`` struct_ops map;
    ``loaded``: the loaded object (``None`` for an adopted handle, which holds the link,
    the struct_ops map, the exit map and the program links as ``adopted_*`` fds instead);
    ``uei``: where the exit record lives (``None`` when the object keeps none); ``report``:
    which module BTFs the load read; ``timings_ns``: phase durations in ns.
    """

    name: str
    ops_name: str
    spec: ObjectSpec | None
    ops_map: str
    loaded: LoadedObject | None
    uei: UeiLayout | None
    report: TargetReport | None = None
    timings_ns: dict[str, int] = field(default_factory=dict)
    attached: bool = False
    discarded: bool = False
    #: Detached in the kernel (``BPF_LINK_DETACH``) but its pin and link fd not yet released.
    release_pending: bool = False
    adopted_link: LinkFd | None = None
    adopted_ops_map: MapFd | None = None
    adopted_exit_map: MapFd | None = None
    #: What it was prepared from (see :meth:`KernelBackend.fresh`; ``None`` when adopted).
    inputs: Freshness | None = None
    #: An adopted handle's program links (fentry/bpf_scx_reg, tracing hooks) by program.
    adopted_program_links: dict[str, LinkFd] = field(default_factory=dict)
    #: The profile's steps after load: attach CPU, after-attach runs, ``[[stats]]``
    #: (``None`` without a profile, and for an adopted handle).
    plan: ProfilePlan | None = None
    #: What creates its struct_ops link (the backend's :attr:`KernelBackend.links`).
    links: StructOpsLinkCalls = KERNEL_LINKS
    #: Attached at least once: its exit record may hold an earlier exit's kind.
    was_attached: bool = False
    #: Its exit record read in place (a read-only mapping of its data map), made by
    #: prepare when its ``ops.exit`` writes one: the first attach's confirmation
    #: (:meth:`KernelBackend._confirmed_by_exit_record`) then makes no ``bpf(2)`` call.
    exit_view: UeiView | None = None
    #: The prefixes (``attach``, ``detach``) whose phases it has recorded.
    phased: set[str] = field(default_factory=set)

    @property
    def adopted(self) -> bool:
        """True for a handle made by :meth:`KernelBackend.adopt`."""
        return self.loaded is None

    def exit_map_fd(self) -> MapFd | None:
        """The data map holding the exit record, if known."""
        if self.loaded is not None:
            if self.uei is None:
                return None
            m = self.loaded.maps.get(self.uei.map_name)
            return m.fd if m is not None else None
        return self.adopted_exit_map

    def program_links(self) -> dict[str, LinkFd]:
        """The links of the object's auto-attached programs, by program name."""
        if self.loaded is not None:
            return dict(self.loaded.program_links)
        return dict(self.adopted_program_links)

    def link(self) -> LinkFd | None:
        """The struct_ops link while attached."""
        if self.loaded is not None:
            return self.loaded.links.get(self.ops_map)
        return self.adopted_link

    def create_link(self) -> LinkFd:
        """Register the scheduler: write the struct_ops value (first time) and create the
        link (``BPF_LINK_CREATE``, attach type ``BPF_STRUCT_OPS``)."""
        if self.loaded is not None:
            made = self.loaded.attach_struct_ops(self.ops_map, links=self.links)
            link = made.get(self.ops_map) or self.loaded.links.get(self.ops_map)
            if link is None:
                raise LoadError(f"{self.name}: struct_ops map {self.ops_map} made no link")
            return link
        if self.adopted_ops_map is None:
            raise LoadError(f"{self.name}: adopted without its struct_ops map")
        self.adopted_link = self.links.create(self.adopted_ops_map)
        return self.adopted_link

    def close_link(self) -> None:
        """Close the link (the scheduler is unregistered when its last reference goes)."""
        if self.loaded is not None:
            self.loaded.detach_struct_ops(self.ops_map)
        elif self.adopted_link is not None:
            self.adopted_link.close()
            self.adopted_link = None

    def close(self) -> None:
        """Close every fd the handle owns: the struct_ops link before the program links
        (the scheduler goes while its hooks still run), then the rest; unmap the exit
        record's view."""
        if self.exit_view is not None:
            self.exit_view.close()
        if self.loaded is not None:
            self.loaded.close()
        if self.adopted_link is not None:
            self.adopted_link.close()
        for link in reversed(list(self.adopted_program_links.values())):
            link.close()
        self.adopted_program_links.clear()
        for fd in (self.adopted_ops_map, self.adopted_exit_map):
            if fd is not None:
                fd.close()


def _ejected_at_enable(h: KernelPrepared, kind: int, reason: str) -> SchedExtError:
    """The error of a first enable that the kernel undid at once: ``h``'s own exit record
    already holds an exit (``kind``, ``reason``) when ``BPF_LINK_CREATE`` returned."""
    return SchedExtError(
        f"{h.name} ({h.ops_name}) was disabled by the kernel right after attach "
        f"({ExitInfo(kind=kind).kind_name}: {reason})"
    )


def _unchanged(path: str | os.PathLike[str], key: SpecKey | None) -> SpecKey | None:
    """``key`` when ``path`` (symlinks followed) is still the file ``key`` was taken of,
    unchanged; ``None`` otherwise: one stat(2), no ``realpath`` walk (a freshness check is
    on a standby hit's path)."""
    if key is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    same = (key.dev, key.ino, key.size, key.mtime_ns) == (
        st.st_dev,
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
    )
    return key if same else None


@dataclass(slots=True)
class Freshness:
    """What a prepared handle was made from (:meth:`KernelBackend.fresh` compares it with
    what it reads now): ``spec``, the inputs of its
    :func:`~schedswitchd.daemon.scheduler_spec.build_scheduler_spec`; ``modules``, the
    loaded module set its load read (a ``module_set().key``, ``None`` when unlistable);
    ``hotplug_seq`` and ``online``, ``hotplug_seq`` and the online CPU list as read before
    the topology (or at the last full check that found the topology unchanged): while
    both still read the same, the topology has not changed."""

    spec: SpecInputs
    modules: object
    hotplug_seq: int | None
    online: bytes | None


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
        #: The handle attached now, for the profile counters status reads from any thread;
        #: ``_stats_lock`` keeps its maps open while they are read.
        self._attached: KernelPrepared | None = None
        self._stats_lock = threading.Lock()
        self.rcu = rcu
        self.pins = PinDir(pin_dir)
        self.registry = registry or KernelBtfRegistry(
            max_entries=btf_max_entries, max_bytes=btf_max_bytes
        )
        self.root = sched_ext_root
        #: ``state``/``enable_seq``/``hotplug_seq`` held open, read with one pread(2) each.
        self.scx_files = scx.StateFiles(sched_ext_root)
        #: The watch's uevent listener keeps the registry's module generation true
        #: (see :meth:`fresh`).
        self._module_events = False
        self.specs = specs or SpecCache()
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        #: The latest attach/detach phases by prefix (see :meth:`_timings`).
        self._latest: dict[str, dict[str, int]] = {}
        self._link_detach_works = True
        #: Which handle's link each pin name holds: a reload's switch of a running
        #: scheduler to its new form attaches a second handle of the same name, whose pin
        #: replaces the old one's; discarding the old handle must not remove it.
        self._pin_owner: dict[str, KernelPrepared] = {}
        #: The kernel's ``scx_enable_helper`` pids (made on the first enable since boot and
        #: kept), for profiles with an attach CPU; looked up by prepare.
        self._enable_helpers: list[int] = []
        #: Switch windows open now (:meth:`switch_window`): the watch reads nothing then.
        self._quiet = 0
        #: The watch's uevent listener (paused during a switch window), when it runs.
        self._listener: UeventListener | None = None

    # --- counters ----------------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + n

    def _timings(self, prefix: str, timings: Mapping[str, int]) -> None:
        """The latest ``prefix`` phases for :meth:`counters` (``<prefix>.<phase>_ns``),
        replacing the previous ones; kept as they are and expanded when counters are read:
        detach calls this inside the no-scheduler gap."""
        with self._lock:
            self._latest[prefix] = dict(timings)

    def counters(self) -> Mapping[str, int]:
        """Registry, spec-cache and backend counters plus the latest phase timings (ns)."""
        st = self.registry.stats()
        sp = self.specs.stats()
        out = {
            "btf_cache_hits": st.cache.hits,
            "btf_cache_misses": st.cache.misses,
            "btf_cache_evictions": st.cache.evictions,
            "btf_cache_invalidations": st.cache.invalidations,
            "btf_cache_entries": st.cache.entries,
            "btf_cache_bytes": st.cache.bytes_held,
            "module_btfs_read": st.module_btfs_read,
            "module_btf_read_ns": st.read_ns,
            "module_uevents": st.module_uevents,
            # Unreadable/malformed module BTFs left out of all-module searches (warned once).
            "module_btfs_skipped": st.skipped,
            # Which modules hold what vmlinux lacks, per module set (objects without
            # .kmod_btfs): hits avoid a walk over every module BTF.
            **memo_counters(st.lookups),
            "spec_cache_hits": sp.hits,
            "spec_cache_misses": sp.misses,
            # Process-wide bpf(2) calls and time inside them (for bench/switch_latency.py).
            "bpf_syscalls": syscall.STATS.calls,
            "bpf_syscall_ns": syscall.STATS.total_ns,
        }
        with self._lock:
            out.update(self._counts)
            for prefix, timings in self._latest.items():
                out.update({f"{prefix}.{k}_ns": v for k, v in timings.items()})
        out.update(self.profile_stats())
        return out

    def profile_stats(self) -> dict[str, int]:
        """The attached scheduler's profile counters (its ``[[stats]]``), read from its
        loaded maps now, as ``profile.<name>``; empty without a profiled scheduler
        attached. A counter that cannot be read is left out (logged at debug)."""
        with self._stats_lock:
            h = self._attached
            if h is None or h.plan is None or h.loaded is None or h.discarded:
                return {}
            try:
                stats = read_stats(h.loaded, h.plan)
            except SchedSwitchError as exc:
                log.debug("profile counters of %s: %s", h.name, exc)
                return {}
            return {f"profile.{k}": v for k, v in stats.items()}

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

    def _hush(self) -> None:
        with self._lock:
            self._quiet += 1
            listener = self._listener if self._quiet == 1 else None
        if listener is not None:
            listener.pause()

    def _unhush(self) -> None:
        with self._lock:
            self._quiet -= 1
            listener = self._listener if self._quiet == 0 else None
        if listener is not None:
            listener.resume()

    # --- kernel view -------------------------------------------------------------------------

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

    def _status(self) -> scx.SchedExtStatus:
        return scx.read_status(self.root)

    def _state_ops(self) -> _StateOps:
        """Only ``state`` and, when enabled, ``root/ops``: these checks sit inside the
        no-scheduler gap, where a full status read (7 files) costs several times more
        (docs/performance.md, standby hit)."""
        state = self.scx_files.state()
        ops = self.scx_files.ops() if state is scx.ScxState.ENABLED else None
        return _StateOps(state, ops)

    # --- prepare -----------------------------------------------------------------------------

    def prepare(self, name: str, spec: SchedulerConfig) -> KernelPrepared:
        """Open, customise and load scheduler ``name`` (see the module docstring); never
        attaches. Raises ``ObjectError``/``CustomizationError``/``BtfError``/``CoreError``/
        ``LoadError`` (``ProgramLoadError`` with ``verifier_log``)/``BpfSyscallError``/
        ``RegistryError``, ``PinError`` (the pin directory is not on a writable bpffs:
        :meth:`PinDir.check <schedswitchd.kernel.sched_ext.scheduler_pins.PinDir.check>`); a failure
        leaves nothing loaded. When declared modules are not loaded, the error message
        names them."""
        self._count("prepares")
        try:
            handle = self._prepare(name, spec)
        except SchedSwitchError:
            self._count("prepare_failures")
            raise
        self._timings("prepare", handle.timings_ns)
        log.info(
            "prepared %s (ops %s): %s",
            name,
            handle.ops_name,
            ", ".join(f"{k} {v / 1e6:.2f} ms" for k, v in handle.timings_ns.items()),
        )
        return handle

    def _prepare(self, name: str, cfg: SchedulerConfig) -> KernelPrepared:
        t: dict[str, int] = {}
        opened = self.specs.open(cfg.object)
        t["open"] = opened.open_ns
        start = time.perf_counter_ns()
        # Not a scheduler: refused first, whatever the kernel (the build finds it again).
        sched_ext_map(opened.spec, self.ops_type)
        if self.ops_type == SCHED_EXT_OPS and not scx.available(self.root):
            raise scx.SchedExtUnavailable(
                f"cannot load {name}: this kernel has no sched_ext ({self.root / 'state'} "
                "is missing; CONFIG_SCHED_CLASS_EXT is not set)"
            )
        # The switch pins the scheduler once it runs and its reply went out: a pin that
        # cannot work would roll every switch back after an "ok" (and with the lease live,
        # again on every pass). Refused here, before anything is loaded or detached.
        self.pins.check()
        # Read before the topology: an equal value later means no CPU came or went since
        # the topology was read (see fresh).
        seq: int | None = None
        if (cfg.hotplug_seq or cfg.profile_path is not None) and scx.available(self.root):
            seq = scx.read_hotplug_seq(self.root)
        module_key = self._module_key()
        topology: Topology | None = None
        profile: ProfileFile | None = None
        online: bytes | None = None
        if cfg.profile_path is not None:
            # The topology is read now, so the profile's values are those of the machine
            # the scheduler is loaded on (a hotplug restart comes through here again).
            profile = read_profile_file(cfg.profile_path)
            online = self.online_file.read()  # before the topology too (see fresh)
            topology = read_topology(self.sysfs_root)

        def profiled(profile: Profile, applied: ProfiledSpec) -> None:
            for note in applied.plan.notes:
                log.info("profile %s: %s", profile.name, note)
            t["profile"] = time.perf_counter_ns() - start

        built = build_scheduler_spec(
            opened,
            cfg,
            topology=topology,
            vmlinux=self.registry.vmlinux if needs_kernel_btf(cfg) else None,
            profile=profile,
            hotplug_seq=seq,
            ops_type=self.ops_type,
            on_profile=profiled,
        )
        for note in built.flag_notes:
            log.warning("%s", note)
        spec, plan, ops_name, ops_map = built.spec, built.plan, built.ops_name, built.ops_map
        uei = uei_layout(spec)
        t["customize"] = time.perf_counter_ns() - start
        start = time.perf_counter_ns()
        targets = self.registry.targets(spec.kmod_btfs, extra=cfg.kmods)
        t["kmod_btfs"] = time.perf_counter_ns() - start
        start = time.perf_counter_ns()
        try:
            loaded = load_object(
                spec,
                targets,
                open_btf_object=self.registry.open_btf_object,
                fill_enums=cfg.fill_enums,
            )
        except SchedSwitchError as exc:
            missing = targets.report.missing
            if not missing:
                raise
            err = LoadError(
                f"{exc} [declared module BTF not available: {', '.join(missing)} "
                "(module not loaded?)]"
            )
            err.verifier_log = exc.verifier_log
            raise err from exc
        t["load"] = time.perf_counter_ns() - start
        try:
            if plan is not None:  # after-load writes, map updates, before-attach runs
                run_before_attach(loaded, plan)  # (timed in load.*)
            # The struct_ops value (member checks, one trampoline per program) now, while
            # the previous scheduler runs: attach, inside the no-scheduler gap, then only
            # creates the link. A refused value fails the prepare, not the switch.
            start = time.perf_counter_ns()
            if loaded.write_struct_ops_value(ops_map):
                t["struct_ops_value"] = time.perf_counter_ns() - start
        except SchedSwitchError:
            loaded.close()
            raise
        if loaded.enum_fill.filled or loaded.enum_fill.missing or loaded.enum_fill.skipped:
            log.info("%s: enum variables: %s", name, loaded.enum_fill.summary())
        for k, v in loaded.timings_ns.items():
            t[f"load.{k}"] = v
        for note in loaded.notes:
            log.info("%s: %s", name, note)
        if plan is not None and plan.attach_cpu is not None:
            # The kernel's scx_enable_helper, found now (a /proc walk), not in the gap.
            self._enable_helpers = enable_helper_pids()
        report = targets.report
        self._count("module_btfs_declared", len(report.declared))
        handle = KernelPrepared(name, ops_name, spec, ops_map, loaded, uei, report, t)
        handle.links = self.links
        handle.inputs = Freshness(built.inputs, module_key, seq, online)
        handle.plan = plan
        handle.exit_view = self._exit_view(handle)
        return handle

    @staticmethod
    def _writes_exit_record(h: KernelPrepared) -> bool:
        """Whether the handle keeps an exit record (a UEI in its data map) that something
        writes: its struct_ops has an ``ops.exit`` program. Without one, nothing would
        fill the record, so an empty one proves nothing."""
        if h.uei is None or h.spec is None or h.loaded is None:
            return False
        so = h.spec.map(h.ops_map).struct_ops
        member = so.member("exit") if so is not None else None
        return member is not None and member.program is not None

    @staticmethod
    def _exit_view(h: KernelPrepared) -> UeiView | None:
        """A read-only mapping of the handle's exit record when its ``ops.exit`` writes
        one and its data map is mmapable; ``None`` otherwise (the confirmation then looks
        the record up, or reads sysfs). Made here, off the switch's path."""
        if not KernelBackend._writes_exit_record(h):
            return None
        assert h.uei is not None and h.loaded is not None
        data = h.loaded.maps.get(h.uei.map_name)
        if data is None or not data.spec.flags & bpf_uapi.F_MMAPABLE:
            return None
        try:
            return UeiView(h.uei, data.fd.fileno(), data.spec.value_size)
        except (OSError, ValueError) as exc:
            log.debug("%s: exit record not mapped (%s); looked up instead", h.name, exc)
            return None

    def _module_key(self) -> object:
        """The loaded module set as the lookup memo identifies it, ``None`` if unlistable."""
        try:
            return self.registry.module_set().key
        except SchedSwitchError:
            return None

    def fresh(self, prepared: Prepared, spec: SchedulerConfig, *, quick: bool = False) -> bool:
        """Whether ``prepared`` is what :meth:`prepare` would make from ``spec`` now: same
        object file (path, inode, size, mtime), same loaded module set and, when ``spec``
        sets ``hotplug_seq``, the same ``/sys/kernel/sched_ext/hotplug_seq`` (the kernel
        refuses to enable a scheduler built for an older CPU topology); with a profile,
        also the same profile file and the same topology (its values were computed from
        it). The caller compares the configuration itself.

        The topology is read whole (~30 sysfs files a CPU, about as long as the
        no-scheduler gap: docs/performance.md, standby hit) unless
        ``quick``: then, if ``hotplug_seq`` still reads what it read before the topology
        was read at prepare (or at the last full check that found it unchanged) and so
        does ``devices/system/cpu/online`` (read between the two), the topology counts as
        unchanged. The kernel moves ``hotplug_seq`` on every CPU online and offline,
        suspend's included, whether or not a scheduler is attached (``handle_hotplug()``);
        an offline moves it first (``sched_cpu_deactivate()``) and takes the CPU out of the
        online mask later, so a topology read in between is paired with the new value and
        the old CPUs: the online list, read here too, catches that. What can change with
        neither (``cpuinfo_max_freq``/``cpuinfo_min_freq`` when turbo is toggled or a
        cpufreq driver loads, ``cpu_capacity``) is what scx's own user space reads once at
        its start and never again. A standby hit takes with ``quick``; the pool's refill
        rounds check in full, off the hit's path. A few stats, two sysfs reads and, without
        ``quick`` (or without sched_ext), the topology."""
        h = cast(KernelPrepared, prepared)
        then = h.inputs
        if h.discarded or h.attached or h.adopted or then is None:
            return False
        key = then.spec
        object_key = _unchanged(spec.object, key.object)
        if object_key is None or not self._modules_unchanged(then.modules):
            return False
        seq: int | None = None
        if spec.hotplug_seq or spec.profile_path is not None:
            try:
                seq = self.scx_files.hotplug_seq()
            except scx.SchedExtUnavailable:
                seq = None
            except SchedSwitchError:
                return False
        profile_key: SpecKey | None = None
        if spec.profile_path is not None:
            profile_key = _unchanged(spec.profile_path, key.profile)
            if profile_key is None:
                return False

        def now(topology: Topology | None) -> SpecInputs:
            return spec_inputs(
                object_key,
                spec,
                profile_key=profile_key,
                topology=topology,
                vmlinux=self.registry.vmlinux if needs_kernel_btf(spec) else None,
                hotplug_seq=seq,
                ops_type=self.ops_type,
            )

        # Everything but the topology first: a standby stale for another reason (a moved
        # hotplug_seq it carries) needs no topology read to say so.
        if now(key.topology) != key:
            return False
        if spec.profile_path is None:
            return True
        online = self.online_file.read()
        unmoved = seq is not None and online is not None
        if quick and unmoved and seq == then.hotplug_seq and online == then.online:
            return True
        try:
            if now(read_topology(self.sysfs_root)) != key:
                return False
        except (SchedSwitchError, OSError):
            return False
        if (seq, online) != (then.hotplug_seq, then.online):
            # CPUs came and went but the topology is the one the values came from again:
            # valid as of ``seq`` and ``online`` (read before the topology just now), so the
            # next quick check needs no full read.
            then.hotplug_seq, then.online = seq, online
        return True

    def _modules_unchanged(self, then: object) -> bool:
        """Whether the module set is the one ``then`` (a ``module_set().key``: the event
        generation and the ``/sys/kernel/btf`` listing) was taken from. While the watch's
        uevent listener feeds the registry, every module add or remove and every lost-events
        overflow moves the generation, so an equal generation answers without listing the
        directory again (docs/performance.md, standby hit); otherwise the listing is
        compared."""
        if (
            self._module_events
            and isinstance(then, tuple)
            and then[0] == self.registry.memo.generation
        ):
            return True
        return self._module_key() == then

    def preopen(self, schedulers: Mapping[str, SchedulerConfig]) -> None:
        """Open every configured object into the spec cache (see the protocol) and do the
        vmlinux work its first load would do (:meth:`_warm_vmlinux`); a file that cannot
        be opened is logged and left for its switch to report."""
        for name, cfg in schedulers.items():
            try:
                opened = self.specs.open(cfg.object)
            except SchedSwitchError as exc:
                log.warning("cannot pre-open %s: %s", name, exc)  # the error names the file
                continue
            if not opened.cached:
                log.debug("pre-opened %s in %.1f ms", name, opened.open_ns / 1e6)
                self._warm_vmlinux(name, opened.spec)
                self._count("preopens")  # after the warming: status then shows it done

    def _warm_vmlinux(self, name: str, spec: ObjectSpec) -> None:
        """Parse vmlinux BTF and build the name and CO-RE candidate indexes ``spec``'s
        lookups read (kfuncs, ksyms, struct_ops types, CO-RE root types: what
        :func:`~schedswitchd.kernel.btf.module_needs.object_module_lookups` asks vmlinux), as
        its first load would, so that the first hint's prepare does not wait for vmlinux's
        types to be scanned and indexed per kind (the figures: docs/architecture.md, "The
        daemon's start"). The indexes belong to the process's one
        vmlinux :class:`~schedswitchd.bpf.btf.reader.Btf`, which every load keeps anyway;
        the candidate lists computed here are dropped (each load has its own cache). A
        failure is logged: the load reports it."""
        start = time.perf_counter_ns()
        try:
            object_module_lookups(spec, self.registry.vmlinux, CandidateCache())
        except SchedSwitchError as exc:
            log.debug("vmlinux lookups of %s not warmed: %s", name, exc)
            return
        self._count("vmlinux_warms")
        log.debug("warmed vmlinux for %s in %.1f ms", name, (time.perf_counter_ns() - start) / 1e6)

    def kernel_bytes(self, prepared: Prepared) -> int:
        """Kernel memory ``prepared`` holds, bytes: ``memlock`` (``/proc/self/fdinfo``) of
        its maps and programs; 0 for an adopted handle (its maps are not all known)."""
        h = cast(KernelPrepared, prepared)
        if h.loaded is None or h.discarded:
            return 0
        fds = [m.fd.fileno() for m in h.loaded.maps.values()]
        fds += [p.fd.fileno() for p in h.loaded.programs.values()]
        return sum(memlock_bytes(fd) for fd in fds)

    # --- attach / detach ---------------------------------------------------------------------

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
        self._count("attaches")
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
                attach_from_cpu(h.loaded, h.plan, h.create_link, self._enable_helpers)
            else:
                h.create_link()
        except BpfSyscallError as exc:
            self._count("attach_failures")
            if exc.errno == errno.EBUSY:
                raise self._busy(h) from exc
            raise
        except SchedSwitchError:
            self._count("attach_failures")
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
            self._count("attach_failures")
            self._undo_attach(h)
            raise
        self._phase_timings(h, "attach", t)
        with self._stats_lock:
            self._attached = h
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
        self._pin_owner[h.name] = h
        t = {"pin": time.perf_counter_ns() - start}
        h.timings_ns["attach.pin"] = t["pin"]
        h.phased.add("attach")
        with self._lock:
            self._latest.setdefault("attach", {})["pin"] = t["pin"]
        log.info(
            "attached %s (ops %s): %s",
            h.name,
            h.ops_name,
            _fmt_ms({k[7:]: v for k, v in h.timings_ns.items() if k.startswith("attach.")}),
        )

    def _phase_timings(self, h: KernelPrepared, prefix: str, t: Mapping[str, int]) -> None:
        """Record ``t`` as ``<prefix>.<phase>`` in the handle and the counters, replacing
        the previous attach/detach's entries (the fallback detach has other phases)."""
        if prefix in h.phased:
            for k in [k for k in h.timings_ns if k.startswith(prefix + ".")]:
                del h.timings_ns[k]
        else:  # none to replace: no walk over every phase of its prepare (a hit's attach)
            h.phased.add(prefix)
        h.timings_ns.update({f"{prefix}.{k}": v for k, v in t.items()})
        self._timings(prefix, t)

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
            raise _ejected_at_enable(h, rec.kind, rec.reason)
        if not self._writes_exit_record(h):
            return False
        assert h.uei is not None and h.spec is not None
        fd = h.exit_map_fd()
        if fd is None:
            return False
        try:
            if self.scx_files.state() is not scx.ScxState.ENABLED:
                return False
            value = syscall.map_lookup_elem(fd, _KEY0, h.spec.map(h.uei.map_name).value_size)
            rec = h.uei.decode(value) if value is not None else None
        except (SchedSwitchError, ValueError, KeyError):
            return False
        if value is None:
            return False
        if rec is not None:
            raise _ejected_at_enable(h, rec.kind, rec.reason)
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
        if self._pin_owner.get(h.name, h) is h:
            self._pin_owner.pop(h.name, None)
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
        if link is None or not self._link_detach_works:
            return False
        try:
            h.links.detach(link)
        except BpfSyscallError as exc:
            if exc.errno == errno.EOPNOTSUPP:
                self._link_detach_works = False
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
        with self._stats_lock:
            if self._attached is h:
                self._attached = None
        if not h.attached:
            return
        self._count("detaches")
        t: dict[str, int] = {}
        start = time.perf_counter_ns()
        if self._detach_in_kernel(h):
            t["link_detach"] = time.perf_counter_ns() - start
            h.attached = False
            h.release_pending = True
        else:
            start = time.perf_counter_ns()
            if self._pin_owner.get(h.name, h) is h:
                self._pin_owner.pop(h.name, None)
                self.pins.unpin(h.name)
            t["unpin"] = time.perf_counter_ns() - start
            start = time.perf_counter_ns()
            h.close_link()
            h.attached = False
            t["link_close"] = time.perf_counter_ns() - start
            start = time.perf_counter_ns()
            self._wait_disabled(h, timeout_s)
            t["disable_wait"] = time.perf_counter_ns() - start
        self._phase_timings(h, "detach", t)
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
        with self._stats_lock:  # not while status reads its maps
            if self._attached is h:
                self._attached = None
            h.close()
            h.discarded = True

    # --- exit info ---------------------------------------------------------------------------

    def exit_info(self, prepared: Prepared) -> ExitInfo | None:
        """The scheduler's exit record from its data map (``uei``), or ``None``."""
        h = cast(KernelPrepared, prepared)
        fd = h.exit_map_fd() if not h.discarded else None
        if h.uei is None or fd is None or h.spec is None:
            return None
        try:
            value_size = h.spec.map(h.uei.map_name).value_size
            value = syscall.map_lookup_elem(fd, _KEY0, value_size)
            rec = h.uei.decode(value) if value is not None else None
        except (SchedSwitchError, ValueError, KeyError) as exc:
            log.warning("cannot read the exit record of %s: %s", h.name, exc)
            return None
        if rec is None:
            return None
        return ExitInfo(
            kind=rec.kind, exit_code=rec.exit_code, reason=rec.reason, message=rec.message
        )

    def exit_recorded(self, prepared: Prepared) -> bool:
        """Whether the handle keeps an exit record :meth:`exit_info` can read: its object
        has a ``uei`` variable and its data map is open (an adopted handle whose data map
        was not pinned has none). Reads nothing."""
        h = cast(KernelPrepared, prepared)
        return (
            h.uei is not None
            and h.spec is not None
            and not h.discarded
            and h.exit_map_fd() is not None
        )

    # --- adopt -------------------------------------------------------------------------------

    def adopt(self, schedulers: Mapping[str, SchedulerConfig]) -> KernelPrepared | None:
        """Take over a scheduler pinned by a previous daemon if the kernel still runs it
        (``enabled`` and ``root/ops`` equal to its ops name) and it is configured; remove
        every other pin (stale). ``None`` when nothing was adopted."""
        try:
            st: scx.SchedExtStatus | None = self._status()
        except SchedSwitchError:
            st = None
        adopted: KernelPrepared | None = None
        for entry in self.pins.names():
            if adopted is None and st is not None and entry in schedulers:
                try:
                    adopted = self._adopt_one(entry, schedulers[entry], st)
                except SchedSwitchError as exc:
                    log.warning("cannot re-adopt pinned scheduler %s: %s", entry, exc)
                if adopted is not None:
                    continue
            try:
                if self.pins.unpin(entry):
                    self._count("stale_pins_removed")
                    log.info("removed stale pin %s", self.pins.root / entry)
            except SchedSwitchError as exc:
                log.warning("%s", exc)
        if adopted is not None:
            self._pin_owner[adopted.name] = adopted
            self._count("adoptions")
            log.info("re-adopted %s (ops %s) from its pin", adopted.name, adopted.ops_name)
        return adopted

    def _adopt_one(
        self, name: str, cfg: SchedulerConfig, st: scx.SchedExtStatus
    ) -> KernelPrepared | None:
        """An attached handle for the pin ``name`` if its link is the scheduler the kernel
        runs. What runs is judged from the kernel alone -- the link's struct_ops map value
        names ``root/ops`` -- not from the object file, which may have been rebuilt (another
        ops name) or removed since: the scheduler is adopted for what it is and replaced
        only by a normal switch. The file, when it still opens, only tells where the exit
        record lives (used only if the pinned data map still has that layout)."""
        if st.state is not scx.ScxState.ENABLED or st.ops is None:
            return None
        pinned = self.pins.open(name)
        if pinned is None:
            return None
        ops_fd: MapFd | None = None
        try:
            info = syscall.link_info(pinned.link)
            if info.type != bpf_uapi.LinkType.STRUCT_OPS or not info.map_id:
                raise LoadError(f"pinned link of {name} is not a live struct_ops link")
            ops_fd = syscall.map_get_fd_by_id(info.map_id)
            if syscall.map_info(ops_fd).type != bpf_uapi.MapType.STRUCT_OPS:
                raise LoadError(f"pinned link of {name} does not hold a struct_ops map")
            running = self._struct_ops_value_name(ops_fd)
            if running != st.ops:
                # A link left over from a scheduler the kernel ejected; another runs now.
                raise LoadError(
                    f"pinned link of {name} holds {running!r}, the kernel runs {st.ops!r}"
                )
        except (SchedSwitchError, BpfSyscallError):
            pinned.close()
            if ops_fd is not None:
                ops_fd.close()
            raise
        ops_name = running
        spec: ObjectSpec | None = None
        ops_map = ""
        try:
            spec = self.specs.open(cfg.object).spec
            ops_map = sched_ext_map(spec, self.ops_type)
            if ops_name_of(spec, ops_map) != ops_name:
                log.warning(
                    "adopting %s as it runs (ops %s): %s now holds another scheduler; it "
                    "replaces the running one at the next switch",
                    name,
                    ops_name,
                    cfg.object,
                )
        except SchedSwitchError as exc:
            log.warning("adopting %s as it runs (ops %s); its object: %s", name, ops_name, exc)
        uei = uei_layout(spec) if spec is not None else None
        exit_map = pinned.exit_map
        if exit_map is not None and (
            uei is None
            or spec is None
            or syscall.map_info(exit_map).value_size != spec.map(uei.map_name).value_size
        ):
            exit_map.close()  # the object changed on disk: its layout is not the map's
            exit_map = None
        return KernelPrepared(
            name,
            ops_name,
            spec,
            ops_map,
            None,
            uei,
            attached=True,
            adopted_link=pinned.link,
            adopted_ops_map=ops_fd,
            adopted_exit_map=exit_map,
            adopted_program_links=pinned.program_links,
            links=self.links,
        )

    def _struct_ops_value_name(self, ops_fd: MapFd) -> str:
        """The ``name`` member of the kernel's value of a struct_ops map (what
        ``root/ops`` reads while it runs), read with ``BPF_MAP_LOOKUP_ELEM``: the value is
        ``struct bpf_struct_ops_<type>`` of vmlinux BTF, its data member the kernel's
        ``struct <type>`` (``kernel/bpf/bpf_struct_ops.c``)."""
        btf = self.registry.vmlinux
        kt = find_struct_ops_kernel_type(btf, self.ops_type)
        if kt is None:
            raise LoadError(f"vmlinux BTF has no struct_ops type {self.ops_type}")
        found = btf.find_member(kt.type_id, "name")
        if found is None:
            raise LoadError(f"struct {self.ops_type} has no 'name' member")
        value = syscall.map_lookup_elem(ops_fd, _KEY0, kt.value_size)
        if value is None:
            raise LoadError("the pinned struct_ops map holds no value")
        start = kt.data_offset + found[0] // 8
        return value[start : start + 128].split(b"\0", 1)[0].decode("utf-8", "replace")

    # --- watching ----------------------------------------------------------------------------

    @property
    def module_events(self) -> bool:
        """True while a :meth:`watch` runs with its uevent listener attached to the BTF
        registry, so the registry's module generation follows every module add and remove
        (and :meth:`fresh` trusts it); False without a watch, or when no uevent socket
        could be opened and the watch relies on its sysfs check."""
        return self._module_events

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
                self._count("sched_ext_uevents")
                notify()

            subs.append(listener.subscribe_sched_ext(on_scx))
            subs.append(self.registry.attach(listener))
            self._module_events = True
            with self._lock:
                self._listener = listener
                if self._quiet:  # a switch window is open already
                    listener.pause()
        stop_event = threading.Event()

        def poll() -> None:
            last = self.kernel_state()
            while not stop_event.wait(WATCH_POLL_S):
                if self._quiet:  # our own switch (switch_window): look after it
                    self._count("watch_checks_held")
                    continue
                now = self.kernel_state()
                if now != last:
                    last = now
                    notify()

        thread = threading.Thread(target=poll, name="scx-watch", daemon=True)
        thread.start()

        def stop() -> None:
            self._module_events = False
            with self._lock:
                if self._listener is listener:
                    self._listener = None
            stop_event.set()
            for sub in subs:
                sub.cancel()
            if listener is not None:
                listener.stop()
            thread.join(2.0)

        return stop


def _fmt_ms(t: Mapping[str, int]) -> str:
    """``phase 1.23 ms, ...`` of phase durations in ns, for the log."""
    return ", ".join(f"{k} {v / 1e6:.2f} ms" for k, v in t.items())


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
