"""bench/gap_profile.py's trace parsing and report, on function_graph text shaped like the
sched_ext VM's (funcgraph-proc and funcgraph-tail on; the measurement itself runs in the VM:
``python bench/gap_profile.py``)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

# One enable and one disable, cut down from a real trace: the syscall's task waits in
# kthread_flush_work while the helper kthread runs the body; context-switch markers between.
TRACE = """\
# tracer: function_graph
#
# CPU  TASK/PID         DURATION                  FUNCTION CALLS
# |     |    |           |   |                     |   |   |   |
 1)   python-128   |               |  bpf_scx_reg() {
 1)   python-128   |               |    scx_enable.isra.0() {
 ------------------------------------------
 1)   python-128   =>  scx_ena-129
 ------------------------------------------

 1)  scx_ena-129   |               |  scx_root_enable_workfn() {
 1)  scx_ena-129   | # 1228.596 us |    } /* scx_alloc_and_add_sched */
 1)  scx_ena-129   |               |    scx_idle_enable() {
 1)  scx_ena-129   |               |      static_key_enable_cpuslocked() {
 1)  scx_ena-129   | ! 350.708 us  |        smp_text_poke_batch_finish();
 1)  scx_ena-129   | ! 421.651 us  |      } /* static_key_enable_cpuslocked */
 1)  scx_ena-129   | ! 444.805 us  |    } /* scx_idle_enable */
 1)  scx_ena-129   |               |    percpu_down_write() {
 1)  scx_ena-129   |               |      rcu_sync_enter() {
 1)  scx_ena-129   | # 6000.000 us |        synchronize_rcu();
 1)  scx_ena-129   | # 6010.000 us |      } /* rcu_sync_enter */
 1)  scx_ena-129   | # 6020.000 us |    } /* percpu_down_write */
 1)  scx_ena-129   |   0.600 us    |    __scx_init_task();
 1)  scx_ena-129   |   0.400 us    |    __scx_init_task();
 1)  scx_ena-129   | * 10000.00 us |  } /* scx_root_enable_workfn */
 1)   python-128   | * 10100.00 us |    } /* scx_enable.isra.0 */
 1)   python-128   | * 10200.00 us |  } /* bpf_scx_reg */
 0)   python-128   |               |  bpf_scx_unreg() {
 0)  sched_e-146   |               |  scx_disable_workfn() {
 0)  sched_e-146   |               |    scx_root_disable() {
 0)  sched_e-146   | + 82.630 us   |      scx_bypass();
 0)  sched_e-146   | * 20000.00 us |      synchronize_rcu();
 0)  sched_e-146   | * 30000.00 us |    } /* scx_root_disable */
 0)  sched_e-146   | * 30010.00 us |  } /* scx_disable_workfn */
 0)   python-128   | * 30100.00 us |  } /* bpf_scx_unreg */
