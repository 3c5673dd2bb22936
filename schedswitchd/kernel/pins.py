"""Pinning a loaded object in bpffs so it outlives the process, and removing such pins.

A pin (``BPF_OBJ_PIN``) is a file on a bpf filesystem holding a reference to a program,
map or link. A struct_ops link pinned this way keeps its scheduler enabled after the
loading process exits; unlinking the last pin (with no fd open) releases it, which
detaches. Legacy (non-link) struct_ops maps stay registered until key 0 is deleted, so
:func:`unpin_directory` deletes it before unlinking their pin.

Layout of a pin directory: ``link_<map>`` (struct_ops links), ``link_<program>`` (links
of the auto-attached programs), ``prog_<name>``,
``map_<name>`` (every map). bpffs refuses ``.`` in names (it reserves them for its own
files), so dots become ``_``: ``.rodata`` is pinned as ``map__rodata``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from schedswitchd.errors import BpfSyscallError, LoadError
from schedswitchd.kernel import bpf_uapi, syscall
from schedswitchd.kernel.fd import LinkFd, MapFd, OwnedFd, ProgFd
from schedswitchd.kernel.loader import LoadedObject

BPF_FS_MAGIC = 0xCAFE4A11  # include/uapi/linux/magic.h

# Names pin_object creates: a kind prefix, then an object name with "." and "/" replaced.
_PIN_ENTRY = re.compile(r"^(link|prog|map)_([^./]+)$")


class _Statfs(ctypes.Structure):
    # Only ``f_type`` (the first field, a ``long`` on Linux ABIs we run on) is read; the
    # padding covers the rest of ``struct statfs`` (120 bytes on 64-bit, see statfs(2)).
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 256)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.statfs.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Statfs)]
_libc.statfs.restype = ctypes.c_int


def fs_magic(path: str | os.PathLike[str]) -> int:
    """The ``statfs(2)`` ``f_type`` of the filesystem holding ``path`` (e.g.
    :data:`BPF_FS_MAGIC`, ``include/uapi/linux/magic.h``). Raises :class:`OSError`."""
    buf = _Statfs()
    if _libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), os.fsdecode(path))
    return int(buf.f_type) & 0xFFFFFFFF


def existing_ancestor(path: Path) -> Path:
    """``path`` made absolute if it exists, else its nearest existing ancestor."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def is_bpffs(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (or, if it does not exist yet, its nearest existing ancestor) lies
    on a bpf filesystem: ``statfs`` type ``BPF_FS_MAGIC``."""
    try:
        return fs_magic(existing_ancestor(Path(path))) == BPF_FS_MAGIC
    except OSError:
        return False


def pin_name(name: str) -> str:
    """``name`` as bpffs accepts it (``.`` and ``/`` become ``_``)."""
    return name.replace(".", "_").replace("/", "_")


def pin_object(obj: LoadedObject, directory: str | os.PathLike[str]) -> dict[str, str]:
    """Pin ``obj``'s links, programs and maps under ``directory`` (created if needed; must
    be on bpffs). Returns ``{pin name: path}``. Afterwards closing ``obj`` leaves legacy
    struct_ops maps registered (the pins own them). On failure the pins made so far are
    removed and :class:`LoadError` / :class:`BpfSyscallError` propagates."""
    d = Path(directory)
    # Checked before mkdir so nothing is created on another filesystem.
    if not is_bpffs(d):
        raise LoadError(f"{d} is not on a bpf filesystem (mount one: mount -t bpf bpf /sys/fs/bpf)")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LoadError(f"cannot create pin directory {d}: {exc.strerror}") from exc
    made: dict[str, str] = {}
    entries: list[tuple[str, OwnedFd]] = [(f"link_{n}", fd) for n, fd in obj.links.items()]
    clash = sorted(set(obj.links) & set(obj.program_links))
    if clash:
        raise LoadError(
            f"cannot pin {obj.spec.name}: struct_ops map and program both named {clash[0]}"
        )
    entries += [(f"link_{n}", fd) for n, fd in obj.program_links.items()]
    entries += [(f"prog_{n}", p.fd) for n, p in obj.programs.items()]
    entries += [(f"map_{n}", m.fd) for n, m in obj.maps.items()]
    try:
        for key, fd in entries:
            pin = pin_name(key)
            syscall.obj_pin(fd, d / pin)
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
        """Close every fd (links, programs, maps); the pins stay."""
        for group in (self.links, self.programs, self.maps):
            for fd in group.values():
                fd.close()

    def __enter__(self) -> PinnedObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pin_entries(directory: Path) -> list[tuple[str, str, str]]:
    """``(entry, kind, name)`` for each entry of ``directory`` that :func:`pin_object`
    could have made: a name ``link_*``/``prog_*``/``map_*`` that is a pin (bpffs shows
    pins as regular files), never a directory or symlink."""
    out = []
    for entry in sorted(os.listdir(directory)):
        m = _PIN_ENTRY.match(entry)
        if m is None:
            continue
        if not stat.S_ISREG(os.lstat(directory / entry).st_mode):
            continue
        out.append((entry, m.group(1), m.group(2)))
    return out


def open_pinned(directory: str | os.PathLike[str]) -> PinnedObject:
    """Re-open every pin of a :func:`pin_object` directory (other entries are ignored)."""
    out = PinnedObject()
    d = Path(directory)
    try:
        for entry, kind, name in _pin_entries(d):
            path = d / entry
            if kind == "link":
                out.links[name] = syscall.obj_get(path, expect=LinkFd)
            elif kind == "prog":
                out.programs[name] = syscall.obj_get(path, expect=ProgFd)
            else:
                out.maps[name] = syscall.obj_get(path, expect=MapFd)
    except BaseException:
        out.close()
        raise
    return out


def _check_pin_directory(d: Path) -> Path:
    """``d`` resolved, if it may be emptied by :func:`unpin_directory`; else LoadError."""
    if not d.is_dir():
        raise LoadError(f"{d} is not a directory of pins")
    real = Path(os.path.realpath(d))
    try:
        magic = fs_magic(real)
    except OSError as exc:
        raise LoadError(f"cannot check the filesystem of {d}: {exc.strerror}") from exc
    if magic != BPF_FS_MAGIC:
        raise LoadError(
            f"{d} is not on a bpf filesystem, so it holds no pins: refusing to touch it"
        )
    if os.path.ismount(real):
        raise LoadError(
            f"{d} is the root of a bpf filesystem, not a pin directory made by "
            "`object load --pin DIR`: refusing to touch it"
        )
    return real


def unpin_directory(directory: str | os.PathLike[str]) -> list[str]:
    """Undo :func:`pin_object`: unregister legacy struct_ops maps (delete key 0), detach
    links, unlink the pins :func:`pin_object` names (``link_*``, ``prog_*``, ``map_*``)
    and remove the directory if that leaves it empty. Anything else in it (other files,
    subdirectories) is left alone; nothing is removed recursively. Returns the removed pin
    names. Raises :class:`LoadError` when ``directory`` is not a directory, is not on a bpf
    filesystem (``statfs`` magic ``BPF_FS_MAGIC``) or is a bpffs mount root, and
    :class:`BpfSyscallError` when a ``link_``/``prog_``/``map_`` pin holds another kind of
    object."""
    d = _check_pin_directory(Path(directory))
    removed: list[str] = []
    with open_pinned(d) as pinned:
        for map_fd in pinned.maps.values():
            info = syscall.map_info(map_fd)
            if info.type == bpf_uapi.MapType.STRUCT_OPS and not info.map_flags & bpf_uapi.F_LINK:
                with contextlib.suppress(BpfSyscallError):
                    syscall.map_delete_elem(map_fd, b"\0\0\0\0")

        # struct_ops links first: the scheduler or congestion control goes before the
        # tracing hooks of its object are detached (the order LoadedObject.close keeps)
        def struct_ops_last(fd: LinkFd) -> bool:
            try:
                return syscall.link_info(fd).type != bpf_uapi.LinkType.STRUCT_OPS
            except BpfSyscallError:
                return True

        for link_fd in sorted(pinned.links.values(), key=struct_ops_last):
            with contextlib.suppress(BpfSyscallError):
                syscall.link_detach(link_fd)
    for entry, _, _ in _pin_entries(d):
        try:
            os.unlink(d / entry)
        except FileNotFoundError:
            continue  # removed concurrently
        except OSError as exc:
            raise LoadError(f"cannot remove pin {d / entry}: {exc.strerror}") from exc
        removed.append(entry)
    if not os.listdir(d):
        d.rmdir()
    return removed
