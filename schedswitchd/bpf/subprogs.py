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
import re
import struct
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from schedswitchd.bpf.btf.ext import BtfExt, ExtColumns, ExtRecords
from schedswitchd.bpf.core.relo import CoreRelo, CoreReloKind
from schedswitchd.bpf.elf import (
    SHN_LORESERVE,
    SHN_UNDEF,
    STB_GLOBAL,
    STB_LOCAL,
    STB_WEAK,
    STT_FUNC,
    STT_NOTYPE,
    STT_SECTION,
    ElfObject,
    Reloc,
    Section,
)
from schedswitchd.bpf.insn import (
    CALL,
    INSN_SIZE,
    LD_IMM64,
    PSEUDO_CALL,
    PSEUDO_FUNC,
    PSEUDO_KFUNC_CALL,
    PSEUDO_MAP_FD,
    PSEUDO_MAP_VALUE,
)
from schedswitchd.bpf.spec import (
    ExternKind,
    ExternSpec,
    ExtInfo,
    ExtPiece,
    Fixup,
    FixupKind,
    LinkedCode,
)
from schedswitchd.errors import ObjectError

_U32 = 1 << 32
_EXTERN_BINDS = (STB_GLOBAL, STB_WEAK)
_MAP_VALUE = FixupKind.MAP_VALUE.value
_SRC_MAP_VALUE = PSEUDO_MAP_VALUE << 4


def _fixup_relo(kind: FixupKind, map_index: int = -1, offset: int = 0, extern: str = "") -> Relo:
    """A relocation the kernel phase completes (a fixup), with its instruction patch: a
    kfunc call gets ``src_reg = BPF_PSEUDO_KFUNC_CALL``; an ``ld_imm64`` its ``src_reg``
    (map fd, map value, or 0 for a ksym: the loader picks BTF id or address) and, for map
    values, the value offset in the second slot's ``imm``."""
    hi = b"\0\0\0\0"
    if kind is FixupKind.KFUNC_CALL:
        src = PSEUDO_KFUNC_CALL
    elif kind is FixupKind.MAP_FD:
        src = PSEUDO_MAP_FD
    elif kind is FixupKind.MAP_VALUE:
        src = PSEUDO_MAP_VALUE
        hi = (offset & 0xFFFFFFFF).to_bytes(4, "little")
    else:
        src = 0
    return _tuple_new(Relo, (kind.value, -1, map_index, offset, extern, kind, src << 4, hi))


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


