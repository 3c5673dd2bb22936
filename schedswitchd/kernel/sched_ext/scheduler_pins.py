"""bpffs pins that keep an attached scheduler alive across a restart of the daemon.

A struct_ops link keeps its scheduler registered while any reference to it exists; a pin
in bpffs is such a reference (verified in the sched_ext VM: after the loading process exits
the scheduler stays enabled, and unlinking the pin disables it). Layout, one directory per
scheduler under the pin root (default ``/sys/fs/bpf/schedswitchd``)::

    <root>/<name>/link          the struct_ops link (BPF_OBJ_PIN of the link fd)
    <root>/<name>/exit_map      the data map holding the scheduler's exit record (optional)
    <root>/<name>/progs/<prog>  the link of each auto-attached program of the object
                                (fentry/bpf_scx_reg, tp_btf/..., iter/...; see
                                schedswitchd.kernel.prog_attach), so they survive too

``<name>`` is the configured scheduler name. Pinning and opening use ``BPF_OBJ_PIN`` and
``BPF_OBJ_GET`` (``include/uapi/linux/bpf.h``); directories are made with ``mkdir``, which
bpffs supports.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from schedswitchd.errors import BpfSyscallError, KernelError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.fd import LinkFd, MapFd
from schedswitchd.kernel.pins import BPF_FS_MAGIC, existing_ancestor, fs_magic

LINK_FILE = "link"
EXIT_MAP_FILE = "exit_map"
PROGS_DIR = "progs"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_@-]{0,63}$")  # "@": mode variants (lavd@gaming)
_PROG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")  # a C identifier


class PinError(KernelError):
    """A pin could not be created, opened or removed (message names the path)."""

    code = "pin"


@dataclass
class PinnedScheduler:
    """A scheduler's pins opened again: the link, the exit map if it was pinned, and the
    program links by program name."""

    name: str
    link: LinkFd
    exit_map: MapFd | None
    program_links: dict[str, LinkFd] = field(default_factory=dict)

    def close(self) -> None:
        """Close every fd, the struct_ops link first (the pins stay)."""
        self.link.close()
        if self.exit_map is not None:
            self.exit_map.close()
        for fd in self.program_links.values():
            fd.close()


def _check_name(name: str) -> str:
    if not _NAME.match(name) or name in (".", ".."):
        raise PinError(f"{name[:80]!r} cannot name a pin directory")
    return name


class PinDir:
    """The pin root. ``root`` must be on a bpf filesystem for :meth:`pin` to work."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, name: str) -> Path:
        """Directory of scheduler ``name``."""
        return self.root / _check_name(name)

    def check(self) -> None:
        """Whether :meth:`pin` can work here, checked without making anything: the root
        (or, while it does not exist, the nearest directory above it, where it would be
        made) is a directory on a bpf filesystem (``statfs(2)`` ``BPF_FS_MAGIC``) that is
        mounted writable (``statvfs(3)`` without ``ST_RDONLY``) and that this process may
        write (``access(2)`` ``W_OK``). A switch pins its scheduler after the reply that
        says it runs; a pin that then fails rolls the switch back, so the switch is
        refused before it begins instead. Raises :class:`PinError` saying what is wrong and
        how to fix it."""
        where = existing_ancestor(self.root)
        mount = "mount bpffs there: mount -t bpf bpf /sys/fs/bpf, or set [daemon] pin_dir"
        if not where.is_dir():
            raise PinError(f"cannot pin schedulers under {self.root}: {where} is not a directory")
        try:
            magic = fs_magic(where)
            readonly = bool(os.statvfs(where).f_flag & os.ST_RDONLY)
        except OSError as exc:
            raise PinError(
                f"cannot pin schedulers under {self.root}: {where}: {exc.strerror}"
            ) from exc
        if magic != BPF_FS_MAGIC:
            raise PinError(
                f"cannot pin schedulers under {self.root}: {where} is not on a bpf "
                f"filesystem ({mount})"
            )
        if readonly or not os.access(where, os.W_OK):
            why = "is mounted read-only" if readonly else "is not writable by this process"
            raise PinError(f"cannot pin schedulers under {self.root}: {where} {why}")

    def pin(
        self,
        name: str,
        link: LinkFd,
        exit_map: MapFd | None,
        program_links: Mapping[str, LinkFd] | None = None,
    ) -> None:
        """Pin ``link`` (and ``exit_map``, and each of ``program_links`` as
        ``progs/<program>``) under ``<root>/<name>/``, replacing old pins there. On failure
        nothing new is left behind; raises :class:`PinError`."""
        d = self.path(name)
        self.unpin(name)
        try:
            d.mkdir(parents=True, exist_ok=True)
            # The program links first: a daemon that dies in between leaves the
            # scheduler unpinned (it ends with the process), never hooks without it.
            if program_links:
                (d / PROGS_DIR).mkdir()
                for prog, fd in program_links.items():
                    if not _PROG_NAME.match(prog):
                        raise PinError(f"{prog[:80]!r} cannot name a program pin")
                    syscall.obj_pin(fd, d / PROGS_DIR / prog)
            syscall.obj_pin(link, d / LINK_FILE)
            if exit_map is not None:
                syscall.obj_pin(exit_map, d / EXIT_MAP_FILE)
        except (OSError, BpfSyscallError, PinError) as exc:
            self.unpin(name)
            raise PinError(f"cannot pin scheduler {name} under {d}: {exc}") from exc

    def unpin(self, name: str) -> bool:
        """Remove ``<root>/<name>/`` and what is pinned in it; True if anything was there.
        Removing the link's pin drops that reference to the link (the scheduler ends if
        nothing else holds it). Raises :class:`PinError` only for an unremovable entry."""
        d = self.path(name)
        found = False
        try:
            entries = list(os.scandir(d))
        except FileNotFoundError:
            return False
        except NotADirectoryError:
            entries = []
        for entry in entries:
            found = True
            try:
                if entry.is_dir(follow_symlinks=False):
                    _rmtree(Path(entry.path))
                else:
                    os.unlink(entry.path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise PinError(f"cannot remove {entry.path}: {exc.strerror}") from exc
        try:
            if d.is_dir() and not d.is_symlink():
                d.rmdir()
            else:
                d.unlink()
            found = True
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise PinError(f"cannot remove {d}: {exc.strerror}") from exc
        return found

    def names(self) -> list[str]:
        """Entries of the pin root (sorted); empty when it does not exist."""
        try:
            return sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise PinError(f"cannot list {self.root}: {exc.strerror}") from exc

    def open(self, name: str) -> PinnedScheduler | None:
        """Open scheduler ``name``'s pins, or ``None`` when it has no link pin. Raises
        :class:`PinError` when the pin holds something other than a link (or a map for
        the exit map) or cannot be opened."""
        d = self.path(name)
        try:
            link = syscall.obj_get(d / LINK_FILE, expect=LinkFd)
        except BpfSyscallError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise PinError(f"cannot open pinned link {d / LINK_FILE}: {exc}") from exc
        exit_map: MapFd | None = None
        try:
            exit_map = syscall.obj_get(d / EXIT_MAP_FILE, expect=MapFd)
        except BpfSyscallError as exc:
            if exc.errno != errno.ENOENT:
                link.close()
                raise PinError(f"cannot open pinned map {d / EXIT_MAP_FILE}: {exc}") from exc
        pinned = PinnedScheduler(name, link, exit_map)
        try:
            progs = sorted(os.listdir(d / PROGS_DIR))
        except FileNotFoundError:
            progs = []
        except OSError as exc:
            pinned.close()
            raise PinError(f"cannot list {d / PROGS_DIR}: {exc.strerror}") from exc
        for prog in progs:
            if not _PROG_NAME.match(prog):
                continue  # not made by pin()
            try:
                pinned.program_links[prog] = syscall.obj_get(d / PROGS_DIR / prog, expect=LinkFd)
            except BpfSyscallError as exc:
                pinned.close()
                raise PinError(f"cannot open pinned link {d / PROGS_DIR / prog}: {exc}") from exc
        return pinned


def _rmtree(d: Path) -> None:
    for entry in os.scandir(d):
        if entry.is_dir(follow_symlinks=False):
            _rmtree(Path(entry.path))
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
    with contextlib.suppress(FileNotFoundError):
        d.rmdir()
