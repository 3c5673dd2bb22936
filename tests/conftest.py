"""Hooks and fixtures of the whole suite: tests marked ``root`` need root and the host
kernel's BTF; a daemon on a fake backend for the tests of daemon/, cli/ and desktop/; BPF
objects compiled from a test's own C source; bpffs and cgroup v2 directories and the kernel
BTF registry for the tests that run real ``bpf(2)`` commands (kernel/, daemon/).

Here, not in a subdirectory's conftest, so that ``pytest tests/daemon/test_x.py`` run as a
normal user skips them as ``pytest`` of the whole tree does. Under ``make test``
(:func:`tests.build_outputs.full_suite`) they fail instead, with the same reason: the suite
must not pass without having run them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from tests.build_outputs import full_suite

if TYPE_CHECKING:
    from tests.daemon.harness import Running

#: Why a ``root`` test cannot run here.
ROOT_REASON = "needs root and a kernel with BTF (/sys/kernel/btf/vmlinux)"


def root_available() -> bool:
    """Whether ``root`` tests can run: effective uid 0 and the running kernel's BTF."""
    return os.geteuid() == 0 and os.path.exists("/sys/kernel/btf/vmlinux")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (or, under the full suite, fail) a ``root`` test that cannot run here."""
    if item.get_closest_marker("root") is None or root_available():
        return
    if full_suite():
        pytest.fail(ROOT_REASON, pytrace=False)
    pytest.skip(ROOT_REASON)


#: ``prctl(2)``'s ``PR_SET_THP_DISABLE`` (``linux/prctl.h``).
PR_SET_THP_DISABLE = 41


def _thp_disabled() -> bool:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    return "THP_enabled:\t0" in status


@pytest.fixture(autouse=True)
def _process_thp_as_it_was() -> Iterator[None]:
    """Give THP back to this process after a test whose code took it away: tests that call
    ``service.main`` on its serving path in-process (its config then refused) run the
    daemon's process-wide THP opt-out, which the child processes of every later test in
    this worker would inherit (test_memory_tuning reads a child's ``THP_enabled``)."""
    yield
    if _thp_disabled():
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0)


@pytest.fixture
def start_server() -> Iterator[Callable[..., Running]]:
    """``start_server(backend=None, **options)``: a :class:`~tests.daemon.harness.Running`
    server (arguments as ``Running`` takes them: a new ``FakeBackend`` unless given), each
    stopped after the test. The harness is imported here, not at the top, so that a run of
    tests that start no daemon (the VM's, the BPF floor's) does not import it."""
    from tests.daemon.harness import Running

    started: list[Running] = []

    def start(*args: Any, **options: Any) -> Running:
        running = Running(*args, **options)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


@pytest.fixture
def srv(start_server: Callable[..., Running]) -> Running:
    """A running server on a fresh ``FakeBackend``, every option at its default."""
    return start_server()


@pytest.fixture(scope="session")
def compile_bpf(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """``compile_bpf(source, name)`` -> ``NAME.bpf.o`` built from the C text ``source`` by
    ``clang -O2 -g -target bpf`` in a new temporary directory (for objects a test writes
    itself; the Makefile builds tests/bpf/). Skips the test when clang is not installed."""

    def build(source: str, name: str) -> Path:
        clang = shutil.which("clang")
        if clang is None:
            pytest.skip("clang not installed")
        tmp = tmp_path_factory.mktemp(name)
        src = tmp / f"{name}.bpf.c"
        src.write_text(source)
        out = tmp / f"{name}.bpf.o"
        subprocess.run(
            [clang, "-O2", "-g", "-target", "bpf", "-c", str(src), "-o", str(out)], check=True
        )
        return out

    return build


def _mounts() -> list[tuple[str, str]]:
    """(mount point, fs type) from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            out.append((left.split()[4], right.split()[0]))
    return out


@pytest.fixture
def bpffs() -> Iterator[Path]:
    """A fresh directory on a bpf filesystem: a subdirectory of /sys/fs/bpf when that is
    bpffs, else a private bpffs mounted on a temporary directory (unmounted afterwards)."""
    mounted: str | None = None
    if ("/sys/fs/bpf", "bpf") in _mounts():
        base = Path("/sys/fs/bpf")
    else:
        mounted = tempfile.mkdtemp(prefix="schedswitchd-bpffs-")
        subprocess.run(["mount", "-t", "bpf", "bpf", mounted], check=True)
        base = Path(mounted)
    d = base / f"schedswitchd-test-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
        if mounted:
            subprocess.run(["umount", mounted], check=True)
            os.rmdir(mounted)


@pytest.fixture
def cgroup2_dir() -> Iterator[Path]:
    """A new empty cgroup v2 directory (removed afterwards); skips without cgroup2."""
    roots = [mp for mp, fs in _mounts() if fs == "cgroup2"]
    if not roots:
        pytest.skip("no cgroup2 mount")
    d = Path(roots[0]) / f"schedswitchd-test-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    try:
        yield d
    finally:
        d.rmdir()


@pytest.fixture(scope="module")
def registry() -> KernelBtfRegistry:
    """The running kernel's BTF registry (``/sys/kernel/btf``), one per test module: the
    module BTFs a module's tests open stay cached across them, as in the daemon."""
    return KernelBtfRegistry()
