"""Fixtures of the daemon's tests (the suite's ``start_server`` and ``srv``, ``bpffs`` and
``registry``: tests/conftest.py)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.bpf.conftest import BPF_BUILD_DIR
from tests.build_outputs import missing_build_output
from tests.daemon.harness import FakeTimer, Running
from tests.kernel.unique_ops import unique_object


@pytest.fixture
def timed(start_server: Callable[..., Running]) -> Running:
    """A server whose timeouts and TTLs run on a :class:`FakeTimer` (read timeout 0.3 s,
    idle timeout 0.4 s): tests move time instead of sleeping through it."""
    return start_server(timer=FakeTimer(), read_timeout=0.3, idle_timeout=0.4)


@pytest.fixture(scope="session")
def bpf_object() -> Callable[[str], Path]:
    """``bpf_object("uei")`` -> a copy of ``build/tests/bpf/uei.bpf.o`` (built by ``make
    test``) whose congestion controls carry this process's names (:data:`UEI`, ...:
    tests/kernel/unique_ops.py), so that a suite running beside this one registers others."""

    def find(name: str) -> Path:
        obj = BPF_BUILD_DIR / f"{name}.bpf.o"
        if not obj.is_file():
            missing_build_output(obj, "test-objects")
        return unique_object(obj)

    return find


@pytest.fixture
def scx_root(tmp_path: Path) -> Path:
    """A directory shaped like /sys/kernel/sched_ext with no scheduler attached."""
    root = tmp_path / "sched_ext"
    root.mkdir()
    for name, text in {
        "state": "disabled",
        "switch_all": "0",
        "nr_rejected": "0",
        "hotplug_seq": "7",
        "enable_seq": "3",
    }.items():
        (root / name).write_text(text + "\n")
    return root


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A fresh temporary directory for a service process's files (removed afterwards)."""
    path = Path(tempfile.mkdtemp(prefix="ssd-svc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
