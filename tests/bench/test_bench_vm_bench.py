"""bench/vm_bench.py's description of the interpreter a VM report was measured on."""

from __future__ import annotations

import platform
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def vm_bench(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("vm_bench")


def test_interpreter_names_a_mapped_libpython(vm_bench: ModuleType, tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f0000000000-7f0000001000 r--p 00000000 08:01 12 /usr/lib/libc.so.6\n"
        "7f0000002000-7f0000003000 r-xp 00000000 08:01 13 /opt/py/lib/libpython3.11.so.1.0\n"
    )
    text = vm_bench.interpreter(maps)
    assert text.startswith(f"CPython {platform.python_version()} (")
    assert text.endswith(", interpreter in libpython3.11.so.1.0)")


def test_interpreter_in_the_executable(vm_bench: ModuleType, tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f0000000000-7f0000001000 r--p 00000000 08:01 12 /usr/lib/libc.so.6\n")
    assert vm_bench.interpreter(maps).endswith(", interpreter in the executable)")
    assert vm_bench.interpreter(tmp_path / "absent").endswith(", interpreter's library unknown)")


def test_interpreter_of_this_process_reads_its_own_maps(vm_bench: ModuleType) -> None:
    # The real /proc/self/maps: the test's interpreter is either kind, and says which.
    shared = any(
        line.rsplit("/", 1)[-1].startswith("libpython")
        for line in Path("/proc/self/maps").read_text().splitlines()
    )
    text = vm_bench.interpreter()
    assert ("interpreter in libpython" in text) == shared
    assert ("/usr/" in text) != ("built outside /usr" in text)
