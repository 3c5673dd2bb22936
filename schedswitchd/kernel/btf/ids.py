"""Kernel BTF object ids by name: ``vmlinux`` and each loaded module's BTF.

The kernel needs a module BTF's *object fd* (kfunc ``fd_array`` slots, ``attach_btf_obj_fd``
for attach targets and struct_ops value types defined in modules). Object ids are found by
walking ``BPF_BTF_GET_NEXT_ID`` and asking each object its name with
``BPF_BTF_GET_FD_BY_ID`` + ``BPF_OBJ_GET_INFO_BY_FD`` (``struct bpf_btf_info``:
``kernel_btf`` set, ``name`` "vmlinux" or the module name; ``include/uapi/linux/bpf.h``).

The walk runs once; afterwards module uevents keep the map true (:meth:`KernelBtfIds.forget`
on ``remove``, :meth:`KernelBtfIds.note_added` on ``add``). A reloaded module gets a new,
higher id (ids come from ``idr_alloc_cyclic``), so an added module is looked up by walking
only ids above the highest seen. Because an event can be missed, :meth:`KernelBtfIds.open`
checks that the object behind an id still carries the expected name and rescans when not.
``EPERM`` while walking (no ``CAP_SYS_ADMIN``) is counted, not raised.
"""

from __future__ import annotations

import errno
import logging
import threading
from dataclasses import dataclass
from typing import Protocol

from schedswitchd.errors import BpfSyscallError, RegistryError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.fd import BtfFd

log = logging.getLogger(__name__)


class BtfObjectOps(Protocol):
    """The three ``bpf(2)`` commands the walk needs (defaults: :mod:`schedswitchd.kernel.
    syscall`). ``next_id`` returns ``None`` past the last id; errors are
    :class:`~schedswitchd.errors.BpfSyscallError`."""

    def next_id(self, start_id: int) -> int | None:
        """``BPF_BTF_GET_NEXT_ID`` after ``start_id``: the next id, or ``None`` past the last."""

    def open(self, btf_id: int) -> BtfFd:
        """``BPF_BTF_GET_FD_BY_ID``: an fd of BTF object ``btf_id``."""

    def name_of(self, fd: BtfFd) -> tuple[str, bool]:
        """(name, kernel_btf) of the BTF object behind ``fd`` (``BPF_OBJ_GET_INFO_BY_FD``)."""


class SyscallBtfObjectOps:
    """:class:`BtfObjectOps` on the real ``bpf(2)``."""

    def next_id(self, start_id: int) -> int | None:
        """``BPF_BTF_GET_NEXT_ID`` after ``start_id``; ``None`` past the last id."""
        return syscall.btf_get_next_id(start_id)

    def open(self, btf_id: int) -> BtfFd:
        """``BPF_BTF_GET_FD_BY_ID``; raises :class:`~schedswitchd.errors.BpfSyscallError`."""
        return syscall.btf_get_fd_by_id(btf_id)

    def name_of(self, fd: BtfFd) -> tuple[str, bool]:
        """(name, kernel_btf) of the BTF object behind ``fd``."""
        info = syscall.btf_info(fd)
        return info.name, info.kernel_btf


@dataclass(frozen=True, slots=True)
class BtfIdStats:
    """Counters: full walks, incremental walks (after ``add`` events), ids skipped for
    ``EPERM``, verifications that found a different object (followed by a rescan), and
    whether the last walk was cut short by ``EPERM`` on ``BPF_BTF_GET_NEXT_ID``."""

    full_scans: int
    incremental_scans: int
    eperm: int
    mismatches: int
    walk_denied: bool


