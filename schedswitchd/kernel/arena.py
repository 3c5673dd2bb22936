"""The user-space side of a BPF arena (``BPF_MAP_TYPE_ARENA``): mapping it and writing its
globals.

An arena is a region of up to 4 GiB (``max_entries`` pages) shared by BPF programs and user
space. Its user address (``user_vm_start``) is ``map_extra`` when the map was created with
one, else fixed by the first ``mmap`` of the map; a program's ``ld_imm64`` of an arena
global (``BPF_PSEUDO_MAP_VALUE`` on the arena map) is resolved by the verifier to
``user_vm_start + offset``, so the map must be mapped once before programs load (libbpf maps
it right after creating it). Pages come into being when touched: a user-space fault or
``bpf_arena_alloc_pages`` allocates one; a BPF store to an absent page is dropped and a load
reads 0. So the pages of the object's arena globals (``.addr_space.1``) are made present
before programs run, zero ones included (libbpf does it by copying the whole section), which
also keeps ``bpf_arena_alloc_pages`` from handing them out.

Source: kernel ``kernel/bpf/arena.c`` (``arena_map_mmap``, ``arena_get_unmapped_area``,
``arena_vm_fault``) and ``Documentation/bpf/map_arena.rst``-era commit messages; ``mmap(2)``,
``madvise(2)`` (``MADV_POPULATE_WRITE``, Linux 5.14).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

from schedswitchd.errors import LoadError

__all__ = ["ArenaMapping", "map_arena", "page_size"]

_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FAILED = ctypes.c_void_p(-1).value
MADV_POPULATE_WRITE = 23

# The process's own symbols (libc is linked into the interpreter), as the other ctypes users
# here: ctypes.util.find_library("c") runs ``/sbin/ldconfig -p`` on import, a process start the
# daemon paid on every start.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def page_size() -> int:
    """The system page size in bytes (``sysconf(_SC_PAGE_SIZE)``)."""
    return mmap.PAGESIZE


class ArenaMapping:
    """One ``mmap`` of an arena map: ``address`` (the arena's user address) and ``length``
    (``max_entries`` pages, in bytes). Reads and writes take byte offsets into the arena;
    :meth:`close` unmaps (the arena and its pages live on in the kernel)."""

    def __init__(self, address: int, length: int, name: str) -> None:
        self.address = address
        self.length = length
        self.name = name
        self._open = True

    def _check(self, offset: int, size: int) -> None:
        if not self._open:
            raise LoadError(f"arena {self.name}: the mapping is closed")
        if offset < 0 or size < 0 or offset + size > self.length:
            raise LoadError(
                f"arena {self.name}: bytes {offset}..{offset + size} lie outside its "
                f"{self.length} bytes"
            )

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (absent pages are allocated, zero, by the read)."""
        self._check(offset, size)
        return ctypes.string_at(self.address + offset, size)

    def write(self, offset: int, data: bytes) -> None:
        """Copy ``data`` to ``offset``."""
        self._check(offset, len(data))
        ctypes.memmove(self.address + offset, data, len(data))

    def populate(self, offset: int, size: int) -> None:
        """Make the pages holding ``offset..offset+size`` present without copying anything:
        one ``MADV_POPULATE_WRITE``, or a one-byte read per page where the kernel lacks it."""
        if size <= 0:
            return
        page = page_size()
        start = offset - offset % page
        end = -(-(offset + size) // page) * page
        self._check(start, end - start)
        if _libc.madvise(self.address + start, end - start, MADV_POPULATE_WRITE) == 0:
            return
        err = ctypes.get_errno()
        if err != errno.EINVAL:  # EINVAL: no MADV_POPULATE_WRITE (Linux < 5.14)
            raise LoadError(
                f"arena {self.name}: cannot make its global pages present: {os.strerror(err)}"
            )
        for at in range(start, end, page):  # a fault allocates the page (arena_vm_fault)
            ctypes.string_at(self.address + at, 1)

    def close(self) -> None:
        """Unmap (idempotent)."""
        if self._open:
            self._open = False
            _libc.munmap(self.address, self.length)

    def __enter__(self) -> ArenaMapping:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def map_arena(map_fd: int, pages: int, address: int, name: str) -> ArenaMapping:
    """``mmap`` arena map ``map_fd`` of ``pages`` pages read-write and shared, at ``address``
    (its ``map_extra``, or 0 to let the kernel choose the first time).

    The address is a hint, not ``MAP_FIXED``: an arena created with ``map_extra`` (or mapped
    before) can only be mapped at its one address, and where something else already lives
    there the kernel refuses (``EBUSY``/``EINVAL``) instead of the mapping replacing it, so a
    second arena at the same fixed address (another load of the same scheduler) cannot clobber
    the first while both are mapped. Raises :class:`LoadError` naming the arena.
    """
    length = pages * page_size()
    got = _libc.mmap(address or None, length, _PROT_RW, mmap.MAP_SHARED, map_fd, 0)
    if got is None or got == _MAP_FAILED:
        err = ctypes.get_errno()
        where = f" at {address:#x}" if address else ""
        raise LoadError(
            f"arena {name}: cannot mmap its {length} bytes{where}: {os.strerror(err)}"
            + (" (the address is in use in this process?)" if address else "")
        )
    if address and got != address:  # cannot happen with the kernel's checks; never write
        _libc.munmap(got, length)
        raise LoadError(f"arena {name}: mapped at {got:#x}, not at its address {address:#x}")
    return ArenaMapping(int(got), length, name)
