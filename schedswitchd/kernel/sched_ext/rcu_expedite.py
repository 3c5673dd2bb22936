"""Expedited RCU grace periods for the length of a scheduler switch.

Most of sched_ext's disable/enable time is spent waiting for RCU grace periods
(``synchronize_rcu()`` and ``percpu_down_write(&scx_fork_rwsem)`` in ``kernel/sched/ext.c``),
during which no BPF scheduler runs. ``/sys/kernel/rcu_expedited`` (kernel
``Documentation/RCU/Design/Expedited-Grace-Periods``; the file is ``kernel/ksysfs.c``'s
``rcu_expedited`` attribute: a decimal int, non-zero makes ``synchronize_rcu()`` behave as
``synchronize_rcu_expedited()``) shortens those waits at the price of IPIs to every CPU, a
fair trade for the moment a switch takes and bad for a whole system's uptime (the gap it
saves: docs/performance.md, "Standby hit"). So the
daemon sets it around the detach/attach pair and restores it after.

Ownership: the file holds one value for the whole system. A non-zero value found before a
switch belongs to an admin (or the boot command line's ``rcupdate.rcu_expedited=1``) and is
left alone. Before writing ``1`` the daemon creates a marker file; it removes it after
restoring ``0``. A daemon that dies in between leaves the marker, and the next one's
:meth:`RcuExpediter.recover` restores ``0`` at start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from contextlib import AbstractContextManager
from pathlib import Path

log = logging.getLogger(__name__)

#: The kernel's switch (``kernel/ksysfs.c``), relative to the sysfs root.
RCU_EXPEDITED = "kernel/rcu_expedited"


class RcuExpediter:
    """Sets ``<sysfs_root>/kernel/rcu_expedited`` to 1 inside :meth:`expedited`.

    ``sysfs_root``: normally ``/sys``; ``marker``: a file path on a filesystem that survives
    the daemon (``/run/schedswitchd/...``), created while the value is ours. ``enabled``:
    False turns every method into a no-op. Never raises: a kernel without the file, a
    read-only sysfs or an unwritable marker directory make it a no-op, logged once.
    """

    def __init__(
        self,
        sysfs_root: Path,
        marker: Path,
        *,
        enabled: bool = True,
        keep_open: bool | None = None,
    ) -> None:
        self.path = sysfs_root / RCU_EXPEDITED
        self.marker = marker
        self.enabled = enabled
        #: Hold the kernel's file open, read and written with pread/pwrite at offset 0
        #: (a sysfs attribute's store takes each write whole, its show runs again at every
        #: read from 0); default where it is under ``/sys``. Each switch opened it twice
        #: otherwise, on the critical path (docs/performance.md, standby hit).
        self.keep_open = self.path.is_relative_to("/sys") if keep_open is None else keep_open
        self._fd: int | None = None
        self._marker_dir_made = False
        #: The marker is made by mknod(2) until a filesystem refuses it.
        self._mknod = True
        #: Switches that ran expedited, and ones left alone because the value was not ours.
        self.used = 0
        self.left_alone = 0
        self._warned = False

    def available(self) -> bool:
        """Whether the kernel's file exists and this process may write it."""
        return self.enabled and os.access(self.path, os.W_OK)

    def _held_fd(self) -> int | None:
        """The kept descriptor (opened on first use), ``None`` when not kept or it cannot
        be opened read-write (then each access opens the file)."""
        if self._fd is None and self.keep_open:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                self.keep_open = False
        return self._fd

    def close(self) -> None:
        """Close the kept descriptor, if any."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _read(self) -> int | None:
        fd = self._held_fd()
        try:
            data = os.pread(fd, 64, 0) if fd is not None else self.path.read_bytes()
            return int(data.strip() or b"0")
        except (OSError, ValueError):
            return None

    def _warn(self, action: str, path: Path, exc: OSError) -> None:
        """Log, once per instance, that ``action`` on ``path`` failed and why."""
        if not self._warned:
            log.warning(
                "cannot %s %s (%s): switches run without expedited RCU",
                action,
                path,
                exc.strerror,
            )
            self._warned = True

    def _write(self, value: int) -> bool:
        fd = self._held_fd()
        try:
            if fd is not None:
                os.pwrite(fd, b"%d\n" % value, 0)
            else:
                self.path.write_text(f"{value}\n")
        except OSError as exc:
            self._warn("write", self.path, exc)
            return False
        return True

    def recover(self) -> bool:
        """At start: if a previous daemon died holding the value (its marker is there),
        restore 0 and remove the marker. Returns whether it restored anything."""
        if not self.marker.exists():
            return False
        restored = self._read() not in (None, 0) and self._write(0)
        with contextlib.suppress(OSError):
            self.marker.unlink()
        if restored:
            log.info("restored %s to 0 (a previous daemon stopped mid-switch)", self.path)
        return restored

    def _make_marker(self) -> None:
        """Create the marker file (its directory the first time, or when it went): one
        ``mknod(2)`` of an empty regular file, where ``open(2)`` and ``close(2)`` were two
        system calls on the switch's path (docs/performance.md, "Standby hit"). One
        there already (a previous switch's restore failed) is fine. A filesystem that
        refuses ``mknod`` gets the file opened as before."""
        if not self._marker_dir_made:
            self.marker.parent.mkdir(parents=True, exist_ok=True)
            self._marker_dir_made = True
        try:
            self._create_marker()
        except FileNotFoundError:
            self.marker.parent.mkdir(parents=True, exist_ok=True)
            self._create_marker()

    def _create_marker(self) -> None:
        if self._mknod:
            try:
                os.mknod(self.marker, 0o644 | stat.S_IFREG)
                return
            except FileExistsError:
                return
            except (PermissionError, NotImplementedError):
                self._mknod = False
        fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.close(fd)

    def expedited(self) -> AbstractContextManager[bool]:
        """Run the body with expedited grace periods; yields whether they are ours.

        Left alone (yields False) when disabled, when the file is absent or unwritable, or
        when it already reads non-zero (an admin's value). A plain context manager, not a
        generator's: it sits on a standby hit's path before ``BPF_LINK_DETACH``."""
        return _Expedited(self)


class _Expedited:
    """:meth:`RcuExpediter.expedited`'s context manager (one use)."""

    __slots__ = ("_ours", "_rcu")

    def __init__(self, rcu: RcuExpediter) -> None:
        self._rcu = rcu
        self._ours = False

    def __enter__(self) -> bool:
        rcu = self._rcu
        if not rcu.enabled:
            return False
        current = rcu._read()
        if current is None:
            return False
        if current != 0:
            rcu.left_alone += 1
            return False
        try:
            rcu._make_marker()
        except OSError as exc:
            rcu._warn("create", rcu.marker, exc)
            return False
        if not rcu._write(1):
            with contextlib.suppress(OSError):
                rcu.marker.unlink()
            return False
        rcu.used += 1
        self._ours = True
        return True

    def __exit__(self, *exc: object) -> None:
        if not self._ours:
            return
        self._ours = False
        rcu = self._rcu
        if rcu._write(0):
            with contextlib.suppress(OSError):
                rcu.marker.unlink()
