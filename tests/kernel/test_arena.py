"""Arena maps on the host kernel: build/tests/bpf/arena_rw.bpf.o (tests/bpf/arena_rw.bpf.c,
built with clang >= 18) loaded by our loader, its syscall program run with
``BPF_PROG_TEST_RUN``, and the arena read back through an ``mmap`` of it.

A host kernel may refuse every arena map even to root (``BPF_MAP_CREATE`` gives ``EPERM``:
seen on a 6.18 host whose other map types, struct_ops and links all work); the kernel tests
then skip saying so, and tests/vm/test_host_kernel_vm.py runs this module in the sched_ext
VM, whose kernel allows arenas, and fails unless every test here passed there."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import MapKind, ObjectSpec
from schedswitchd.errors import BpfSyscallError, LoadError
from schedswitchd.kernel.arena import page_size
from schedswitchd.kernel.bpf_uapi import MapType
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import LoadedObject, load_object
from schedswitchd.kernel.syscall import map_create, map_info, prog_test_run
from tests.build_outputs import missing_build_output

OBJ = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf" / "arena_rw.bpf.o"
ARENA_BASE = 1 << 45  # __ulong(map_extra, 1ull << 45): an ENUM64 in the BTF
ARENA_PAGES = 16
SEED = 0x5EED
ZEROS = 1536  # u64 elements


def _spec() -> ObjectSpec:
    if not OBJ.is_file():
        missing_build_output(OBJ, "test-objects")
    return open_object(OBJ)


def _u64(raw: bytes) -> int:
    return int(struct.unpack("<Q", raw)[0])


def test_arena_spec_keeps_only_initialised_globals() -> None:
    arena = _spec().map("arena")
    assert arena.kind is MapKind.ARENA
    assert arena.map_extra == ARENA_BASE and arena.max_entries == ARENA_PAGES
    offsets = {v.name: v.offset for v in arena.variables}
    assert offsets == {"seed": 0, "result": 8, "zeros": 16, "alloc_off": 16 + 8 * ZEROS}
    assert arena.data_size == 16 + 8 * ZEROS + 8
    assert arena.data == SEED.to_bytes(8, "little").rstrip(b"\0")  # zeros are not kept


def test_open_does_not_copy_arena_zeros(tmp_path: Path) -> None:
    """A 64 MiB zero tail appended to the arena section costs nothing to open: the file is
    mapped and the zeros are never copied."""
    spec = _spec()  # skips/fails first when the object is missing
    raw = bytearray(OBJ.read_bytes())
    assert spec.map("arena").data is not None
    # grow .addr_space.1 in place: it is the section whose sh_size we patch, with the
    # added zeros placed at the end of the file (sh_offset moved there)
    from schedswitchd.bpf.elf import read_elf

    elf = read_elf(bytes(raw))
    sec = elf.section_by_name(".addr_space.1")
    assert sec is not None
    shoff = struct.unpack_from("<Q", raw, 0x28)[0]
    hdr = shoff + 64 * sec.index
    body = bytes(raw[struct.unpack_from("<Q", raw, hdr + 24)[0] :][: sec.size])
    big = 64 << 20
    new_off = len(raw)
    raw += body + bytes(big - len(body))
    struct.pack_into("<QQ", raw, hdr + 24, new_off, big)
    path = tmp_path / "arena_big.bpf.o"
    path.write_bytes(bytes(raw))
    del raw
    open_object(path)  # imports and first-use caches
    tracemalloc.start()
    try:
        grown = open_object(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert grown.map("arena").data_size == big
    assert peak < 8 << 20, f"opening allocated {peak} bytes at its peak for a 64 MiB arena"


#: ``BPF_F_MMAPABLE`` (include/uapi/linux/bpf.h), which an arena map must have.
F_MMAPABLE = 1 << 10


@pytest.fixture
def arena_allowed() -> None:
    """Skips when this kernel refuses a one-page arena map even to root (``EPERM``)."""
    try:
        map_create(MapType.ARENA, 0, 0, 1, name="probe", flags=F_MMAPABLE).close()
    except BpfSyscallError as exc:
        if exc.errno_name != "EPERM":
            raise
        pytest.skip(f"this kernel refuses arena maps even to root: {exc}")


@pytest.fixture
def loaded(bpffs: Path, arena_allowed: None) -> LoadedObject:
    spec = _spec()
    registry = KernelBtfRegistry()
    return load_object(spec, registry.targets(spec.kmod_btfs), pin_root=bpffs)


@pytest.mark.root
def test_arena_program_reads_writes_and_allocates(loaded: LoadedObject) -> None:
    with loaded as obj:
        arena = obj.maps["arena"]
        info = map_info(arena.fd)
        assert (info.map_extra, info.max_entries) == (ARENA_BASE, ARENA_PAGES)
        # BPF_MAP_TYPE_ARENA = 33, BPF_F_MMAPABLE = 1 << 10 (include/uapi/linux/bpf.h)
        assert info.type == 33 and info.map_flags & (1 << 10)
        assert arena.arena_address == ARENA_BASE
        run = prog_test_run(obj.programs["arena_run"].fd, ctx_in=b"")
        assert run.retval == 0  # bpf_arena_alloc_pages returned a page
        assert _u64(obj.read_variable("seed")) == SEED  # the initialised global
        assert _u64(obj.read_variable("result")) == SEED + 1
        page = page_size()
        alloc_off = _u64(obj.read_variable("alloc_off"))
        globals_pages = -(-obj.spec.map("arena").data_size // page)
        # the globals' pages were all made present, so the allocator skipped them ...
        assert alloc_off % page == 0 and globals_pages * page <= alloc_off < ARENA_PAGES * page
        with obj.arena_mapping() as view:
            assert view.address == ARENA_BASE
            # ... and the store to the last zero-initialised element, on page 3, was kept
            assert _u64(view.read(16 + 8 * (ZEROS - 1), 8)) == SEED * 2
            assert _u64(view.read(alloc_off, 8)) == 0xABCD  # what the program stored there
            # while mapped here, another mapping of the same fixed address is refused
            with pytest.raises(LoadError, match="cannot mmap"):
                obj.arena_mapping()
        obj.write_variable("seed", (7).to_bytes(8, "little"))
        assert prog_test_run(obj.programs["arena_run"].fd, ctx_in=b"").retval == 0
        assert _u64(obj.read_variable("result")) == 8


@pytest.mark.root
def test_two_loads_of_one_fixed_address_arena(bpffs: Path, arena_allowed: None) -> None:
    """A switch loads the new scheduler while the old one runs: two arenas at the same
    ``map_extra`` address must coexist (the loader unmaps each once its globals are set)."""
    spec = _spec()
    registry = KernelBtfRegistry()
    targets = registry.targets(spec.kmod_btfs)
    with (
        load_object(spec, targets, pin_root=bpffs) as first,
        load_object(spec, targets, pin_root=bpffs) as second,
    ):
        for obj in (first, second):
            assert prog_test_run(obj.programs["arena_run"].fd, ctx_in=b"").retval == 0
        second.write_variable("seed", (100).to_bytes(8, "little"))
        assert prog_test_run(second.programs["arena_run"].fd, ctx_in=b"").retval == 0
        assert _u64(first.read_variable("result")) == SEED + 1
        assert _u64(second.read_variable("result")) == 101
