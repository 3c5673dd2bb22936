"""Pinning a loaded object in bpffs so it outlives the process, and removing such pins.

A pin (``BPF_OBJ_PIN``) is a file on a bpf filesystem holding a reference to a program,
map or link. A struct_ops link pinned this way keeps its scheduler enabled after the
loading process exits; unlinking the last pin (with no fd open) releases it, which
detaches. Legacy (non-link) struct_ops maps stay registered until key 0 is deleted, so
:func:`unpin_directory` deletes it before unlinking their pin.

Layout of a pin directory: ``link_<map>`` (struct_ops links), ``prog_<name>``,
``map_<name>`` (every map). bpffs refuses ``.`` in names (it reserves them for its own
files), so dots become ``_``: ``.rodata`` is pinned as ``map__rodata``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from schedswitchd.errors import BpfSyscallError, LoadError
from schedswitchd.kernel import attr as A
from schedswitchd.kernel import syscall as S
from schedswitchd.kernel.fd import LinkFd, MapFd, OwnedFd, ProgFd
from schedswitchd.kernel.loader import LoadedObject

BPF_FS_MAGIC = 0xCAFE4A11


def is_bpffs(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` lies on a bpf filesystem (``statfs`` type ``BPF_FS_MAGIC``),
    judged from ``/proc/self/mountinfo`` (the longest mount point containing it)."""
    target = os.path.realpath(path)
    best, fstype = "", ""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            mnt = left.split()[4].replace("\\040", " ")
            inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) >= len(best):
                best, fstype = mnt, right.split()[0]
    return fstype == "bpf"


def pin_name(name: str) -> str:
    """``name`` as bpffs accepts it (``.`` and ``/`` become ``_``)."""
    return name.replace(".", "_").replace("/", "_")


def pin_object(obj: LoadedObject, directory: str | os.PathLike[str]) -> dict[str, str]:
    """Pin ``obj``'s links, programs and maps under ``directory`` (created if needed; must
    be on bpffs). Returns ``{pin name: path}``. Afterwards closing ``obj`` leaves legacy
    struct_ops maps registered (the pins own them). On failure the pins made so far are
    removed and :class:`LoadError` / :class:`BpfSyscallError` propagates."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if not is_bpffs(d):
        raise LoadError(f"{d} is not on a bpf filesystem (mount -t bpf bpf /sys/fs/bpf)")
    made: dict[str, str] = {}
    entries: list[tuple[str, OwnedFd]] = [(f"link_{n}", fd) for n, fd in obj.links.items()]
    entries += [(f"prog_{n}", p.fd) for n, p in obj.programs.items()]
    entries += [(f"map_{n}", m.fd) for n, m in obj.maps.items()]
    try:
        for key, fd in entries:
            pin = pin_name(key)
            S.obj_pin(fd, d / pin)
            made[pin] = str(d / pin)
    except BaseException:
        for made_path in made.values():
            with contextlib.suppress(OSError):
                os.unlink(made_path)
        raise
    obj.leave_attached()  # the pins own the registration now
    return made


@dataclass
class PinnedObject:
    """Fds re-opened from a pin directory (``BPF_OBJ_GET``), by pin name without the kind
    prefix. Close it when done; the pins stay."""

    links: dict[str, LinkFd] = field(default_factory=dict)
    programs: dict[str, ProgFd] = field(default_factory=dict)
    maps: dict[str, MapFd] = field(default_factory=dict)

    def close(self) -> None:
        for group in (self.links, self.programs, self.maps):
            for fd in group.values():
                fd.close()

    def __enter__(self) -> PinnedObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_pinned(directory: str | os.PathLike[str]) -> PinnedObject:
    """Re-open every pin of a :func:`pin_object` directory."""
    out = PinnedObject()
    try:
        for entry in sorted(os.listdir(directory)):
            kind, _, name = entry.partition("_")
            path = Path(directory) / entry
            if kind == "link":
                out.links[name] = S.obj_get(path, expect=LinkFd)
            elif kind == "prog":
                out.programs[name] = S.obj_get(path, expect=ProgFd)
            elif kind == "map":
                out.maps[name] = S.obj_get(path, expect=MapFd)
    except BaseException:
        out.close()
        raise
    return out


def unpin_directory(directory: str | os.PathLike[str]) -> list[str]:
    """Undo :func:`pin_object`: unregister legacy struct_ops maps (delete key 0), detach
    links, unlink every pin and remove the directory. Returns the removed pin names.
    Raises :class:`LoadError` when ``directory`` is not a pin directory."""
    d = Path(directory)
    if not d.is_dir():
        raise LoadError(f"{d} is not a directory of pins")
    removed: list[str] = []
    with open_pinned(d) as pinned:
        for map_fd in pinned.maps.values():
            info = S.map_info(map_fd)
            if info.type == A.MapType.STRUCT_OPS and not info.map_flags & A.F_LINK:
                with contextlib.suppress(BpfSyscallError):
                    S.map_delete_elem(map_fd, b"\0\0\0\0")
        for link_fd in pinned.links.values():
            with contextlib.suppress(BpfSyscallError):
                S.link_detach(link_fd)
    for entry in sorted(os.listdir(d)):
        os.unlink(d / entry)
        removed.append(entry)
    d.rmdir()
    return removed
