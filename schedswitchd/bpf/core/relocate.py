"""The CO-RE engine: resolve a program's CO-RE relocations against target BTFs and patch
its instructions.

Entry point :func:`relocate`. For each relocation (``.BTF.ext`` ``core_relo`` record, see
:class:`schedswitchd.bpf.core.relo.CoreRelo`):

1. parse the access string on the local root type (:mod:`.access`);
2. find candidates by essential name and kind, vmlinux first, module BTFs only when vmlinux
   has none, cached per local type (:mod:`.candidates`);
3. match the local spec on each candidate (:mod:`.match`) and compute local and target
   values (:mod:`.calc`); all matching candidates must agree on the field bit offset,
   the value and the poison decision, else the relocation is ambiguous (``CoreError``);
   candidates that did not match are pruned from the cached list when any did;
4. with no match, FIELD_EXISTS/TYPE_EXISTS/TYPE_MATCHES/TYPE_SIZE/TYPE_ID_TARGET/
   ENUMVAL_EXISTS give 0 and the other kinds poison the instruction;
5. patch the instruction after validating its original value (:mod:`.patch`).

Semantics follow libbpf (``src/relo_core.c``, ``bpf_core_find_cands`` in ``src/libbpf.c``)
and kernel doc ``Documentation/bpf/llvm_reloc.rst``; no syscalls are made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schedswitchd.bpf.core.access import BtfView, Spec, parse_spec, type_of
from schedswitchd.bpf.core.calc import Resolution, calc_relo
from schedswitchd.bpf.core.candidates import CandidateCache, CandidateList
from schedswitchd.bpf.core.match import spec_match
from schedswitchd.bpf.core.patch import patch_insn
from schedswitchd.bpf.core.relo import CoreRelo, CoreReloKind
from schedswitchd.errors import CoreError

__all__ = ["CandidateCache", "CoreRelocation", "CoreResult", "relocate"]


@dataclass(frozen=True, slots=True)
class CoreRelocation:
    """The outcome of one relocation.

    ``local_value``/``target_value``: what the instruction held (as computed from local
    BTF) and what it holds now, as unsigned 64-bit ints (0 for a poisoned instruction's
    target value). ``poisoned``: the instruction became ``call 0xbad2310``. ``found``: a
    candidate matched. ``target_btf``/``target_type_id``: the BTF name and type id of the
    first matching candidate (None when none matched or for TYPE_ID_LOCAL).
    ``target_access``: the matched low-level access path in the target ("" if none).
    ``candidates``: how many candidates matched.
    """

    relo: CoreRelo
    kind: CoreReloKind
    local_value: int
    target_value: int
    poisoned: bool
    found: bool
    target_btf: str | None
    target_type_id: int | None
    target_access: str
    candidates: int


@dataclass(frozen=True, slots=True)
class CoreResult:
    """:func:`relocate`'s answer: patched ``insns`` (bytes, same length as given),
    ``results`` (one per relocation, in order) and ``consulted``: the names of the target
    BTFs whose types were searched for candidates, in target order (a BTF whose search was
    done earlier and cached in the :class:`CandidateCache` counts as consulted)."""

    insns: bytes
    results: tuple[CoreRelocation, ...]
    consulted: tuple[str, ...]


def _describe(local: BtfView, relo: CoreRelo, index: int) -> str:
    try:
        name = type_of(local, relo.type_id).name or "<anon>"
    except CoreError:
        name = "?"
    return (
        f"CO-RE relocation #{index} ({relo.kind.name} on [{relo.type_id}] {name} "
        f"access {relo.access!r}, insn #{relo.insn_idx})"
    )


def _resolve(
    local: BtfView, relo: CoreRelo, cands: CandidateList | None
) -> tuple[Resolution, Spec | None, int]:
    """Resolution, first matching target spec, number of matching candidates."""
    local_spec = parse_spec(local, relo.type_id, relo.access, relo.kind)
    if relo.kind == CoreReloKind.TYPE_ID_LOCAL:
        # Linking may renumber local ids, so the original value is not checked.
        return Resolution(relo.type_id, relo.type_id, False, False), None, 0
    assert cands is not None
    best: tuple[Resolution, Spec] | None = None
    matched = []
    for cand in cands.cands:
        targ_spec = spec_match(local_spec, cand.btf, cand.type_id)
        if targ_spec is None:
            continue
        res = calc_relo(relo.kind, local_spec, targ_spec)
        if best is None:
            best = (res, targ_spec)
        elif targ_spec.bit_offset != best[1].bit_offset:
            raise CoreError(
                f"field offset ambiguity: candidate [{cand.type_id}] in {cand.btf.name!r} "
                f"puts the field at bit {targ_spec.bit_offset}, an earlier one at bit "
                f"{best[1].bit_offset}"
            )
        elif res.poison != best[0].poison or res.new_val != best[0].new_val:
            raise CoreError(
                f"relocation decision ambiguity: candidate [{cand.type_id}] in "
                f"{cand.btf.name!r} gives {'poison' if res.poison else res.new_val}, an "
                f"earlier one {'poison' if best[0].poison else best[0].new_val}"
            )
        matched.append(cand)
    if best is None:
        return calc_relo(relo.kind, local_spec, None), None, 0
    # libbpf narrows the cached list to the candidates that matched this relocation.
    cands.cands[:] = matched
    return best[0], best[1], len(matched)


def relocate(
    local: BtfView,
    insns: bytes | bytearray,
    relos: Sequence[CoreRelo],
    targets: Sequence[BtfView],
    cache: CandidateCache | None = None,
) -> CoreResult:
    """Resolve ``relos`` of one linked program and return its patched instructions.

    ``local``: the object's BTF. ``insns``: the program's instructions (8-byte slots; not
    modified). ``relos``: its CO-RE relocations, ``insn_idx`` counting slots. ``targets``:
    the BTFs to search, ordered: vmlinux first, then module BTFs (consulted only for a
    local type with no candidate in vmlinux). ``cache``: share one across the programs of
    an object; a fresh one is used when None.

    Raises ``CoreError`` (naming the relocation) for a malformed access string, an
    anonymous local type, an ambiguous relocation, an instruction that does not hold the
    expected original value or is not patchable, or an instruction index out of range.
    """
    if len(insns) % 8:
        raise CoreError(f"program of {len(insns)} bytes is not a whole number of instructions")
    cache = cache if cache is not None else CandidateCache()
    buf = bytearray(insns)
    consulted: set[str] = set()
    results: list[CoreRelocation] = []
    for index, relo in enumerate(relos):
        try:
            cands = None
            if relo.kind != CoreReloKind.TYPE_ID_LOCAL:
                cands = cache.get(local, relo.type_id, targets)
                consulted.update(cands.consulted)
            res, targ_spec, n_matched = _resolve(local, relo, cands)
            poisoned = patch_insn(buf, relo.insn_idx, res)
        except CoreError as exc:
            raise CoreError(f"{_describe(local, relo, index)}: {exc}") from exc
        results.append(
            CoreRelocation(
                relo=relo,
                kind=relo.kind,
                local_value=res.orig_val,
                target_value=0 if poisoned else res.new_val,
                poisoned=poisoned,
                found=targ_spec is not None,
                target_btf=targ_spec.btf.name if targ_spec is not None else None,
                target_type_id=targ_spec.root_type_id if targ_spec is not None else None,
                target_access=targ_spec.access_string() if targ_spec is not None else "",
                candidates=n_matched,
            )
        )
    ordered = tuple(dict.fromkeys(t.name for t in targets if t.name in consulted))
    return CoreResult(insns=bytes(buf), results=tuple(results), consulted=ordered)
