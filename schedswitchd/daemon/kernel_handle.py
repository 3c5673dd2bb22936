"""The kernel backend's handle of one scheduler: what :class:`KernelBackend
<schedswitchd.daemon.kernel_backend.KernelBackend>`'s prepare loaded (or its adopt took over
from a previous daemon's pins), the fds it owns, and what it was prepared from."""

from __future__ import annotations

from dataclasses import dataclass, field

from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.daemon.scheduler_spec import SpecInputs
from schedswitchd.errors import LoadError
from schedswitchd.kernel.btf.registry import TargetReport
from schedswitchd.kernel.fd import LinkFd, MapFd
from schedswitchd.kernel.loader import LoadedObject
from schedswitchd.kernel.sched_ext.exit_info import UeiLayout, UeiView
from schedswitchd.kernel.struct_ops.link import KERNEL_LINKS, StructOpsLinkCalls
from schedswitchd.profile.apply import ProfilePlan


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
    #: (``Attacher._confirmed_by_exit_record`` in :mod:`schedswitchd.daemon.kernel_attach`)
    #: then makes no ``bpf(2)`` call.
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
