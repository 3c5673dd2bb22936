"""bench/vm_bench.py's description of the interpreter a VM report was measured on, and
the command line a report shows."""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

LIBC = "7f0000000000-7f0000001000 r--p 00000000 08:01 12 /usr/lib/libc.so.6\n"
LIBPYTHON = "7f0000002000-7f0000003000 r-xp 00000000 08:01 13 /opt/py/lib/libpython3.11.so.1.0\n"


@pytest.fixture
def vm_bench(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("vm_bench")


def test_a_mapped_libpython_is_named(vm_bench: ModuleType) -> None:
    text = vm_bench.describe_interpreter("CPython", "3.11.7", "/opt/py/bin/python3.11", LIBPYTHON)
    assert text == "CPython 3.11.7 (built outside /usr, interpreter in libpython3.11.so.1.0)"


def test_an_interpreter_in_its_executable(vm_bench: ModuleType) -> None:
    text = vm_bench.describe_interpreter("CPython", "3.11.2", "/usr/bin/python3.11", LIBC)
    assert text == "CPython 3.11.2 (/usr/bin/python3.11, interpreter in the executable)"


def test_the_interpreter_described_is_the_one_run(vm_bench: ModuleType) -> None:
    # Another process of this test's interpreter says what it is: its version, and
    # whether it runs from a libpython as this process does.
    shared = any(
        line.rsplit("/", 1)[-1].startswith("libpython")
        for line in Path("/proc/self/maps").read_text().splitlines()
    )
    text = vm_bench.interpreter(Path(sys.executable))
    assert text.startswith(f"{platform.python_implementation()} {platform.python_version()} (")
    assert ("interpreter in libpython" in text) == shared, text
    assert vm_bench.interpreter(Path("/nonexistent/python")).startswith("interpreter unknown (")


def test_a_vm_report_names_the_venvs_interpreter(
    vm_bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Path] = []

    def describe(python: Path = vm_bench.VENV_PYTHON) -> str:
        asked.append(python)
        return "CPython 9.9 (here)"

    monkeypatch.setattr(vm_bench, "interpreter", describe)
    result = SimpleNamespace(accel="tcg", ramroot={"memory_mib": 2304})
    text = vm_bench.machine(result, SimpleNamespace(version="7.2"))
    assert text.endswith("; CPython 9.9 (here)") and "kernel 7.2" in text
    assert asked == [vm_bench.REPO / ".venv" / "bin" / "python"]


def test_produced_by_line_leaves_out_the_output_directory(vm_bench: ModuleType) -> None:
    argv = ["--configs", "default", "--out", "/some/tmp/dir", "--switches", "8"]
    assert vm_bench.argv_without_out(argv) == "--configs default --switches 8"
    assert vm_bench.argv_without_out(["--out=/x", "--switches", "4"]) == "--switches 4"
