"""Our loader runs the sample sched_ext schedulers in the VM (one boot): load + attach the
``.struct_ops.link`` build -> ``enabled`` with the right ops name -> a workload moves its
counter -> detach -> ``disabled``; and the legacy build's programs, loaded by libbpf 1.1
(``bpftool prog loadall``) and by us, have identical xlated instructions (map ids aside)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tools import vm
from tools.sidkernel import SidKernel

pytestmark = pytest.mark.vm

SCHEDULERS = ("fifo", "vtime", "latency")  # latency reads uinput's BTF: insmod'ed first


@pytest.fixture(scope="module")
def observed(
    vm_run: Callable[..., vm.VmResult], sched_objects: Path, sid_kernel: SidKernel
) -> dict[str, Any]:
    script = 'bash "$RESULTS/insmod.sh"\n' + "".join(
        f'cd "$REPO" && PYTHONPATH="$REPO" "$PY" -m tests.vm.loader_driver "{sched_objects}" '
        f'{name} "$RESULTS/{name}.json"\n'
        for name in SCHEDULERS
    )
    inputs = {"insmod.sh": vm.insmod_script(sid_kernel, ["uinput"], strict=True)}
    res = vm_run(script, timeout=600, inputs=inputs)
    res.check()
    return {name: json.loads(res.text(f"{name}.json")) for name in SCHEDULERS}


@pytest.mark.parametrize("name", SCHEDULERS)
def test_our_loader_enables_and_disables(observed: dict[str, Any], name: str) -> None:
    c = observed[name]["cycle"]
    assert "exception" not in c, c.get("tb")
    assert c["initial"] == "disabled"
    assert c["enabled"] and c["ops"] == f"ss_{name}"
    assert c["state_after_workload"] == "enabled"
    assert c["nr_enqueued"] > 0
    assert c["disabled"]
    assert {"btf", "maps", "attach"} <= set(c["timings_ns"])


@pytest.mark.parametrize("name", SCHEDULERS)
def test_xlated_same_as_libbpf_in_vm(observed: dict[str, Any], name: str) -> None:
    x = observed[name]["xlated"]
    assert "exception" not in x, x.get("tb")
    assert "libbpf_error" not in x, x.get("libbpf_error")
    assert x["ours"] == x["theirs"]
    assert all(x["equal"].values()), x["diffs"]
