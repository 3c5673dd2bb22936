"""A scheduler's exit record as the kernel backend reads it: the ``uei`` variable its
``ops.exit`` writes into its data map (``kind``, ``exit_code``, ``reason``, ``message``;
layout from the object's BTF, :mod:`schedswitchd.kernel.sched_ext.exit_info`).

Read with ``BPF_MAP_LOOKUP_ELEM`` on the data map's fd, or in place from a read-only
mapping of it (:class:`~schedswitchd.kernel.sched_ext.exit_info.UeiView`) that prepare makes
for an mmapable data map, so that an attach's confirmation makes no ``bpf(2)`` call.
"""

from __future__ import annotations

import logging

from schedswitchd.daemon.kernel_handle import KernelPrepared
from schedswitchd.daemon.protocol import ExitInfo
from schedswitchd.errors import SchedExtError, SchedSwitchError
from schedswitchd.kernel import bpf_uapi, syscall
from schedswitchd.kernel.sched_ext.exit_info import UeiView

log = logging.getLogger("schedswitchd.backend")

#: The key of the one element of a data map (``.bss``/``.data``): ``u32`` 0.
KEY0 = b"\0\0\0\0"


def read_exit_info(h: KernelPrepared) -> ExitInfo | None:
    """``h``'s exit record from its data map (``BPF_MAP_LOOKUP_ELEM``), or ``None`` when it
    keeps none, its map is gone, nothing was written yet (kind 0) or the read failed
    (logged as a warning)."""
    fd = h.exit_map_fd() if not h.discarded else None
    if h.uei is None or fd is None or h.spec is None:
        return None
    try:
        value_size = h.spec.map(h.uei.map_name).value_size
        value = syscall.map_lookup_elem(fd, KEY0, value_size)
        rec = h.uei.decode(value) if value is not None else None
    except (SchedSwitchError, ValueError, KeyError) as exc:
        log.warning("cannot read the exit record of %s: %s", h.name, exc)
        return None
    if rec is None:
        return None
    return ExitInfo(kind=rec.kind, exit_code=rec.exit_code, reason=rec.reason, message=rec.message)


def exit_recorded(h: KernelPrepared) -> bool:
    """Whether ``h`` keeps an exit record :func:`read_exit_info` can read: its object has a
    ``uei`` variable and its data map is open (an adopted handle whose data map was not
    pinned has none). Reads nothing."""
    return (
        h.uei is not None and h.spec is not None and not h.discarded and h.exit_map_fd() is not None
    )


def writes_exit_record(h: KernelPrepared) -> bool:
    """Whether ``h`` keeps an exit record (a UEI in its data map) that something writes: its
    struct_ops has an ``ops.exit`` program. Without one, nothing would fill the record, so
    an empty one proves nothing."""
    if h.uei is None or h.spec is None or h.loaded is None:
        return False
    so = h.spec.map(h.ops_map).struct_ops
    member = so.member("exit") if so is not None else None
    return member is not None and member.program is not None


def exit_view(h: KernelPrepared) -> UeiView | None:
    """A read-only mapping of ``h``'s exit record when its ``ops.exit`` writes one and its
    data map is mmapable; ``None`` otherwise (the confirmation then looks the record up, or
    reads sysfs). Made by prepare, off the switch's path."""
    if not writes_exit_record(h):
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


def ejected_at_enable(h: KernelPrepared, kind: int, reason: str) -> SchedExtError:
    """The error of a first enable that the kernel undid at once: ``h``'s own exit record
    already holds an exit (``kind``, ``reason``) when ``BPF_LINK_CREATE`` returned."""
    return SchedExtError(
        f"{h.name} ({h.ops_name}) was disabled by the kernel right after attach "
        f"({ExitInfo(kind=kind).kind_name}: {reason})"
    )
