"""Taking over what a previous daemon left running: its scheduler's pins.

A daemon that stops (or dies) after a switch leaves the running scheduler's struct_ops
link pinned under its pin directory (with the data map holding the exit record and the
program links; :class:`~schedswitchd.kernel.sched_ext.scheduler_pins.PinDir`). The next
daemon adopts it if the kernel still runs it and the configuration still names it, and
removes every other pin. What runs is judged from the kernel alone (``root/ops`` against
the ``name`` in the link's struct_ops map value), not from the object file, which may
have been rebuilt or removed since.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.scheduler import ops_name_of, sched_ext_map
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.kernel_exit import KEY0
from schedswitchd.daemon.kernel_handle import KernelPrepared
from schedswitchd.daemon.kernel_stats import BackendStats
from schedswitchd.errors import BpfSyscallError, LoadError, SchedSwitchError
from schedswitchd.kernel import bpf_uapi, syscall
from schedswitchd.kernel.fd import MapFd
from schedswitchd.kernel.sched_ext import sysfs as scx
from schedswitchd.kernel.sched_ext.exit_info import uei_layout
from schedswitchd.kernel.sched_ext.scheduler_pins import PinDir
from schedswitchd.kernel.spec_cache import SpecCache
from schedswitchd.kernel.struct_ops.link import StructOpsLinkCalls
from schedswitchd.kernel.struct_ops.value import find_struct_ops_kernel_type

log = logging.getLogger("schedswitchd.backend")


class Adoption:
    """The kernel backend's takeover of pinned schedulers: ``pins``, the pin directory;
    ``specs``, where an adopted scheduler's object is opened (for its exit record's
    layout); ``registry_vmlinux``, vmlinux BTF (the struct_ops value's layout);
    ``ops_type``, the struct_ops type of a scheduler; ``links``, what the adopted handle
    creates its link with when attached again; ``stats``, where adoptions and stale pins
    are counted."""

    def __init__(
        self,
        pins: PinDir,
        specs: SpecCache,
        vmlinux: Callable[[], Btf],
        ops_type: str,
        links: StructOpsLinkCalls,
        stats: BackendStats,
    ) -> None:
        self.pins = pins
        self.specs = specs
        self.vmlinux = vmlinux
        self.ops_type = ops_type
        self.links = links
        self.stats = stats

    def adopt(
        self, schedulers: Mapping[str, SchedulerConfig], st: scx.SchedExtStatus | None
    ) -> KernelPrepared | None:
        """Take over a scheduler pinned by a previous daemon if the kernel still runs it
        (``st``: ``enabled`` and ``root/ops`` equal to its ops name; ``None``: unknown) and
        it is configured; remove every other pin (stale). ``None`` when nothing was
        adopted. Never raises for a pin it cannot use (logged)."""
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
                    self.stats.count("stale_pins_removed")
                    log.info("removed stale pin %s", self.pins.root / entry)
            except SchedSwitchError as exc:
                log.warning("%s", exc)
        if adopted is not None:
            self.stats.count("adoptions")
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
        btf = self.vmlinux()
        kt = find_struct_ops_kernel_type(btf, self.ops_type)
        if kt is None:
            raise LoadError(f"vmlinux BTF has no struct_ops type {self.ops_type}")
        found = btf.find_member(kt.type_id, "name")
        if found is None:
            raise LoadError(f"struct {self.ops_type} has no 'name' member")
        value = syscall.map_lookup_elem(ops_fd, KEY0, kt.value_size)
        if value is None:
            raise LoadError("the pinned struct_ops map holds no value")
        start = kt.data_offset + found[0] // 8
        return value[start : start + 128].split(b"\0", 1)[0].decode("utf-8", "replace")
