"""The sched_ext VM boots and gives a script what the harness promises (one boot)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from tests.build_outputs import built_object
from tools import vm
from tools.sidkernel import SidKernel

pytestmark = pytest.mark.vm

# Small modules that need no hardware, with dependencies (crc and crypto helpers).
MODULES = ["uinput", "tcp_bbr", "btrfs", "nfsv4", "ceph", "dm_crypt", "wireguard"]

#: A host directory under the guest's tmpfs ``/tmp``, as a clone's ``../shared`` under /tmp
#: is: a scheduler object copied there (by ``_hidden_corpus``) reaches the guest only through
#: run_in_vm's ``share``.
HIDDEN = Path(vm.GUEST_TMPFS[0]) / f"schedswitchd-vm-share-{os.getpid()}"
HIDDEN_OBJECT = HIDDEN / "corpus" / "fifo.bpf.o"
VM_SHARE = [HIDDEN]


@pytest.fixture(scope="module", autouse=True)
def _hidden_corpus(sched_objects: Path) -> Iterator[None]:
    """``HIDDEN_OBJECT`` exists on the host while the module's VM boots (autouse: before)."""
    HIDDEN_OBJECT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sched_objects / "fifo.bpf.o", HIDDEN_OBJECT)
    yield
    shutil.rmtree(HIDDEN, ignore_errors=True)


def _program_names(path: Path | str) -> str:
    return " ".join(sorted(p.name for p in open_object(path).programs))


def VM_INPUTS(kernel: SidKernel, sched_dir: Path) -> dict[str, bytes | str]:
    return {"insmod.sh": vm.insmod_script(kernel, MODULES, strict=True)}


VM_PRELUDE = 'bash "$RESULTS/insmod.sh"'

VM_STEPS = {
    "state": "cat /sys/kernel/sched_ext/state",
    "kernel": 'uname -r; echo "$KVER"; '
    'grep -x CONFIG_SCHED_CLASS_EXT=y "$KMOD_ROOT/lib/modules/$KVER/config"',
    "root_is_readonly": "touch /etc/schedswitchd-vm-probe",
    "results": 'mkdir -p "$RESULTS/out" && printf "from the VM\\n" > "$RESULTS/out/hello.txt"',
    "no_network": "ls /sys/class/net",
    "exit_status": "echo before; exit 7",
    "modules": "for m in " + " ".join(MODULES) + "; do "
    'test -d /sys/module/$m && test -f /sys/kernel/btf/$m && echo "ok $m"; done',
    "modprobe": 'modprobe -d "$KMOD_ROOT" isofs && test -f /sys/kernel/btf/isofs && echo loaded',
    "bpffs": "mount | grep -c ' /sys/fs/bpf type bpf'",
    # a host path under /tmp, which the guest's tmpfs hides unless run_in_vm binds it back
    "hidden_host_path": f'cd "$REPO" && PYTHONPATH="$REPO" "$PY" - {HIDDEN_OBJECT} <<\'EOF\'\n'
    "import sys\n"
    "from schedswitchd.bpf.object import open_object\n"
    'print(" ".join(sorted(p.name for p in open_object(sys.argv[1]).programs)))\n'
    f"EOF\ntouch {HIDDEN}/written",
    # .kconfig externs read the VM kernel's config where a device keeps it (tools/vm.py puts
    # the cached package's config at /boot/config-$(uname -r)): our loader, the kconfig
    # test object, CONFIG_HZ as the file says
    "kconfig": 'grep -E "^CONFIG_HZ=" "/boot/config-$(uname -r)"; cd "$REPO" && '
    'PYTHONPATH="$REPO" "$PY" - <<\'EOF\'\n'
    "import struct\n"
    "from schedswitchd.bpf.object import open_object\n"
    "from schedswitchd.kernel.btf.registry import KernelBtfRegistry\n"
    "from schedswitchd.kernel.kconfig import read_kernel_config\n"
    "from schedswitchd.kernel.loader import load_object\n"
    'print("source", read_kernel_config().source)\n'
    'spec = open_object("build/tests/bpf/kconfig.bpf.o")\n'
    "reg = KernelBtfRegistry()\n"
    "with load_object(spec, reg.targets(spec.kmod_btfs)) as obj:\n"
    '    print("hz", struct.unpack("<i", obj.read_variable("CONFIG_HZ"))[0])\n'
    "EOF",
}


