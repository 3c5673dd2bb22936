"""Opening an object frees the file's bytes at once, not at the next cyclic GC pass (the warm
daemon opens each scheduler's ~0.9 MiB object once and keeps only the spec)."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object


@pytest.fixture
def no_gc() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def test_open_keeps_no_copy_of_the_file(bpf_object: Callable[[str], Path], no_gc: None) -> None:
    path = bpf_object("core_kinds")  # the largest test object (DWARF included)
    data = path.read_bytes()
    assert len(data) > 256 << 10
    open_object(data, name="warm")  # imports and first-use caches
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        copy = bytes(bytearray(data))  # a private copy, traced, that should be freed
        spec = open_object(copy, name="core_kinds")
        del copy
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert spec.name == "core_kinds"
    assert kept < len(data) // 2, f"{kept} bytes kept after opening a {len(data)}-byte object"
