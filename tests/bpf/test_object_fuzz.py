"""Mutated objects (truncated files and sections, bad relocation offsets, symbol indices
out of range, inconsistent .BTF.ext, broken section headers, and size fields: BTF array
``nelems``, DATASEC/VAR/struct sizes, section and NOBITS sizes, symbol values) make
``open_object`` and the linking of its programs (``ObjectSpec.link_programs``, which the
daemon runs at open) raise only ``ObjectError``/``BtfError`` -- never another exception, never
a hang, never an allocation of what the file does not hold (each input runs with 1 GiB of
address space to spare: ``tests.fuzzing.address_space_headroom``). A mutation may leave an
object that still opens; where it cannot (the file cut inside its section header table, a
section reaching past the end of the file), the test asserts the error."""

from __future__ import annotations

import io
import signal
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Kind
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import MAX_ARRAY_VALUE_SIZE
from schedswitchd.errors import BtfError, ObjectError
from tests import fuzzing
from tests.bpf.conftest import BPF_BUILD_DIR
from tests.build_outputs import missing_build_output

OBJECTS = (
    "maps", "globals", "subprogs", "ksyms", "kconfig", "struct_ops", "kmod_fixed", "kmod_ptrs",
    "core_kinds", "arena",
)  # fmt: skip
_SHDR = 64  # sizeof(Elf64_Shdr)


@dataclass(frozen=True)
class _Sec:
    index: int
    name: str
    offset: int
    size: int
    type: str


@dataclass(frozen=True)
class _Obj:
    data: bytes
    sections: tuple[_Sec, ...]
    shoff: int

    def named(self, pred: str) -> list[_Sec]:
        return [s for s in self.sections if s.size and pred in s.name and ".debug" not in s.name]


def _load(name: str) -> _Obj:
    path = BPF_BUILD_DIR / f"{name}.bpf.o"
    if not path.is_file():
        missing_build_output(path, "test-objects")
    data = path.read_bytes()
    elf = ELFFile(io.BytesIO(data))
    secs = tuple(
        _Sec(i, s.name, s["sh_offset"], s["sh_size"], str(s["sh_type"]))
        for i, s in enumerate(elf.iter_sections())
    )
    return _Obj(data, secs, elf["e_shoff"])


_CACHE: dict[str, _Obj] = {}


def _obj(name: str) -> _Obj:
    if name not in _CACHE:
        _CACHE[name] = _load(name)
    return _CACHE[name]


class _Hang(Exception):
    pass


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    def alarm(_sig: int, _frame: FrameType | None) -> None:
        raise _Hang(f"open_object ran for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module", autouse=True)
def _bounded_memory() -> Iterator[None]:
    with fuzzing.address_space_headroom():
        yield
    fuzzing.flush()


def _open_or_typed_error(blob: bytes, test: str = "elf") -> ObjectError | BtfError | None:
    """Open a mutated object within 10 s: the typed error it raised, or None if it opened.

    A mutation may leave an object that still opens (a byte of padding, a shrunk DWARF
    section): what every test checks is that nothing but ``ObjectError``/``BtfError``
    escapes and nothing hangs; tests whose mutation cannot leave a valid object also
    assert the error. Each outcome is counted under ``test`` (``tests.fuzzing.record``)."""
    try:
        with _deadline(10.0):
            open_object(blob, name="fuzz").link_programs()  # linking is deferred to use
    except (ObjectError, BtfError) as exc:
        fuzzing.record(test, type(exc).__name__)
        return exc
    except BaseException as exc:
        fuzzing.record(test, f"defect:{fuzzing.exception_name(exc)}")
        raise
    fuzzing.record(test, "opened")
    return None


u32s = st.one_of(
    st.integers(0, 64),
    st.integers(0, 2**32 - 1),
    st.sampled_from([2**31 - 1, 2**31, 2**32 - 8, 2**32 - 1, 8, 16, 24]),
)
u64s = st.one_of(u32s, st.integers(0, 2**64 - 1), st.sampled_from([2**63, 2**64 - 8]))
# sizes and counts: around the kernel's array value limit, u32 overflow, and small ones
sizes = st.one_of(
    st.integers(0, 4096),
    st.integers(0, 2**32 - 1),
    st.sampled_from(
        [
            MAX_ARRAY_VALUE_SIZE,
            MAX_ARRAY_VALUE_SIZE + 1,
            MAX_ARRAY_VALUE_SIZE - 7,
            2**32 - 1,
            2**32 - 16,
            2**30,
            2**28 + 1,
            0x10000,
        ]
    ),
)

FUZZ = settings(
    max_examples=fuzzing.examples(800),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)


