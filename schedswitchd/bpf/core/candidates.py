"""CO-RE candidate search and the per-local-type candidate cache.

A *candidate* for a local root type is a target type of a compatible kind (the same BTF
kind, ENUM and ENUM64 counting as one) whose essential name (``___flavour`` suffix dropped,
see :func:`schedswitchd.bpf.btf.types.essential_name`) equals the local type's. Target BTFs
are searched in the order given: the first (vmlinux) always; the others (module BTFs,
split on vmlinux, own types only) only when the first yields *no* candidate at all, which
is libbpf's rule (``bpf_core_find_cands`` in ``src/libbpf.c``).

libbpf caches a candidate list per local root type id and *prunes* it as relocations are
resolved: candidates that failed to match one relocation are dropped for the next ones of
the same type (when at least one matched). :class:`CandidateCache` keeps that behaviour and
is keyed by (local BTF, local type id, ordered target list), so a cache is never reused
for a different target list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schedswitchd.bpf.btf.types import Kind, essential_name
from schedswitchd.bpf.core.access import BtfView, type_of
from schedswitchd.errors import BtfError, CoreError


@dataclass(frozen=True, slots=True)
class Candidate:
    """One target type: ``type_id`` in ``btf`` (a vmlinux or module BTF)."""

    btf: BtfView
    type_id: int


class CandidateList:
    """The candidates found for one local root type, plus the names of the target BTFs
    that were searched to find them (``consulted``, in search order)."""

    __slots__ = ("cands", "consulted")

    def __init__(self, cands: list[Candidate], consulted: tuple[str, ...]) -> None:
        self.cands = cands
        self.consulted = consulted

    def __len__(self) -> int:
        return len(self.cands)


def _search_one(targ: BtfView, ess: str, kinds: tuple[Kind, ...]) -> list[int]:
    ids: list[int] = []
    try:
        for kind in kinds:
            ids.extend(targ.find_by_essential_name(ess, kind))
    except BtfError as exc:
        raise CoreError(f"searching CO-RE candidates in BTF {targ.name!r}: {exc}") from exc
    # libbpf scans ids in ascending order; ENUM and ENUM64 hits are interleaved by id.
    return sorted(set(ids))


def find_candidates(
    local: BtfView, local_type_id: int, targets: Sequence[BtfView]
) -> CandidateList:
    """Candidates for ``local_type_id`` across ``targets`` (first = vmlinux, rest = modules).

    Modules are searched only when the first target has no candidate. ``CoreError`` for an
    anonymous local type (CO-RE cannot search for those) or an unreadable target BTF.
    """
    lt = type_of(local, local_type_id)
    if not lt.name:
        raise CoreError(
            f"CO-RE relocation against anonymous local type [{local_type_id}] "
            f"({lt.kind.name}) cannot be resolved: candidates are found by name"
        )
    ess = essential_name(lt.name)
    kinds = (Kind.ENUM, Kind.ENUM64) if lt.kind in (Kind.ENUM, Kind.ENUM64) else (lt.kind,)
    if not targets:
        return CandidateList([], ())
    main, modules = targets[0], targets[1:]
    cands = [Candidate(main, i) for i in _search_one(main, ess, kinds)]
    consulted = [main.name]
    if not cands:
        for mod in modules:
            cands.extend(Candidate(mod, i) for i in _search_one(mod, ess, kinds))
            consulted.append(mod.name)
    return CandidateList(cands, tuple(consulted))


class CandidateCache:
    """Candidate lists per (local BTF, local type id, ordered target BTFs).

    Pass one cache to several :func:`schedswitchd.bpf.core.relocate.relocate` calls for the programs
    of one object (libbpf shares it across an object's programs). Entries hold references
    to the BTFs in their key, so object identity stays a valid key. ``hits`` and ``misses``
    count lookups.
    """

    def __init__(self) -> None:
        self._entries: dict[
            tuple[int, int, tuple[int, ...]],
            tuple[BtfView, tuple[BtfView, ...], CandidateList],
        ] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry (e.g. after a module BTF was reloaded)."""
        self._entries.clear()

    def get(self, local: BtfView, local_type_id: int, targets: Sequence[BtfView]) -> CandidateList:
        """The (possibly pruned) candidate list, searching on first use."""
        key = (id(local), local_type_id, tuple(id(t) for t in targets))
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
            return entry[2]
        self.misses += 1
        found = find_candidates(local, local_type_id, targets)
        self._entries[key] = (local, tuple(targets), found)
        return found
