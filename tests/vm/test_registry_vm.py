"""The BTF registry, uevent listener and sched_ext reader in the sched_ext VM, real modules.

One boot runs ``tests/vm/registry_driver.py``: it insmods two modules, unloads and reloads
one with the registry listening, then again with the registry detached (missed events), and
registers a sample scheduler with bpftool to see the sched_ext root kobject's uevents, and
loads (with our loader) a tc program whose kfunc and CO-RE relocation live in the fou
module's BTF (``tests/vm/kmod_fou.bpf.c``), declared and undeclared.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tools import vm
from tools.sidkernel import SidKernel

from .drivers import driver_line, driver_part

pytestmark = pytest.mark.vm

MODULE, SECOND = "dummy", "xor"
LATENCY_NOKMOD = "latency.nokmod.bpf.o"  # ss_latency without .kmod_btfs: CO-RE on uinput
SCHEDULER, SCX_OPS = "fifo.legacy.bpf.o", "ss_fifo"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _build_fou(kernel: SidKernel, out: Path) -> tuple[Path, Path]:
    """tests/vm/kmod_fou.bpf.c against the sid kernel's vmlinux.h, with and without
    .kmod_btfs."""
    out.mkdir(parents=True, exist_ok=True)
    inc = out / "include"
    inc.mkdir(exist_ok=True)
    link = inc / "vmlinux.h"
    if not link.exists():
        link.symlink_to(kernel.vmlinux_h)
    objs = (out / "kmod_fou.bpf.o", out / "kmod_fou.nokmod.bpf.o")
    for obj, extra in zip(objs, ([], ["-DNO_KMOD_BTFS"]), strict=True):
        subprocess.run(
            ["clang", "-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86",
             "-Wno-missing-declarations", *extra, f"-I{inc}", f"-I{REPO / 'tests' / 'bpf'}",
             "-c", str(HERE / "kmod_fou.bpf.c"), "-o", str(obj)],
            check=True,
        )  # fmt: skip
    return objs


@pytest.fixture(scope="module")
def seen(
    vm_run: Callable[..., vm.VmResult], sid_kernel: SidKernel, sched_objects: Path
) -> dict[str, Any]:
    ko = sid_kernel.decompressed_paths()
    sched = sched_objects / SCHEDULER
    fou, fou_nokmod = _build_fou(sid_kernel, REPO / "build" / "vm-registry")
    cfg = {
        "ko": {MODULE: str(ko[MODULE]), SECOND: str(ko[SECOND])},
        "fou_ko": [str(ko[n]) for n in vm.module_load_order(sid_kernel, ["fou"])],
        "fou_obj": str(fou),
        "fou_nokmod_obj": str(fou_nokmod),
        "scheduler": str(sched) if sched.is_file() else None,
        "scx_ops": SCX_OPS,
        "uinput_ko": [str(ko[n]) for n in vm.module_load_order(sid_kernel, ["uinput"])],
        "latency_nokmod_obj": str(sched_objects / LATENCY_NOKMOD),
    }
    script = driver_line(
        "registry_driver", '"$RESULTS/registry_cfg.json"', '"$RESULTS/registry.json"'
    )
    res = vm_run(script, inputs={"registry_cfg.json": json.dumps(cfg)}, timeout=420)
    res.check()
    text = res.text("registry.json")
    (REPO / "build" / "vm-registry" / "observed.json").write_text(text)  # for a reader
    out: dict[str, Any] = json.loads(text)
    return out


def test_ids_walk_finds_vmlinux_and_loaded_modules(seen: dict[str, Any]) -> None:
    init = driver_part(seen, "initial")
    assert "vmlinux" in init["ids"]
    # the initramfs loaded the 9p modules: each has a BTF file and a kernel BTF object
    assert init["names"] and set(init["names"]) <= set(init["ids"])


def test_declared_modules_by_name_with_verified_object_ids(seen: dict[str, Any]) -> None:
    r = driver_part(seen, "load_two")
    assert all(i["rc"] == 0 for i in r["insmod"]), r["insmod"]
    assert all(t is not None and t < 2 for t in r["event_s"]), r["event_s"]
    assert isinstance(r["id"], int) and isinstance(r["id_second"], int)
    rep = r["report"]
    # exactly the two declared modules are read, whatever else is loaded
    assert len(r["present"]) > 2
    assert (rep["found"], rep["missing"], rep["read"]) == (
        [MODULE, SECOND],
        ["not_loaded_mod"],
        [MODULE, SECOND],
    )
    assert rep["start_id"] == rep["vmlinux_end"]
    assert r["again"]["read"] == [] and r["again"]["hits"] == 2
    assert r["raw_equal"]  # the sysfs file is the kernel object's BTF


def test_rmmod_drops_entry_and_id(seen: dict[str, Any]) -> None:
    r = driver_part(seen, "unload")
    assert r["rmmod"]["rc"] == 0 and r["event_s"] is not None and r["event_s"] < 2
    assert MODULE not in r["cached"]
    assert r["report"]["missing"] == [MODULE] and r["report"]["read"] == []
    assert isinstance(r["id"], str) and "no kernel BTF object" in r["id"]


def test_reload_uses_new_btf_and_new_id(seen: dict[str, Any]) -> None:
    first, r = seen["load_two"], driver_part(seen, "reload")
    assert r["insmod"]["rc"] == 0 and r["event_s"] is not None
    assert isinstance(r["id"], int) and r["id"] > first["id"]
    assert r["report"]["read"] == [MODULE] and r["report"]["hits"] == 0
    assert r["report"]["btf_obj"] != first["again"]["btf_obj"]


def test_missed_events_never_serve_stale(seen: dict[str, Any]) -> None:
    prev, r = seen["reload"], driver_part(seen, "missed")
    assert r["rmmod"]["rc"] == 0 and r["insmod"]["rc"] == 0
    assert r["uevents_delta"] == 0  # the registry heard nothing
    assert r["report"]["read"] == [MODULE] and r["stale_dropped"] == 1
    assert isinstance(r["id"], int) and r["id"] > prev["id"]


def test_sched_ext_uevents_and_states(seen: dict[str, Any]) -> None:
    r = driver_part(seen, "scx")
    assert "skipped" not in r, f"sample scheduler {SCHEDULER} was not built"
    assert r["register"]["rc"] == 0, r["register"]
    assert r["enabled"]["state"] == "enabled" and r["enabled"]["ops"] == SCX_OPS
    assert r["enabled"]["enable_seq"] >= 1
    assert r["add_event_s"] is not None and r["remove_event_s"] is not None
    assert r["unregister"]["rc"] == 0
    assert r["disabled"] == {"state": "disabled", "ops": None}
    assert ["add", "/kernel/sched_ext/root", SCX_OPS] in r["events"]
    assert ["remove", "/kernel/sched_ext/root", SCX_OPS] in r["events"]


def test_kfunc_and_core_relocation_in_a_declared_module(seen: dict[str, Any]) -> None:
    r = driver_part(seen, "kfunc_module")
    assert all(i["rc"] == 0 for i in r["insmod"]), r["insmod"]
    d = r["declared"]
    assert d["kmod_btfs"] == ["fou"] and not d["fallback"]
    assert d["extern"]["resolved"] and d["extern"]["btf"] == "fou" and d["extern"]["fd_index"] > 0
    assert d["retval"] == 2  # CO-RE: offsetof(struct bpf_fou_encap, dport) from fou's BTF
    # only fou is read, though several modules are loaded
    assert len(r["present"]) > 3 and d["read"] in (["fou"], []) and d["found"] == ["fou"]
    assert d["searched"] == ["vmlinux", "fou"]


def test_undeclared_object_falls_back_to_all_modules(seen: dict[str, Any]) -> None:
    f = driver_part(seen, "kfunc_module")["fallback"]
    assert f["kmod_btfs"] is None and f["fallback"]
    assert f["extern"]["btf"] == "fou" and f["retval"] == 2
    assert "fou" in f["found"]


def test_module_reload_then_load_uses_the_new_btf_object(seen: dict[str, Any]) -> None:
    r = driver_part(seen, "kfunc_module")
    assert r["rmmod"]["rc"] == 0 and r["reinsmod"]["rc"] == 0
    a = r["after_reload"]
    assert a["read"] == ["fou"] and a["retval"] == 2 and a["extern"]["btf"] == "fou"
    assert isinstance(r["id_after"], int) and r["id_after"] > r["id_before"]


def test_memo_second_load_of_an_undeclared_object_reads_only_its_module(
    seen: dict[str, Any],
) -> None:
    r = driver_part(seen, "memo")
    assert all(i["rc"] == 0 for i in r["insmod"]), r["insmod"]
    first, second, third = r["first"], r["second"], r["third"]
    assert first["fallback"] and first["programs"] and first["bss"]
    # the first load after the module set changed walks every module BTF once ...
    assert first["memo"]["walks"] == 1 and first["memo"]["misses"] >= 2
    assert len(first["read"]) + first["hits_cache"] == len(r["present"])
    assert len(set(first["read"])) == len(first["read"]) and set(first["read"]) <= set(r["present"])
    assert "uinput" in first["found"]
    # ... the next ones read nothing (uinput stays cached) and walk nothing
    for warm in (second, third):
        assert warm["read"] == [] and warm["found"] == ["uinput"], warm
        assert warm["memo"]["walks"] == 0 and warm["memo"]["misses"] == 0
        assert warm["memo"]["hits"] == first["memo"]["misses"]
    assert r["holders_before"] == [["uinput", r["id_before"]]]


def test_memo_after_module_reload_uses_the_new_btf_and_id(seen: dict[str, Any]) -> None:
    r = driver_part(seen, "memo")
    assert r["rmmod"]["rc"] == 0 and r["reinsmod"]["rc"] == 0
    a = r["after_reload"]
    assert a["memo"]["walks"] == 1 and a["memo"]["invalidations"] == 0  # dropped by the event
    assert "uinput" in a["read"] and a["found"] == ["uinput"]
    assert isinstance(r["id_after"], int) and r["id_after"] > r["id_before"]
    assert r["holders_after"] == [["uinput", r["id_after"]]]
    w = r["warm_after_reload"]
    assert w["read"] == [] and w["memo"]["walks"] == 0
    # missed events: the listing of /sys/kernel/btf (a new inode for uinput) invalidates
    assert r["missed_rmmod"]["rc"] == 0 and r["missed_insmod"]["rc"] == 0
    m = r["after_missed"]
    assert m["memo"]["invalidations"] == 1 and m["memo"]["walks"] == 1
    assert "uinput" in m["read"]
    assert isinstance(r["id_missed"], int) and r["id_missed"] > r["id_after"]
    assert r["holders_missed"] == [["uinput", r["id_missed"]]]


def test_memo_kfunc_in_a_module_warm(seen: dict[str, Any]) -> None:
    f = driver_part(seen, "memo")["fou_warm"]
    assert f["fallback"] and f["extern"]["btf"] == "fou" and f["extern"]["fd_index"] > 0
    assert f["retval"] == 2 and f["read"] == []


def test_listener_stopped_cleanly(seen: dict[str, Any]) -> None:
    lst = seen["listener"]
    assert not lst["running_after_stop"] and lst["callback_errors"] == 0
    assert lst["overflows"] == 0
