"""The kernel BTF registry: vmlinux once, declared module BTFs by name, a bounded cache.

libbpf reads the BTF of *every* loaded module whenever a CO-RE relocation, a kfunc or an
attach target is missing from vmlinux. Here a load names the modules it may touch (the
object's ``.kmod_btfs`` section plus configured extras) and only those are read:

* ``<btf_root>/vmlinux`` is parsed once per process (shared by every registry);
* ``<btf_root>/<module>`` is read as split BTF on vmlinux (kernel doc
  ``Documentation/bpf/btf.rst``; ``/sys/kernel/btf/<module>`` exists while the module is
  loaded, with ``CONFIG_DEBUG_INFO_BTF_MODULES``);
* parsed module BTFs live in a :class:`~schedswitchd.kernel.lru.BoundedLru` bounded by entry
  count and bytes (raw BTF size);
* a cached module is served only while its file is the one it was read from (device, inode,
  size, mtime): a reloaded module gets a new sysfs node, so even a missed uevent cannot make
  the registry serve a stale module. Module ``add``/``remove`` uevents drop entries eagerly
  and keep the name → BTF object id map (:class:`~schedswitchd.kernel.btf.ids.KernelBtfIds`)
  true.

Without any declaration a load falls back to libbpf's behaviour, searching every module, but
lazily: :meth:`TargetBtfs.first` and :meth:`TargetBtfs.modules` parse one module at a time,
only when vmlinux lacked what was asked for, and through the cache. Named lookups
(:meth:`TargetBtfs.first_holding`, :meth:`TargetBtfs.modules_holding`) go through the
registry's :class:`~schedswitchd.kernel.btf.module_memo.LookupMemo`: the first load after the
set of loaded modules changed walks every module once for all of an object's names (like
libbpf); later loads read only the modules that hold candidates. Modules read by a walk
that hold none are not admitted to the cache, so a walk does not evict useful entries.

A module BTF that cannot be read or parsed (a corrupt or truncated file) is skipped, with
a warning, wherever every module is searched (fallback walks and iteration): one broken
module must not fail every load that merely looks through all of them. It is counted
(``kmod_btf_skipped`` in :meth:`RegistryStats.as_counters`, shown by the daemon's
``status``), named in :attr:`TargetReport.skipped`, and remembered by file identity so an
unchanged bad file is neither re-read nor warned about again. A module an object
*declares* (``.kmod_btfs``) still fails its load when it cannot be read: that load needs it.

``btf_root`` is a parameter so tests can point it at a directory of real split BTF files.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, TypeVar

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.errors import BtfError, RegistryError
from schedswitchd.kernel.btf.ids import BtfIdStats, KernelBtfIds
from schedswitchd.kernel.btf.module_memo import (
    DEFAULT_MAX_LOOKUPS,
    Holders,
    LookupMemo,
    MemoStats,
    ModuleLookup,
    ModuleSet,
)
from schedswitchd.kernel.fd import BtfFd
from schedswitchd.kernel.lru import BoundedLru, LruStats
from schedswitchd.kernel.uevents import Action, Subscription, Uevent, UeventListener

log = logging.getLogger(__name__)

SYS_BTF_ROOT: Final = Path("/sys/kernel/btf")
VMLINUX: Final = "vmlinux"
#: ``MODULE_NAME_LEN`` (``include/linux/module.h``) is 56 bytes including the NUL.
MODULE_NAME_MAX: Final = 55
DEFAULT_MAX_ENTRIES: Final = 32
DEFAULT_MAX_BYTES: Final = 32 << 20

_MODULE_NAME = re.compile(r"[A-Za-z0-9_]+")
T = TypeVar("T")


def normalize_module_name(name: str) -> str:
    """The kernel's name for a module: ``-`` becomes ``_`` as ``modprobe`` and Kbuild do.

    Raises :class:`RegistryError` for names that cannot be a module (empty, too long, or
    holding characters other than letters, digits, ``_`` and ``-``), e.g. a path from a
    hostile ``.kmod_btfs`` section.
    """
    norm = name.replace("-", "_")
    if not _MODULE_NAME.fullmatch(norm) or len(norm) > MODULE_NAME_MAX:
        raise RegistryError(f"{name[:80]!r} is not a kernel module name")
    return norm


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What tells one version of a BTF file from the next: ``os.stat`` fields."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        """The identity of the file ``st`` describes (device, inode, size, mtime in ns)."""
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class ModuleBtf:
    """One parsed module BTF as cached: ``nbytes`` is its raw size, ``read_ns`` the time
    to read and parse it, ``identity`` the file it came from, ``generation`` the module's
    event generation when the read started (it is cached only if no event came since)."""

    name: str
    btf: Btf
    nbytes: int
    identity: FileIdentity
    read_ns: int
    generation: int = 0


_vmlinux_lock = threading.Lock()
_vmlinux_cache: dict[tuple[str, FileIdentity], Btf] = {}


def shared_vmlinux(path: str | os.PathLike[str]) -> Btf:
    """The vmlinux BTF at ``path``, parsed once per process per file version.

    Raises :class:`RegistryError` if the file is missing, :class:`BtfError` if malformed.
    """
    p = os.path.realpath(path)
    try:
        ident = FileIdentity.of(os.stat(p))
    except OSError as exc:
        raise RegistryError(f"no vmlinux BTF at {path}: {exc.strerror}") from exc
    key = (p, ident)
    with _vmlinux_lock:
        btf = _vmlinux_cache.get(key)
        if btf is None:
            btf = Btf.from_file(p, name=VMLINUX)
            _vmlinux_cache[key] = btf
        return btf


@dataclass(slots=True)
class TargetReport:
    """What one load's target set touched (filled as modules are read).

    ``declared``: module names the load may touch, normalised and de-duplicated in order
    (empty in fallback mode); ``fallback``: no declaration, every module may be searched;
    ``found``: modules whose BTF was obtained; ``missing``: declared modules that are not
    loaded; ``read``: module BTFs read from ``btf_root`` for this load (cache misses);
    ``cache_hits``: served from the cache; ``read_ns``: time spent reading and parsing;
    ``skipped``: modules left out of an all-module search because their BTF could not be
    read or parsed (each with the reason).
    """

    declared: tuple[str, ...]
    fallback: bool
    found: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)
    cache_hits: int = 0
    read_ns: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def modules_read(self) -> int:
        """Number of module BTFs read from disk for this load."""
        return len(self.read)


@dataclass(frozen=True, slots=True)
class RegistryStats:
    """Registry counters: the cache's (``cache``), module BTFs read from disk and the time
    spent (ns) since creation, cache entries dropped because their file changed
    (``stale_dropped``), module uevents handled, the id map's counters (``ids``,
    ``None`` without kernel ids), the module lookup memo's (``lookups``), and how often an
    unreadable or malformed module BTF was skipped by an all-module search (``skipped``)."""

    cache: LruStats
    module_btfs_read: int
    read_ns: int
    stale_dropped: int
    module_uevents: int
    ids: BtfIdStats | None
    lookups: MemoStats
    skipped: int = 0

    def as_counters(self) -> dict[str, int]:
        """Flat ``name -> int`` counters for status output (bytes, ns and counts as named)."""
        c = self.cache
        out = {
            "btf_cache_hits": c.hits,
            "btf_cache_misses": c.misses,
            "btf_cache_evictions": c.evictions,
            "btf_cache_invalidations": c.invalidations,
            "btf_cache_entries": c.entries,
            "btf_cache_bytes": c.bytes_held,
            "btf_cache_max_entries": c.max_entries,
            "btf_cache_max_bytes": c.max_bytes,
            "kmod_btfs_read": self.module_btfs_read,
            "kmod_btf_read_ns": self.read_ns,
            "kmod_btf_stale_dropped": self.stale_dropped,
            "kmod_uevents": self.module_uevents,
            "kmod_btf_skipped": self.skipped,
            **memo_counters(self.lookups),
        }
        if self.ids is not None:
            out["btf_id_full_scans"] = self.ids.full_scans
            out["btf_id_incremental_scans"] = self.ids.incremental_scans
            out["btf_id_mismatches"] = self.ids.mismatches
        return out


def memo_counters(m: MemoStats) -> dict[str, int]:
    """The lookup memo's counters as flat status counters (``module_lookup_*``)."""
    return {
        "module_lookup_hits": m.hits,
        "module_lookup_misses": m.misses,
        "module_lookup_walks": m.walks,
        "module_lookup_invalidations": m.invalidations,
        "module_lookup_entries": m.entries,
        "module_lookup_max_entries": m.max_entries,
        "module_lookup_evictions": m.evictions,
        "module_set_checks": m.checks,
        "module_set_check_ns": m.check_ns,
        "module_set_changes_unheard": m.unheard,
    }


