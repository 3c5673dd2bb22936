"""The kernel backend's counters for ``status``: how often each step ran or failed, the
latest phase timings of prepare, attach and detach (ns), the BTF registry's and spec
cache's counters, and the attached scheduler's profile counters (its ``[[stats]]``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from schedswitchd.daemon.kernel_handle import KernelPrepared
from schedswitchd.errors import SchedSwitchError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry, memo_counters
from schedswitchd.kernel.sched_ext.profile_steps import read_stats
from schedswitchd.kernel.spec_cache import SpecCache

log = logging.getLogger("schedswitchd.backend")


class BackendStats:
    """Counts and the latest phase timings, written by the backend's worker thread and read
    by ``status`` from any thread (thread-safe), and the handle attached now, whose profile
    counters ``status`` reads (``attached_lock`` keeps its maps open while they are read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        #: The latest phases by prefix (``prepare``, ``attach``, ``detach``; see :meth:`timings`).
        self._latest: dict[str, dict[str, int]] = {}
        #: The handle attached now (``None`` between a detach and the next attach).
        self.attached: KernelPrepared | None = None
        self.attached_lock = threading.Lock()

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to counter ``key``."""
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + n

    def timings(self, prefix: str, timings: Mapping[str, int]) -> None:
        """The latest ``prefix`` phases for :meth:`snapshot` (``<prefix>.<phase>_ns``),
        replacing the previous ones; kept as they are and expanded when counters are read:
        detach calls this inside the no-scheduler gap."""
        with self._lock:
            self._latest[prefix] = dict(timings)

    def add_timing(self, prefix: str, phase: str, ns: int) -> None:
        """Add (or replace) one phase of the latest ``prefix`` phases."""
        with self._lock:
            self._latest.setdefault(prefix, {})[phase] = ns

    def phase_timings(self, h: KernelPrepared, prefix: str, t: Mapping[str, int]) -> None:
        """Record ``t`` as ``<prefix>.<phase>`` in the handle and the counters, replacing
        the previous attach/detach's entries (the fallback detach has other phases)."""
        if prefix in h.phased:
            for k in [k for k in h.timings_ns if k.startswith(prefix + ".")]:
                del h.timings_ns[k]
        else:  # none to replace: no walk over every phase of its prepare (a hit's attach)
            h.phased.add(prefix)
        h.timings_ns.update({f"{prefix}.{k}": v for k, v in t.items()})
        self.timings(prefix, t)

    def set_attached(self, h: KernelPrepared) -> None:
        """``h`` is the scheduler attached now."""
        with self.attached_lock:
            self.attached = h

    def clear_attached(self, h: KernelPrepared) -> None:
        """``h`` is no longer attached (no change when another one is)."""
        with self.attached_lock:
            if self.attached is h:
                self.attached = None

    def snapshot(self) -> dict[str, int]:
        """The counts and the latest phase timings (``<prefix>.<phase>_ns``, ns) now."""
        out: dict[str, int] = {}
        with self._lock:
            out.update(self._counts)
            for prefix, timings in self._latest.items():
                out.update({f"{prefix}.{k}_ns": v for k, v in timings.items()})
        return out

    def profile_stats(self) -> dict[str, int]:
        """The attached scheduler's profile counters (its ``[[stats]]``), read from its
        loaded maps now, as ``profile.<name>``; empty without a profiled scheduler
        attached. A counter that cannot be read is left out (logged at debug)."""
        with self.attached_lock:
            h = self.attached
            if h is None or h.plan is None or h.loaded is None or h.discarded:
                return {}
            try:
                stats = read_stats(h.loaded, h.plan)
            except SchedSwitchError as exc:
                log.debug("profile counters of %s: %s", h.name, exc)
                return {}
            return {f"profile.{k}": v for k, v in stats.items()}


def backend_counters(
    registry: KernelBtfRegistry, specs: SpecCache, stats: BackendStats
) -> dict[str, int]:
    """Registry, spec-cache and backend counters plus the latest phase timings (ns) and the
    attached scheduler's profile counters: what ``status`` shows of the kernel backend."""
    st = registry.stats()
    sp = specs.stats()
    out = {
        "btf_cache_hits": st.cache.hits,
        "btf_cache_misses": st.cache.misses,
        "btf_cache_evictions": st.cache.evictions,
        "btf_cache_invalidations": st.cache.invalidations,
        "btf_cache_entries": st.cache.entries,
        "btf_cache_bytes": st.cache.bytes_held,
        "module_btfs_read": st.module_btfs_read,
        "module_btf_read_ns": st.read_ns,
        "module_uevents": st.module_uevents,
        # Unreadable/malformed module BTFs left out of all-module searches (warned once).
        "module_btfs_skipped": st.skipped,
        # Which modules hold what vmlinux lacks, per module set (objects without
        # .kmod_btfs): hits avoid a walk over every module BTF.
        **memo_counters(st.lookups),
        "spec_cache_hits": sp.hits,
        "spec_cache_misses": sp.misses,
        # Process-wide bpf(2) calls and time inside them (for bench/switch_latency.py).
        "bpf_syscalls": syscall.STATS.calls,
        "bpf_syscall_ns": syscall.STATS.total_ns,
    }
    out.update(stats.snapshot())
    out.update(stats.profile_stats())
    return out
