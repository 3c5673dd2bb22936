"""Programs beside a scheduler's struct_ops in the sched_ext VM (one boot, driver
``tests/vm/progs_driver.py``): ss_hooked (tests/vm/bpf/hooked.bpf.c) has
``fentry``/``fexit`` on ``bpf_scx_reg``, ``tp_btf/sched_switch``, a ``SEC("syscall")``
program and an optional ``?fentry`` whose target the kernel lacks. The loader attaches the
hooks before the struct_ops link (so they see the registration), runs the syscall program
before and after attach, and leaves no link after close; the daemon's backend pins the
program links next to the struct_ops link, adopts them after a restart and removes them.
The host kernel refuses fentry programs and has no kprobe PMU, so tests/bpf/attach.bpf.o's
fentry/fexit and tests/bpf/kprobes.bpf.o's kprobe/kretprobe on getpgid(2) run here."""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.build_outputs import built_object
from tools import vm

from .drivers import driver_line, driver_part

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def observed(vm_run: Callable[..., vm.VmResult], sched_objects: object) -> dict[str, Any]:
    script = driver_line(
        "progs_driver",
        '"$REPO/build/tests/vm/bpf/hooked.bpf.o"',
        '"$REPO/build/tests/bpf/attach.bpf.o"',
        '"$REPO/build/tests/bpf/kprobes.bpf.o"',
        '"$RESULTS/progs.json"',
    )
    res = vm_run(script, timeout=420)
    res.check()
    out: dict[str, Any] = json.loads(res.text("progs.json"))
    return out


def test_hooks_attach_before_the_struct_ops_link(observed: dict[str, Any]) -> None:
    o = driver_part(observed, "loader")
    assert o["initial"] == "disabled"
    assert "opt_missing" not in o["programs"]
    assert "ssd_no_such_kernel_function" in o["skipped"]["opt_missing"]
    assert {"on_scx_reg", "on_scx_reg_exit", "on_switch", "setup"} <= set(o["programs"])
    assert o["enabled"] and o["ops"] == "ss_hooked"
    # bpf_scx_reg runs inside BPF_LINK_CREATE: hooks attached before it saw it, once
    assert (o["reg_calls"], o["reg_exits"], o["reg_ret"]) == (1, 1, 0)
    assert o["enq_at_reg"] == 0  # entered before the scheduler enqueued anything
    assert set(o["program_links"]) == {"on_scx_reg", "on_scx_reg_exit", "on_switch"}
    assert max(o["program_links"].values()) < o["ops_link"]
    assert o["switches"] > 0 and o["nr_enqueued"] > 0
    assert o["links_while_loaded"] == 3
    assert o["disabled"]
    assert o["links_left"] == []


def test_syscall_program_runs_before_and_after_attach(observed: dict[str, Any]) -> None:
    o = driver_part(observed, "loader")
    assert o["run_before"] == {"retval": 0, "ctx_enqueued": 0, "seed": 42, "reg_calls": 0}
    after = o["run_after"]
    assert after["retval"] == 1 and after["seed"] == 7
    assert after["ctx_enqueued"] >= o["nr_enqueued"] > 0  # read earlier; it only grows


def test_fentry_fexit_on_a_syscall_function(observed: dict[str, Any]) -> None:
    built_object("attach")  # `make test-objects`: skips (fails under make test) without it
    o = driver_part(observed, "fentry")
    assert o["links"] == ["on_getpgid_entry", "on_getpgid_exit"]
    assert o["rets"] == [o["pgid"], o["pgid"], -1]  # the last for a pid that does not exist
    assert (o["fentry_hits"], o["fexit_hits"]) == (3, 3)
    assert o["fexit_last_ret"] == -errno.ESRCH  # what the kernel function returned


def test_kprobe_kretprobe_on_a_syscall_function(observed: dict[str, Any]) -> None:
    built_object("kprobes")
    o = driver_part(observed, "kprobe")
    assert o["links"] == ["on_getpgid_kprobe", "on_getpgid_kretprobe"]
    assert o["link_types"] == [7]  # BPF_LINK_TYPE_PERF_EVENT
    assert o["rets"] == [o["pgid"], o["pgid"], -1]
    assert (o["kprobe_hits"], o["kretprobe_hits"]) == (3, 3)
    assert o["kretprobe_last_ret"] == -errno.ESRCH


def test_backend_pins_adopts_and_removes_program_links(observed: dict[str, Any]) -> None:
    o = driver_part(observed, "backend")
    assert o["initial"] == "disabled"
    assert not o["links_before_attach"]  # nothing attached while preparing
    assert o["pins"] == ["exit_map", "link", "progs"]
    assert o["prog_pins"] == ["on_scx_reg", "on_scx_reg_exit", "on_switch"]
    assert "attach.programs" in o["attach_phases"]
    assert o["enabled_after_death"] and o["links_alive_after_death"]
    assert o["adopted"]
    assert o["adopted_links"] == o["prog_link_ids"]
    assert o["after_detach"] == "disabled"
    assert o["pins_left"] == []
    assert o["links_gone"]
    assert o["final"] == "disabled"
