"""A least-recently-used cache bounded by entry count and by bytes, with counters.

Used by the kernel BTF registry for parsed module BTFs, where the byte size of an entry is
the size of its raw BTF. Thread-safe: one lock around every operation.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class LruStats:
    """Counters of one :class:`BoundedLru` (cumulative since creation, except ``entries``
    and ``bytes_held`` which are current).

    ``hits``/``misses``: :meth:`BoundedLru.get` outcomes; ``evictions``: entries pushed out
    by a bound; ``invalidations``: entries removed by :meth:`BoundedLru.pop`; ``rejected``:
    values larger than the byte bound, never stored; ``bytes_held``: sum of the byte sizes
    of the entries held; ``max_entries``/``max_bytes``: the bounds.
    """

    hits: int
    misses: int
    evictions: int
    invalidations: int
    rejected: int
    entries: int
    bytes_held: int
    max_entries: int
    max_bytes: int


class BoundedLru(Generic[K, V]):
    """LRU map holding at most ``max_entries`` values and ``max_bytes`` bytes (the sizes the
    caller declares on :meth:`put`). Both bounds must be positive (``ValueError``)."""

    def __init__(self, *, max_entries: int, max_bytes: int) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(
                f"LRU bounds must be positive (max_entries={max_entries}, max_bytes={max_bytes})"
            )
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._invalidations = 0
        self._rejected = 0

    def get(self, key: K, *, valid: Callable[[V], bool] | None = None) -> V | None:
        """The value for ``key`` (now most recently used) or ``None``; counts a hit or miss.

        With ``valid``, a value for which ``valid(value)`` is false is removed (counted as an
        invalidation) and the lookup is a miss. ``valid`` runs under the cache's lock.
        """
        with self._lock:
            item = self._data.get(key)
            if item is not None and valid is not None and not valid(item[0]):
                del self._data[key]
                self._bytes -= item[1]
                self._invalidations += 1
                item = None
            if item is None:
                self._misses += 1
                return None
            self._data.move_to_end(key)
            self._hits += 1
            return item[0]

    def peek(self, key: K) -> V | None:
        """The value for ``key`` without touching recency or counters."""
        with self._lock:
            item = self._data.get(key)
            return None if item is None else item[0]

    def put(self, key: K, value: V, nbytes: int) -> list[K]:
        """Store ``value`` (``nbytes`` bytes, >= 0) as most recently used, replacing any value
        for ``key``; evict least recently used entries until both bounds hold.

        Returns the evicted keys, oldest first. A value larger than ``max_bytes`` is not
        stored (counted in ``rejected``) and any previous value for ``key`` is dropped.
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        evicted: list[K] = []
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if nbytes > self._max_bytes:
                self._rejected += 1
                return evicted
            while self._data and (
                len(self._data) + 1 > self._max_entries or self._bytes + nbytes > self._max_bytes
            ):
                old_key, (_, old_bytes) = self._data.popitem(last=False)
                self._bytes -= old_bytes
                self._evictions += 1
                evicted.append(old_key)
            self._data[key] = (value, nbytes)
            self._bytes += nbytes
        return evicted

    def pop(self, key: K) -> V | None:
        """Remove and return the value for ``key`` (an invalidation), or ``None``."""
        with self._lock:
            item = self._data.pop(key, None)
            if item is None:
                return None
            self._bytes -= item[1]
            self._invalidations += 1
            return item[0]

    def clear(self) -> int:
        """Remove every entry (counted as invalidations); returns how many there were."""
        with self._lock:
            n = len(self._data)
            self._data.clear()
            self._bytes = 0
            self._invalidations += n
            return n

    def ordered_keys(self) -> list[K]:
        """Keys from least to most recently used."""
        with self._lock:
            return list(self._data)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._data

    @property
    def bytes_held(self) -> int:
        """The sizes of the entries held, summed (bytes, as the cache was told them)."""
        with self._lock:
            return self._bytes

    def stats(self) -> LruStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            return LruStats(
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                invalidations=self._invalidations,
                rejected=self._rejected,
                entries=len(self._data),
                bytes_held=self._bytes,
                max_entries=self._max_entries,
                max_bytes=self._max_bytes,
            )
