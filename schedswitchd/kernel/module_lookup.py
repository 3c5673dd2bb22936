"""Which module BTFs hold a name that vmlinux lacks, remembered per set of loaded modules.

When vmlinux has no candidate for a CO-RE relocation's root type, a kfunc, a typed ksym, a
struct_ops type or an attach target, libbpf parses the BTF of *every* loaded module and
collects candidates from all of them (``bpf_core_find_cands``/``find_ksym_btf_id`` in
``src/libbpf.c``). A long-running daemon that switches to an object without ``.kmod_btfs``
would pay that walk on every switch. :class:`LookupMemo` keeps, per :class:`ModuleLookup`,
the outcome of one full walk -- the modules (names and kernel BTF object ids) that hold a
candidate, possibly none -- valid for exactly the set of loaded modules it was computed
against, so later loads read only the modules that hold candidates.

What identifies the set of loaded modules (:class:`ModuleSet`):

* a generation bumped by every module ``add``/``remove`` uevent and by a netlink overflow
  (:meth:`LookupMemo.bump`);
* a fingerprint of the BTF root that needs no events: the directory's (inode, mtime) and each
  entry's (name, inode) from one ``getdents`` pass (``os.scandir``, no ``stat`` per entry).
  A loaded module adds an entry, an unloaded one removes it, and a reloaded one is a new
  sysfs (kernfs) node with a new inode number; a file replaced by rename in a test
  directory is a new inode too. (The kernel never rewrites a module's BTF node in place.)
  Cost: ~0.3 ms for 300 entries on the host (``bench/switch_latency.py`` reports it in the
  VM as ``module_set_check_ns``).

Answers stay exactly those of a full walk: a lookup's holders are every module, in walk
order, that has a type of the looked-up kind with that (essential) name among its own
types, which is a superset of where the loader's probe can succeed, so probing only the
holders in that order finds the same first hit and collects the same CO-RE candidates
(ambiguities included).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from schedswitchd.bpf.btf import Btf
from schedswitchd.bpf.btf_types import Kind, essential_name
from schedswitchd.errors import RegistryError

#: Memo entries kept at most (each a name and a few module names: ~200 bytes).
DEFAULT_MAX_LOOKUPS: Final = 4096
_VMLINUX: Final = "vmlinux"

_KIND_WORD: Final = {
    Kind.STRUCT: "struct",
    Kind.UNION: "union",
    Kind.ENUM: "enum",
    Kind.ENUM64: "enum",
    Kind.FUNC: "func",
    Kind.VAR: "var",
}


@dataclass(frozen=True, slots=True)
class ModuleLookup:
    """One name looked up in module BTFs: a type of one of ``kinds`` named ``name`` among
    a module's own types (``essential``: compared by essential name, ``___flavour``
    dropped, as CO-RE candidates are; see :func:`essential_name`)."""

    name: str
    kinds: tuple[Kind, ...]
    essential: bool = False

    @classmethod
    def core(cls, local: Btf, type_id: int) -> ModuleLookup | None:
        """The lookup of CO-RE candidates for local root type ``type_id`` (ENUM and ENUM64
        as one kind, like the candidate search), or ``None`` for an anonymous type."""
        t = local.type(type_id)
        if not t.name:
            return None
        kinds = (Kind.ENUM, Kind.ENUM64) if t.kind in (Kind.ENUM, Kind.ENUM64) else (t.kind,)
        return cls(essential_name(t.name), kinds, essential=True)

    def held_by(self, btf: Btf) -> bool:
        """Whether ``btf``'s own types (not its base's) hold a match."""
        for kind in self.kinds:
            ids = (
                btf.find_by_essential_name(self.name, kind)
                if self.essential
                else btf.find_ids(self.name, kind)
            )
            if ids:
                return True
        return False

    def __str__(self) -> str:
        return f"{_KIND_WORD.get(self.kinds[0], self.kinds[0].name.lower())} {self.name}"


@dataclass(frozen=True, slots=True)
class ModuleSet:
    """The loaded modules as seen once: ``names`` sorted (the walk order), ``key`` what
    must be equal for a memo answer to apply (event generation and fingerprint)."""

    names: tuple[str, ...]
    key: tuple[object, ...]

    @property
    def generation(self) -> int:
        gen = self.key[0]
        assert isinstance(gen, int)
        return gen


#: A lookup's answer: (module name, kernel BTF object id or ``None``) of every holder, in
#: walk order; empty when no module holds a match.
Holders = tuple[tuple[str, int | None], ...]


@dataclass(frozen=True, slots=True)
class MemoStats:
    """Memo counters: lookups answered from the memo (``hits``) or needing a walk
    (``misses``), full module walks, times the memo was dropped because the module set
    changed (``invalidations``), entries held and their bound, entries dropped by the bound
    (``evictions``), and the time spent checking the module set (ns, ``check_ns`` over
    ``checks`` checks)."""

    hits: int
    misses: int
    walks: int
    invalidations: int
    entries: int
    max_entries: int
    evictions: int
    checks: int
    check_ns: int


class LookupMemo:
    """Module holders per :class:`ModuleLookup`, for one BTF root. Thread-safe.

    ``max_entries``: lookups remembered at most (least recently used dropped first).
    Typical use (by :class:`~schedswitchd.kernel.btf_registry.KernelBtfRegistry`)::

        mods = memo.scan(root)                 # before walking
        known, missing = memo.get(mods, lookups)
        ... walk mods.names for missing ...
        memo.store(mods, answers)
    """

    def __init__(self, *, max_entries: int = DEFAULT_MAX_LOOKUPS) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[ModuleLookup, Holders] = OrderedDict()
        self._valid_for: tuple[object, ...] | None = None
        self._gen = 0
        self._hits = self._misses = self._walks = 0
        self._invalidations = self._evictions = 0
        self._checks = self._check_ns = 0

    def bump(self) -> None:
        """The module set changed (a module uevent or lost events): forget every answer."""
        with self._lock:
            self._gen += 1
            self._drop_locked()

    def _drop_locked(self) -> None:
        if self._entries:
            self._invalidations += 1
            self._entries.clear()
        self._valid_for = None

    def scan(self, root: Path) -> ModuleSet:
        """The module set under ``root`` now (one directory listing, no ``stat`` per
        entry). Raises :class:`RegistryError` when ``root`` cannot be listed."""
        start = time.perf_counter_ns()
        with self._lock:
            gen = self._gen
        try:
            st = os.stat(root)
            with os.scandir(root) as it:
                entries = sorted((e.name, e.inode()) for e in it if e.name != _VMLINUX)
        except OSError as exc:
            raise RegistryError(f"cannot list {root}: {exc.strerror}") from exc
        mods = ModuleSet(
            tuple(n for n, _ in entries), (gen, st.st_ino, st.st_mtime_ns, tuple(entries))
        )
        with self._lock:
            self._checks += 1
            self._check_ns += time.perf_counter_ns() - start
        return mods

    def get(
        self, mods: ModuleSet, lookups: Iterable[ModuleLookup]
    ) -> tuple[dict[ModuleLookup, Holders], list[ModuleLookup]]:
        """Answers remembered for ``mods`` (a different set drops the memo first), and the
        lookups that need a walk, in the order given, without duplicates."""
        known: dict[ModuleLookup, Holders] = {}
        missing: list[ModuleLookup] = []
        with self._lock:
            if mods.key != self._valid_for:
                self._drop_locked()
                self._valid_for = mods.key
            for lk in lookups:
                if lk in known or lk in missing:
                    continue
                got = self._entries.get(lk)
                if got is None:
                    self._misses += 1
                    missing.append(lk)
                else:
                    self._hits += 1
                    self._entries.move_to_end(lk)
                    known[lk] = got
        return known, missing

    def forget(self, mods: ModuleSet) -> None:
        """An answer for ``mods`` turned out stale (a holder's BTF object id changed):
        drop everything."""
        with self._lock:
            if mods.key == self._valid_for:
                self._drop_locked()

    def store(self, mods: ModuleSet, answers: Mapping[ModuleLookup, Holders]) -> bool:
        """Remember ``answers`` from one walk over ``mods``; counts the walk. Nothing is
        kept (``False``) when the module set changed since ``mods`` was taken."""
        with self._lock:
            self._walks += 1
            if mods.generation != self._gen:
                return False
            if mods.key != self._valid_for:
                self._drop_locked()
                self._valid_for = mods.key
            for lk, holders in answers.items():
                self._entries[lk] = holders
                self._entries.move_to_end(lk)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self._evictions += 1
            return True

    def stats(self) -> MemoStats:
        with self._lock:
            return MemoStats(
                self._hits,
                self._misses,
                self._walks,
                self._invalidations,
                len(self._entries),
                self.max_entries,
                self._evictions,
                self._checks,
                self._check_ns,
            )