"""


@pytest.fixture(scope="module")
def gp(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("gap_profile")


def test_parse_graph_reads_leaves_and_closing_lines(gp: ModuleType) -> None:
    calls = gp.parse_graph(TRACE)
    assert calls[0] == ("scx_ena-129", 1, "scx_alloc_and_add_sched", 1228.596)
    assert calls[1] == ("scx_ena-129", 3, "smp_text_poke_batch_finish", 350.708)
    assert calls[-1] == ("python-128", 0, "bpf_scx_unreg", 30100.0)
    assert sum(1 for c in calls if c[2] == "__scx_init_task") == 2
    # headers, context-switch markers and opening lines are not calls
    assert all(c[2] and "=>" not in c[2] and "{" not in c[2] for c in calls)


def test_nest_builds_trees_per_task(gp: ModuleType) -> None:
    roots = gp.nest([list(c) for c in gp.parse_graph(TRACE)])
    names = [(r["task"], r["name"]) for r in roots]
    assert names == [
        ("scx_ena-129", "scx_root_enable_workfn"),
        ("python-128", "bpf_scx_reg"),
        ("sched_e-146", "scx_disable_workfn"),
        ("python-128", "bpf_scx_unreg"),
    ]
    body = roots[0]
    assert [k["name"] for k in body["kids"]] == [
        "scx_alloc_and_add_sched",
        "scx_idle_enable",
        "percpu_down_write",
        "__scx_init_task",
        "__scx_init_task",
    ]
    assert gp._inside(body, ("synchronize_rcu",)) == 6000.0
    assert gp._inside(roots[2], ("synchronize_rcu",)) == 20000.0


def test_breakdown_per_switch(gp: ModuleType) -> None:
    text = "\n".join(gp.breakdown([list(c) for c in gp.parse_graph(TRACE)], 1))
    assert "bpf_scx_unreg: 30.1 ms per switch; its kthread body scx_root_disable: 30.0" in text
    assert "bpf_scx_reg: 10.2 ms per switch; its kthread body scx_root_enable_workfn: 10.0" in text
    assert "20.0 ms  RCU grace periods" in text and "6.0 ms  RCU grace periods" in text
    assert "0.4 ms  static key flips" in text
    assert "9.9 ms  everything else in scx_root_disable" in text


def _rec(gap: float, dis: float, ena: float, confirm: float, total: float) -> dict[str, Any]:
    ns = {"gap_ns": gap, "disable_ns": dis, "enable_ns": ena, "confirm_ns": confirm,
          "ours_ns": gap - dis - ena, "total_ns": total}  # fmt: skip
    return {k: int(v * 1e6) for k, v in ns.items()}


def test_report_table_and_trace_sections(gp: ModuleType) -> None:
    recs = [_rec(110, 60, 40, 4, 220), _rec(100, 55, 38, 3, 200), _rec(130, 70, 45, 5, 240)]
    calls = [list(c) for c in gp.parse_graph(TRACE)]
    runs = {
        "default": {"plain": recs, "watch": recs,
                    "trace": {"filter": {"functions": ["bpf_scx_reg"], "switches": recs[:1],
                                         "calls": calls},
                              "graph": {"functions": ["scx_root_disable"],
                                        "switches": recs[:1], "calls": calls}}},
        "expedited": {"plain": recs, "watch": recs},
    }  # fmt: skip
    meta = {"argv": "--configs default,expedited", "date": "d", "kernel": "7.2", "accel": "tcg",
            "host": "2 cores", "load": "0.5", "switches": "3"}  # fmt: skip
    text = gp.report(runs, meta)
    assert (
        "| default (the harness's kernel command line, 2 vCPUs) | no | 110.0 | 60.0 | 40.0 " in text
    )
    assert "| 10.0 | 4.0 | 220 | 0.50 |" in text
    assert "| expedited (rcupdate.rcu_expedited=1, 2 vCPUs) | uevents + sysfs poll |" in text
    assert "## Kernel side, default" in text and "## Kernel side, expedited" not in text
    assert "scx_root_disable: 30.0 ms per switch" in text


def test_saved_runs_keep_the_trace_section_instead_of_the_calls(gp: ModuleType) -> None:
    recs = [_rec(110, 60, 40, 4, 220)]
    trace = {"filter": {"functions": [], "switches": recs}, "graph": {"switches": recs},
             "section": ["", "## Kernel side, default: (saved)"]}  # fmt: skip
    meta = {"argv": "", "date": "d", "kernel": "7.2", "accel": "tcg", "host": "2 cores",
            "load": "0.5", "switches": "1"}  # fmt: skip
    text = gp.report({"default": {"plain": recs, "watch": recs, "trace": trace}}, meta)
    assert text.rstrip().endswith("## Kernel side, default: (saved)")


def test_rcu_ratio_is_judged_on_the_exact_value(gp: ModuleType) -> None:
    meta = {"argv": "", "date": "d", "kernel": "7.2", "accel": "tcg", "host": "2 cores",
            "load": "0.5", "switches": "1"}  # fmt: skip
    plain = [_rec(124, 60, 56, 4, 280)]
    near = gp.report({"default": {"plain": plain, "rcu": [_rec(50, 21, 26, 4, 175)]}}, meta)
    # 50 / 124 = 0.403: shown as 0.403, not rounded into the target
    assert "50.0 / 124.0 ms = 0.403 (target <= 0.4: MISSED)" in near
    under = gp.report({"default": {"plain": plain, "rcu": [_rec(40, 18, 20, 4, 150)]}}, meta)
    assert "40.0 / 124.0 ms = 0.323 (target <= 0.4: met)" in under

    # rcupdate.rcu_expedited=1 from the boot: no run-time ratio to judge, the page says why
    boot = {"plain": plain, "rcu": plain, "boot_expedited": True}
    text = gp.report({"expedited": boot}, meta)
    assert "expedited: rcu_expedited is 1 from the boot" in text
    assert "target <= 0.4" not in text
