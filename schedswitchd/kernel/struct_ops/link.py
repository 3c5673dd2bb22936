"""The two ``bpf(2)`` commands that start and stop a struct_ops scheduler, as one object.

A sched_ext scheduler runs from ``BPF_LINK_CREATE`` (attach type ``BPF_STRUCT_OPS``, its
struct_ops map as the "program") until ``BPF_LINK_DETACH`` of that link, or until the
link's last reference goes (``include/uapi/linux/bpf.h``; ``bpf_struct_ops_link_create()``
and ``bpf_struct_ops_map_link_detach()`` in ``kernel/bpf/bpf_struct_ops.c``). The
daemon's backend issues exactly these two commands through a :class:`StructOpsLinkCalls`
it is built with, so both are one seam: the host tests, whose kernel runs
``tcp_congestion_ops`` struct_ops but has no sched_ext, wrap the real calls in a model of
what sched_ext does on them (its ``EBUSY`` while another scheduler runs, the sysfs state
it sets) instead of replacing the backend's own methods. Every other ``bpf(2)`` command
(maps, programs, pins, the struct_ops value) goes to the kernel as is.
"""

from __future__ import annotations

from schedswitchd.kernel import bpf_uapi, syscall
from schedswitchd.kernel.fd import LinkFd, MapFd


class StructOpsLinkCalls:
    """Create and detach struct_ops links in the running kernel. Subclass to observe or
    answer them otherwise (tests only); the daemon uses :data:`KERNEL_LINKS`."""

    def create(self, map_fd: MapFd) -> LinkFd:
        """``BPF_LINK_CREATE`` with attach type ``BPF_STRUCT_OPS`` for struct_ops map
        ``map_fd`` (a ``BPF_F_LINK`` map whose value is already written): registers the
        ops (for ``sched_ext_ops``: enables the scheduler before the call returns).
        Raises ``BpfSyscallError`` (e.g. ``EBUSY``: sched_ext is not ``disabled``)."""
        return syscall.link_create(map_fd, bpf_uapi.AttachType.STRUCT_OPS)

    def detach(self, link: LinkFd) -> None:
        """``BPF_LINK_DETACH`` of struct_ops link ``link``: unregisters the ops before the
        call returns; the fd stays open. Raises ``BpfSyscallError`` (``EOPNOTSUPP`` on
        kernels before 6.10, which cannot detach struct_ops links)."""
        syscall.link_detach(link)


#: The calls as they go to the kernel.
KERNEL_LINKS = StructOpsLinkCalls()
