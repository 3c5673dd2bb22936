"""What a test does when a build output it reads (``make test-objects`` / ``make
schedulers`` build them into ``build/``) or the sid kernel cache (``make kernel``) is missing.

Under ``make test`` (the whole suite, CI; it sets ``SCHEDSWITCHD_FULL_SUITE=1`` after
building everything) a missing output FAILS the test: the suite must not pass without
having run it. Anywhere else (``make unit``, a plain ``pytest`` on a fresh clone) the test
skips and says which make target builds the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

from tools.sidkernel import SidKernel, cached_kernel, ensure_kernel

FULL_SUITE_ENV = "SCHEDSWITCHD_FULL_SUITE"
#: Where ``make test-objects`` builds tests/bpf/*.bpf.c.
TEST_OBJECT_DIR = Path(__file__).resolve().parents[1] / "build" / "tests" / "bpf"


def full_suite() -> bool:
    """True when running as ``make test`` / ``make pytest`` (every build output required)."""
    return os.environ.get(FULL_SUITE_ENV) == "1"


def missing_build_output(path: Path | str, target: str = "test-objects") -> NoReturn:
    """Fail (full suite) or skip (otherwise) a test that needs ``path``."""
    message = f"{path} is missing: run `make {target}` (or `make test`)"
    if full_suite():
        pytest.fail(message)
    pytest.skip(message)


def built_object(name: str) -> Path:
    """``build/tests/bpf/NAME.bpf.o`` (from ``tests/bpf/NAME.bpf.c``); fails or skips the
    test when it has not been built (:func:`missing_build_output`)."""
    path = TEST_OBJECT_DIR / f"{name}.bpf.o"
    if not path.is_file():
        missing_build_output(path, "test-objects")
    return path


def sid_kernel() -> SidKernel:
    """The cached Debian sid kernel (``make kernel``) for host tests that read its BTF or
    modules: under the full suite :func:`tools.sidkernel.ensure_kernel` (downloading it if
    needed); elsewhere only an existing cache, else the test skips (no download)."""
    if full_suite():
        return ensure_kernel()
    kernel = cached_kernel()
    if kernel is None:
        pytest.skip("no cached sid kernel: run `make kernel` (or `make test`)")
    return kernel
