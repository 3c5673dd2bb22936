"""SpecCache: hits for an unchanged file, a fresh open after the file changes, LRU bound."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf.spec_cache import SpecCache
from schedswitchd.errors import ObjectError


def test_cache_hits_and_invalidation(bpf_object: Callable[[str], Path], tmp_path: Path) -> None:
    path = tmp_path / "x.bpf.o"
    shutil.copy(bpf_object("globals"), path)
    cache = SpecCache(capacity=2)
    a = cache.open(path)
    assert cache.open(path) is a and (cache.hits, cache.misses) == (1, 1)
    shutil.copy(bpf_object("maps"), path)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    b = cache.open(path)
    assert b is not a and b.map("counts").max_entries == 128 and len(cache) == 1
    for name in ("subprogs", "kconfig"):
        cache.open(bpf_object(name))
    assert len(cache) == 2
    with pytest.raises(ObjectError, match="cannot read"):
        cache.open(tmp_path / "missing.o")
