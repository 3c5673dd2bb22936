"""Our loader runs the sample sched_ext schedulers in the VM (one boot): load + attach the
``.struct_ops.link`` build -> ``enabled`` with the right ops name -> a workload moves its
counter -> detach -> ``disabled``; and the legacy build's programs, loaded by libbpf 1.1
(``bpftool prog loadall``) and by us, have identical xlated instructions (map ids aside).
First, before uinput is insmod'ed, loading ss_latency (it declares uinput in ``.kmod_btfs``)
fails with a LoadError naming the module and leaves sched_ext disabled. Last,
``sched_ext_ops.flags`` by name through ``schedswitchctl object load --ops-flag``: the flag
resolved from the VM kernel's BTF is in the kernel's struct_ops value and takes effect, a
name this kernel lacks is dropped, and required it is refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tools import vm
from tools.sidkernel import SidKernel

from .drivers import driver_line

pytestmark = pytest.mark.vm

SCHEDULERS = ("fifo", "vtime", "latency")  # latency reads uinput's BTF: insmod'ed first


@pytest.fixture(scope="module")
def observed(
    vm_run: Callable[..., vm.VmResult], sched_objects: Path, sid_kernel: SidKernel
) -> dict[str, Any]:
    script = (
        (
            driver_line(
                "loader_driver",
                "--absent",
                f'"{sched_objects}"',
                "latency",
                '"$RESULTS/absent.json"',
            )
            + 'bash "$RESULTS/insmod.sh"\n'
        )
        + "".join(
            driver_line("loader_driver", f'"{sched_objects}"', name, f'"$RESULTS/{name}.json"')
            for name in SCHEDULERS
        )
        + driver_line(
            "loader_driver",
            "--ops-flags",
            f'"{sched_objects}"',
            "fifo",
            '"$RESULTS/ops_flags.json"',
        )
        + driver_line(
            "loader_driver", "--verdicts", f'"{sched_objects}"', '"$RESULTS/verdicts.json"'
        )
    )
    inputs = {"insmod.sh": vm.insmod_script(sid_kernel, ["uinput"], strict=True)}
    res = vm_run(script, timeout=900, inputs=inputs)
    res.check()
    out = {name: json.loads(res.text(f"{name}.json")) for name in SCHEDULERS}
    out["absent"] = json.loads(res.text("absent.json"))
    out["ops_flags"] = json.loads(res.text("ops_flags.json"))
    out["verdicts"] = json.loads(res.text("verdicts.json"))
    return out


#: ``enum scx_exit_kind``: ``SCX_EXIT_ERROR_BPF`` (``scx_bpf_error()``).
EXIT_ERROR_BPF = 1025


def test_object_load_says_what_the_kernel_did(observed: dict[str, Any]) -> None:
    """``object load --json`` of a sched_ext scheduler carries the kernel's state and the
    scheduler's exit record, and exits 1 unless the kernel kept it enabled: left to run,
    ss_fifo is enabled (0); with error_after it is ejected by its own scx_bpf_error()
    while --watch holds it (1, the record's kind and message); with another scheduler
    attached it is never enabled (1, the kernel's EBUSY and the other's ops name)."""
    v = observed["verdicts"]
    assert "exception" not in v, v.get("tb")
    assert v["initial"] == "disabled"
    runs = v["runs"]
    assert runs["rc"] == 0, runs
    assert runs["doc"]["sched_ext"] == {
        "state": "enabled",
        "ops": "ss_fifo",
        "expected_ops": "ss_fifo",
        "exit": None,
        "verdict": "enabled",
    }
    assert v["after_runs"] == "disabled"
    ej = v["ejected"]
    assert ej["rc"] == 1, ej
    scx = ej["doc"]["sched_ext"]
    assert scx["verdict"] == "ejected" and scx["exit"] is not None, scx
    assert scx["exit"]["kind"] == EXIT_ERROR_BPF
    assert "injected error after 200 enqueues" in scx["exit"]["message"], scx
    assert v["after_ejected"] == "disabled"
    assert v["holder"]["rc"] == 0
    ref = v["refused"]
    assert ref["rc"] == 1 and ref["doc"]["error"]["message"], ref
    assert ref["doc"]["sched_ext"]["verdict"] == "never enabled"
    assert ref["doc"]["sched_ext"]["ops"] == "ss_fifo"  # the other one still runs
    assert v["unload_rc"] == 0 and v["final"] == "disabled"


#: ``SCX_OPS_SWITCH_PARTIAL`` in the VM kernel (``kernel/sched/ext_internal.h``: 1 << 3)
SWITCH_PARTIAL = 1 << 3


def test_ops_flags_by_name_reach_the_kernel(observed: dict[str, Any]) -> None:
    """``--ops-flag SCX_OPS_SWITCH_PARTIAL`` (value from the VM kernel's ``enum
    scx_ops_flags``) is what the kernel holds in ss_fifo's struct_ops value, and it acts:
    ``switch_all`` reads 0 (only SCHED_EXT tasks move); ``SCX_OPS_HAS_CGROUP_WEIGHT``, which
    this kernel no longer has, is dropped with a note; with ``--require-ops-flag`` the same
    name is refused before anything is loaded and sched_ext stays disabled."""
    r = observed["ops_flags"]
    assert "exception" not in r, r.get("tb")
    assert r["initial"] == "disabled"
    assert r["rc"] == 0, r["stderr"]
    assert r["ops_flags"] == {
        "value": SWITCH_PARTIAL,
        "set": {"SCX_OPS_SWITCH_PARTIAL": SWITCH_PARTIAL},
        "dropped": ["SCX_OPS_HAS_CGROUP_WEIGHT"],
    }
    assert r["enabled"] and r["ops"] == "ss_fifo"
    assert r["kernel_flags"] == SWITCH_PARTIAL
    assert r["switch_all"] == "0"
    assert r["unload_rc"] == 0 and r["disabled"]
    req = r["required"]
    assert req["rc"] == 1 and req["stdout"] == ""
    assert "required flag SCX_OPS_HAS_CGROUP_WEIGHT: the kernel lacks it" in req["stderr"]
    assert req["state_after"] == "disabled" and r["final"] == "disabled"


def test_module_not_loaded_is_named(observed: dict[str, Any]) -> None:
    """ss_latency without uinput: our loader refuses it with a LoadError whose message names
    the declared module that is not loaded, and nothing stays loaded or attached."""
    a = observed["absent"]
    assert "exception" not in a, a.get("tb")
    assert a["declared"] == ["uinput"] and a["report_missing"] == ["uinput"]
    assert not a["loaded"]
    assert "LoadError" in a["error_mro"], a
    print("absent-module error:", a["error_type"], a["message"])
    assert "declared module(s) not loaded: uinput" in a["message"], a["message"]
    # the poisoned relocation that made the verifier refuse ops.init is named too
    assert "CO-RE ENUMVAL_VALUE of enum uinput_state___ss" in a["message"], a["message"]
    assert a["missing_modules"] == ["uinput"]
    assert a["initial"] == "disabled" and a["final"] == "disabled"
    assert a["bpf_progs_left"] == "", a["bpf_progs_left"]


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
