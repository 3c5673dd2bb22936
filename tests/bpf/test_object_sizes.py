"""Size fields taken from the file are checked before they are computed with or allocated:
a ``.kconfig`` char array of ~2**32 elements, a NOBITS ``.bss`` of up to 4 GiB, values
beyond the kernel's array map limit (``MAX_ARRAY_VALUE_SIZE``, ``kernel/bpf/arraymap.c``).

The memory tests run ``open_object`` in a child process under ``RLIMIT_AS`` (its address
space at start plus 1 GiB): materialising a 2 GiB ``.bss`` there fails with ``MemoryError``.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Array
from schedswitchd.bpf.elf import SHT_NOBITS, read_elf
from schedswitchd.bpf.externs import MAX_KCONFIG_ARRAY
from schedswitchd.bpf.maps import MAX_HASH_ENTRIES, PCPU_MIN_UNIT_SIZE
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import MAX_ARRAY_VALUE_SIZE
from schedswitchd.errors import ObjectError

Obj = Callable[[str], Path]
_SHDR = 64  # sizeof(Elf64_Shdr)


def _section_header(data: bytes, name: str) -> int:
    """Byte offset of section ``name``'s header (``sh_size`` is at +32)."""
    elf = read_elf(data)
    sec = elf.section_by_name(name)
    assert sec is not None, name
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    return int(shoff) + _SHDR * sec.index


def with_section_size(data: bytes, name: str, size: int) -> bytes:
    """``data`` with section ``name``'s ``sh_size`` set to ``size``."""
    buf = bytearray(data)
    struct.pack_into("<Q", buf, _section_header(data, name) + 32, size)
    return bytes(buf)


def with_array_nelems(data: bytes, old: int, new: int) -> bytes:
    """``data`` with every BTF ARRAY of ``old`` elements in ``.BTF`` made ``new`` long."""
    buf = bytearray(data)
    hdr = _section_header(data, ".BTF")
    (sec_off,) = struct.unpack_from("<Q", data, hdr + 24)
    sec = read_elf(data).section_by_name(".BTF")
    assert sec is not None
    btf = Btf.from_bytes(sec.data)
    hits = 0
    for tid in btf.own_ids():
        t = btf.type(tid)
        if isinstance(t, Array) and t.nelems == old:
            # btf_type (12 bytes) then btf_array {type, index_type, nelems}
            struct.pack_into("<I", buf, sec_off + btf.type_offset(tid) + 20, new)
            hits += 1
    assert hits, f"no ARRAY of {old} elements"
    return bytes(buf)


@pytest.mark.parametrize(
    "nelems", [0xFFFFFFF0, 0xFFFFFFFF, MAX_ARRAY_VALUE_SIZE, 1 << 30, MAX_KCONFIG_ARRAY + 1]
)
def test_huge_kconfig_char_array_is_an_object_error(bpf_object: Obj, nelems: int) -> None:
    # CONFIG_DEFAULT_HOSTNAME is `char [16]`; near 2**32 the DATASEC size overflowed the
    # u32 it is packed into (struct.error), at 2**31-1 a 2 GiB .kconfig value was allocated,
    # at 2**30 a 1 GiB .kconfig map was made: more than a config line can fill.
    data = with_array_nelems(bpf_object("kconfig").read_bytes(), 16, nelems)
    assert len(data) < 64 * 1024
    with pytest.raises(ObjectError, match=f"'CONFIG_DEFAULT_HOSTNAME' is {nelems} bytes"):
        open_object(data)


def test_kconfig_char_array_of_a_config_line_opens(bpf_object: Obj) -> None:
    data = with_array_nelems(bpf_object("kconfig").read_bytes(), 16, MAX_KCONFIG_ARRAY)
    kconfig = open_object(data).map(".kconfig")
    assert MAX_KCONFIG_ARRAY < kconfig.value_size < 2 * MAX_KCONFIG_ARRAY


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        # percpu: PERCPU_HASH, key_size 8, value_size 16, max_entries 16
        (16, PCPU_MIN_UNIT_SIZE + 1, "'percpu': .*: a per-CPU value of 32769 bytes"),
        # counts: HASH of 128 entries
        (128, MAX_HASH_ENTRIES + 1, "'counts': .*2147483649 entries"),
    ],
)
def test_map_sizes_the_kernel_refuses_are_refused_at_open(
    bpf_object: Obj, old: int, new: int, match: str
) -> None:
    data = with_array_nelems(bpf_object("maps").read_bytes(), old, new)
    with pytest.raises(ObjectError, match=rf"map {match}") as err:
        open_object(data)
    assert "the kernel refuses it (E2BIG)" in str(err.value)


def test_bss_is_not_materialised(bpf_object: Obj) -> None:
    spec = open_object(bpf_object("globals"))
    bss = spec.map(".bss")
    assert bss.data is None and bss.value_size > 0


