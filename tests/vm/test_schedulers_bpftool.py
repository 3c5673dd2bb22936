"""The sample schedulers run for real: Debian's bpftool (libbpf 1.1) registers their legacy
``.struct_ops`` builds in the sched_ext VM (one boot for the whole module).

Per scheduler: register -> ``/sys/kernel/sched_ext/state`` is ``enabled`` and ``root/ops``
names it -> a workload completes and the scheduler's counters moved -> unregister ->
``disabled``. ss_fifo with ``error_after`` set is ejected by the kernel and its exit info is
read back from its ``.data`` map. ss_latency needs uinput's BTF: it fails to load without the
module and reads uinput's types once it is loaded.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tools import vm
from tools.rodata import set_rodata
from tools.sidkernel import SidKernel

pytestmark = pytest.mark.vm

SCHEDULERS = ("fifo", "vtime", "latency")
ERROR_AFTER = 50

VM_COMMON = r"""
B=$REPO/build/bpf
state() { cat /sys/kernel/sched_ext/state; }
ops() { cat /sys/kernel/sched_ext/root/ops 2>/dev/null || echo none; }
# wait_state WANT SECONDS: poll until the state is WANT
wait_state() {
  for _ in $(seq 1 $(( $2 * 10 ))); do [ "$(state)" = "$1" ] && return 0; sleep 0.1; done
  echo "state still $(state), wanted $1" >&2; return 1
}
# A small workload that must finish under the new scheduler: 4 parallel sorts + python.
workload() {
  for i in 1 2 3 4; do seq 1 30000 | sort -rn | tail -1 > /dev/null & done
  python3 -c 'print(sum(i * i for i in range(200000)))'
  wait
}
dump() { bpftool -j map dump name "$1"; }
"""


def _cycle(name: str) -> str:
    return f"""
set -e
bpftool struct_ops register $B/{name}.legacy.bpf.o
echo "state=$(state) ops=$(ops)"
workload
echo "after-workload state=$(state)"
echo "BSS $(dump {name}.bss)"
bpftool struct_ops unregister name ss_{name}
wait_state disabled 10
echo "final=$(state)"
"""


VM_PRELUDE = ""

VM_STEPS = {
    "latency_without_uinput": """
bpftool struct_ops register $B/latency.legacy.bpf.o; echo "rc=$?"; echo "state=$(state)"
""",
    "insmod_uinput": 'bash "$RESULTS/insmod.sh"',
    **{f"cycle_{s}": _cycle(s) for s in SCHEDULERS},
    "latency_boost": """
set -e
bpftool struct_ops register $B/latency.legacy.bpf.o
python3 -c 'import time; t = time.time() + 2
while time.time() < t: pass' &
pid=$!
key=$(printf '%08x' $pid | sed -E 's/(..)(..)(..)(..)/\\4 \\3 \\2 \\1/')
bpftool map update name boost_tgids key hex $key value hex 01 00 00 00
wait $pid
echo "BSS $(dump latency.bss)"
bpftool struct_ops unregister name ss_latency
wait_state disabled 10
""",
    "fifo_error": """
bpftool struct_ops register "$RESULTS/fifo_err.bpf.o" || exit 1
workload
wait_state disabled 30; echo "waited=$?"
echo "DATA $(dump fifo_err.data)"
dmesg | grep 'sched_ext:'
bpftool struct_ops unregister name ss_fifo
echo "final=$(state)"
""",
}
VM_TIMEOUT = 240
VM_STEP_TIMEOUT = 60


def VM_INPUTS(kernel: SidKernel, sched_dir: Path) -> dict[str, bytes | str]:
    obj = (sched_dir / "fifo.legacy.bpf.o").read_bytes()
    return {
        "fifo_err.bpf.o": set_rodata(obj, "error_after", ERROR_AFTER),
        "insmod.sh": vm.insmod_script(kernel, ["uinput"], strict=True),
    }


def _json_after(tag: str, text: str) -> Any:
    for line in text.splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1 :])
    raise AssertionError(f"no {tag} line in:\n{text}")


def _datasec(dump: Any, section: str) -> dict[str, Any]:
    """{variable: value} from bpftool's formatted JSON dump of an internal map."""
    out: dict[str, Any] = {}
    for var in dump[0]["formatted"]["value"][section]:
        out.update(var)
    return out


@pytest.mark.parametrize("name", SCHEDULERS)
def test_register_run_unregister(vm_steps: vm.StepsResult, name: str) -> None:
    out = vm_steps.step(f"cycle_{name}").check().output
    assert f"state=enabled ops=ss_{name}" in out
    assert "after-workload state=enabled" in out
    assert out.rstrip().endswith("final=disabled")
    bss = _datasec(_json_after("BSS", out), ".bss")
    enqueued = bss["nr_enqueued"]
    assert (sum(enqueued) if isinstance(enqueued, list) else enqueued) > 0


def test_latency_reads_uinput_btf_when_loaded(
    vm_steps: vm.StepsResult, sid_kernel: SidKernel
) -> None:
    bss = _datasec(_json_after("BSS", vm_steps.step("cycle_latency").check().output), ".bss")
    # What uinput's own BTF says, read on the host from the cached module BTF.
    btf_file, base = str(sid_kernel.btf_root / "uinput"), str(sid_kernel.vmlinux_btf)
    dump = subprocess.run(
        ["bpftool", "btf", "dump", "file", btf_file, "-B", base],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    size = re.search(r"STRUCT 'uinput_device' size=(\d+)", dump)
    created = re.search(r"'UIST_CREATED' val=(\d+)", dump)
    assert size and created
    assert bss["uinput_device_size"] == int(size.group(1))
    assert bss["uinput_created_state"] == int(created.group(1))


def test_latency_fails_without_uinput(vm_steps: vm.StepsResult) -> None:
    out = vm_steps.step("latency_without_uinput").output
    assert "rc=0" not in out
    assert "state=disabled" in out
    assert "uinput_device" in out  # libbpf names the CO-RE type it could not find


def test_latency_boosts_mapped_tgid(vm_steps: vm.StepsResult) -> None:
    out = vm_steps.step("latency_boost").check().output
    bss = _datasec(_json_after("BSS", out), ".bss")
    assert bss["nr_enqueued"][0] > 0  # level 0: the boosted process


def test_error_injection_ejects(vm_steps: vm.StepsResult) -> None:
    out = vm_steps.step("fifo_error").check().output
    assert "waited=0" in out
    assert 'BPF scheduler "ss_fifo" disabled (scx_bpf_error)' in out
    assert out.rstrip().endswith("final=disabled")
    uei = _datasec(_json_after("DATA", out), ".data")["uei"]
    assert uei["recorded"] == 1
    assert uei["kind"] == 1025  # SCX_EXIT_ERROR_BPF
    assert uei["reason"] == "scx_bpf_error"
    message = f"injected error after {ERROR_AFTER} enqueues"
    assert uei["msg"] == message
    # the kernel logs the message after the scheduler's name: once, not "ss_fifo: ss_fifo:"
    assert f"sched_ext: ss_fifo: {message}" in out
    assert "ss_fifo: ss_fifo:" not in out