class KernelBtfIds:
    """Thread-safe map from kernel BTF name (``"vmlinux"``, module names) to BTF object id."""

    def __init__(self, ops: BtfObjectOps | None = None) -> None:
        self._ops: BtfObjectOps = ops if ops is not None else SyscallBtfObjectOps()
        self._lock = threading.RLock()
        self._ids: dict[str, int] = {}
        self._built = False
        self._max_seen = 0
        self._pending: set[str] = set()
        self._full = 0
        self._incr = 0
        self._eperm = 0
        self._mismatch = 0
        self._denied = False

    def stats(self) -> BtfIdStats:
        """A consistent snapshot of the counters (:class:`BtfIdStats`)."""
        with self._lock:
            return BtfIdStats(self._full, self._incr, self._eperm, self._mismatch, self._denied)

    def _walk(self, start: int) -> dict[str, int]:
        found: dict[str, int] = {}
        cur = start
        while True:
            try:
                nxt = self._ops.next_id(cur)
            except BpfSyscallError as exc:
                if exc.errno == errno.EPERM:
                    self._eperm += 1
                    self._denied = True
                    log.warning("walking BTF ids: %s (need CAP_SYS_ADMIN)", exc)
                    return found
                raise
            if nxt is None:
                return found
            if nxt <= cur:  # the kernel guarantees ascending ids; never loop on a bad answer
                raise RegistryError(f"BPF_BTF_GET_NEXT_ID({cur}) returned {nxt}")
            cur = nxt
            self._max_seen = max(self._max_seen, cur)
            try:
                fd = self._ops.open(cur)
            except BpfSyscallError as exc:
                if exc.errno == errno.ENOENT:  # freed while we walked
                    continue
                if exc.errno == errno.EPERM:
                    self._eperm += 1
                    continue
                raise
            with fd:
                name, kernel_btf = self._ops.name_of(fd)
            if kernel_btf and name:
                found[name] = cur  # ascending walk: a later (reloaded) object wins

    def scan(self) -> None:
        """Walk every BTF id and rebuild the map."""
        with self._lock:
            self._denied = False
            self._max_seen = 0
            self._ids = self._walk(0)
            self._built = True
            self._pending.clear()
            self._full += 1

    def _ensure(self) -> None:
        if not self._built:
            self.scan()

    def lookup(self, name: str) -> int | None:
        """The BTF object id last seen for ``name`` (the first call walks all ids), or
        ``None``. Not verified: use :meth:`open` before handing an id to the kernel."""
        with self._lock:
            self._ensure()
            if name in self._pending:
                self._incr += 1
                self._ids.update(self._walk(self._max_seen))
                self._pending.discard(name)
                if name not in self._ids:
                    self.scan()
            return self._ids.get(name)

    def names(self) -> dict[str, int]:
        """A copy of the whole map."""
        with self._lock:
            self._ensure()
            return dict(self._ids)

    def forget(self, name: str) -> None:
        """A module was removed: drop its id."""
        with self._lock:
            self._ids.pop(name, None)
            self._pending.discard(name)

    def note_added(self, name: str) -> None:
        """A module was (re)loaded: its id is looked up again on next use."""
        with self._lock:
            self._ids.pop(name, None)
            self._pending.add(name)

    def mark_dirty(self) -> None:
        """Events may have been missed: the next lookup walks every id again."""
        with self._lock:
            self._built = False

    def open(self, name: str) -> BtfFd:
        """An fd of the kernel BTF object named ``name``, verified to carry that name.

        On a stale id (object freed, or its id now names something else) rescans once.
        Raises :class:`RegistryError` when no kernel BTF of that name exists (module not
        loaded, or the walk was denied), :class:`BpfSyscallError` on other failures.
        """
        for attempt in range(2):
            btf_id = self.lookup(name)
            if btf_id is not None:
                fd = self._verified(btf_id, name)
                if fd is not None:
                    return fd
                with self._lock:
                    self._mismatch += 1
            if attempt == 0:
                self.scan()
        denied = " (walking BTF ids was denied: EPERM)" if self._denied else ""
        raise RegistryError(f"no kernel BTF object named {name!r}{denied}")

    def _verified(self, btf_id: int, name: str) -> BtfFd | None:
        try:
            fd = self._ops.open(btf_id)
        except BpfSyscallError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        try:
            got, kernel_btf = self._ops.name_of(fd)
        except BaseException:
            fd.close()
            raise
        if got == name and kernel_btf:
            return fd
        fd.close()
        return None