def test_bss_over_the_kernel_limit_is_refused(bpf_object: Obj) -> None:
    data = with_section_size(bpf_object("globals").read_bytes(), ".bss", MAX_ARRAY_VALUE_SIZE + 1)
    with pytest.raises(ObjectError, match=r"'\.bss' is 2147483648 bytes: the kernel refuses"):
        open_object(data)


_CHILD = textwrap.dedent(
    """
    import resource, sys
    from schedswitchd.bpf.object import open_object
    from schedswitchd.errors import ObjectError
    data = open(sys.argv[1], "rb").read()
    with open("/proc/self/statm") as f:
        vsz = int(f.read().split()[0]) * resource.getpagesize()
    limit = vsz + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        spec = open_object(data, name="big")
    except ObjectError as exc:
        print("ObjectError", exc)
    else:
        m = spec.map(".bss")
        print("opened", m.value_size, m.data is None)
        if len(sys.argv) > 2:  # then set a variable of it, as a config's rodata key would
            from schedswitchd.bpf.customize import set_variable
            spec = set_variable(spec, sys.argv[2], 7)
            print("set", len(spec.map(".bss").data))
    """
)


@pytest.mark.parametrize(
    ("size", "expect"),
    [
        # 2 GiB - 8 of zeros: accepted, nothing allocated
        (MAX_ARRAY_VALUE_SIZE - 7, f"opened {MAX_ARRAY_VALUE_SIZE - 7} True"),
        # ~4 GiB: refused without allocating it
        (0xFFFFFFF0, "ObjectError"),
    ],
)
def test_big_bss_under_an_address_space_limit(
    bpf_object: Obj, tmp_path: Path, size: int, expect: str
) -> None:
    blob = with_section_size(bpf_object("globals").read_bytes(), ".bss", size)
    assert read_elf(blob).section_by_name(".bss") is not None
    assert next(s for s in read_elf(blob).sections if s.name == ".bss").type == SHT_NOBITS
    path = tmp_path / "big.bpf.o"
    path.write_bytes(blob)
    assert len(blob) < 64 * 1024  # a small file claiming gigabytes
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(expect), out.stdout + out.stderr[-2000:]


def test_setting_a_variable_of_a_big_bss_allocates_up_to_it(
    bpf_object: Obj, tmp_path: Path
) -> None:
    # The .bss opened lazily, but setting one u64 made bytes(value_size) and copies of it:
    # a MemoryError with 1 GiB of address space to spare.
    size = MAX_ARRAY_VALUE_SIZE - 7
    blob = with_section_size(bpf_object("globals").read_bytes(), ".bss", size)
    path = tmp_path / "big.bpf.o"
    path.write_bytes(blob)
    zeroed = open_object(blob).map(".bss").variable("zeroed")
    assert zeroed is not None
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), "zeroed"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [f"opened {size} True", f"set {zeroed.offset + 8}"]


def _with_symbol_value(data: bytes, section: str, value: int) -> bytes:
    """``data`` with the first named symbol defined in ``section`` at ``value``."""
    elf = read_elf(data)
    sec = elf.section_by_name(section)
    symtab = elf.section_by_name(".symtab")
    assert sec is not None and symtab is not None
    sym = next(s for s in elf.symbols if s.shndx == sec.index and s.name)
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    (symtab_off,) = struct.unpack_from("<Q", data, int(shoff) + _SHDR * symtab.index + 24)
    buf = bytearray(data)
    struct.pack_into("<Q", buf, int(symtab_off) + 24 * sym.index + 8, value)  # st_value
    return bytes(buf)


@pytest.mark.parametrize("value", [1 << 31, 1 << 33, (1 << 64) - 8])
def test_arena_global_at_a_huge_offset_is_an_object_error(bpf_object: Obj, value: int) -> None:
    data = _with_symbol_value(bpf_object("arena").read_bytes(), ".addr_space.1", value)
    with pytest.raises(ObjectError, match="does not fit section"):
        open_object(data)


def test_arena_reference_before_its_section_is_an_object_error(bpf_object: Obj) -> None:
    # A negative addend (the ld_imm64's imm) put the reference before the arena's start;
    # the offset ends in the second slot's 32-bit imm, so it must be in 0..2**32-1.
    data = bpf_object("arena").read_bytes()
    elf = read_elf(data)
    arena = elf.section_by_name(".addr_space.1")
    assert arena is not None
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    buf = bytearray(data)
    hits = 0
    for sec_idx, relocs in elf.relocs.items():
        (sec_off,) = struct.unpack_from("<Q", data, int(shoff) + _SHDR * sec_idx + 24)
        for r in relocs:
            if elf.symbols[r.sym].shndx == arena.index:
                struct.pack_into("<i", buf, int(sec_off) + r.offset + 4, -(1 << 20))
                hits += 1
    assert hits
    with pytest.raises(ObjectError, match="arena offset -1048576"):
        open_object(bytes(buf))
