"""Map attributes in the encodings libbpf reads (``parse_btf_map_def``) and the adjustments
libbpf makes before creating a map (ring buffer sizes), opened by our object model and checked
against the maps the host kernel creates (``BPF_OBJ_GET_INFO_BY_FD``). Objects:
build/tests/bpf/{map_extra,map_extra_bad,ringbuf_sizes}.bpf.o (tests/bpf/*.bpf.c,
tests/bpf/bpf_compat.h)."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.errors import ObjectError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import load_object, ringbuf_size
from tests.build_outputs import built_object


def test_ulong_map_extra_is_read_from_its_enum() -> None:
    spec = open_object(built_object("map_extra"))
    assert spec.map("bloom_ulong").map_extra == 5  # __ulong(map_extra, 5)
    assert spec.map("bloom_uint").map_extra == 2  # __uint(map_extra, 2)


def test_ulong_with_two_enumerators_is_refused() -> None:
    with pytest.raises(ObjectError, match="'map_extra' is an enum of 2 enumerators"):
        open_object(built_object("map_extra_bad"))


@pytest.mark.root
def test_ulong_map_extra_reaches_the_kernel(bpffs: Path) -> None:
    spec = open_object(built_object("map_extra"))
    registry = KernelBtfRegistry()
    with load_object(spec, registry.targets(spec.kmod_btfs), pin_root=bpffs) as obj:
        assert syscall.map_info(obj.maps["bloom_ulong"].fd).map_extra == 5
        assert syscall.map_info(obj.maps["bloom_uint"].fd).map_extra == 2
        run = syscall.prog_test_run(obj.programs["add_and_check"].fd, ctx_in=struct.pack("<Q", 77))
        assert run.retval == 1


# --- ring buffer sizes (ringbuf_sizes.bpf.c) ---------------------------------------------------

RINGBUF_SIZES = {"odd": 2, "three_pages": 4, "one_page": 1, "from_user": 4}  # in pages


def test_ringbuf_size_rounds_up_to_power_of_2_pages() -> None:
    page = 4096
    assert [ringbuf_size(n, page) for n in (0, 1, page, page + 1, 3 * page, 8 * page)] == [
        0,
        page,
        page,
        2 * page,
        4 * page,
        8 * page,
    ]
    assert ringbuf_size((1 << 31) + 1, page) == (1 << 31) + 1  # no multiple below 2**32


@pytest.mark.root
def test_ringbuf_sizes_are_rounded_up_in_the_kernel(bpffs: Path) -> None:
    spec = open_object(built_object("ringbuf_sizes"))
    assert spec.map("odd").max_entries == 5000  # the spec keeps what the file says
    registry = KernelBtfRegistry()
    with load_object(spec, registry.targets(spec.kmod_btfs), pin_root=bpffs) as obj:
        for name, pages in RINGBUF_SIZES.items():
            assert syscall.map_info(obj.maps[name].fd).max_entries == pages * mmap.PAGESIZE, name
        run = syscall.prog_test_run(obj.programs["produce"].fd, ctx_in=struct.pack("<Q", 0))
        assert run.retval == 1  # a 6000-byte record fits the 8192 bytes, not 5000
