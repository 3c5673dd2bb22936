"""Fixtures for the BPF object tests: where ``make test-objects`` puts the compiled
``tests/bpf/*.bpf.c`` objects (``build/tests/bpf/*.bpf.o``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.build_outputs import missing_build_output

REPO = Path(__file__).resolve().parents[2]
BPF_SRC_DIR = REPO / "tests" / "bpf"
BPF_BUILD_DIR = REPO / "build" / "tests" / "bpf"


@pytest.fixture(scope="session")
def bpf_build_dir() -> Path:
    """The directory holding the compiled test objects."""
    return BPF_BUILD_DIR


@pytest.fixture(scope="session")
def bpf_object() -> Callable[[str], Path]:
    """``bpf_object("maps")`` -> path of ``build/tests/bpf/maps.bpf.o``.

    A missing object fails the test under ``make test`` (which builds every object first)
    and skips it elsewhere (:func:`tests.build_outputs.missing_build_output`). Staleness is
    left to make: a rebase touches sources without changing them, so comparing mtimes here
    would fail for no reason.
    """

    def find(name: str) -> Path:
        obj = BPF_BUILD_DIR / f"{name}.bpf.o"
        if not obj.is_file():
            missing_build_output(obj, "test-objects")
        return obj

    return find
