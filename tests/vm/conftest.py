"""Fixtures for tests that run inside the sched_ext VM (marker ``vm``).

One boot per test module: a module declares its checks as named shell steps

    pytestmark = pytest.mark.vm
    VM_PRELUDE = "..."        # optional, runs once before the steps (insmod, setup)
    VM_COMMON = "..."         # optional, sourced by every step (shell functions)
    VM_STEPS = {"state": "cat /sys/kernel/sched_ext/state", ...}
    VM_TIMEOUT = 240          # optional, seconds for the whole boot
    VM_INPUTS = {...}         # optional: files put in $RESULTS
    VM_SHARE = [...]          # optional: host paths under /tmp the steps read (run_in_vm)

and each test asserts on ``vm_steps.step("state")``. VM_STEPS, VM_PRELUDE, VM_COMMON,
VM_INPUTS and VM_SHARE may also be functions ``(kernel: SidKernel, sched_dir: Path) ->
value``, called once when the module's VM boots. Other tests call ``vm_run(script)`` for a
boot of their own. When qemu or the kernel cannot be obtained these fixtures FAIL (never
skip): `make test` must not pass without having run the VM.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tools import vm
from tools.sidkernel import SidKernel, ensure_kernel

REPO = Path(__file__).resolve().parents[2]
SCHED_DIR = REPO / "build" / "bpf"


@pytest.fixture(scope="session")
def sid_kernel() -> SidKernel:
    """The cached Debian sid kernel; fails the test when it cannot be obtained."""
    if shutil.which(vm.QEMU) is None:
        pytest.fail(f"{vm.QEMU} is not installed (Debian package qemu-system-x86; `make deps`)")
    try:
        return ensure_kernel()
    except Exception as e:  # any failure here means the VM tests cannot run: say why
        pytest.fail(f"cannot obtain the sched_ext kernel for the VM: {type(e).__name__}: {e}")


@pytest.fixture(scope="session")
def vm_run(sid_kernel: SidKernel) -> Callable[..., vm.VmResult]:
    """``vm_run(script, **kwargs) -> VmResult``: one boot running ``script`` (see
    :func:`tools.vm.run_in_vm` for the keyword arguments)."""

    def run(script: str, **kwargs: Any) -> vm.VmResult:
        return vm.run_in_vm(script, kernel=sid_kernel, **kwargs)

    return run


@pytest.fixture(scope="session")
def sched_objects() -> Path:
    """``build/bpf`` with the sample schedulers built (``make schedulers``, a no-op when
    they are up to date)."""
    proc = subprocess.run(
        ["make", "-s", "schedulers"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"make schedulers failed:\n{proc.stdout}\n{proc.stderr}")
    return SCHED_DIR


@pytest.fixture(scope="module")
def vm_steps(
    request: pytest.FixtureRequest, sid_kernel: SidKernel, sched_objects: Path
) -> vm.StepsResult:
    """The test module's ``VM_STEPS`` run in one boot (see the module docstring)."""
    module = request.module

    def declared(name: str, default: Any) -> Any:
        value = getattr(module, name, default)
        return value(sid_kernel, sched_objects) if callable(value) else value

    steps: Mapping[str, str] = declared("VM_STEPS", None)
    if not steps:
        pytest.fail(f"{module.__name__} uses vm_steps but declares no VM_STEPS")
    result = vm.run_steps(
        steps,
        prelude=declared("VM_PRELUDE", ""),
        common=declared("VM_COMMON", ""),
        step_timeout=getattr(module, "VM_STEP_TIMEOUT", 120),
        kernel=sid_kernel,
        timeout=getattr(module, "VM_TIMEOUT", 240),
        inputs=declared("VM_INPUTS", None),
        share=declared("VM_SHARE", ()),
    )
    if not result.steps:
        pytest.fail(f"no step of {module.__name__} ran in the VM\n{result.vm.tail()}")
    return result
