"""Opened BPF objects, cached by file identity so a switch does not re-parse its ELF file.

Opening an object (:func:`~schedswitchd.bpf.object.open_object`) is pure and its result, an
:class:`~schedswitchd.bpf.spec.ObjectSpec`, immutable, so one spec serves every later load of
the same file. The key is the file's resolved path plus ``(st_dev, st_ino, st_size,
st_mtime_ns)`` taken from the *open* file, so a rebuilt or replaced object (new inode, size
or mtime) is opened again and the bytes parsed are the bytes identified.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from schedswitchd.bpf.object import open_object_noted
from schedswitchd.bpf.object_file import OBJECT_FILE, open_object_file
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.errors import BtfError, ObjectError, unreadable
from schedswitchd.kernel.lru import BoundedLru, LruStats

#: Default bounds: a daemon config names a handful of schedulers.
DEFAULT_MAX_ENTRIES = 16
DEFAULT_MAX_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class SpecKey:
    """What identifies one version of an object file."""

    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of_path(cls, path: str | os.PathLike[str]) -> SpecKey | None:
        """The key of the file at ``path`` now (symlinks resolved), ``None`` if it cannot
        be stat'ed."""
        try:
            real = os.path.realpath(path)
            st = os.stat(real)
        except (OSError, ValueError):  # ValueError: a NUL byte
            return None
        return cls(real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class OpenedSpec:
    """A cache answer: the spec, its key, whether it came from the cache and the time spent
    (ns) reading and parsing it (0 on a hit); ``note`` says which embedded object was used
    when the file is an executable (:mod:`schedswitchd.bpf.embedded`)."""

    spec: ObjectSpec
    key: SpecKey
    cached: bool
    open_ns: int
    note: str | None = None


def object_name(path: str) -> str:
    """libbpf's object name: the file name up to its first dot (``fifo`` for
    ``fifo.bpf.o``)."""
    base = os.path.basename(path)
    return base.split(".", 1)[0] or base


class SpecCache:
    """A bounded LRU of opened objects keyed by :class:`SpecKey`; thread-safe.

    ``max_entries``/``max_bytes`` bound the cache (bytes = object file sizes).
    """

    def __init__(
        self, *, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._lru: BoundedLru[SpecKey, tuple[ObjectSpec, str | None]] = BoundedLru(
            max_entries=max_entries, max_bytes=max_bytes
        )

    def open(self, path: str | os.PathLike[str]) -> OpenedSpec:
        """The spec of the object at ``path`` (from the cache when the file is unchanged),
        its programs linked (:meth:`~schedswitchd.bpf.spec.ObjectSpec.link_programs`).

        Raises :class:`~schedswitchd.errors.ObjectError` when the file cannot be read or is
        not a valid BPF object, :class:`~schedswitchd.errors.BtfError` for bad ``.BTF``;
        either names ``path`` once.
        """
        try:
            real = os.path.realpath(path)
        except ValueError:  # a NUL byte
            real = os.fspath(path)  # open_object_file says why
        start = time.perf_counter_ns()
        file = open_object_file(real)  # ObjectError for what is not a regular file
        try:
            with file as f:
                st = os.fstat(f.fileno())
                key = SpecKey(real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                hit = self._lru.get(key)
                if hit is not None:
                    return OpenedSpec(hit[0], key, True, 0, hit[1])
                # from the open file: only what the spec keeps is read (not an arena's
                # megabytes of zero globals, not DWARF), and these are the bytes identified
                spec, note = open_object_noted(f, name=object_name(real))
                # Programs are linked now, not at their first load: a malformed program is
                # refused here, before any switch (the daemon pre-opens configured objects
                # after READY), and a prepare finds the spec complete.
                spec.link_programs()
        except OSError as exc:
            raise ObjectError(
                f"cannot read BPF object {os.fspath(path)!r}: {unreadable(exc, OBJECT_FILE)}"
            ) from exc
        except (ObjectError, BtfError) as exc:
            # opened from the file, so the error does not say which one: name it once, as
            # open_object(path) does (a daemon opens many)
            raise type(exc)(f"{os.fspath(path)}: {exc}") from exc
        self._lru.put(key, (spec, note), st.st_size)
        return OpenedSpec(spec, key, False, time.perf_counter_ns() - start, note)

    def stats(self) -> LruStats:
        """The cache's counters (hits, misses, evictions, ...)."""
        return self._lru.stats()
