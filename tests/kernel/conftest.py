"""Fixtures for tests that run real ``bpf(2)`` commands on the host kernel (root only):
bpffs and cgroup v2 mounts, the kernel BTF registry."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedswitchd.kernel.btf.registry import KernelBtfRegistry

BPF_FS_MAGIC = 0xCAFE4A11


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
