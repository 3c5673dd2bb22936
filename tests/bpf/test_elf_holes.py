"""What opening a file reads: of ``.addr_space.1`` only the parts the file system reports
as data (``SEEK_DATA``/``SEEK_HOLE``), finding the same initialised prefix as a read of
every byte (the ``bytes`` path, which scans the whole section); the kept sections in a few
``pread`` calls, adjacent ones together, and not the DWARF.

Linkers leave an arena's zero globals as holes: the corpus's lavd has 21 MiB of them in
0.8 MiB on disk, and reading the zeros through ``pread`` was ~4 ms of its open.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from schedswitchd.bpf.elf import read_elf
from schedswitchd.bpf.object import open_object

Obj = Callable[[str], Path]
_BIG = 256 << 20  # the arena section grown to this many bytes, all but its start a hole


def _grown(bpf_object: Obj, path: Path, size: int, marks: tuple[int, ...] = ()) -> int:
    """Write ``arena_rw`` with ``.addr_space.1`` moved to the end of the file and grown to
    ``size`` bytes by a hole to ``path``; a 0x7f byte written at each offset of ``marks``
    (section offsets) makes a data extent inside the hole. Returns the file offset where
    the first hole starts (the section's end when the file system reports none)."""
    raw = bytearray(bpf_object("arena_rw").read_bytes())
    sec = read_elf(bytes(raw)).section_by_name(".addr_space.1")
    assert sec is not None
    (shoff,) = struct.unpack_from("<Q", raw, 0x28)
    hdr = shoff + 64 * sec.index
    (old_off,) = struct.unpack_from("<Q", raw, hdr + 24)
    body = bytes(raw[old_off : old_off + sec.size])
    new_off = -(-len(raw) // 4096) * 4096
    struct.pack_into("<QQ", raw, hdr + 24, new_off, size)
    with open(path, "wb") as f:
        f.write(bytes(raw))
        f.seek(new_off)
        f.write(body)
        for m in marks:
            f.seek(new_off + m)
            f.write(b"\x7f")
        f.truncate(new_off + size)
    with open(path, "rb") as f:
        try:
            return os.lseek(f.fileno(), new_off + len(body), os.SEEK_HOLE)
        except OSError:
            return new_off + size


@pytest.fixture
def pread_bytes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Bytes read through ``os.pread`` while the test runs."""
    got = [0]
    real = os.pread

    def counted(fd: int, n: int, off: int) -> bytes:
        out = real(fd, n, off)
        got[0] += len(out)
        return out

    monkeypatch.setattr(os, "pread", counted)
    yield got


def test_open_reads_no_hole(bpf_object: Obj, tmp_path: Path, pread_bytes: list[int]) -> None:
    path = tmp_path / "holes.bpf.o"
    if _grown(bpf_object, path, _BIG) >= path.stat().st_size:
        pytest.skip(f"the file system of {tmp_path} does not report holes")
    spec = open_object(path)
    arena = spec.map("arena")
    assert arena.data_size == _BIG
    assert arena.data == open_object(bpf_object("arena_rw")).map("arena").data
    assert pread_bytes[0] < path.stat().st_blocks * 512 + (1 << 20), pread_bytes[0]


def test_data_after_a_hole_is_found(bpf_object: Obj, tmp_path: Path) -> None:
    # data extents inside the hole, the last one 1 MiB before the section's end: the
    # initialised prefix runs to it, the bytes between are zeros, as a full read finds
    size, mid, last = 8 << 20, 2 << 20, 7 << 20
    path = tmp_path / "marks.bpf.o"
    _grown(bpf_object, path, size, (mid, last))
    from_file = open_object(path).map("arena")
    from_bytes = open_object(path.read_bytes()).map("arena")
    assert from_file.data is not None and len(from_file.data) == last + 1
    assert from_file.data == from_bytes.data
    assert from_file.data[mid] == 0x7F and from_file.data[-1] == 0x7F
    assert from_file.data_size == size


def test_adjacent_sections_are_read_together(
    bpf_object: Obj, pread_bytes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # struct_ops.bpf.o has 33 sections, DWARF among them: the kept ones are read in a few
    # runs (one pread each, besides the headers), and no DWARF section of more than the
    # gap is read
    path = bpf_object("struct_ops")
    calls = [0]
    counted = os.pread

    def counting(fd: int, n: int, off: int) -> bytes:
        calls[0] += 1
        return counted(fd, n, off)

    monkeypatch.setattr(os, "pread", counting)
    spec = open_object(path)
    assert spec.programs and calls[0] <= 12, calls[0]
    elf = read_elf(path.read_bytes())
    dwarf = sum(s.size for s in elf.sections if s.name.startswith(".debug"))
    assert dwarf > 64 << 10  # the object has DWARF worth skipping
    assert pread_bytes[0] < path.stat().st_size - dwarf + (64 << 10)