class KernelBtfRegistry:
    """vmlinux and module BTFs of one kernel, for every load a process makes.

    ``btf_root``: a directory shaped like ``/sys/kernel/btf``. ``max_entries``/``max_bytes``:
    the module cache bounds. ``ids``: the kernel BTF object id map; ``"auto"`` (default)
    means a :class:`KernelBtfIds` on the running kernel when ``btf_root`` is
    ``/sys/kernel/btf``, else none (a directory of files has no kernel objects).
    ``max_lookups``: bound of the module lookup memo (entries).

    Thread-safe. Typical use by the loader::

        targets = registry.targets(spec.kmod_btfs, extra=config_extra_kmods)
        result = relocate(local, insns, relos, targets.all())     # vmlinux + declared
        fd = registry.open_btf_object("nf_tables")                 # for fd_array

    and by the daemon: ``registry.attach(listener)`` once.
    """

    def __init__(
        self,
        *,
        btf_root: str | os.PathLike[str] = SYS_BTF_ROOT,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ids: KernelBtfIds | Literal["auto"] | None = "auto",
        max_lookups: int = DEFAULT_MAX_LOOKUPS,
    ) -> None:
        self.btf_root = Path(btf_root)
        self._cache: BoundedLru[str, ModuleBtf] = BoundedLru(
            max_entries=max_entries, max_bytes=max_bytes
        )
        if ids == "auto":
            ids = KernelBtfIds() if self.btf_root == SYS_BTF_ROOT else None
        self.ids: KernelBtfIds | None = ids
        self._lock = threading.Lock()
        self._gen: dict[str, int] = {}
        self._vmlinux: Btf | None = None
        self._read = 0
        self._read_ns = 0
        self._stale = 0
        self._uevents = 0
        self._skipped = 0
        self._bad: dict[str, FileIdentity | None] = {}  # module -> bad file's identity
        self.memo = LookupMemo(max_entries=max_lookups)

    # --- BTFs ------------------------------------------------------------------------------

    @property
    def vmlinux(self) -> Btf:
        """vmlinux BTF (parsed on first use, shared by the process). Raises
        :class:`RegistryError` when ``btf_root`` has no ``vmlinux``."""
        btf = self._vmlinux
        if btf is None:
            btf = shared_vmlinux(self.btf_root / VMLINUX)
            self._vmlinux = btf
        return btf

    def module_names(self) -> list[str]:
        """Names of the module BTFs present now (``btf_root`` minus ``vmlinux``), sorted."""
        try:
            names = os.listdir(self.btf_root)
        except OSError as exc:
            raise RegistryError(f"cannot list {self.btf_root}: {exc.strerror}") from exc
        return sorted(n for n in names if n != VMLINUX)

    def module(
        self, name: str, *, report: TargetReport | None = None, admit: bool = True
    ) -> Btf | None:
        """The split BTF of module ``name`` (``-`` read as ``_``), from the cache when its
        file is unchanged, else read from ``btf_root``; ``None`` when the module is not
        loaded. ``report`` gets the read/hit accounted; ``admit=False`` does not put a
        module read now into the cache. Raises :class:`RegistryError` for a bad name,
        :class:`BtfError` (naming the module) for malformed BTF."""
        name = normalize_module_name(name)
        if name == VMLINUX:
            return self.vmlinux
        entry = self._entry(name, report, admit=admit)
        return entry.btf if entry is not None else None

    def _entry(self, name: str, report: TargetReport | None, *, admit: bool) -> ModuleBtf | None:
        path = self.btf_root / name
        entry = self._cache.get(name, valid=lambda e: self._still_current(e, path))
        if entry is not None:
            if report is not None:
                report.cache_hits += 1
            return entry
        return self._read_module(name, path, report, admit=admit)

    def entry_or_skip(
        self, name: str, report: TargetReport | None, *, admit: bool = False
    ) -> ModuleBtf | None:
        """:meth:`_entry` for an all-module search: a module whose BTF cannot be read or
        parsed gives ``None`` (as an unloaded one does) instead of an error. The skip is
        counted and put in ``report.skipped``; the first skip of a given file is logged as a
        warning, and while that file is unchanged it is neither re-read nor logged again."""
        path = self.btf_root / name
        reason = ""
        if name in self._bad:
            try:
                ident: FileIdentity | None = FileIdentity.of(os.stat(path))
            except OSError:
                ident = None
            with self._lock:
                if ident is not None and self._bad.get(name) == ident:
                    reason = "unchanged since it could not be parsed"
        if not reason:
            try:
                return self._entry(name, report, admit=admit)
            except (BtfError, RegistryError) as exc:
                reason = str(exc)
                try:
                    bad: FileIdentity | None = FileIdentity.of(os.stat(path))
                except OSError:
                    bad = None
                with self._lock:
                    self._bad[name] = bad
                log.warning(
                    "skipping module BTF %s: %s (searching every module; its types, kfuncs "
                    "and struct_ops are not available to loads)",
                    path,
                    reason,
                )
        with self._lock:
            self._skipped += 1
        if report is not None:
            report.skipped.append((name, reason))
        return None

    def _still_current(self, entry: ModuleBtf, path: Path) -> bool:
        try:
            ok = FileIdentity.of(os.stat(path)) == entry.identity
        except OSError:
            ok = False
        if not ok:
            self._stale += 1
        return ok

    def _read_module(
        self, name: str, path: Path, report: TargetReport | None, *, admit: bool = True
    ) -> ModuleBtf | None:
        vmlinux = self.vmlinux
        with self._lock:
            gen = self._gen.get(name, 0)
        t0 = time.perf_counter_ns()
        try:
            # Read (not mmap) module BTF: small files, and a module file replaced under a
            # mapping could fault; identity and bytes come from the same open file.
            with open(path, "rb", buffering=0) as f:
                ident = FileIdentity.of(os.fstat(f.fileno()))
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RegistryError(f"cannot read module BTF {path}: {exc.strerror}") from exc
        try:
            btf = Btf.from_bytes(data, base=vmlinux, name=name)
        except BtfError as exc:
            raise BtfError(f"module {name!r}: {exc}", where=str(path)) from exc
        dt = time.perf_counter_ns() - t0
        entry = ModuleBtf(name, btf, len(data), ident, dt, gen)
        with self._lock:
            self._read += 1
            self._read_ns += dt
            if admit:
                self._admit_locked(entry)
        if report is not None:
            report.read.append(name)
            report.read_ns += dt
        return entry

    def _admit_locked(self, entry: ModuleBtf) -> None:
        # An add/remove event during the read means what we read may be gone already.
        if self._gen.get(entry.name, 0) == entry.generation:
            self._cache.put(entry.name, entry, entry.nbytes)

    # --- module lookups ----------------------------------------------------------------------

    def module_set(self) -> ModuleSet:
        """The loaded modules now, as the lookup memo identifies them (one listing of
        ``btf_root``). Raises :class:`RegistryError` when it cannot be listed."""
        return self.memo.scan(self.btf_root)

    def holders(
        self,
        lookups: Iterable[ModuleLookup],
        *,
        mods: ModuleSet | None = None,
        report: TargetReport | None = None,
        keep: dict[str, Btf] | None = None,
    ) -> dict[ModuleLookup, Holders]:
        """For each lookup, the modules of ``mods`` (default: the set loaded now) whose own
        types hold a match, with their kernel BTF object ids, in walk order (sorted names).

        Answers come from the memo while the module set is the one they were computed
        for; the others are found by one walk that reads every module BTF once (through
        the cache; ``report`` accounts reads and hits) and are remembered. A memo answer
        whose holder's BTF object id changed (a reload seen only by the id map) drops the
        memo and walks again. ``keep`` receives the holders' BTFs a walk parsed (so a
        caller need not read them twice when the cache cannot hold them). Raises
        :class:`RegistryError`/:class:`BtfError` as :meth:`module` does.
        """
        lookups = list(lookups)
        if mods is None:
            mods = self.module_set()
        known, missing, unheard = self.memo.get(mods, lookups)
        if unheard and self.ids is not None:
            self.ids.mark_dirty()  # modules came or went unannounced: ids may be stale too
        if known and self.ids is not None and not self._ids_unchanged(known):
            self.memo.forget(mods)
            known, missing, _ = self.memo.get(mods, lookups)
        if missing:
            answers = self._walk(mods, missing, report, keep)
            self.memo.store(mods, answers)
            known.update(answers)
        return known

    def _ids_unchanged(self, known: dict[ModuleLookup, Holders]) -> bool:
        ids = self.ids
        assert ids is not None
        for holders in known.values():
            for name, btf_id in holders:
                if btf_id is not None and ids.lookup(name) != btf_id:
                    return False
        return True

    def _walk(
        self,
        mods: ModuleSet,
        lookups: list[ModuleLookup],
        report: TargetReport | None,
        keep: dict[str, Btf] | None,
    ) -> dict[ModuleLookup, Holders]:
        found: dict[ModuleLookup, list[str]] = {lk: [] for lk in lookups}
        for name in mods.names:
            try:
                name = normalize_module_name(name)
            except RegistryError:
                continue  # not a module node (e.g. a stray file in a test directory)
            entry = self.entry_or_skip(name, report)
            if entry is None:  # unloaded since the listing, or unreadable (skipped)
                continue
            held = False
            for lk in lookups:
                if lk.held_by(entry.btf):
                    found[lk].append(name)
                    held = True
            if held:
                if keep is not None:
                    keep[name] = entry.btf
                if name not in self._cache:
                    with self._lock:
                        self._admit_locked(entry)
        return {lk: tuple((n, self.btf_object_id(n)) for n in names) for lk, names in found.items()}

    def targets(self, declared: Iterable[str] | None, *, extra: Iterable[str] = ()) -> TargetBtfs:
        """The BTFs one load may search: vmlinux plus modules.

        ``declared`` is the object's ``.kmod_btfs`` names (``None`` when it has no such
        section), ``extra`` the configuration's names for this scheduler; empty names (an
        all-NUL ``.kmod_btfs`` entry) are skipped. With any name, only those modules are
        read, right away; absent ones land in ``report.missing``. With neither, the set is
        in fallback mode: every module, read lazily on demand.
        Raises :class:`RegistryError` for an invalid module name.
        """
        extra = tuple(extra)
        names: list[str] = []
        seen: set[str] = set()
        fallback = declared is None and not extra
        for raw in [*(declared or ()), *extra]:
            if not raw:  # an all-NUL .kmod_btfs entry
                continue
            n = normalize_module_name(raw)
            if n != VMLINUX and n not in seen:
                seen.add(n)
                names.append(n)
        return TargetBtfs(self, tuple(names), fallback)

    # --- kernel objects --------------------------------------------------------------------

    def btf_object_id(self, name: str) -> int | None:
        """The (unverified) kernel BTF object id of ``vmlinux`` or a module, or ``None``."""
        if self.ids is None:
            return None
        return self.ids.lookup(_object_name(name))

    def open_btf_object(self, name: str) -> BtfFd:
        """An fd of the kernel BTF object of ``vmlinux`` or module ``name``, verified to carry
        that name (rescanning ids on a mismatch). Raises :class:`RegistryError` when the
        module is not loaded or this registry has no kernel ids (a directory ``btf_root``)."""
        if self.ids is None:
            raise RegistryError(
                f"no kernel BTF objects for {self.btf_root} (not the running kernel's)"
            )
        return self.ids.open(_object_name(name))

    # --- events ----------------------------------------------------------------------------

    def invalidate(self, name: str) -> None:
        """Drop the cached BTF of module ``name``; a read in flight will not be cached."""
        with self._lock:
            self._gen[name] = self._gen.get(name, 0) + 1
            self._cache.pop(name)

    def handle_uevent(self, event: Uevent) -> None:
        """Apply a module ``add``/``remove`` uevent (others are ignored): the cached BTF is
        dropped and the id map updated, so a reloaded module is never served stale."""
        name = event.module_name
        if name is None or event.action not in (Action.ADD, Action.REMOVE):
            return
        with self._lock:
            self._uevents += 1
        self.memo.bump()
        self.invalidate(name)
        if self.ids is not None:
            if event.action == Action.REMOVE:
                self.ids.forget(name)
            else:
                self.ids.note_added(name)

    def resync(self) -> None:
        """Events were lost: drop every cached module and rebuild the id map on next use."""
        with self._lock:
            for name in self._cache.ordered_keys():
                self._gen[name] = self._gen.get(name, 0) + 1
            self._cache.clear()
        self.memo.bump()
        if self.ids is not None:
            self.ids.mark_dirty()

    def attach(self, listener: UeventListener) -> Subscription:
        """Keep this registry true from ``listener``'s module events and overflows. The
        returned handle's ``cancel()`` detaches."""
        mods = listener.subscribe_modules(self.handle_uevent)
        over = listener.on_overflow(self.resync)

        def cancel() -> None:
            mods.cancel()
            over.cancel()

        return Subscription(cancel)

    # --- counters --------------------------------------------------------------------------

    def stats(self) -> RegistryStats:
        """A consistent snapshot of the registry's counters (:class:`RegistryStats`)."""
        with self._lock:
            return RegistryStats(
                cache=self._cache.stats(),
                module_btfs_read=self._read,
                read_ns=self._read_ns,
                stale_dropped=self._stale,
                module_uevents=self._uevents,
                ids=self.ids.stats() if self.ids is not None else None,
                lookups=self.memo.stats(),
                skipped=self._skipped,
            )

    def cached_modules(self) -> list[str]:
        """Names in the cache, least recently used first."""
        return self._cache.ordered_keys()


