"""A BPF ELF relocatable file read into plain, validated records.

Source of the format: the ELF-64 gABI (``elf(5)``) and kernel doc
``Documentation/bpf/llvm_reloc.rst`` (BPF relocation types). Only what the object model
needs is kept: sections with their bytes, the symbol table, and ``SHT_REL`` relocations
grouped by the section they patch. The fixed-size tables are unpacked with :mod:`struct`
(a scheduler has thousands of symbols and relocations; parsing them field by field through
pyelftools cost more than libbpf's whole ``bpf_object__open``). Every malformed input
becomes :class:`~schedswitchd.errors.ObjectError`.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, NamedTuple, overload

from schedswitchd.errors import ObjectError

EM_BPF = 247

SHT_PROGBITS = 1
SHT_SYMTAB = 2
SHT_STRTAB = 3
SHT_NOBITS = 8
SHT_REL = 9

SHF_WRITE = 0x1
SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4

SHN_UNDEF = 0
SHN_LORESERVE = 0xFF00
SHN_ABS = 0xFFF1
SHN_COMMON = 0xFFF2

STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
STT_NOTYPE, STT_OBJECT, STT_FUNC, STT_SECTION, STT_FILE = 0, 1, 2, 3, 4
STV_DEFAULT, STV_INTERNAL, STV_HIDDEN = 0, 1, 2

# BPF relocation types (llvm_reloc.rst).
R_BPF_NONE = 0
R_BPF_64_64 = 1  # ld_imm64 of a map, global data or extern
R_BPF_64_ABS64 = 2  # 64-bit data pointer (e.g. .kmod_btfs string pointers, .maps .values)
R_BPF_64_ABS32 = 3  # 32-bit data (DWARF, .BTF)
R_BPF_64_NODYLD32 = 4  # .BTF.ext
R_BPF_64_32 = 10  # call / pseudo func

_REL_SIZE = 16  # sizeof(Elf64_Rel)
_SYM_SIZE = 24  # sizeof(Elf64_Sym)


#: The arena globals' section: often megabytes of zeros (arrays sized for the largest
#: machine), of which only the initialised prefix is kept.
ARENA_SECTION = ".addr_space.1"


def _is_dwarf(name: str) -> bool:
    return name.startswith(".debug")


@dataclass(frozen=True, slots=True)
class Section:
    """One ELF section; ``size`` is ``sh_size`` in bytes. ``data`` is the section's bytes,
    except: empty for ``SHT_NOBITS`` (``.bss``) and for DWARF (``.debug*``, which the loader
    never reads); for the arena globals (``.addr_space.1``) only up to its last non-zero byte
    (the rest is zeros, never copied)."""

    index: int
    name: str
    type: int
    flags: int
    size: int
    link: int
    info: int
    data: bytes

    @property
    def is_exec(self) -> bool:
        """An executable ``SHT_PROGBITS`` section (``SHF_EXECINSTR``): BPF program code."""
        return self.type == SHT_PROGBITS and bool(self.flags & SHF_EXECINSTR)


class Symbol(NamedTuple):
    """One ``Elf64_Sym``; ``shndx`` is a section index or ``SHN_*``. A named tuple (as
    :class:`Reloc`): a scheduler has thousands, built at every open."""

    index: int  # type: ignore[assignment]  # the field shadows tuple.index, as intended
    name: str
    value: int
    size: int
    type: int
    bind: int
    visibility: int
    shndx: int

    @property
    def is_extern(self) -> bool:
        """Undefined GLOBAL/WEAK NOTYPE: a ``__ksym``/``__kconfig`` extern (libbpf's rule)."""
        return (
            self.shndx == SHN_UNDEF
            and self.bind in (STB_GLOBAL, STB_WEAK)
            and self.type == STT_NOTYPE
            and bool(self.name)
        )


class Reloc(NamedTuple):
    """One ``Elf64_Rel`` (BPF uses REL: any addend is stored in the patched bytes)."""

    offset: int
    sym: int
    type: int


@dataclass(frozen=True, slots=True)
class ElfObject:
    """Sections by index, symbols by index, relocations keyed by the patched section."""

    sections: tuple[Section, ...]
    symbols: tuple[Symbol, ...]
    relocs: dict[int, tuple[Reloc, ...]]
    #: name -> the first section of that name (built from ``sections`` when not given)
    by_name: dict[str, Section] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.by_name:
            for sec in reversed(self.sections):  # the first of a repeated name wins
                self.by_name[sec.name] = sec

    def section_by_name(self, name: str) -> Section | None:
        """The first section called ``name``, or ``None``."""
        return self.by_name.get(name)

    def section(self, index: int) -> Section:
        """Section ``index``; ``ObjectError`` if out of range."""
        if not 0 <= index < len(self.sections):
            raise ObjectError(f"section index {index} is out of range")
        return self.sections[index]

    def symbol(self, index: int) -> Symbol:
        """Symbol ``index``; ``ObjectError`` if out of range."""
        if not 0 < index < len(self.symbols):
            raise ObjectError(f"symbol index {index} is out of range (0..{len(self.symbols)})")
        return self.symbols[index]


class _FileBytes:
    """Read-only, ``bytes``-like access to an open file by offset (``os.pread``): what
    :func:`read_elf` slices sections out of, so that only the parts kept are ever read, and
    a file cut short while being read gives short reads (an ``ObjectError``), never the
    ``SIGBUS`` a shrinking ``mmap`` would."""

    def __init__(self, f: BinaryIO) -> None:
        self._fd = f.fileno()
        self._size = os.fstat(self._fd).st_size

    def __len__(self) -> int:
        return self._size

    def data_extents(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The ranges of ``[start, stop)`` that may hold data, in order; the rest are holes,
        which read as zeros (``lseek`` with ``SEEK_DATA``/``SEEK_HOLE``, lseek(2)). The
        whole range where the file system does not report holes."""
        out: list[tuple[int, int]] = []
        pos = start
        try:
            while pos < stop:
                data = os.lseek(self._fd, pos, os.SEEK_DATA)
                if data >= stop:
                    break
                pos = os.lseek(self._fd, data, os.SEEK_HOLE)
                out.append((data, min(pos, stop)))
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no data at or after pos
                return [(start, stop)]  # no hole reporting: every byte may be data
        return out

    @overload
    def __getitem__(self, key: int) -> int: ...

    @overload
    def __getitem__(self, key: slice) -> bytes: ...

    def __getitem__(self, key: int | slice) -> int | bytes:
        if isinstance(key, int):
            got = self[key : key + 1]
            if not got:
                raise IndexError(key)
            return got[0]
        start, stop, step = key.indices(self._size)
        if step != 1:
            raise ValueError("only contiguous slices")
        parts = []
        while start < stop:
            chunk = os.pread(self._fd, stop - start, start)
            if not chunk:
                raise ObjectError(
                    f"the file shrank while being read (nothing at byte {start} of {self._size})"
                )
            parts.append(chunk)
            start += len(chunk)
        return b"".join(parts)


def read_elf(data: bytes | BinaryIO) -> ElfObject:
    """Parse a BPF relocatable ELF file (little-endian ELF64, ``EM_BPF``) from its bytes or
    from a file opened for binary reading (then only the headers, tables and the sections
    kept are read from it: not DWARF, not the zeros of the arena globals).

    Raises :class:`ObjectError` for anything that is not such a file or whose section,
    symbol or relocation tables do not fit the file.
    """
    if isinstance(data, bytes):
        return _read_elf(data)
    return _read_elf(_FileBytes(data))


# The ELF64 structures (elf(5)), little-endian: the file header's fields from e_type on,
# Elf64_Shdr, Elf64_Sym and Elf64_Rel. Read with struct rather than pyelftools' construct
# parsers: a scheduler has thousands of symbols and relocations, and the per-field parsing
# made the ELF reading alone cost more than libbpf's whole bpf_object__open.
_EHDR = struct.Struct("<HHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_REL = struct.Struct("<QQ")
_SHN_XINDEX = 0xFFFF
_tuple_new = tuple.__new__
_ET_REL = 1


def _read_elf(data: bytes | _FileBytes) -> ElfObject:
    if data[:4] != b"\x7fELF":
        raise ObjectError("not an ELF file (no ELF magic at the start)")
    if len(data) < 64:
        raise ObjectError(
            f"truncated ELF file: {len(data)} bytes is shorter than the 64-byte ELF header"
        )
    head = data[:64]
    if head[4] != 2 or head[5] != 1:
        raise ObjectError("not a little-endian ELF64 file (BPF objects are ELF64 LE)")
    e_type, e_machine, *_, shstrndx = _EHDR.unpack_from(head, 16)
    if e_machine != EM_BPF:
        raise ObjectError(f"ELF machine is {e_machine}, not EM_BPF ({EM_BPF})")
    if e_type != _ET_REL:
        raise ObjectError(f"ELF type is {e_type}, not a relocatable object (ET_REL)")
    try:
        sections = _read_sections(data, shstrndx)
        symbols = _read_symbols(sections)
        relocs = _read_relocs(sections, len(symbols))
    except (struct.error, IndexError) as exc:  # a table cut short inside its section
        raise ObjectError(f"malformed ELF (corrupt or truncated file): {exc}") from exc
    return ElfObject(tuple(sections), tuple(symbols), relocs)


def _check_section_table(data: bytes | _FileBytes) -> tuple[int, int]:
    """The ELF64 header's section header table must lie inside the file (``e_shoff`` at
    byte 0x28, ``e_shentsize``/``e_shnum`` at 0x3A/0x3C; ``elf(5)``). A file cut short
    (an interrupted copy or build) fails here, with the sizes in words. Returns
    ``(e_shoff, e_shnum)``."""
    head = data[:64]
    shoff = struct.unpack_from("<Q", head, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
    if shentsize != 64:
        raise ObjectError(
            f"malformed ELF file: section headers of {shentsize} bytes (ELF64 uses 64)"
        )
    if shoff == 0:
        raise ObjectError("malformed ELF file: it has no section header table")
    entries = max(shnum, 1)  # 0 means the count is kept in section 0's sh_size
    end = shoff + entries * 64
    if end > len(data):
        raise ObjectError(
            f"truncated ELF file: its section header table ({entries} entries at byte "
            f"{shoff}) ends at byte {end}, but the file has only {len(data)} bytes "
            "(cut short, e.g. an interrupted copy or build?)"
        )
    return shoff, shnum


def _cstr(table: bytes, off: int, what: str) -> str:
    """The NUL-terminated name at ``off`` of a string table (latin-1: never a decode error)."""
    if not 0 <= off < len(table) and not (off == 0 and not table):
        raise ObjectError(f"{what}: name offset {off} is outside its string table")
    end = table.find(b"\0", off)
    return table[off : end if end >= 0 else len(table)].decode("latin-1")


def _read_sections(data: bytes | _FileBytes, shstrndx: int) -> list[Section]:
    shoff, num = _check_section_table(data)
    first = _SHDR.unpack(data[shoff : shoff + 64])
    if num == 0:  # the real count is section 0's sh_size (elf(5), e_shnum)
        num = first[5]
    if shstrndx == _SHN_XINDEX:  # the real index is section 0's sh_link
        shstrndx = first[6]
    if num > 65535:
        raise ObjectError(f"{num} sections is too many")
    end = shoff + num * 64
    if end > len(data):
        raise ObjectError(
            f"truncated ELF file: its section header table ({num} entries at byte "
            f"{shoff}) ends at byte {end}, but the file has only {len(data)} bytes"
        )
    headers = list(_SHDR.iter_unpack(data[shoff:end]))
    if not 0 <= shstrndx < num:
        raise ObjectError(f"section name table index {shstrndx} is out of range (0..{num})")
    s_type, s_off, s_size = headers[shstrndx][1], headers[shstrndx][4], headers[shstrndx][5]
    if s_type == SHT_NOBITS or s_off + s_size > len(data):
        raise ObjectError(f"section name table {shstrndx} does not fit the file")
    shstr = data[s_off : s_off + s_size] if shstrndx else b""
    names = [_cstr(shstr, h[0], f"section {i}") if shstrndx else "" for i, h in enumerate(headers)]
    # SHT_REL sections patching DWARF or BTF are never applied: their bodies are not read.
    skip_rel = {
        i
        for i, h in enumerate(headers)
        if h[1] == SHT_REL and 0 < h[7] < num and _ignored_target(names[h[7]])
    }
    bodies: list[bytes] = []
    wanted: list[tuple[int, int, int]] = []  # (section index, offset, size) to read whole
    for i, (_, stype, _fl, _addr, off, size, _lk, _inf, _al, _es) in enumerate(headers):
        name = names[i]
        body = b""
        if stype == SHT_NOBITS or stype == 0:
            if size >= 1 << 32:
                raise ObjectError(f"section {i} ({name!r}) claims {size} bytes")
        else:
            if off + size > len(data):
                raise ObjectError(
                    f"section {i} ({name!r}) at offset {off} with size {size} "
                    f"extends past the end of the file ({len(data)} bytes)"
                )
            if _is_dwarf(name) or i in skip_rel:
                pass
            elif name == ARENA_SECTION:
                body = data[off : off + _initialised_len(data, off, size)]
            else:
                wanted.append((i, off, size))
        bodies.append(body)
    for i, body in _read_bodies(data, wanted):
        bodies[i] = body
    return [
        Section(i, names[i], stype, flags, size, link, info, bodies[i])
        for i, (_, stype, flags, _addr, _off, size, link, info, _al, _es) in enumerate(headers)
    ]


#: Kept sections this close to each other in a file are read with one ``pread``: the gap
#: (a few bytes of alignment, the relocations of ``.BTF``, a small DWARF section) is read
#: along and dropped, which costs less than another system call and its Python wrapping.
_READ_GAP = 16 << 10


def _read_bodies(
    data: bytes | _FileBytes, wanted: list[tuple[int, int, int]]
) -> Iterator[tuple[int, bytes]]:
    """``(section index, bytes)`` of each ``(index, offset, size)`` of ``wanted`` (bounds
    already checked); from a file, runs of sections at most :data:`_READ_GAP` apart are
    read at once (a scheduler's object has ~50 sections, mostly small)."""
    if not isinstance(data, _FileBytes):
        for i, off, size in wanted:
            yield i, data[off : off + size]
        return
    order = sorted(wanted, key=lambda w: w[1])
    j, n = 0, len(order)
    while j < n:
        start = order[j][1]
        end = start + order[j][2]
        k = j + 1
        while k < n and order[k][1] <= end + _READ_GAP:
            end = max(end, order[k][1] + order[k][2])
            k += 1
        buf = data[start:end]
        for i, off, size in order[j:k]:
            yield i, buf[off - start : off - start + size]
        j = k


_ZERO_CHUNK = bytes(1 << 16)


def _initialised_len(data: bytes | _FileBytes, off: int, size: int) -> int:
    """Bytes of ``data[off:off+size]`` up to its last non-zero byte, found from the end in
    64 KiB chunks (each copied, compared with zeros and dropped), so the trailing zeros are
    never held in memory at once. In a file, only the ranges that may hold data are read:
    a linker leaves arena zeros as holes, most of an arena object's size on disk."""
    ranges = (
        data.data_extents(off, off + size) if isinstance(data, _FileBytes) else [(off, off + size)]
    )
    for start_of, end in reversed(ranges):
        while end > start_of:
            start = max(start_of, end - len(_ZERO_CHUNK))
            chunk = data[start:end]
            if chunk != _ZERO_CHUNK[: end - start]:
                return start - off + len(chunk.rstrip(b"\0"))
            end = start
    return 0


def _ignored_target(name: str) -> bool:
    # DWARF and BTF relocations only matter to linkers; the loader never applies them.
    return name.startswith(".debug") or name in (".BTF", ".BTF.ext") or name.startswith(".eh_frame")


def _read_symbols(sections: list[Section]) -> list[Symbol]:
    symtabs = [s for s in sections if s.type == SHT_SYMTAB]
    if not symtabs:
        raise ObjectError("the object has no symbol table (.symtab)")
    if len(symtabs) > 1:
        raise ObjectError("the object has more than one symbol table")
    symtab = symtabs[0]
    if not 0 < symtab.link < len(sections) or sections[symtab.link].type != SHT_STRTAB:
        raise ObjectError(f"symbol table links to section {symtab.link}, not a string table")
    if symtab.size % _SYM_SIZE:
        raise ObjectError(f"symbol table size {symtab.size} is not a multiple of {_SYM_SIZE}")
    strtab = sections[symtab.link].data
    nstr = len(strtab)
    find = strtab.find
    out = []
    for i, (name_off, info, other, shndx, value, size) in enumerate(_SYM.iter_unpack(symtab.data)):
        if name_off:
            if name_off >= nstr:
                raise ObjectError(f"symbol {i}: name offset {name_off} is outside the string table")
            end = find(b"\0", name_off)
            name = strtab[name_off : end if end >= 0 else nstr].decode("latin-1")
        else:
            name = ""
        out.append(
            _tuple_new(Symbol, (i, name, value, size, info & 0xF, info >> 4, other & 0x3, shndx))
        )
    return out


def _read_relocs(sections: list[Section], nsyms: int) -> dict[int, tuple[Reloc, ...]]:
    out: dict[int, tuple[Reloc, ...]] = {}
    for s in sections:
        if s.type != SHT_REL:
            continue
        if not 0 < s.info < len(sections):
            raise ObjectError(
                f"relocation section {s.name!r} patches section {s.info}, out of range"
            )
        if _ignored_target(sections[s.info].name):
            continue
        if s.size % _REL_SIZE:
            raise ObjectError(
                f"relocation section {s.name!r} size {s.size} is not a multiple of 16"
            )
        relos = [
            _tuple_new(Reloc, (r_offset, r_info >> 32, r_info & 0xFFFFFFFF))
            for r_offset, r_info in _REL.iter_unpack(s.data)
        ]
        if relos and max(r.sym for r in relos) >= nsyms:
            j, sym = next((j, r.sym) for j, r in enumerate(relos) if r.sym >= nsyms)
            raise ObjectError(
                f"relocation {j} of {s.name!r} names symbol {sym}, out of range (0..{nsyms})"
            )
        out[s.info] = out.get(s.info, ()) + tuple(relos)
    return out