class Relo(NamedTuple):
    """A classified relocation of one instruction.

    ``kind`` is one of ``"call"``/``"func"`` (``target`` = instruction index in ``.text``)
    or a :class:`FixupKind` value (with ``map_index``, ``offset``, ``extern``). A named
    tuple: a scheduler has thousands, classified at every open. For a fixup, ``fixup`` is
    its :class:`FixupKind` and the patch the instruction gets is worked out here, once per
    classified relocation: ``src`` is its new ``src_reg`` shifted into place (``src_reg <<
    4``), ``hi`` the 4 little-endian bytes of an ``ld_imm64``'s second ``imm`` (the map
    value offset, else 0).
    """

    kind: str
    target: int = -1
    map_index: int = -1
    offset: int = 0
    extern: str = ""
    fixup: FixupKind | None = None
    src: int = 0
    hi: bytes = b"\0\0\0\0"


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
    symbols = elf.symbols
    nsyms = len(symbols)
    same: dict[int, Relo] = {}  # (symbol index << 1 | is a call) -> its relocation
    for sec_idx, relocs in elf.relocs.items():
        sec = elf.section(sec_idx)
        if not sec.is_exec:
            continue
        per: dict[int, Relo] = {}
        data = sec.data
        size = len(data)
        for n, rel in enumerate(relocs):
            offset, sym_idx, _rtype = rel
            if offset % INSN_SIZE or offset + INSN_SIZE > size:
                raise ObjectError(f"{_where(n, sec, rel)}: not an instruction of the section")
            idx = offset // INSN_SIZE
            code, regs, _off, imm = _INSN_HEAD.unpack_from(data, offset)
            src, wide = regs >> 4, code == LD_IMM64
            sym = symbols[sym_idx] if 0 < sym_idx < nsyms else elf.symbol(sym_idx)
            _i, sym_name, sym_value, _sz, sym_type, sym_bind, _vis, shndx = sym
            is_call = code == CALL
            if not is_call and not wide:
                raise ObjectError(
                    f"{_where(n, sec, rel)}: instruction code {code:#x} cannot be relocated"
                )
            if wide and offset + 2 * INSN_SIZE > size:
                raise ObjectError(f"{_where(n, sec, rel)}: ld_imm64 is cut off by the section end")
            if idx in per:
                raise ObjectError(f"{_where(n, sec, rel)}: instruction is relocated twice")
            # An extern's or a map's relocation depends on the symbol alone (and whether the
            # instruction is a call): classified once per symbol, then reused.
            seen = same.get(sym_idx << 1 | is_call)
            if seen is not None:
                per[idx] = seen
                continue
            # Symbol.is_extern, spelt out: this loop runs for every relocation at every open
            if (
                shndx == SHN_UNDEF
                and sym_type == STT_NOTYPE
                and sym_bind in _EXTERN_BINDS
                and sym_name
            ):
                ext = externs.get(sym_name)
                if ext is None:
                    raise ObjectError(f"{_where(n, sec, rel)}: unknown extern {sym_name!r}")
                if is_call:
                    if ext.kind is not ExternKind.KFUNC:
                        raise ObjectError(
                            f"{_where(n, sec, rel)}: call of {sym_name!r}, which is not a kfunc"
                        )
                    r = _fixup_relo(_KIND_KFUNC_CALL, -1, 0, ext.name)
                elif ext.kind is ExternKind.KCONFIG:
                    r = _fixup_relo(_KIND_MAP_VALUE, kconfig_map, ext.offset, ext.name)
                else:
                    r = _fixup_relo(_KIND_KSYM, -1, 0, ext.name)
                per[idx] = same[sym_idx << 1 | is_call] = r
                continue
            if is_call:
                if src != PSEUDO_CALL:
                    raise ObjectError(
                        f"{_where(n, sec, rel)}: relocated call is not a BPF-to-BPF call"
                    )
                if shndx != text_index or sym_value % INSN_SIZE:
                    raise ObjectError(
                        f"{_where(n, sec, rel)}: call target {sym_name!r} is not in .text"
                    )
                target = sym_value // INSN_SIZE + imm + 1
                per[idx] = _tuple_new(Relo, ("call", target, -1, 0, "", None, 0, _ZERO4))
                continue
            if not 0 < shndx < SHN_LORESERVE:
                raise ObjectError(
                    f"{_where(n, sec, rel)}: symbol {sym_name!r} is in special section "
                    f"{shndx:#x}; uninitialised global variable?"
                )
            if shndx == text_index and (
                (sym_bind == STB_LOCAL and sym_type == STT_SECTION)
                or (sym_bind == STB_GLOBAL and sym_type == STT_FUNC)
            ):
                # clang leaves src_reg 0; the loader marks it BPF_PSEUDO_FUNC (as libbpf does)
                if src not in (0, PSEUDO_FUNC):
                    raise ObjectError(
                        f"{_where(n, sec, rel)}: subprogram address load has src_reg {src}"
                    )
                byte = sym_value + imm
                if byte % INSN_SIZE or byte < 0:
                    raise ObjectError(
                        f"{_where(n, sec, rel)}: callback offset {byte} is misaligned"
                    )
                per[idx] = _tuple_new(Relo, ("func", byte // INSN_SIZE, -1, 0, "", None, 0, _ZERO4))
                continue
            value_off = imm + sym_value
            if arena is not None and shndx == arena[0]:
                # the second slot's imm holds it (32 bits)
                if not 0 <= value_off < _U32:
                    raise ObjectError(
                        f"{_where(n, sec, rel)}: arena offset {value_off} is out of range"
                    )
                am, hi4 = arena[1], value_off.to_bytes(4, "little")
                per[idx] = _tuple_new(
                    Relo, (_MAP_VALUE, -1, am, value_off, "", _KIND_MAP_VALUE, _SRC_MAP_VALUE, hi4)
                )
            elif shndx == maps_section:
                m = maps_offsets.get(sym_value)
                if m is None:
                    raise ObjectError(f"{_where(n, sec, rel)}: no map at .maps offset {sym_value}")
                per[idx] = same[sym_idx << 1] = _fixup_relo(_KIND_MAP_FD, m)
            elif shndx in data_maps:
                if not 0 <= value_off < _U32:
                    raise ObjectError(
                        f"{_where(n, sec, rel)}: global data offset {value_off} is out of range"
                    )
                dm, hi4 = data_maps[shndx], value_off.to_bytes(4, "little")
                per[idx] = _tuple_new(
                    Relo, (_MAP_VALUE, -1, dm, value_off, "", _KIND_MAP_VALUE, _SRC_MAP_VALUE, hi4)
                )
            else:
                name = elf.section(shndx).name
                raise ObjectError(
                    f"{_where(n, sec, rel)}: reference to section {name!r}, which is not a map"
                )
        out[sec_idx] = per
    return out


def _where(n: int, sec: Section, rel: Reloc) -> str:
    """How a relocation is named in errors (built only for an error)."""
    return f"relocation {n} of {sec.name!r} at offset {rel.offset}"


_NO_RECORDS = ExtRecords([], array("I"), 1)


class ExtIndex:
    """The ``.BTF.ext`` records of each section sorted by ``insn_off`` (ties in file order),
    so that the records of one function are a slice found by bisection: a scheduler's
    ``.text`` has tens of thousands of line_info records and hundreds of subprograms, and
    scanning every record for each subprogram each entry program pulls in made opening
    lavd take seconds. func_info and line_info stay undecoded records
    (:class:`~schedswitchd.bpf.btf.ext.ExtRecords`), CO-RE relocations are columns
    (:class:`~schedswitchd.bpf.btf.ext.ExtColumns`). Build one per object (:class:`Linker`
    does)."""

    def __init__(self, ext: BtfExt) -> None:
        self.ext = ext
        self._sorted: dict[tuple[str, str], ExtColumns] = {}
        self._records: dict[tuple[str, str], tuple[ExtRecords, bool]] = {}

    def records(self, what: str, section: str) -> tuple[ExtRecords, bool]:
        """The ``what`` (``func_info``/``line_info``) records of ``section`` sorted by
        ``insn_off`` (stable), and whether any of them is misaligned (not at an
        instruction: only then are the records of each function checked one by one)."""
        key = (what, section)
        hit = self._records.get(key)
        if hit is None:
            table = self.ext.func_info if what == "func_info" else self.ext.line_info
            recs = table.get(section, _NO_RECORDS)
            offs = recs.insn_off
            if offs != sorted(offs):  # not clang's order: move whole records
                order = sorted(range(len(offs)), key=offs.__getitem__)  # stable
                width, words = recs.width, recs.words
                moved = array("I")
                for i in order:
                    moved.extend(words[i * width : (i + 1) * width])
                recs = ExtRecords([offs[i] for i in order], moved, width)
            hit = self._records[key] = (recs, any(map(_LOW, recs.insn_off)))
        return hit

    def columns(self, what: str, section: str) -> ExtColumns:
        """The CO-RE relocation (``what`` = ``core_relo``) records of ``section``, sorted by
        ``insn_off`` (stable), as columns."""
        key = (what, section)
        hit = self._sorted.get(key)
        if hit is None:
            cols = self.ext.core_relos.get(section)
            if cols is None:
                hit = ExtColumns([], ())
            elif cols.insn_off == sorted(cols.insn_off):  # clang's order: nothing to move
                hit = cols
            else:
                offs = cols.insn_off
                order = sorted(range(len(offs)), key=offs.__getitem__)  # stable
                hit = ExtColumns(
                    [offs[i] for i in order],
                    tuple([c[i] for i in order] for c in cols.fields),
                )
            self._sorted[key] = hit
        return hit

    def range(self, cols: ExtColumns | ExtRecords, start: int, end: int) -> tuple[int, int]:
        """Indices ``[lo, hi)`` of ``cols``'s records with ``start <= insn_off < end``."""
        offs = cols.insn_off
        return bisect.bisect_left(offs, start), bisect.bisect_left(offs, end)


class _Call(NamedTuple):
    """A call or callback load of a prepared function: ``slot`` counts from the function's
    first instruction, ``target`` is the callee's ``.text`` instruction index; ``code``,
    ``regs`` and ``off`` are the instruction's first bytes as linked (``regs`` with
    ``BPF_PSEUDO_FUNC`` for a callback load) -- only ``imm`` depends on the layout."""

    slot: int
    target: int
    code: int
    regs: int
    off: int


@dataclass(frozen=True, slots=True)
class _Prepared:
    """One function relocated once, whichever entry programs pull it in: ``body`` with its
    map, global data, kfunc, ksym and kconfig relocations applied; ``calls`` its calls and
    callback loads in instruction order and ``runs`` its fixups (``insn_idx`` counting from
    the function's start) cut at the calls: ``runs[k]`` are the fixups between call
    ``k - 1`` and call ``k`` (``len(calls) + 1`` runs). Its func_info and line_info are
    undecoded pieces (``fi``, ``li``; ``None`` when it has none) whose ``shift`` places the
    function at slot 0 (a copy at slot ``base`` adds ``base``), its CO-RE records ``cr``
    have function-relative instruction indices."""

    function: Function
    body: bytes
    calls: tuple[_Call, ...]
    runs: tuple[tuple[Fixup, ...], ...]
    fi: ExtPiece | None
    li: ExtPiece | None
    cr: tuple[CoreRelo, ...]


_INSN_HEAD = struct.Struct("<BBhi")
#: The opcodes whose slots linking may touch: BPF_CALL and ld_imm64.
_CANDIDATE = re.compile(b"[" + re.escape(bytes([CALL, LD_IMM64])) + b"]")
_OFF = struct.Struct("<h")
_IMM = struct.Struct("<i")
_ZERO4 = bytes(4)
_ZERO6 = bytes(6)


class Linker:
    """Links the entry programs of one object with the ``.text`` functions they reach.

    ``text_funcs`` maps a ``.text`` instruction index to the function starting there;
    ``relos`` is :func:`classify_relocs`'s result; ``ext`` the object's ``.BTF.ext`` (or
    ``None``). Each function is relocated (and its ``.BTF.ext`` records are cut out and
    checked) once, the first time an entry program reaches it; linking an entry program
    then only concatenates prepared bodies, patches the call offsets of the new layout and
    re-bases the prepared records. A scheduler's ``.text`` helpers are shared by tens of
    programs (lavd: 49 programs pull in 506 subprogram copies), and relocating every copy
    anew made opening it take seconds.
    """

    def __init__(
        self,
        text_funcs: Mapping[int, Function],
        relos: Mapping[int, Mapping[int, Relo]],
        ext: BtfExt | None,
    ) -> None:
        self._text_funcs = text_funcs
        self._relos = relos
        self._index = ExtIndex(ext) if ext is not None else None
        self._prepared: dict[tuple[int, int], _Prepared] = {}
        self._candidates: dict[int, list[int]] = {}

    def _slots_to_visit(self, sec: Section) -> list[int]:
        """The slots of ``sec`` whose opcode is ``BPF_CALL`` or ``ld_imm64``, in order
        (found once per section from the opcode bytes, every 8th): only those can be
        relocated (:func:`classify_relocs` refuses relocations of other instructions) or
        be calls and callback loads."""
        hit = self._candidates.get(sec.index)
        if hit is None:
            codes = sec.data[0::INSN_SIZE]
            hit = self._candidates[sec.index] = [m.start() for m in _CANDIDATE.finditer(codes)]
        return hit

    def link(self, entry: Function) -> LinkedCode:
        """Link ``entry``: its own instructions, then each ``.text`` function it reaches
        (through calls or callback pointers, transitively) once, depth-first in libbpf's
        order (its recursive ``bpf_object__reloc_code``), so the linked layout and the
        kernel's xlated program are libbpf's.

        Raises :class:`ObjectError` for calls into the middle of a function or outside
        ``.text``, callbacks without a relocation, a cut-off ``ld_imm64``, and ``.BTF.ext``
        records that are misaligned or carry an unknown CO-RE kind.
        """
        first = self._prepare(entry)
        out = bytearray(first.body)
        placed: dict[int, int] = {}
        fixups: list[Fixup] = []
        subs: list[str] = []
        finfo: list[ExtPiece] = []
        linfo: list[ExtPiece] = []
        crelos: list[CoreRelo] = []
        _rebased(first, 0, finfo, linfo, crelos)
        # An explicit stack of (prepared function, base slot, next run) frames keeps deep
        # call chains off the C stack; fixups come out in the order the old instruction
        # walk produced them (depth-first, callee before the caller's later instructions).
        stack: list[tuple[_Prepared, int, int]] = [(first, 0, 0)]
        while stack:
            prep, base, k = stack.pop()
            calls, runs = prep.calls, prep.runs
            while True:
                run = runs[k]
                if run:
                    if base:
                        fixups.extend(
                            [_tuple_new(Fixup, (a, i + base, m, o, e)) for a, i, m, o, e in run]
                        )
                    else:
                        fixups.extend(run)
                if k == len(calls):
                    break
                ev = calls[k]
                k += 1
                sub = self._text_funcs[ev.target]
                at = placed.get(sub.offset)
                fresh = at is None
                if at is None:
                    at = placed[sub.offset] = len(out) // INSN_SIZE
                    callee = self._prepare(sub)
                    subs.append(sub.name)
                    out += callee.body
                    _rebased(callee, at, finfo, linfo, crelos)
                slot = base + ev.slot
                _INSN_HEAD.pack_into(out, slot * INSN_SIZE, ev.code, ev.regs, ev.off, at - slot - 1)
                if fresh:
                    stack.append((prep, base, k))
                    stack.append((callee, at, 0))
                    break
        return LinkedCode(
            bytes(out),
            tuple(fixups),
            ExtInfo(tuple(finfo), tuple(linfo)),
            tuple(crelos),
            tuple(subs),
        )

    def _prepare(self, f: Function) -> _Prepared:
        key = (f.section.index, f.offset)
        hit = self._prepared.get(key)
        if hit is None:
            hit = self._prepared[key] = self._relocate(f)
        return hit

    def _relocate(self, f: Function) -> _Prepared:
        sec = f.section
        data = sec.data
        fo = f.offset
        body = bytearray(data[fo : fo + f.size])
        n = f.size // INSN_SIZE
        first = fo // INSN_SIZE
        relos = self._relos.get(sec.index, _NO_RELOS)
        in_text = sec.name == ".text"
        text_funcs = self._text_funcs
        calls: list[_Call] = []
        runs: list[tuple[Fixup, ...]] = []
        fixups: list[Fixup] = []
        # Only calls and ld_imm64 can change: visit those in order, skipping the second
        # slot of each ld_imm64 as a sequential walk would. Instructions are read from the
        # section (a patch changes only its own slots) and patched in ``body``.
        cands = self._slots_to_visit(sec)
        lo = bisect.bisect_left(cands, first)
        hi = bisect.bisect_left(cands, first + n)
        skip = -1
        for i in cands[lo:hi]:
            if i == skip:
                continue
            j = i - first  # slot in the function
            q = i * INSN_SIZE
            code = data[q]
            wide = code == LD_IMM64
            if wide:
                if j + 1 >= n:
                    raise ObjectError(f"{f.name}: ld_imm64 at instruction {j} is cut off")
                skip = i + 1
            r = relos.get(i)
            if r is not None:
                kind = r[5]
                if kind is not None:  # a fixup: record it, patch the instruction for it
                    fixups.append(_tuple_new(Fixup, (kind, j, r[2], r[3], r[4])))
                    p = j * INSN_SIZE
                    body[p + 1] = r[6] | (data[q + 1] & 0x0F)
                    if wide:  # imm 0; the second slot's imm: the map value offset or 0
                        body[p + 4 : p + 8] = _ZERO4
                        body[p + 12 : p + 16] = r[7]
                    else:  # kfunc call: off and imm 0 (the loader fills them)
                        body[p + 2 : p + 8] = _ZERO6
                    continue
                target = r[1]
            elif code == CALL:
                if data[q + 1] >> 4 != PSEUDO_CALL:
                    continue  # a helper call
                if not in_text:
                    raise ObjectError(
                        f"{f.name}: call at instruction {j} without a relocation leaves .text"
                    )
                target = i + _IMM.unpack_from(data, q + 4)[0] + 1
            else:
                if data[q + 1] >> 4 == PSEUDO_FUNC:
                    raise ObjectError(
                        f"{f.name}: callback load at instruction {j} has no relocation"
                    )
                continue
            if target < 0:
                continue
            if target not in text_funcs:
                raise ObjectError(
                    f"{f.name}: instruction {j} calls .text instruction {target}, "
                    "which does not start a function"
                )
            regs = data[q + 1]
            if wide:
                regs = (PSEUDO_FUNC << 4) | (regs & 0x0F)
            off = _OFF.unpack_from(data, q + 2)[0]
            calls.append(_tuple_new(_Call, (j, target, code, regs, off)))
            runs.append(tuple(fixups))
            fixups.clear()
        runs.append(tuple(fixups))
        if self._index is None:
            return _Prepared(f, bytes(body), tuple(calls), tuple(runs), None, None, ())
        return _ext_records(f, bytes(body), tuple(calls), tuple(runs), self._index)


_NO_RELOS: dict[int, Relo] = {}
_tuple_new = tuple.__new__


def _rebased(
    prep: _Prepared,
    base: int,
    finfo: list[ExtPiece],
    linfo: list[ExtPiece],
    crelos: list[CoreRelo],
) -> None:
    """Append ``prep``'s ``.BTF.ext`` records moved to start at slot ``base``: its func_info
    and line_info as one undecoded piece each (decoded at load; lavd's programs carry ~18k
    line_info records), its CO-RE records re-based."""
    fi, li = prep.fi, prep.li
    if fi is not None:
        finfo.append(_tuple_new(ExtPiece, (fi[0], fi[1], fi[2], fi[3], fi[4] + base)))
    if li is not None:
        linfo.append(_tuple_new(ExtPiece, (li[0], li[1], li[2], li[3], li[4] + base)))
    if prep.cr:
        crelos.extend([_tuple_new(CoreRelo, (r[0] + base, *r[1:])) for r in prep.cr])


# Enum members as module constants: a class attribute lookup of an enum member goes through
# a descriptor, paid per relocation at every open (docs/performance.md, "Cold open").
_KIND_KFUNC_CALL = FixupKind.KFUNC_CALL
_KIND_MAP_FD = FixupKind.MAP_FD
_KIND_MAP_VALUE = FixupKind.MAP_VALUE
_KIND_KSYM = FixupKind.KSYM


#: ``enum bpf_core_relo_kind`` values -> members (a dict lookup, not an enum call per record).
_CORE_KINDS = {k.value: k for k in CoreReloKind}
#: ``_LOW(byte offset)`` is non-zero when the offset is not an instruction's.
_LOW = (INSN_SIZE - 1).__and__


def _misaligned(f: Function, offs: list[int], what: str) -> None:
    """Raise for the first of ``offs`` (byte offsets) that is not an instruction's."""
    for off in offs:
        if off % INSN_SIZE:
            raise ObjectError(
                f".BTF.ext {what} record at offset {off} of {f.section.name!r} is misaligned"
            )


def _ext_records(
    f: Function,
    body: bytes,
    calls: tuple[_Call, ...],
    runs: tuple[tuple[Fixup, ...], ...],
    index: ExtIndex,
) -> _Prepared:
    """``f`` prepared with its ``.BTF.ext`` records: each kind's slice of its section's
    records, checked (aligned; a known CO-RE kind); func_info and line_info as undecoded
    pieces, CO-RE records function-relative."""
    name = f.section.name
    lo, hi = f.offset, f.offset + f.size
    fo = f.offset
    first = fo // INSN_SIZE

    pieces: list[ExtPiece | None] = []
    for what in ("func_info", "line_info"):
        recs, misaligned = index.records(what, name)
        a, b = index.range(recs, lo, hi)
        if misaligned and any(map(_LOW, recs.insn_off[a:b])):
            _misaligned(f, recs.insn_off[a:b], what)
        pieces.append(
            _tuple_new(ExtPiece, (recs.words, recs.width, a, b, -first)) if b > a else None
        )

    cols = index.columns("core_relo", name)
    a, b = index.range(cols, lo, hi)
    crelos: list[CoreRelo] = []
    if b > a:
        types, accesses, kinds = cols.fields
        for j in range(a, b):
            off = cols.insn_off[j]
            if off % INSN_SIZE:
                _misaligned(f, [off], "core_relo")
            kind = _CORE_KINDS.get(kinds[j])
            if kind is None:
                raise ObjectError(
                    f".BTF.ext CO-RE relocation at {name}+{off} has unknown kind {kinds[j]}"
                )
            crelos.append(
                _tuple_new(CoreRelo, ((off - fo) // INSN_SIZE, types[j], accesses[j], kind))
            )
    return _Prepared(f, body, calls, runs, pieces[0], pieces[1], tuple(crelos))
