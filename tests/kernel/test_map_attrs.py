"""Map attributes in the encodings libbpf reads (``parse_btf_map_def``), opened by our
object model and checked against the maps the host kernel creates from them
(``BPF_OBJ_GET_INFO_BY_FD``). Objects: build/tests/bpf/map_extra.bpf.o and
map_extra_bad.bpf.o (tests/bpf/map_extra*.bpf.c, tests/bpf/bpf_compat.h)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.errors import ObjectError
from schedswitchd.kernel import syscall as S
from schedswitchd.kernel.btf_registry import KernelBtfRegistry
from schedswitchd.kernel.loader import load_object

OBJ_DIR = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf"


def bpf_object(name: str) -> Path:
    path = OBJ_DIR / f"{name}.bpf.o"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make test-objects` (or `make test`)")
    return path


def test_ulong_map_extra_is_read_from_its_enum() -> None:
    spec = open_object(bpf_object("map_extra"))
    assert spec.map("bloom_ulong").map_extra == 5  # __ulong(map_extra, 5)
    assert spec.map("bloom_uint").map_extra == 2  # __uint(map_extra, 2)


def test_ulong_with_two_enumerators_is_refused() -> None:
    with pytest.raises(ObjectError, match="'map_extra' is an enum of 2 enumerators"):
        open_object(bpf_object("map_extra_bad"))


@pytest.mark.root
def test_ulong_map_extra_reaches_the_kernel(bpffs: Path) -> None:
    spec = open_object(bpf_object("map_extra"))
    registry = KernelBtfRegistry()
    with load_object(spec, registry.targets(spec.kmod_btfs), pin_root=bpffs) as obj:
        assert S.map_info(obj.maps["bloom_ulong"].fd).map_extra == 5
        assert S.map_info(obj.maps["bloom_uint"].fd).map_extra == 2
        run = S.prog_test_run(obj.programs["add_and_check"].fd, ctx_in=struct.pack("<Q", 77))
        assert run.retval == 1