def test_sched_ext_is_there_and_disabled(vm_steps: vm.StepsResult) -> None:
    assert vm_steps.step("state").check().output.strip() == "disabled"


def test_runs_the_cached_kernel(vm_steps: vm.StepsResult, sid_kernel: SidKernel) -> None:
    lines = vm_steps.step("kernel").check().output.split()
    assert lines[:2] == [sid_kernel.version, sid_kernel.version]
    assert lines[2] == "CONFIG_SCHED_CLASS_EXT=y"


def test_host_root_is_read_only(vm_steps: vm.StepsResult) -> None:
    step = vm_steps.step("root_is_readonly")
    assert step.returncode != 0
    assert "Read-only file system" in step.output


def test_results_come_back(vm_steps: vm.StepsResult) -> None:
    vm_steps.step("results").check()
    assert vm_steps.vm.files["out/hello.txt"] == b"from the VM\n"


def test_no_network_device(vm_steps: vm.StepsResult) -> None:
    assert vm_steps.step("no_network").check().output.split() == ["lo"]


def test_step_exit_status_and_output(vm_steps: vm.StepsResult) -> None:
    step = vm_steps.step("exit_status")
    assert (step.returncode, step.output) == (7, "before\n")
    with pytest.raises(vm.VmError, match="exited 7"):
        step.check()


def test_insmod_in_dependency_order(vm_steps: vm.StepsResult) -> None:
    assert "insmod: " in vm_steps.vm.text("steps/_prelude.out")
    out = vm_steps.step("modules").check().output.split("\n")
    assert [line for line in out if line] == [f"ok {m}" for m in MODULES]


def test_modprobe_from_the_cache(vm_steps: vm.StepsResult) -> None:
    assert vm_steps.step("modprobe").check().output.strip() == "loaded"


def test_bpffs_mounted(vm_steps: vm.StepsResult) -> None:
    assert vm_steps.step("bpffs").check().output.strip() == "1"


def test_host_paths_under_tmp_reach_the_guest_read_only(vm_steps: vm.StepsResult) -> None:
    """An object in a host directory under ``/tmp`` (hidden by the guest's tmpfs there) that
    run_in_vm was asked to share opens in the guest as on the host, and stays read-only."""
    step = vm_steps.step("hidden_host_path")
    lines = step.output.splitlines()
    assert lines[0] == _program_names(HIDDEN_OBJECT), step.output
    assert "Read-only file system" in lines[-1], step.output
    assert not (HIDDEN / "written").exists()


def test_kconfig_where_a_device_keeps_it(vm_steps: vm.StepsResult, sid_kernel: SidKernel) -> None:
    """The VM's kernel config is at ``/boot/config-<release>``, our loader's kconfig reader
    takes it from there, and a ``__kconfig`` extern gets the file's value."""
    built_object("kconfig")  # the step opens it: skips (fails under make test) without it
    lines = vm_steps.step("kconfig").check().output.split("\n")
    want = next(
        line for line in sid_kernel.config.read_text().splitlines() if line.startswith("CONFIG_HZ=")
    )
    assert lines[0] == want
    assert lines[1] == f"source /boot/config-{sid_kernel.version}"
    assert lines[2] == f"hz {want.split('=')[1]}"


def test_unknown_step_is_a_clear_error(vm_steps: vm.StepsResult) -> None:
    with pytest.raises(vm.VmError, match="did not finish"):
        vm_steps.step("never-declared")
