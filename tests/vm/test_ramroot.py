"""Ramroot mode of the VM harness: the script runs in a tmpfs root with no 9p and no module
loaded, its results still come back (one boot)."""

from __future__ import annotations

import pytest

from tools import vm
from tools.ramroot import RamRootSpec
from tools.sidkernel import SidKernel

pytestmark = pytest.mark.vm

SCRIPT = r"""
echo "btf: $(ls /sys/kernel/btf | tr '\n' ' ')"
echo "modules: $(wc -l < /proc/modules)"
echo "mounts: $(awk '{print $2 "=" $3}' /proc/mounts | tr '\n' ' ')"
"$PY" -c 'import os, sys, pydantic, schedswitchd.daemon.service, schedswitchd.kernel.loader
print("python:", os.path.realpath(sys.executable), schedswitchd.__file__)'
echo "python status: $?"
bpftool version | head -n 1
# netfs is also one of the 9p modules the init re-inserts afterwards to copy results out.
insmod "$UINPUT" && insmod "$NETFS" && echo "inserted"
echo "btf after: $(ls /sys/kernel/btf | tr '\n' ' ')"
echo "modules after: $(cut -d' ' -f1 /proc/modules | tr '\n' ' ')"
mkdir -p "$RESULTS/out" && echo "from the ramroot" > "$RESULTS/out/hello.txt"
"""


@pytest.fixture(scope="module")
def ramroot_run(sid_kernel: SidKernel) -> vm.VmResult:
    paths = sid_kernel.decompressed_paths()
    uinput, netfs = paths["uinput"], paths["netfs"]
    return vm.run_in_vm(
        SCRIPT,
        kernel=sid_kernel,
        timeout=240,
        env={"UINPUT": str(uinput), "NETFS": str(netfs)},
        ramroot=RamRootSpec(extra_files=(uinput, netfs)),
    ).check()


def _line(result: vm.VmResult, key: str) -> str:
    for line in result.output.splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {key!r} line in\n{result.output}")


def test_only_vmlinux_btf_and_no_module(ramroot_run: vm.VmResult) -> None:
    assert _line(ramroot_run, "btf") == "vmlinux"
    assert _line(ramroot_run, "modules") == "0"
    assert ramroot_run.ramroot is not None
    assert ramroot_run.ramroot["module_btfs"] == 0


def test_root_is_tmpfs_without_9p(ramroot_run: vm.VmResult) -> None:
    mounts = dict(m.split("=", 1) for m in _line(ramroot_run, "mounts").split())
    assert mounts["/"] == "tmpfs"
    assert "9p" not in mounts.values()


def test_python_and_the_package_run_from_the_tmpfs(
    ramroot_run: vm.VmResult, sid_kernel: SidKernel
) -> None:
    assert _line(ramroot_run, "python status") == "0"
    exe, pkg = _line(ramroot_run, "python").split()
    assert exe.startswith("/") and "python3" in exe
    assert pkg == str(vm.REPO / "schedswitchd" / "__init__.py")
    assert "bpftool v" in ramroot_run.output


def test_modules_inserted_by_the_script_are_the_only_ones(ramroot_run: vm.VmResult) -> None:
    assert "inserted" in ramroot_run.output
    assert _line(ramroot_run, "btf after") == "netfs uinput vmlinux"
    assert sorted(_line(ramroot_run, "modules after").split()) == ["netfs", "uinput"]


def test_results_come_back_out(ramroot_run: vm.VmResult) -> None:
    # Also when the script left one of the 9p modules (netfs) loaded.
    assert ramroot_run.files["out/hello.txt"] == b"from the ramroot\n"


def test_memory_and_figures(ramroot_run: vm.VmResult) -> None:
    stats = ramroot_run.ramroot
    assert stats is not None
    # The tmpfs holds about what the host packed; the VM got that much on top of 2 GiB.
    assert 0.8 * stats["tree_bytes"] < stats["tmpfs_kib"] * 1024 < 1.5 * stats["tree_bytes"]
    assert stats["memory_mib"] >= 2048 + stats["tree_bytes"] / 2**20
    assert stats["mem_available_kib"] > 1024 * 1024
