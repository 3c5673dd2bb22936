"""run_in_vm's contract: exit status, output, inputs, result files, hard timeout, stalled boots
(4 boots)."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import pytest

from tools import vm

pytestmark = pytest.mark.vm


def test_script_status_output_and_files(vm_run: Callable[..., vm.VmResult]) -> None:
    result = vm_run(
        'cat "$RESULTS/in.txt"; echo "cwd=$(pwd) user=$(id -u)"; echo err >&2\n'
        'cp "$RESULTS/in.txt" "$RESULTS/copy.txt"; exit 3\n',
        inputs={"in.txt": "hello\n"},
        cwd="/usr",
        timeout=120,
    )
    assert result.returncode == 3
    assert not result.timed_out
    assert result.output == "hello\ncwd=/usr user=0\nerr\n"
    assert result.files["copy.txt"] == b"hello\n"
    assert vm.INIT_STARTED in result.console
    assert result.stalled_boots == 0
    assert result.log_dir is not None and (result.log_dir / "console.log").is_file()
    with pytest.raises(vm.VmError, match="exit status 3"):
        result.check()
    shutil.rmtree(result.log_dir)


def test_hard_timeout_keeps_the_console(vm_run: Callable[..., vm.VmResult]) -> None:
    # Generous: boot alone can take 20 s of wall time on a loaded 2-core host under TCG.
    result = vm_run("echo started; sleep 600", timeout=60)
    assert result.timed_out
    assert result.returncode is None
    assert result.elapsed_s < 75
    assert result.log_dir is not None
    assert (result.log_dir / "console.log").read_text(errors="replace") == result.console
    assert vm.READY_MARK in result.console  # it had booted; the script was what hung
    assert result.output == "started\n"
    shutil.rmtree(result.log_dir)


def test_a_boot_silent_before_init_is_retried_then_reported(
    vm_run: Callable[..., vm.VmResult],
) -> None:
    # `quiet` keeps the kernel silent until init starts (several seconds under TCG, forced
    # here: KVM might boot within the limit), which the stall rule cannot tell from a wedged
    # kernel when its limit is 2 s: every boot stalls.
    result = vm_run(
        "echo ran", cmdline="quiet", boot_stall_s=2.0, boot_attempts=2, timeout=120, accel="tcg"
    )
    assert result.stalled_boots == 2
    assert result.returncode is None and not result.timed_out
    assert result.output == ""  # the script never ran
    assert result.elapsed_s < 30  # ended by the stall rule, not the timeout
    assert result.log_dir is not None
    assert sorted(p.name for p in result.log_dir.glob("console.stalled-*.log")) == [
        "console.stalled-1.log",
        "console.stalled-2.log",
    ]
    assert "stalled before init" in result.tail()
    with pytest.raises(vm.VmError, match="every VM boot stalled before init"):
        result.check()
    shutil.rmtree(result.log_dir)
