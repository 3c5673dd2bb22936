"""Preparing a scheduler for the kernel backend, and telling whether a prepared one is
still what a prepare would make now.

:meth:`Preparer.prepare` does all heavy work while the previous scheduler still runs: open
the object (:class:`~schedswitchd.kernel.spec_cache.SpecCache`, keyed by path, device,
inode, size and mtime), build its spec
(:func:`~schedswitchd.daemon.scheduler_spec.build_scheduler_spec`: profile, ``.rodata``
tunables, ``sched_ext_ops`` scalars, ``hotplug_seq`` from
``/sys/kernel/sched_ext/hotplug_seq``), read only the module BTFs the object declares in
``.kmod_btfs`` plus the configured extras (through the registry's bounded cache), run
CO-RE, create maps, load programs and write the ``sched_ext_ops`` struct_ops value
(``BPF_MAP_UPDATE_ELEM``: member checks and one trampoline per program; for a
``BPF_F_LINK`` map it registers nothing). :meth:`Preparer.fresh` compares the handle's
:class:`~schedswitchd.daemon.kernel_handle.Freshness` with what it reads now (a standby's
check).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import cast

from schedswitchd.bpf.core.relocate import CandidateCache
from schedswitchd.bpf.scheduler import SCHED_EXT_OPS, sched_ext_map
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.daemon.backend import Prepared
from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.kernel_exit import exit_view
from schedswitchd.daemon.kernel_handle import Freshness, KernelPrepared
from schedswitchd.daemon.kernel_stats import BackendStats
from schedswitchd.daemon.scheduler_spec import (
    ProfileFile,
    SpecInputs,
    build_scheduler_spec,
    needs_kernel_btf,
    read_profile_file,
    spec_inputs,
)
from schedswitchd.errors import LoadError, SchedSwitchError
from schedswitchd.kernel.btf.module_needs import object_module_lookups
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.fdinfo import memlock_bytes
from schedswitchd.kernel.loader import load_object
from schedswitchd.kernel.sched_ext import sysfs as scx
from schedswitchd.kernel.sched_ext.exit_info import uei_layout
from schedswitchd.kernel.sched_ext.profile_steps import enable_helper_pids, run_before_attach
from schedswitchd.kernel.sched_ext.scheduler_pins import PinDir
from schedswitchd.kernel.spec_cache import SpecCache, SpecKey
from schedswitchd.kernel.struct_ops.link import StructOpsLinkCalls
from schedswitchd.profile.apply import ProfiledSpec
from schedswitchd.profile.model import Profile
from schedswitchd.profile.topology import OnlineFile, Topology, read_topology

log = logging.getLogger("schedswitchd.backend")


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


class Preparer:
    """The kernel backend's prepare, freshness check and pre-open (one worker thread at a
    time). ``specs``: the spec cache; ``registry``: the kernel BTF registry; ``pins``: the
    pin directory (checked before anything loads); ``root``/``scx_files``:
    ``/sys/kernel/sched_ext`` and its held-open files; ``sysfs_root``/``online_file``: where
    a profile's topology and the online CPU list are read; ``ops_type``: the struct_ops type
    of a scheduler; ``links``: what a handle creates its link with; ``stats``: counters;
    ``module_events``: whether the watch's uevent listener keeps the registry's module
    generation true now."""

    def __init__(
        self,
        *,
        specs: SpecCache,
        registry: KernelBtfRegistry,
        pins: PinDir,
        root: Path,
        scx_files: scx.StateFiles,
        sysfs_root: Path,
        online_file: OnlineFile,
        ops_type: str,
        links: StructOpsLinkCalls,
        stats: BackendStats,
        module_events: Callable[[], bool],
    ) -> None:
        self.specs = specs
        self.registry = registry
        self.pins = pins
        self.root = root
        self.scx_files = scx_files
        self.sysfs_root = sysfs_root
        self.online_file = online_file
        self.ops_type = ops_type
        self.links = links
        self.stats = stats
        self.module_events = module_events
        #: The kernel's ``scx_enable_helper`` pids (made on the first enable since boot and
        #: kept), for profiles with an attach CPU; looked up by prepare, read by attach.
        self.enable_helpers: list[int] = []

    def prepare(self, name: str, spec: SchedulerConfig) -> KernelPrepared:
        """Open, customise and load scheduler ``name`` (see the module docstring); never
        attaches. Raises ``ObjectError``/``CustomizationError``/``BtfError``/``CoreError``/
        ``LoadError`` (``ProgramLoadError`` with ``verifier_log``)/``BpfSyscallError``/
        ``RegistryError``, ``PinError`` (the pin directory is not on a writable bpffs:
        :meth:`PinDir.check <schedswitchd.kernel.sched_ext.scheduler_pins.PinDir.check>`); a failure
        leaves nothing loaded. When declared modules are not loaded, the error message
        names them."""
        self.stats.count("prepares")
        try:
            handle = self._prepare(name, spec)
        except SchedSwitchError:
            self.stats.count("prepare_failures")
            raise
        self.stats.timings("prepare", handle.timings_ns)
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
            self.enable_helpers[:] = enable_helper_pids()  # in place: the attacher holds it
        report = targets.report
        self.stats.count("module_btfs_declared", len(report.declared))
        handle = KernelPrepared(name, ops_name, spec, ops_map, loaded, uei, report, t)
        handle.links = self.links
        handle.inputs = Freshness(built.inputs, module_key, seq, online)
        handle.plan = plan
        handle.exit_view = exit_view(handle)
        return handle

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
            self.module_events()
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
                self.stats.count("preopens")  # after the warming: status then shows it done

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
        self.stats.count("vmlinux_warms")
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