@FUZZ
@given(name=st.sampled_from(OBJECTS), data=st.data())
def test_truncated_files_and_sections(name: str, data: st.DataObject) -> None:
    o = _obj(name)
    blob = bytearray(o.data)
    if data.draw(st.booleans()):
        cut = data.draw(st.integers(0, len(blob) - 1))
        del blob[cut:]
        error = _open_or_typed_error(bytes(blob), "elf:truncated")
        if cut < o.shoff + len(o.sections) * _SHDR:  # the section header table is cut
            assert error is not None, f"{name} cut at {cut} of {len(o.data)} bytes opened"
    else:
        # shrink one section's sh_size (a truncated section) or grow it past the file
        sec = data.draw(st.sampled_from([s for s in o.sections if s.index]))
        new = data.draw(st.one_of(st.integers(0, max(sec.size, 1)), u64s))
        struct.pack_into("<Q", blob, o.shoff + sec.index * _SHDR + 32, new)
        error = _open_or_typed_error(bytes(blob), "elf:truncated")
        if sec.type != "SHT_NOBITS" and sec.offset + new > len(blob):  # reaches past the file
            assert error is not None, f"{name}: {sec.name} of {new} bytes past the end opened"


@FUZZ
@given(name=st.sampled_from(OBJECTS), data=st.data())
def test_bad_relocations(name: str, data: st.DataObject) -> None:
    o = _obj(name)
    rels = o.named(".rel")
    if not rels:
        return
    sec = data.draw(st.sampled_from(rels))
    blob = bytearray(o.data)
    for _ in range(data.draw(st.integers(1, 3))):
        j = data.draw(st.integers(0, sec.size // 16 - 1))
        at = sec.offset + 16 * j
        field = data.draw(st.sampled_from(["offset", "sym", "type"]))
        if field == "offset":
            struct.pack_into("<Q", blob, at, data.draw(u64s))
        elif field == "sym":
            struct.pack_into("<I", blob, at + 12, data.draw(u32s))
        else:
            struct.pack_into("<I", blob, at + 8, data.draw(u32s))
    _open_or_typed_error(bytes(blob), "elf:relocations")  # typed error or an object


@FUZZ
@given(name=st.sampled_from(OBJECTS), data=st.data())
def test_bad_symbols(name: str, data: st.DataObject) -> None:
    o = _obj(name)
    symtab = next(s for s in o.sections if s.name == ".symtab")
    blob = bytearray(o.data)
    for _ in range(data.draw(st.integers(1, 3))):
        j = data.draw(st.integers(1, symtab.size // 24 - 1))
        at = symtab.offset + 24 * j
        field = data.draw(st.sampled_from(["name", "info", "other", "shndx", "value", "size"]))
        if field == "name":
            struct.pack_into("<I", blob, at, data.draw(u32s))
        elif field in ("info", "other"):
            blob[at + (4 if field == "info" else 5)] = data.draw(st.integers(0, 255))
        elif field == "shndx":
            struct.pack_into("<H", blob, at + 6, data.draw(st.integers(0, 0xFFFF)))
        else:
            struct.pack_into("<Q", blob, at + (8 if field == "value" else 16), data.draw(u64s))
    _open_or_typed_error(bytes(blob), "elf:symbols")  # typed error or an object


@FUZZ
@given(name=st.sampled_from(OBJECTS), data=st.data())
def test_inconsistent_btf_ext_and_section_bytes(name: str, data: st.DataObject) -> None:
    o = _obj(name)
    blob = bytearray(o.data)
    target = data.draw(
        st.sampled_from(
            [".BTF.ext", ".maps", ".kmod_btfs", ".struct_ops", "sched", ".text", ".BTF"]
        )
    )
    secs = o.named(target) or o.named(".BTF.ext")
    sec = data.draw(st.sampled_from(secs))
    for _ in range(data.draw(st.integers(1, 4))):
        if sec.name == ".BTF.ext" and data.draw(st.booleans()):
            # header words and the first records: offsets, lengths, rec_size, counts
            off = data.draw(st.integers(0, min(sec.size, 96) // 4 - 1)) * 4
            struct.pack_into("<I", blob, sec.offset + off, data.draw(u32s))
        else:
            off = data.draw(st.integers(0, sec.size - 1))
            blob[sec.offset + off] = data.draw(st.integers(0, 255))
    _open_or_typed_error(bytes(blob), "elf:btf_ext_and_bytes")  # typed error or an object


@FUZZ
@given(name=st.sampled_from(OBJECTS), data=st.data())
def test_broken_section_headers(name: str, data: st.DataObject) -> None:
    o = _obj(name)
    blob = bytearray(o.data)
    sec = data.draw(st.sampled_from(o.sections))
    field = data.draw(
        st.sampled_from([(0, "I"), (4, "I"), (8, "Q"), (24, "Q"), (40, "I"), (44, "I")])
    )
    value = data.draw(u32s if field[1] == "I" else u64s)
    struct.pack_into("<" + field[1], blob, o.shoff + sec.index * _SHDR + field[0], value)
    _open_or_typed_error(bytes(blob), "elf:section_headers")  # typed error or an object


@dataclass(frozen=True)
class _Field:
    at: int  # byte offset in the file
    what: str


_FIELDS: dict[str, tuple[_Field, ...]] = {}


def _btf_size_fields(name: str) -> tuple[_Field, ...]:
    """File offsets of the size words of ``name``'s ``.BTF``: ARRAY ``nelems``, STRUCT/
    UNION/INT/ENUM ``size``, DATASEC ``size`` and each entry's ``offset``/``size``, VAR
    ``type`` (what sizes a variable). Layouts: kernel doc ``Documentation/bpf/btf.rst``."""
    if name in _FIELDS:
        return _FIELDS[name]
    o = _obj(name)
    sec = next(s for s in o.sections if s.name == ".BTF")
    btf = Btf.from_bytes(o.data[sec.offset : sec.offset + sec.size])
    out: list[_Field] = []
    for tid in btf.own_ids():
        at = sec.offset + btf.type_offset(tid)
        kind = btf.kind(tid)
        if kind == Kind.ARRAY:
            out.append(_Field(at + 20, f"array {tid} nelems"))
        elif kind in (Kind.STRUCT, Kind.UNION, Kind.INT, Kind.ENUM, Kind.ENUM64):
            out.append(_Field(at + 8, f"{kind.name} {tid} size"))
        elif kind == Kind.VAR:
            out.append(_Field(at + 8, f"var {tid} type"))
        elif kind == Kind.DATASEC:
            out.append(_Field(at + 8, f"datasec {tid} size"))
            (info,) = struct.unpack_from("<I", o.data, at + 4)
            for i in range(info & 0xFFFF):
                out.append(_Field(at + 12 + 12 * i + 4, f"datasec {tid} var {i} offset"))
                out.append(_Field(at + 12 + 12 * i + 8, f"datasec {tid} var {i} size"))
    _FIELDS[name] = tuple(out)
    return _FIELDS[name]


SIZES_FUZZ = settings(FUZZ, max_examples=fuzzing.examples(400))


@SIZES_FUZZ
@given(name=st.sampled_from(OBJECTS), data=st.data())
def test_btf_size_fields(name: str, data: st.DataObject) -> None:
    """Array lengths (the ~2**32-element ``.kconfig`` char array), type and DATASEC sizes,
    variable offsets and sizes."""
    fields = _btf_size_fields(name)
    blob = bytearray(_obj(name).data)
    for _ in range(data.draw(st.integers(1, 3))):
        f = data.draw(st.sampled_from(fields))
        struct.pack_into("<I", blob, f.at, data.draw(sizes))
    _open_or_typed_error(bytes(blob), "elf:btf_sizes")  # typed error or an object


@SIZES_FUZZ
@given(name=st.sampled_from(OBJECTS), data=st.data())
def test_section_and_symbol_sizes(name: str, data: st.DataObject) -> None:
    """``sh_size`` of data and NOBITS sections (a 10 KB file claiming a 4 GiB ``.bss``),
    ``st_value``/``st_size`` of the symbols in them."""
    o = _obj(name)
    blob = bytearray(o.data)
    data_secs = [
        s
        for s in o.sections
        if s.name.startswith((".bss", ".data", ".rodata", ".kconfig", ".maps", ".struct_ops"))
    ]
    for _ in range(data.draw(st.integers(1, 3))):
        use_section: bool = data.draw(st.booleans())
        if data_secs and use_section:
            sec = data.draw(st.sampled_from(data_secs))
            if sec.type == "SHT_NOBITS":
                value = data.draw(sizes)
            else:
                value = data.draw(st.one_of(st.integers(0, sec.size), sizes))
            struct.pack_into("<Q", blob, o.shoff + sec.index * _SHDR + 32, value)
        else:
            symtab = next(s for s in o.sections if s.name == ".symtab")
            j = data.draw(st.integers(1, symtab.size // 24 - 1))
            field = data.draw(st.sampled_from([8, 16]))  # st_value, st_size
            struct.pack_into("<Q", blob, symtab.offset + 24 * j + field, data.draw(sizes))
    _open_or_typed_error(bytes(blob), "elf:section_sizes")  # typed error or an object
