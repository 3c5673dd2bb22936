"""Getting raw BTF bytes out of a file: raw BTF, ELF ``.BTF`` sections, xz-compressed modules.

Formats: raw BTF as in ``/sys/kernel/btf/*`` (kernel doc ``Documentation/bpf/btf.rst``); ELF
section headers per the System V gABI (``include/uapi/linux/elf.h``), 32/64-bit, either byte
order; ``.ko.xz`` modules are xz streams (Debian compresses modules with xz).
"""

from __future__ import annotations

import lzma
import mmap
import os
import struct

from schedswitchd.errors import BtfError, unreadable

__all__ = ["elf_section", "load_btf_bytes"]

#: What a BTF path must hold, said when it cannot be read.
BTF_FILE = "raw BTF, or an ELF file with a .BTF section, also xz-compressed"
_ELF_MAGIC = b"\x7fELF"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_SHT_NOBITS = 8
_SHN_XINDEX = 0xFFFF


def load_btf_bytes(path: str | os.PathLike[str]) -> bytes | mmap.mmap:
    """The raw BTF of the file at ``path``.

    Raw BTF files are mapped read-only with ``mmap`` (``MAP_PRIVATE``: the kernel refuses
    shared mappings of ``/sys/kernel/btf/vmlinux``) and read whole where mapping is refused.
    ELF files (also xz-compressed) yield a copy of their ``.BTF`` section. Raises
    ``BtfError`` naming the path when the file cannot be read or has no ``.BTF``.
    """
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise BtfError(f"cannot open BTF file: {unreadable(e, BTF_FILE)}", where=p) from e
    try:
        head = os.pread(fd, 8, 0)
        if head.startswith(_XZ_MAGIC):
            try:
                elf = lzma.decompress(_read_all(fd, p))
            except (lzma.LZMAError, EOFError) as e:
                raise BtfError(f"bad xz stream: {e}", where=p) from e
            if not elf.startswith(_ELF_MAGIC):
                raise BtfError("xz file does not hold an ELF file", where=p)
            return elf_section(elf, ".BTF", where=p)
        if head.startswith(_ELF_MAGIC):
            # A vmlinux ELF is hundreds of MB: map it and copy only the .BTF section out.
            try:
                mapped: bytes | mmap.mmap = mmap.mmap(
                    fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ
                )
            except (OSError, ValueError):
                mapped = _read_all(fd, p)
            try:
                return elf_section(mapped, ".BTF", where=p)
            finally:
                if isinstance(mapped, mmap.mmap):
                    mapped.close()
        try:
            return mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        except (OSError, ValueError):
            return _read_all(fd, p)
    except OSError as e:
        raise BtfError(f"cannot read BTF file: {unreadable(e, BTF_FILE)}", where=p) from e
    finally:
        os.close(fd)


def _read_all(fd: int, where: str) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def elf_section(data: bytes | mmap.mmap, name: str, *, where: str = "ELF") -> bytes:
    """A copy of the contents of the ELF section called ``name`` in ``data``.

    Raises ``BtfError`` for malformed ELF headers, section headers out of bounds, or when the
    section is absent (``where`` names the file in the message).
    """
    if len(data) < 64 or data[:4] != _ELF_MAGIC:
        raise BtfError("not an ELF file", where=where)
    cls, enc = data[4], data[5]
    if cls not in (1, 2) or enc not in (1, 2):
        raise BtfError(f"unsupported ELF class {cls} / data encoding {enc}", where=where)
    e = "<" if enc == 1 else ">"
    if cls == 2:
        shoff = struct.unpack_from(e + "Q", data, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", data, 0x3A)
        sh = struct.Struct(e + "IIQQQQIIQQ")
        name_i, off_i, size_i, link_i = 0, 4, 5, 6
    else:
        shoff = struct.unpack_from(e + "I", data, 0x20)[0]
        shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", data, 0x2E)
        sh = struct.Struct(e + "IIIIIIIIII")
        name_i, off_i, size_i, link_i = 0, 4, 5, 6
    if shoff == 0:
        raise BtfError("ELF file has no section headers", where=where)
    if shentsize < sh.size:
        raise BtfError(f"ELF section header size {shentsize} too small", where=where)

    def header(i: int) -> tuple[int, ...]:
        at = shoff + i * shentsize
        if at + sh.size > len(data):
            raise BtfError(f"ELF section header {i} past the end of the file", where=where)
        return sh.unpack_from(data, at)

    first = header(0)
    if shnum == 0:
        shnum = first[size_i]
    if shstrndx == _SHN_XINDEX:
        shstrndx = first[link_i]
    if shnum > (len(data) - shoff) // shentsize:
        raise BtfError(f"ELF claims {shnum} section headers past the file end", where=where)
    strtab = header(shstrndx)
    str_lo, str_hi = strtab[off_i], strtab[off_i] + strtab[size_i]
    if str_hi > len(data):
        raise BtfError("ELF section name table past the end of the file", where=where)
    want = name.encode()
    for i in range(shnum):
        h = header(i)
        lo = str_lo + h[name_i]
        if lo >= str_hi:
            continue
        hi = data.find(b"\0", lo, str_hi)
        if hi < 0 or data[lo:hi] != want:
            continue
        if h[1] == _SHT_NOBITS:
            raise BtfError(f"ELF section {name} has no contents", where=where)
        off, size = h[off_i], h[size_i]
        if off + size > len(data):
            raise BtfError(f"ELF section {name} past the end of the file", where=where)
        return data[off : off + size]
    raise BtfError(f"no {name} section", where=where)
