"""open_object rejects what libbpf rejects, with an ObjectError that says what is wrong."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf.elf import read_elf
from schedswitchd.bpf.object import open_object
from schedswitchd.errors import ObjectError

Obj = Callable[[str], Path]


def _strtab_patch(data: bytes, old: bytes, new: bytes) -> bytes:
    """Replace a section name inside the ELF string table (not the BTF strings)."""
    assert len(new) == len(old)
    elf = read_elf(data)
    names = elf.sections[1] if elf.sections[1].name == ".strtab" else elf.section_by_name(".strtab")
    assert names is not None
    start = data.index(names.data)
    at = data.index(old + b"\0", start, start + len(names.data))
    return data[:at] + new + data[at + len(new) :]


def test_legacy_maps_section_is_rejected(bpf_object: Obj) -> None:
    data = _strtab_patch(bpf_object("maps").read_bytes(), b".maps", b"maps\0")
    with pytest.raises(ObjectError, match="legacy 'maps' section"):
        open_object(data)


def test_arena_globals_need_an_arena_map(bpf_object: Obj) -> None:
    data = _strtab_patch(
        bpf_object("globals").read_bytes(), b".data.cpu_loads", b".addr_space.1\0\0"
    )
    with pytest.raises(ObjectError, match="no arena map"):
        open_object(data)


def test_struct_ops_member_bound_to_other_program_type(bpf_object: Obj) -> None:
    data = _strtab_patch(
        bpf_object("struct_ops").read_bytes(), b"struct_ops/ssd_init", b"syscall\0" + bytes(11)
    )
    with pytest.raises(ObjectError, match="not a struct_ops program"):
        open_object(data)


def test_static_entry_program_is_rejected(bpf_object: Obj) -> None:
    raw = bytearray(bpf_object("kmod_fixed").read_bytes())
    elf = read_elf(bytes(raw))
    sym = next(s for s in elf.symbols if s.name == "kmod_fixed")
    symtab = elf.section_by_name(".symtab")
    assert symtab is not None
    at = bytes(raw).index(symtab.data) + 24 * sym.index + 4
    raw[at] = (0 << 4) | (raw[at] & 0xF)  # STB_LOCAL
    with pytest.raises(ObjectError, match="is static"):
        open_object(bytes(raw))


def test_invalid_kmod_name_names_its_offset(bpf_object: Obj) -> None:
    data = bpf_object("kmod_fixed").read_bytes()
    at = data.index(b"xfs\0")
    bad = data[:at] + b"x s\0" + data[at + 4 :]
    with pytest.raises(
        ObjectError, match=r"\.kmod_btfs: name at offset 56 .* not a valid module name"
    ):
        open_object(bad)


def test_not_an_elf_and_unreadable_path(tmp_path: Path) -> None:
    with pytest.raises(ObjectError, match="not an ELF file"):
        open_object(b"hello")
    with pytest.raises(ObjectError, match="cannot read BPF object"):
        open_object(tmp_path / "missing.bpf.o")
    x86 = bytearray(b"\x7fELF\x02\x01\x01" + bytes(57))
    struct.pack_into("<HH", x86, 16, 1, 62)  # ET_REL, EM_X86_64
    with pytest.raises(ObjectError, match="not EM_BPF"):
        open_object(bytes(x86))