def _object_name(name: str) -> str:
    return VMLINUX if name == VMLINUX else normalize_module_name(name)


class TargetBtfs:
    """The target BTFs of one load (from :meth:`KernelBtfRegistry.targets`).

    Declared mode: the declared modules were read on creation; :meth:`all` is vmlinux plus
    those found. Fallback mode: nothing was read; :meth:`modules` and :meth:`first` read one
    module at a time as the caller asks, so a load whose names are all in vmlinux reads none;
    :meth:`prefetch`, :meth:`first_holding` and :meth:`modules_holding` answer named lookups
    through the registry's memo (one module walk for all names of a load when the memo
    lacks them) and read only the modules that hold a match. The module set is listed once
    per target set: a load sees one snapshot, as libbpf does.
    ``report`` accounts what was read; ``searched`` names the BTFs consulted so far, for
    error messages. Use from one thread.
    """

    def __init__(self, registry: KernelBtfRegistry, declared: tuple[str, ...], fallback: bool):
        self.registry = registry
        self.vmlinux = registry.vmlinux
        self.report = TargetReport(declared=declared, fallback=fallback)
        self._mods: dict[str, Btf] = {}
        self._searched: list[str] = [VMLINUX]
        self._modset: ModuleSet | None = None
        self._holders: dict[ModuleLookup, Holders] = {}
        self._walked: dict[str, Btf] = {}  # holders parsed by a walk of this load
        if not fallback:
            for name in declared:
                btf = registry.module(name, report=self.report)
                if btf is None:
                    self.report.missing.append(name)
                else:
                    self._mods[name] = btf
                    self.report.found.append(name)
                    self._searched.append(name)

    @property
    def fallback(self) -> bool:
        """No module BTFs were declared: every loaded module may be searched (read lazily)."""
        return self.report.fallback

    @property
    def searched(self) -> tuple[str, ...]:
        """Names of the BTFs handed out so far: ``vmlinux`` first, then modules; after a
        named lookup in fallback mode, a last entry ``"all N module BTFs"`` says that every
        loaded module was (or, through the memo, is known to have been) looked at."""
        if self._modset is None:
            return tuple(self._searched)
        return (*self._searched, f"all {len(self._modset.names)} module BTFs")

    def prefetch(self, lookups: Iterable[ModuleLookup]) -> None:
        """Fallback mode: find the holders of every lookup at once (at most one module
        walk, none when the memo knows them all). Declared mode: nothing to do."""
        if not self.fallback:
            return
        need = [lk for lk in lookups if lk not in self._holders]
        if not need:
            return
        if self._modset is None:
            self._modset = self.registry.module_set()
        self._holders.update(
            self.registry.holders(need, mods=self._modset, report=self.report, keep=self._walked)
        )

    def _holder_names(self, lookups: Iterable[ModuleLookup]) -> list[str]:
        lookups = list(lookups)
        self.prefetch(lookups)
        names = {name for lk in lookups for name, _ in self._holders[lk]}
        return sorted(names)  # the walk order

    def modules_holding(self, lookups: Iterable[ModuleLookup]) -> list[Btf]:
        """The module BTFs that may hold a match for any of ``lookups``, in search order:
        the declared modules, or (fallback) the holders among all loaded modules, read
        through the cache. Searching these finds exactly what searching every module finds."""
        if not self.fallback:
            return list(self._mods.values())
        out = []
        for name in self._holder_names(lookups):
            btf = self.module(name)
            if btf is not None:  # unloaded since the walk
                out.append(btf)
        return out

    def first_holding(
        self, lookup: ModuleLookup, probe: Callable[[Btf], T | None]
    ) -> tuple[Btf, T] | None:
        """:meth:`first` for a probe that can succeed only on a BTF holding ``lookup``:
        ``probe(vmlinux)``, then each module of :meth:`modules_holding` in order."""
        got = probe(self.vmlinux)
        if got is not None:
            return self.vmlinux, got
        for btf in self.modules_holding([lookup]):
            got = probe(btf)
            if got is not None:
                return btf, got
        return None

    def modules(self) -> Iterator[Btf]:
        """Module BTFs: the declared ones, or (fallback) every loaded module, each read only
        when the iterator reaches it."""
        if not self.fallback:
            yield from self._mods.values()
            return
        for name in self.registry.module_names():
            btf = self._mods.get(name)
            if btf is None:
                btf = self._fallback_module(name)
                if btf is None:  # unloaded since the listing, or unreadable (skipped)
                    continue
                self._mods[name] = btf
                self.report.found.append(name)
                self._searched.append(name)
            yield btf

    def __iter__(self) -> Iterator[Btf]:
        """vmlinux, then :meth:`modules`."""
        yield self.vmlinux
        yield from self.modules()

    def all(self) -> list[Btf]:
        """vmlinux plus every module BTF of the set (in fallback mode this reads them all:
        prefer :meth:`first` there)."""
        return list(self)

    def module(self, name: str) -> Btf | None:
        """A module of this set by name (``None`` if it is not part of it or not loaded)."""
        name = normalize_module_name(name)
        if name in self._mods:
            return self._mods[name]
        if not self.fallback:
            return None
        btf = self._walked.pop(name, None) or self._fallback_module(name)
        if btf is not None:
            self._mods[name] = btf
            self.report.found.append(name)
            self._searched.append(name)
        return btf

    def _fallback_module(self, name: str) -> Btf | None:
        """A module read for an all-module search, through the cache, or ``None`` when it
        is not loaded or its BTF cannot be read or parsed (skipped and counted)."""
        try:
            name = normalize_module_name(name)
        except RegistryError:
            return None  # not a module node (e.g. a stray file in a test directory)
        if name == VMLINUX:
            return self.vmlinux
        entry = self.registry.entry_or_skip(name, self.report, admit=True)
        return entry.btf if entry is not None else None

    def first(self, probe: Callable[[Btf], T | None]) -> tuple[Btf, T] | None:
        """libbpf's search order: ``probe(vmlinux)``, then each module until ``probe``
        returns something other than ``None``. Modules are read only if vmlinux fails."""
        for btf in self:
            got = probe(btf)
            if got is not None:
                return btf, got
        return None

    def not_found(self, what: str) -> RegistryError:
        """An error for ``what`` (e.g. ``"kfunc scx_bpf_foo"``) that names the BTFs
        searched and the declared modules that were not loaded."""
        msg = f"{what} not found in {', '.join(self.searched)}"
        if self.report.missing:
            msg += f" (declared but not loaded: {', '.join(self.report.missing)})"
        if not self.fallback:
            msg += "; only declared modules are searched (.kmod_btfs / configured kmods)"
        return RegistryError(msg)
