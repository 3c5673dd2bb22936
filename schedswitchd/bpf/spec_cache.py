"""A small bounded cache of opened object specs, keyed by file identity.

The daemon switches between a handful of scheduler objects; re-reading and re-linking an
object it has already opened is wasted work while the old scheduler runs. A spec is
immutable (customisation returns copies), so one cached spec can be shared. The key is
``(st_dev, st_ino, st_size, st_mtime_ns)`` of the path, so a rebuilt or replaced file is
opened afresh.
"""

from __future__ import annotations

import os
from collections import OrderedDict

from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.errors import ObjectError

_Key = tuple[str, int, int, int, int]


class SpecCache:
    """LRU of :class:`ObjectSpec` by path and file identity; ``capacity`` specs at most.

    ``hits`` and ``misses`` count lookups. Not thread-safe: use from one thread (the
    daemon's loader worker).
    """

    def __init__(self, capacity: int = 8) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._specs: OrderedDict[_Key, ObjectSpec] = OrderedDict()

    def open(self, path: str | os.PathLike[str]) -> ObjectSpec:
        """The spec of ``path``, from the cache when the file is unchanged.

        Raises :class:`ObjectError` if the file cannot be read, or as ``open_object``.
        """
        p = os.fspath(path)
        try:
            st = os.stat(p)
        except OSError as exc:
            raise ObjectError(f"cannot read BPF object {p!r}: {exc}") from exc
        key = (os.path.abspath(p), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        spec = self._specs.get(key)
        if spec is not None:
            self.hits += 1
            self._specs.move_to_end(key)
            return spec
        self.misses += 1
        spec = open_object(p)
        for old in [k for k in self._specs if k[0] == key[0]]:
            del self._specs[old]  # an older version of the same path
        self._specs[key] = spec
        while len(self._specs) > self.capacity:
            self._specs.popitem(last=False)
        return spec

    def __len__(self) -> int:
        return len(self._specs)
