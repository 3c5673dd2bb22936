"""bpfland and flash on a NUMA machine: the VM booted with three NUMA nodes (CPU 0 on node
0, CPU 1 on node 1, node 2 memory only), the corpus objects loaded with their shipped
profiles by ``schedswitchctl object load --profile``. The topology model sees 2 nodes with
CPUs and 3 node ids; each profile turns NUMA on (``numa_enabled``; flash ``numa_disabled``
false) with ``SCX_OPS_BUILTIN_IDLE_PER_NODE``, and the kernel keeps each enabled, with no
exit recorded, through 15 s of work. Skips without the corpus (``../shared/corpus``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.corpus import corpus_object
from tools import vm

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def observed(vm_run: Callable[..., vm.VmResult]) -> dict[str, Any]:
    objs = {s: corpus_object(s) for s in ("bpfland", "flash")}
    ctl = '"$PY" -m schedswitchd.cli.ctl'
    load = "object load {obj} --profile {s} --set {s}_ops.timeout_ms=30000 --watch 15 --json"
    script = (
        'cd "$REPO"\n'
        f'{ctl} profile topology --json > "$RESULTS/topology.json"\n'
        "(while :; do seq 1 3000 | sort -rn > /dev/null; done) &\nW=$!\n"
    )
    for s, obj in objs.items():
        script += f'{ctl} profile show {s} --json > "$RESULTS/{s}.show.json"\n'
        script += f'{ctl} {load.format(obj=obj, s=s)} > "$RESULTS/{s}.json"\n'
        script += f'echo $? > "$RESULTS/{s}.rc"\n'
    script += "kill $W\n"
    res = vm_run(script, timeout=900, numa_nodes=3)
    res.check()
    out: dict[str, Any] = {"topology": json.loads(res.text("topology.json"))}
    for s in objs:
        out[s] = {"rc": int(res.text(f"{s}.rc")), "doc": json.loads(res.text(f"{s}.json"))}
    for s in objs:
        out[s]["show"] = json.loads(res.text(f"{s}.show.json"))
    return out


def test_the_model_sees_two_nodes_with_cpus_and_three_ids(observed: dict[str, Any]) -> None:
    t = observed["topology"]
    assert t["nr_node_ids"] == 3
    assert [n["cpus"] for n in t["nodes"]] == [[0], [1]]


@pytest.mark.parametrize(
    ("name", "var", "value"), [("bpfland", "numa_enabled", True), ("flash", "numa_disabled", False)]
)
def test_profiles_run_the_numa_path(
    observed: dict[str, Any], name: str, var: str, value: bool
) -> None:
    r = observed[name]
    show = r["show"]
    assert show["variables"][var] is value
    assert "SCX_OPS_BUILTIN_IDLE_PER_NODE" in show["add_flags"]
    assert r["rc"] == 0, r["doc"]
    scx = r["doc"]["sched_ext"]
    assert scx["verdict"] == "enabled" and scx["ops"] == name and scx["exit"] is None, scx
    assert not any("dropped" in n for n in r["doc"]["profile"]["notes"])
