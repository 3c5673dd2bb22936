"""Set a ``.rodata`` tunable in a copy of a BPF ELF object before a loader sees it.

Loaders such as ``bpftool struct_ops register`` load ``.rodata`` as compiled; tests and
benchmarks that drive the sample schedulers through them (e.g. ``error_after`` of ss_fifo)
patch the initial bytes instead, the way libbpf skeletons write ``skel->rodata->x`` before
load. ELF layout: ``include/uapi/linux/elf.h``; the variable is a symbol in ``.rodata``
whose value is its offset in the section.
"""

from __future__ import annotations

import io
import struct

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection


class RodataError(Exception):
    """The object has no such ``.rodata`` variable, or the value does not fit it."""


def set_rodata(obj: bytes, name: str, value: int) -> bytes:
    """A copy of ``obj`` with the ``.rodata`` variable ``name`` set to ``value``.

    The width (1, 2, 4 or 8 bytes, little-endian) comes from the symbol's size. Raises
    RodataError if the symbol is missing, not in ``.rodata``, or ``value`` does not fit.
    """
    elf = ELFFile(io.BytesIO(obj))
    rodata_index = next((i for i, s in enumerate(elf.iter_sections()) if s.name == ".rodata"), None)
    if rodata_index is None:
        raise RodataError("object has no .rodata section")
    rodata = elf.get_section(rodata_index)
    symtab = elf.get_section_by_name(".symtab")
    if not isinstance(symtab, SymbolTableSection):
        raise RodataError("object has no symbol table")
    for sym in symtab.iter_symbols():
        if sym.name == name and sym["st_shndx"] == rodata_index:
            size = sym["st_size"]
            fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}.get(size)
            if fmt is None:
                raise RodataError(f"{name} is {size} bytes, not an integer")
            if not 0 <= value < 1 << (8 * size):
                raise RodataError(f"{value} does not fit {name} ({size} bytes)")
            out = bytearray(obj)
            struct.pack_into(fmt, out, rodata["sh_offset"] + sym["st_value"], value)
            return bytes(out)
    raise RodataError(f"no .rodata variable {name!r}")
