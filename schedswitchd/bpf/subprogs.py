"""Program relocation and subprogram linking (libbpf's ``bpf_program__record_reloc``,
``bpf_object__reloc_code`` and ``reloc_prog_func_and_line_info``).

Every ``STT_FUNC`` symbol of an executable section is a function: in ``.text`` a
subprogram, elsewhere an entry program. Relocations of executable sections are classified
per instruction (map reference, global data, subprogram call, callback pointer, kfunc call,
ksym or kconfig load, arena data). Each entry program is then linked on its own: the
``.text`` subprograms it reaches (through calls or callback pointers, transitively) are
appended once each after it (depth-first, in libbpf's order), call and
``BPF_PSEUDO_FUNC`` offsets are rewritten for the new layout, and func_info, line_info
and CO-RE records are re-based to the linked instruction indices.
Instruction format: :mod:`schedswitchd.bpf.insn`.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schedswitchd.bpf.btf.ext import BtfExt
from schedswitchd.bpf.core.relo import CoreRelo, CoreReloKind
from schedswitchd.bpf.elf import (
    SHN_LORESERVE,
    STB_GLOBAL,
    STB_LOCAL,
    STT_FUNC,
    STT_SECTION,
    ElfObject,
    Section,
)
from schedswitchd.bpf.insn import (
    CALL,
    INSN_SIZE,
    PSEUDO_CALL,
    PSEUDO_FUNC,
    PSEUDO_KFUNC_CALL,
    PSEUDO_MAP_FD,
    PSEUDO_MAP_VALUE,
    Insn,
    decode,
    encode_into,
)
from schedswitchd.bpf.spec import (
    ExternKind,
    ExternSpec,
    Fixup,
    FixupKind,
    FuncInfo,
    LineInfo,
)
from schedswitchd.errors import ObjectError

_U32 = 1 << 32


@dataclass(frozen=True, slots=True)
class Function:
    """A function symbol: ``offset``/``size`` in bytes inside ``section``."""

    name: str
    section: Section
    offset: int
    size: int
    bind: int

    @property
    def first(self) -> int:
        """Index of its first instruction in the section."""
        return self.offset // INSN_SIZE


@dataclass(frozen=True, slots=True)
class Relo:
    """A classified relocation of one instruction.

    ``kind`` is one of ``"call"``/``"func"`` (``target`` = instruction index in ``.text``)
    or a :class:`FixupKind` value (with ``map_index``, ``offset``, ``extern``).
    """

    kind: str
    target: int = -1
    map_index: int = -1
    offset: int = 0
    extern: str = ""


@dataclass(frozen=True, slots=True)
class Linked:
    """One linked entry program."""

    insns: bytes
    fixups: tuple[Fixup, ...]
    func_info: tuple[FuncInfo, ...]
    line_info: tuple[LineInfo, ...]
    core_relos: tuple[CoreRelo, ...]
    subprograms: tuple[str, ...]


def collect_functions(elf: ElfObject) -> dict[int, list[Function]]:
    """Functions per executable section index, sorted by offset.

    Raises :class:`ObjectError` for a misaligned, empty, overlapping or out-of-bounds
    function, or a ``static`` function outside ``.text`` (not a valid entry program).
    """
    out: dict[int, list[Function]] = {}
    for sym in elf.symbols:
        if sym.type != STT_FUNC or not 0 < sym.shndx < SHN_LORESERVE:
            continue
        sec = elf.section(sym.shndx)
        if not sec.is_exec:
            raise ObjectError(f"function {sym.name!r} is in non-executable section {sec.name!r}")
        if sym.value % INSN_SIZE or sym.size % INSN_SIZE or sym.size == 0:
            raise ObjectError(
                f"function {sym.name!r} at {sym.value} with size {sym.size} is not a whole "
                "number of instructions"
            )
        if sym.value + sym.size > len(sec.data):
            raise ObjectError(f"function {sym.name!r} extends past the end of {sec.name!r}")
        if sec.name != ".text" and sym.bind == STB_LOCAL:
            raise ObjectError(
                f"program {sym.name!r} in {sec.name!r} is static; entry programs must be global"
            )
        out.setdefault(sec.index, []).append(Function(sym.name, sec, sym.value, sym.size, sym.bind))
    for funcs in out.values():
        funcs.sort(key=lambda f: f.offset)
        for a, b in itertools.pairwise(funcs):
            if a.offset + a.size > b.offset:
                raise ObjectError(
                    f"functions {a.name!r} and {b.name!r} overlap in {a.section.name!r}"
                )
    return out


def classify_relocs(
    elf: ElfObject,
    text_index: int,
    maps_offsets: Mapping[int, int],
    maps_section: int,
    data_maps: Mapping[int, int],
    arena: tuple[int, int] | None,
    kconfig_map: int,
    externs: Mapping[str, ExternSpec],
) -> dict[int, dict[int, Relo]]:
    """Relocations of executable sections, as ``{section index: {insn index: Relo}}``.

    ``maps_offsets``: ``.maps`` byte offset -> map index; ``data_maps``: data section
    index -> map index; ``arena``: (``.addr_space.1`` section index, arena map index).
    Raises :class:`ObjectError` for a relocation that is misaligned, outside its section,
    on an instruction that is neither a call nor ``ld_imm64``, or against a symbol that
    names nothing the loader can place.
    """
    out: dict[int, dict[int, Relo]] = {}
    for sec_idx, relocs in elf.relocs.items():
        sec = elf.section(sec_idx)
        if not sec.is_exec:
            continue
        per: dict[int, Relo] = {}
        for n, rel in enumerate(relocs):
            where = f"relocation {n} of {sec.name!r} at offset {rel.offset}"
            if rel.offset % INSN_SIZE or rel.offset + INSN_SIZE > len(sec.data):
                raise ObjectError(f"{where}: not an instruction of the section")
            idx = rel.offset // INSN_SIZE
            ins = decode(sec.data, idx)
            sym = elf.symbol(rel.sym)
            is_call = ins.code == CALL
            if not is_call and not ins.is_ld_imm64:
                raise ObjectError(f"{where}: instruction code {ins.code:#x} cannot be relocated")
            if ins.is_ld_imm64 and rel.offset + 2 * INSN_SIZE > len(sec.data):
                raise ObjectError(f"{where}: ld_imm64 is cut off by the section end")
            if idx in per:
                raise ObjectError(f"{where}: instruction is relocated twice")
            if sym.is_extern:
                ext = externs.get(sym.name)
                if ext is None:
                    raise ObjectError(f"{where}: unknown extern {sym.name!r}")
                if is_call:
                    if ext.kind is not ExternKind.KFUNC:
                        raise ObjectError(f"{where}: call of {sym.name!r}, which is not a kfunc")
                    per[idx] = Relo(FixupKind.KFUNC_CALL.value, extern=ext.name)
                elif ext.kind is ExternKind.KCONFIG:
                    per[idx] = Relo(
                        FixupKind.MAP_VALUE.value,
                        map_index=kconfig_map,
                        offset=ext.offset,
                        extern=ext.name,
                    )
                else:
                    per[idx] = Relo(FixupKind.KSYM.value, extern=ext.name)
                continue
            if is_call:
                if ins.src != PSEUDO_CALL:
                    raise ObjectError(f"{where}: relocated call is not a BPF-to-BPF call")
                if sym.shndx != text_index or sym.value % INSN_SIZE:
                    raise ObjectError(f"{where}: call target {sym.name!r} is not in .text")
                per[idx] = Relo("call", target=sym.value // INSN_SIZE + ins.imm + 1)
                continue
            if not 0 < sym.shndx < SHN_LORESERVE:
                raise ObjectError(
                    f"{where}: symbol {sym.name!r} is in special section {sym.shndx:#x}; "
                    "uninitialised global variable?"
                )
            if sym.shndx == text_index and (
                (sym.bind == STB_LOCAL and sym.type == STT_SECTION)
                or (sym.bind == STB_GLOBAL and sym.type == STT_FUNC)
            ):
                # clang leaves src_reg 0; the loader marks it BPF_PSEUDO_FUNC (as libbpf does)
                if ins.src not in (0, PSEUDO_FUNC):
                    raise ObjectError(f"{where}: subprogram address load has src_reg {ins.src}")
                byte = sym.value + ins.imm
                if byte % INSN_SIZE or byte < 0:
                    raise ObjectError(f"{where}: callback offset {byte} is misaligned")
                per[idx] = Relo("func", target=byte // INSN_SIZE)
                continue
            value_off = ins.imm + sym.value
            if arena is not None and sym.shndx == arena[0]:
                if not 0 <= value_off < _U32:  # the second slot's imm holds it (32 bits)
                    raise ObjectError(f"{where}: arena offset {value_off} is out of range")
                per[idx] = Relo(FixupKind.MAP_VALUE.value, map_index=arena[1], offset=value_off)
            elif sym.shndx == maps_section:
                m = maps_offsets.get(sym.value)
                if m is None:
                    raise ObjectError(f"{where}: no map at .maps offset {sym.value}")
                per[idx] = Relo(FixupKind.MAP_FD.value, map_index=m)
            elif sym.shndx in data_maps:
                if not 0 <= value_off < _U32:
                    raise ObjectError(f"{where}: global data offset {value_off} is out of range")
                per[idx] = Relo(
                    FixupKind.MAP_VALUE.value, map_index=data_maps[sym.shndx], offset=value_off
                )
            else:
                name = elf.section(sym.shndx).name
                raise ObjectError(f"{where}: reference to section {name!r}, which is not a map")
        out[sec_idx] = per
    return out


def _insn_off(record: Any) -> int:
    return int(record.insn_off)


class ExtIndex:
    """The ``.BTF.ext`` records of each section sorted by ``insn_off``, so that the records
    of one function are found by bisection: a scheduler's ``.text`` has tens of thousands of
    line_info records and hundreds of subprograms, and scanning every record for each
    subprogram each entry program pulls in made opening lavd take seconds. Build one per
    object and pass it to every :func:`link_program` call."""

    def __init__(self, ext: BtfExt) -> None:
        self.ext = ext
        self._sorted: dict[tuple[str, str], tuple[list[int], list[Any]]] = {}

    def within(self, what: str, section: str, start: int, end: int) -> list[Any]:
        """The ``what`` (``func_info``/``line_info``/``core_relo``) records of ``section``
        with ``start <= insn_off < end``, in offset order (ties in file order)."""
        key = (what, section)
        hit = self._sorted.get(key)
        if hit is None:
            table: Mapping[str, tuple[Any, ...]]
            if what == "func_info":
                table = self.ext.func_info
            elif what == "line_info":
                table = self.ext.line_info
            else:
                table = self.ext.core_relos
            recs: list[Any] = sorted(table.get(section, ()), key=_insn_off)
            hit = ([r.insn_off for r in recs], recs)
            self._sorted[key] = hit
        offs, recs = hit
        return recs[bisect.bisect_left(offs, start) : bisect.bisect_left(offs, end)]


def link_program(
    entry: Function,
    text_funcs: Mapping[int, Function],
    relos: Mapping[int, Mapping[int, Relo]],
    ext: BtfExt | None,
    index: ExtIndex | None = None,
) -> Linked:
    """Link ``entry`` with the ``.text`` functions it reaches.

    ``text_funcs`` maps a ``.text`` instruction index to the function starting there;
    ``relos`` is :func:`classify_relocs`'s result; ``index`` an :class:`ExtIndex` of
    ``ext`` shared by the object's programs (one is built when absent). Raises
    :class:`ObjectError` for calls into the middle of a function or outside ``.text``,
    callbacks without a relocation, and ``.BTF.ext`` records that are misaligned or carry
    an unknown CO-RE kind.
    """
    if ext is not None and (index is None or index.ext is not ext):
        index = ExtIndex(ext)
    out = bytearray(entry.section.data[entry.offset : entry.offset + entry.size])
    placed: dict[int, int] = {}
    fixups: list[Fixup] = []
    finfo: list[FuncInfo] = []
    linfo: list[LineInfo] = []
    crelos: list[CoreRelo] = []
    subs: list[str] = []
    if ext is not None:
        assert index is not None
        _rebase_ext(entry, 0, index, finfo, linfo, crelos)
    # Depth-first like libbpf's recursive bpf_object__reloc_code, so the linked layout (and
    # the kernel's xlated program) is the same as libbpf's; an explicit stack of
    # (function, base slot, next instruction) frames keeps deep call chains off the C stack.
    stack: list[list[Any]] = [[entry, 0, 0]]
    while stack:
        frame = stack[-1]
        f, base, j = frame
        n = f.size // INSN_SIZE
        if j >= n:
            stack.pop()
            continue
        sec_idx = f.first + j
        slot = base + j
        ins = decode(out, slot)
        if ins.is_ld_imm64 and j + 1 >= n:
            raise ObjectError(f"{f.name}: ld_imm64 at instruction {j} is cut off")
        frame[2] = j + (2 if ins.is_ld_imm64 else 1)
        r = relos.get(f.section.index, {}).get(sec_idx)
        target = -1
        if r is not None and r.kind in ("call", "func"):
            target = r.target
        elif r is not None:
            _apply(out, slot, ins, r, fixups)
        elif ins.code == CALL and ins.src == PSEUDO_CALL:
            if f.section.name != ".text":
                raise ObjectError(
                    f"{f.name}: call at instruction {j} without a relocation leaves .text"
                )
            target = sec_idx + ins.imm + 1
        elif ins.is_ld_imm64 and ins.src == PSEUDO_FUNC:
            raise ObjectError(f"{f.name}: callback load at instruction {j} has no relocation")
        if target < 0:
            continue
        sub = text_funcs.get(target)
        if sub is None:
            raise ObjectError(
                f"{f.name}: instruction {j} calls .text instruction {target}, "
                "which does not start a function"
            )
        fresh = sub.offset not in placed
        if fresh:
            placed[sub.offset] = len(out) // INSN_SIZE
            subs.append(sub.name)
            out += sub.section.data[sub.offset : sub.offset + sub.size]
            if index is not None:
                _rebase_ext(sub, placed[sub.offset], index, finfo, linfo, crelos)
        rel = placed[sub.offset] - slot - 1
        src = PSEUDO_FUNC if ins.is_ld_imm64 else ins.src
        encode_into(out, slot, Insn(ins.code, ins.dst, src, ins.off, rel))
        if fresh:
            stack.append([sub, placed[sub.offset], 0])
    return Linked(bytes(out), tuple(fixups), tuple(finfo), tuple(linfo), tuple(crelos), tuple(subs))


def _apply(out: bytearray, slot: int, ins: Insn, r: Relo, fixups: list[Fixup]) -> None:
    kind = FixupKind(r.kind)
    fixups.append(Fixup(kind, slot, r.map_index, r.offset, r.extern))
    if kind is FixupKind.KFUNC_CALL:
        encode_into(out, slot, Insn(ins.code, ins.dst, PSEUDO_KFUNC_CALL, 0, 0))
        return
    second = decode(out, slot + 1)
    if kind is FixupKind.MAP_FD:
        src, hi = PSEUDO_MAP_FD, 0
    elif kind is FixupKind.MAP_VALUE:
        src, hi = PSEUDO_MAP_VALUE, r.offset - (1 << 32 if r.offset >= 1 << 31 else 0)
    else:  # KSYM: the loader picks BTF id or address
        src, hi = 0, 0
    encode_into(out, slot, Insn(ins.code, ins.dst, src, ins.off, 0))
    encode_into(out, slot + 1, Insn(second.code, second.dst, second.src, second.off, hi))


def _aligned(f: Function, insn_off: int, what: str) -> None:
    if insn_off % INSN_SIZE:
        raise ObjectError(
            f".BTF.ext {what} record at offset {insn_off} of {f.section.name!r} is misaligned"
        )


def _rebase_ext(
    f: Function,
    base: int,
    index: ExtIndex,
    finfo: list[FuncInfo],
    linfo: list[LineInfo],
    crelos: list[CoreRelo],
) -> None:
    name = f.section.name
    lo, hi = f.offset, f.offset + f.size

    def idx(off: int) -> int:
        return base + (off - f.offset) // INSN_SIZE

    for fi in index.within("func_info", name, lo, hi):
        _aligned(f, fi.insn_off, "func_info")
        finfo.append(FuncInfo(idx(fi.insn_off), fi.type_id))
    for li in index.within("line_info", name, lo, hi):
        _aligned(f, li.insn_off, "line_info")
        linfo.append(LineInfo(idx(li.insn_off), li.file_name_off, li.line_off, li.line_col))
    for cr in index.within("core_relo", name, lo, hi):
        _aligned(f, cr.insn_off, "core_relo")
        try:
            kind = CoreReloKind(cr.kind)
        except ValueError:
            raise ObjectError(
                f".BTF.ext CO-RE relocation at {name}+{cr.insn_off} has unknown kind {cr.kind}"
            ) from None
        crelos.append(CoreRelo(idx(cr.insn_off), cr.type_id, cr.access, kind))
