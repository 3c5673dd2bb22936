"""The ramroot's file list (tools/ramroot.py), computed on the host: symlinks, skipped trees,
the venv's runtime distributions only, ldd closure, and an archive that busybox unpacks into
a root where the venv python imports the package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.build_outputs import missing_build_output
from tools import vm
from tools.ramroot import Manifest as RamManifest
from tools.ramroot import (
    RamRootError,
    RamRootSpec,
    compute_manifest,
    ldd_closure,
    python_probe,
    write_archive,
)

REPO = Path(__file__).resolve().parents[2]
VENV_PY = REPO / ".venv" / "bin" / "python"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


@pytest.fixture(scope="module")
def manifest() -> RamManifest:
    return compute_manifest(RamRootSpec())


def test_symlinks_in_directories_and_at_the_end(tmp_path: Path) -> None:
    (tmp_path / "usr" / "lib").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "real.so.1.2").write_bytes(b"x" * 10)
    (tmp_path / "usr" / "lib" / "real.so.1").symlink_to("real.so.1.2")
    (tmp_path / "lib").symlink_to("usr/lib")  # a directory link, relative
    (tmp_path / "opt").mkdir()
    (tmp_path / "opt" / "up").symlink_to("../lib/real.so.1")  # ".." through a link
    man = RamManifest()
    man.add(tmp_path / "opt" / "up")
    real = str(tmp_path / "usr" / "lib" / "real.so.1.2")
    assert man.files == {real}
    assert man.total_bytes == 10
    assert man.links == {
        str(tmp_path / "opt" / "up"): "../lib/real.so.1",
        str(tmp_path / "lib"): "usr/lib",
        str(tmp_path / "usr" / "lib" / "real.so.1"): "real.so.1.2",
    }
    man.add(tmp_path / "lib" / "real.so.1.2")  # same file by another way: stored once
    assert man.files == {real} and man.total_bytes == 10


def test_loops_missing_paths_and_directories_are_errors(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    man = RamManifest()
    with pytest.raises(RamRootError, match="too many symlinks"):
        man.add(tmp_path / "a")
    with pytest.raises(RamRootError, match="does not exist"):
        man.add(tmp_path / "nothing")
    with pytest.raises(RamRootError, match="not a regular file"):
        man.add(tmp_path)


def test_tree_skips_and_pycache_filter(tmp_path: Path) -> None:
    tag = sys.implementation.cache_tag
    for rel in ("keep.py", "test/t.py", "pkg/m.py", f"pkg/__pycache__/m.{tag}.pyc",
                f"pkg/__pycache__/m.{tag}.opt-1.pyc", "pkg/__pycache__/m.cpython-39.pyc",
                "_tkinter.so"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    man = RamManifest()
    import re

    man.add_tree(tmp_path, skip={"test"}, skip_files=re.compile("^_tkinter"))
    got = {os.path.relpath(f, tmp_path) for f in man.files}
    assert got == {"keep.py", "pkg/m.py", f"pkg/__pycache__/m.{tag}.pyc"}


def test_probe_lists_runtime_requirements_only() -> None:
    info = python_probe(VENV_PY, ["schedswitchd"])
    dists = info["distributions"]
    assert isinstance(dists, list)
    for needed in ("schedswitchd", "pydantic", "pydantic-core", "pyelftools", "pyroute2",
                   "systemd-python", "typing-extensions"):  # fmt: skip
        assert needed in dists
    for extra in ("matplotlib", "numpy", "pytest", "mypy", "ruff", "hypothesis"):
        assert extra not in dists
    with pytest.raises(RamRootError, match="not installed"):
        python_probe(VENV_PY, ["no-such-distribution-here"])


def test_manifest_has_what_the_bench_runs(manifest: RamManifest) -> None:
    if not (REPO / "build" / "bpf" / "latency.bpf.o").is_file():
        missing_build_output(REPO / "build" / "bpf" / "latency.bpf.o", "schedulers")
    files = manifest.files
    real_py = os.path.realpath(VENV_PY)
    assert real_py in files
    assert str(VENV_PY) in manifest.links  # the venv's python -> python3 -> ... chain
    assert str(REPO / ".venv" / "pyvenv.cfg") in files
    assert str(REPO / "schedswitchd" / "daemon" / "service.py") in files
    assert str(REPO / "bench" / "switch_latency.py") in files
    assert str(REPO / "build" / "bpf" / "latency.bpf.o") in files
    assert os.path.realpath(shutil.which("bpftool") or "") in files
    assert os.path.realpath("/etc/ld.so.cache") in files
    import pydantic_core

    assert os.path.realpath(pydantic_core._pydantic_core.__file__) in files
    # Every library the interpreter and bpftool need is in (ldd's closure).
    for lib in ldd_closure([real_py, os.path.realpath(shutil.which("bpftool") or "")]):
        assert os.path.realpath(lib) in files, lib
    import os as os_mod

    stdlib = os.path.dirname(os_mod.__file__)
    assert os.path.join(stdlib, "json", "decoder.py") in files


def test_manifest_leaves_out_bench_extras_and_dev_trees(manifest: RamManifest) -> None:
    stdlib = os.path.dirname(os.__file__)
    site = os.path.join(REPO, ".venv", "lib")
    for f in manifest.files:
        assert not f.startswith(os.path.join(stdlib, "test") + "/"), f
        assert not f.startswith(os.path.join(stdlib, "idlelib") + "/"), f
        assert "/site-packages/matplotlib/" not in f and "/site-packages/numpy" not in f, f
        assert "/site-packages/_pytest/" not in f and "/site-packages/mypy/" not in f, f
        assert "_tkinter" not in os.path.basename(f), f
        assert ".opt-1.pyc" not in f and "/bench/results/" not in f, f
    assert any(f.startswith(site) for f in manifest.files)
    assert manifest.total_bytes < 400 << 20  # well under the VM's spare memory


def test_extra_files_and_missing_things(tmp_path: Path) -> None:
    ko = tmp_path / "m.ko"
    ko.write_bytes(b"\x7fELF")
    man = compute_manifest(RamRootSpec(extra_files=(ko,), repo_paths=()))
    assert str(ko) in man.files
    with pytest.raises(RamRootError, match="no-such-tool"):
        compute_manifest(RamRootSpec(executables=("no-such-tool",)))
    with pytest.raises(RamRootError, match="could not describe"):
        compute_manifest(RamRootSpec(python=tmp_path / "nopython"))


def test_archive_unpacks_with_busybox_and_the_venv_runs_there(
    manifest: RamManifest, tmp_path: Path
) -> None:
    """The VM's init unpacks with busybox tar and chroots: do the same on the host."""
    if os.geteuid() != 0:
        pytest.fail("needs root (chroot)")
    results = tmp_path / "results"
    (results / ".vm").mkdir(parents=True)
    (results / ".vm" / "script").write_text("echo hi\n")
    archive = tmp_path / "root.tar"
    size = write_archive(manifest, archive, extra={vm.RESULTS_IN_VM: results})
    assert size >= manifest.total_bytes
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert vm.RESULTS_IN_VM.lstrip("/") + "/.vm/script" in names
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["busybox", "tar", "-xf", str(archive), "-C", str(root)], check=True)
    assert (root / vm.RESULTS_IN_VM.lstrip("/") / ".vm" / "script").read_text() == "echo hi\n"
    proc = subprocess.run(
        [CHROOT, str(root), str(VENV_PY), "-c",
         "import sys, schedswitchd.daemon.service, schedswitchd.kernel.loader, pydantic, "
         "systemd.journal; print(schedswitchd.__file__)"],
        capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(REPO / "schedswitchd" / "__init__.py")
    proc = subprocess.run(
        [CHROOT, str(root), "/bin/bash", "-c", "bpftool version && insmod --version"],
        capture_output=True, text=True, check=False, env={"PATH": "/usr/sbin:/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "libbpf" in proc.stdout


def test_ramroot_stats_from_the_console() -> None:
    console = (
        "[    9.1] something\n"
        f"{vm.RAMROOT_STATS_MARK} tmpfs_kib=111520 unpack_start_s=3.00 unpack_end_s=10.53 "
        "mem_available_kib=2040176 btf=vmlinux,\n"
    )
    stats = vm.ramroot_stats(console)
    assert stats is not None
    assert stats["tmpfs_kib"] == 111520
    assert stats["unpack_s"] == pytest.approx(7.53)
    assert stats["module_btfs"] == 0
    left = console.replace("btf=vmlinux,", "btf=9p,netfs,vmlinux,")
    assert (vm.ramroot_stats(left) or {})["module_btfs"] == 2
    assert vm.ramroot_stats("no such line") is None
