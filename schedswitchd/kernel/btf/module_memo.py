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
* a fingerprint of the BTF root that needs no events: the raw ``getdents64(2)`` records of
  the directory (each entry's inode number, offset, type and name), compared as bytes, with
  no ``stat`` and no Python object per entry. A loaded module adds an entry, an unloaded one
  removes it, and a reloaded one is a new sysfs (kernfs) node with a new inode number
  (kernfs inode numbers carry a generation); a file replaced by rename in a test directory
  is a new inode too. (The kernel never rewrites a module's BTF node in place.) Entry
  names are decoded only when a walk needs them. A check costs about a bare
  ``os.listdir``, far less than ``os.scandir`` with inodes (docs/performance.md, standby
  hit; ``bench/switch_latency.py`` reports it per switch as ``module_set_check_ns``).

Answers stay exactly those of a full walk: a lookup's holders are every module, in walk
order, that has a type of the looked-up kind with that (essential) name among its own
types, which is a superset of where the loader's probe can succeed, so probing only the
holders in that order finds the same first hit and collects the same CO-RE candidates
(ambiguities included).
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Kind, essential_name
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


_libc = ctypes.CDLL(None, use_errno=True)
_getdents64 = getattr(_libc, "getdents64", None)  # glibc >= 2.30
if _getdents64 is not None:
    _getdents64.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
    _getdents64.restype = ctypes.c_ssize_t
_DIRENT_HEAD = struct.Struct("=QqHB")  # d_ino, d_off, d_reclen, d_type (linux/dirent.h)
_DIRENT_BUF = 64 << 10


def read_dirents(path: Path) -> bytes:
    """The raw ``struct linux_dirent64`` records of directory ``path`` (``getdents64(2)``),
    concatenated; ``os.scandir`` records re-encoded the same way where libc lacks
    ``getdents64``. Raises ``OSError``."""
    if _getdents64 is None:
        with os.scandir(path) as it:
            return b"".join(
                _DIRENT_HEAD.pack(e.inode(), 0, 0, 0) + os.fsencode(e.name) + b"\0"
                for e in sorted(it, key=lambda e: e.name)
            )
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        buf = ctypes.create_string_buffer(_DIRENT_BUF)
        chunks: list[bytes] = []
        while True:
            n = _getdents64(fd, buf, _DIRENT_BUF)
            if n < 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), str(path))
            if n == 0:
                return b"".join(chunks)
            chunks.append(buf.raw[:n])
    finally:
        os.close(fd)


def dirent_names(raw: bytes) -> list[str]:
    """Entry names of :func:`read_dirents` records, without ``.`` and ``..``. Raises
    :class:`RegistryError` for records that do not parse."""
    names = []
    off = 0
    while off < len(raw):
        if off + _DIRENT_HEAD.size > len(raw):
            raise RegistryError("truncated directory record")
        _, _, reclen, _ = _DIRENT_HEAD.unpack_from(raw, off)
        end = raw.find(b"\0", off + _DIRENT_HEAD.size)
        if end < 0 or (reclen and end >= off + reclen):
            raise RegistryError("directory record without a terminated name")
        name = os.fsdecode(raw[off + _DIRENT_HEAD.size : end])
        if name not in (".", ".."):
            names.append(name)
        off = off + reclen if reclen else end + 1
    return names


class ModuleSet:
    """The loaded modules as seen once: ``key`` is what must be equal for a memo answer to
    apply (event generation and the directory's raw records); :attr:`names` the module
    names, sorted (the walk order), decoded on first use."""

    __slots__ = ("_names", "_raw", "key")

    def __init__(self, generation: int, raw: bytes) -> None:
        self.key: tuple[int, bytes] = (generation, raw)
        self._raw = raw
        self._names: tuple[str, ...] | None = None

    @property
    def generation(self) -> int:
        """The module event generation this set was read at."""
        return self.key[0]

    @property
    def names(self) -> tuple[str, ...]:
        """The loaded modules' names, sorted, without ``vmlinux`` (decoded on first use)."""
        if self._names is None:
            self._names = tuple(sorted(n for n in dirent_names(self._raw) if n != _VMLINUX))
        return self._names


#: A lookup's answer: (module name, kernel BTF object id or ``None``) of every holder, in
#: walk order; empty when no module holds a match.
Holders = tuple[tuple[str, int | None], ...]


@dataclass(frozen=True, slots=True)
class MemoStats:
    """Memo counters: lookups answered from the memo (``hits``) or needing a walk
    (``misses``), full module walks, times the memo was dropped because the module set
    changed (``invalidations``), entries held and their bound, entries dropped by the bound
    (``evictions``), and the time spent checking the module set (ns, ``check_ns`` over
    ``checks`` checks), and module set changes no event announced (``unheard``)."""

    hits: int
    misses: int
    walks: int
    invalidations: int
    entries: int
    max_entries: int
    evictions: int
    checks: int
    check_ns: int
    unheard: int


class LookupMemo:
    """Module holders per :class:`ModuleLookup`, for one BTF root. Thread-safe.

    ``max_entries``: lookups remembered at most (least recently used dropped first).
    Typical use (by :class:`~schedswitchd.kernel.btf.registry.KernelBtfRegistry`)::

        mods = memo.scan(root)                 # before walking
        known, missing, _ = memo.get(mods, lookups)
        ... walk mods.names for missing ...
        memo.store(mods, answers)
    """

    def __init__(self, *, max_entries: int = DEFAULT_MAX_LOOKUPS) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[ModuleLookup, Holders] = OrderedDict()
        self._valid_for: tuple[int, bytes] | None = None
        self._gen = 0
        self._hits = self._misses = self._walks = 0
        self._invalidations = self._evictions = 0
        self._checks = self._check_ns = 0
        self._unheard = 0

    @property
    def generation(self) -> int:
        """How many module events (and lost-event resyncs) :meth:`bump` counted so far."""
        with self._lock:
            return self._gen

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
        """The module set under ``root`` now (one ``getdents64`` pass, no ``stat`` per
        entry). Raises :class:`RegistryError` when ``root`` cannot be listed."""
        start = time.perf_counter_ns()
        with self._lock:
            gen = self._gen
        try:
            raw = read_dirents(root)
        except OSError as exc:
            raise RegistryError(f"cannot list {root}: {exc.strerror}") from exc
        mods = ModuleSet(gen, raw)
        with self._lock:
            self._checks += 1
            self._check_ns += time.perf_counter_ns() - start
        return mods

    def get(
        self, mods: ModuleSet, lookups: Iterable[ModuleLookup]
    ) -> tuple[dict[ModuleLookup, Holders], list[ModuleLookup], bool]:
        """Answers remembered for ``mods`` (a different set drops the memo first), the
        lookups that need a walk (in the order given, without duplicates), and whether the
        module set changed without any event having said so (missed events, or nobody
        listening): then other event-maintained state, like the BTF object id map, may be
        stale too."""
        known: dict[ModuleLookup, Holders] = {}
        missing: list[ModuleLookup] = []
        unheard = False
        with self._lock:
            if mods.key != self._valid_for:
                if self._valid_for is not None and self._valid_for[0] == mods.generation:
                    unheard = True
                    self._unheard += 1
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
        return known, missing, unheard

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
        """A consistent snapshot of the memo's counters (:class:`MemoStats`)."""
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
                self._unheard,
            )
