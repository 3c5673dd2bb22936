"""BPF objects embedded in executables: what an installed scheduler (``/usr/bin/scx_lavd``)
is. Its libbpf-rs skeleton carries the linked BPF ELF object as bytes inside the program
(``include_bytes!``), so the object is found by its ELF header.

A candidate is every ``\\x7fELF`` at an 8-byte-aligned-or-not offset whose header says
``ELFCLASS64``, little endian, ``EV_CURRENT``, ``ET_REL`` and ``e_machine == EM_BPF``
(247, ``include/uapi/linux/elf-em.h``), with a section-header table that fits. Its size
comes from its own headers: the end of the section-header table (``e_shoff + e_shnum *
e_shentsize``) or of the furthest section, whichever is later (the ELF gABI puts no
order on them). Of the executable itself only its ELF header is read (with pyelftools,
which knows every class, byte order and machine name); nothing else of it is trusted.

With several candidates, the ones holding a ``.struct_ops``/``.struct_ops.link``
section (a scheduler's ``sched_ext_ops``) are preferred and the first of those is used;
the note :func:`select_object` returns says which one and what else was there.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from schedswitchd.errors import ObjectError

__all__ = ["EM_BPF", "EmbeddedObject", "find_embedded", "is_program", "select_object"]

EM_BPF = 247
_ELF_MAGIC = b"\x7fELF"
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr
_SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_ET_REL = 1
_SHT_NOBITS = 8
#: Refuse absurd headers before allocating anything for them.
_MAX_SECTIONS = 1 << 16


@dataclass(frozen=True, slots=True)
class EmbeddedObject:
    """One embedded BPF ELF: ``offset`` and ``size`` in bytes inside the executable;
    ``sections`` its section names; ``struct_ops`` whether one is a struct_ops section."""

    offset: int
    size: int
    sections: tuple[str, ...]

    @property
    def struct_ops(self) -> bool:
        """True when the object defines struct_ops (a scheduler's ``sched_ext_ops``)."""
        return any(s in (".struct_ops", ".struct_ops.link") for s in self.sections)


def _is_bpf_elf(data: bytes | memoryview, off: int = 0) -> bool:
    if len(data) - off < _EHDR.size:
        return False
    ident = bytes(data[off : off + 16])
    if ident[:4] != _ELF_MAGIC or ident[4] != 2 or ident[5] != 1 or ident[6] != 1:
        return False
    e_type, e_machine = struct.unpack_from("<HH", data, off + 16)
    return bool(e_type == _ET_REL and e_machine == EM_BPF)


def _candidate(data: bytes, off: int) -> EmbeddedObject | None:
    if not _is_bpf_elf(data, off):
        return None
    (_, _, _, _, _, _, shoff, _, ehsize, _, _, shentsize, shnum, shstrndx) = _EHDR.unpack_from(
        data, off
    )
    avail = len(data) - off
    if ehsize != _EHDR.size or shentsize != _SHDR.size or not 0 < shnum <= _MAX_SECTIONS:
        return None
    end = shoff + shnum * shentsize
    if shoff < _EHDR.size or end > avail or shstrndx >= shnum:
        return None
    headers = [_SHDR.unpack_from(data, off + shoff + i * shentsize) for i in range(shnum)]
    for sh in headers:
        sh_type, sh_offset, sh_size = sh[1], sh[4], sh[5]
        if sh_type != _SHT_NOBITS and sh_size:
            if sh_offset + sh_size > avail:
                return None
            end = max(end, sh_offset + sh_size)
    strtab = headers[shstrndx]
    s_off, s_size = strtab[4], strtab[5]
    names_raw = data[off + s_off : off + s_off + s_size]
    names = []
    for sh in headers:
        start = sh[0]
        if start >= len(names_raw):
            return None
        stop = names_raw.find(b"\0", start)
        names.append(names_raw[start : stop if stop >= 0 else len(names_raw)].decode("latin-1"))
    return EmbeddedObject(off, end, tuple(names))


def _program_machine(data: bytes) -> str | None:
    """The machine of an executable or shared object (``ET_EXEC``/``ET_DYN``) of another
    machine than BPF, as pyelftools names it (``EM_X86_64``, ``EM_AARCH64``, ...), or
    ``None`` for anything else. The host executable is read with pyelftools because it may
    be of any ELF class and byte order; only its header is read."""
    if data[:4] != _ELF_MAGIC:
        return None
    # e_type is the u16 at byte 16 in every ELF class, in the byte order of e_ident[EI_DATA]
    # (1 = LSB, 2 = MSB). Anything but ET_EXEC (2) / ET_DYN (3) -- every BPF object, ET_REL
    # -- is answered here: pyelftools' ELFFile builds its struct parsers on each call, which
    # cost more than a small object's whole open.
    if len(data) >= 18 and data[5] in (1, 2):
        e_type = int.from_bytes(data[16:18], "little" if data[5] == 1 else "big")
        if e_type not in (2, 3):
            return None
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        header = ELFFile(io.BytesIO(data)).header
        e_type, e_machine = header["e_type"], header["e_machine"]
    except (ELFError, struct.error, ValueError, KeyError, IndexError, TypeError):
        return None  # a broken header: not an executable to search
    if e_type not in ("ET_EXEC", "ET_DYN") or e_machine in ("EM_BPF", EM_BPF):
        return None
    return str(e_machine)


def is_program(data: bytes) -> bool:
    """An executable or shared object (``ET_EXEC``/``ET_DYN``) of another machine, with a
    whole ELF header: the only files searched for an embedded object."""
    return _program_machine(data) is not None


def find_embedded(data: bytes) -> list[EmbeddedObject]:
    """Every BPF ELF object embedded in ``data``, in file order (non-overlapping: the scan
    resumes after each object found). Never raises for bad input."""
    out: list[EmbeddedObject] = []
    pos = 1 if data[:4] == _ELF_MAGIC else 0  # skip the executable's own header
    while True:
        off = data.find(_ELF_MAGIC, pos)
        if off < 0:
            return out
        cand = _candidate(data, off)
        if cand is None:
            pos = off + 1
            continue
        out.append(cand)
        pos = off + cand.size


def select_object(data: bytes, what: str) -> tuple[bytes, str | None]:
    """The BPF object to open from file ``what``'s bytes: the file itself (note ``None``)
    unless it is an executable or shared object of another machine, else the embedded object
    chosen as the module docstring says, with a note naming it (and the others when there
    are several). Raises :class:`ObjectError` for an executable that holds none."""
    machine = _program_machine(data)
    if machine is None:
        # A BPF object (maybe a broken one), or not an ELF executable at all: the ELF
        # reader gives the precise error for those.
        return data, None
    found = find_embedded(data)
    if not found:
        raise ObjectError(
            f"{what}: an executable for machine {machine} (not EM_BPF {EM_BPF}) that embeds no "
            "BPF object (no ELF64 little-endian EM_BPF relocatable image found inside)"
        )
    schedulers = [o for o in found if o.struct_ops]
    pick = (schedulers or found)[0]
    note = f"{what}: using the BPF object embedded at offset {pick.offset:#x} ({pick.size} bytes)"
    if len(found) > 1:
        others = ", ".join(
            f"{o.offset:#x} ({o.size} bytes{', struct_ops' if o.struct_ops else ''})"
            for o in found
            if o is not pick
        )
        reason = "the first with struct_ops" if schedulers else "the first"
        note += f"; {len(found)} embedded, chose {reason}; others at {others}"
    return data[pick.offset : pick.offset + pick.size], note
