"""Runs inside the sched_ext VM (``tests/vm/test_registry_vm.py``): the BTF registry, the
uevent listener and the sched_ext reader against a kernel with real modules and sched_ext.

Usage (in the VM): ``python -m tests.vm.registry_driver CONFIG.json OUT.json``. CONFIG holds
``{"ko": {name: decompressed .ko path}, "fou_ko": [.ko paths of fou and its dependencies,
dependencies first], "fou_obj"/"fou_nokmod_obj": tests/vm/kmod_fou.bpf.c built with and
without .kmod_btfs, "scheduler": legacy .bpf.o path or null, "scx_ops": its ops name,
"uinput_ko": [.ko paths of uinput and its dependencies], "latency_nokmod_obj": the
ss_latency scheduler built without .kmod_btfs (CO-RE types only uinput has)}``.
Writes one JSON object of observations; the host test asserts. Every step records what it
saw rather than asserting, so one failure does not hide the rest.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedswitchd.bpf.object import open_object
from schedswitchd.errors import RegistryError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry, TargetBtfs
from schedswitchd.kernel.loader import load_object
from schedswitchd.kernel.sched_ext import sysfs
from schedswitchd.kernel.uevents import Uevent, UeventListener

MODULE = "dummy"  # drivers/net/dummy.ko: no dependencies, has BTF, nothing else loads it
SECOND = "xor"  # lib/raid/xor/xor.ko: no dependencies


class Events:
    """Module and sched_ext uevents seen, waitable."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        self.cond = threading.Condition()

    def __call__(self, ev: Uevent) -> None:
        with self.cond:
            key = ev.module_name or ev.devpath
            self.seen.append((str(ev.action), key, ev.scx_ops))
            self.cond.notify_all()

    def wait(self, action: str, key: str, timeout_s: float = 15.0) -> float | None:
        """Seconds until (action, key) was seen (counting from now), or None."""
        t0 = time.monotonic()
        with self.cond:
            ok = self.cond.wait_for(
                lambda: any(a == action and k == key for a, k, _ in self.seen), timeout_s
            )
        return time.monotonic() - t0 if ok else None

    def clear(self) -> None:
        with self.cond:
            self.seen.clear()


def _wait_for_state(
    state: str, ops: str | None, listener: UeventListener, timeout_s: float = 20.0
) -> sysfs.SchedExtStatus:
    """Poll /sys/kernel/sched_ext (every 5 ms, and at each sched_ext uevent) until it is
    in ``state`` (with ops name ``ops`` if given); AssertionError after ``timeout_s``."""
    wake = threading.Event()
    sub = listener.subscribe_sched_ext(lambda _ev: wake.set())
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            wake.clear()
            status = sysfs.read_status()
            if status.state == state and (ops is None or status.ops == ops):
                return status
            left = deadline - time.monotonic()
            assert left > 0, f"sched_ext not {state} (ops {ops}) in {timeout_s} s: {status}"
            wake.wait(min(0.005, left))
    finally:
        sub.cancel()


def sh(*argv: str) -> dict[str, Any]:
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    return {"argv": list(argv), "rc": p.returncode, "err": p.stderr[-400:]}


def obj_id(reg: KernelBtfRegistry, name: str) -> int | str:
    """The verified object id of ``name``, or the error text."""
    try:
        with reg.open_btf_object(name) as fd:
            info = syscall.btf_info(fd)
            return info.id if info.name == name and info.kernel_btf else f"bad info {info}"
    except RegistryError as exc:
        return f"RegistryError: {exc}"


#: Every module BTF object a report named, kept alive: a report gives its ``id()``, which
#: names one object across the driver's steps only while that object lives (a freed one's
#: address is reused, and a reload's new object could otherwise compare equal).
_REPORTED: list[object] = []


def report(reg: KernelBtfRegistry, names: list[str]) -> dict[str, Any]:
    t = reg.targets(names)
    r = t.report
    btf = t.module(names[0]) if r.found else None
    if btf is not None:
        _REPORTED.append(btf)
    return {
        "found": r.found,
        "missing": r.missing,
        "read": r.read,
        "hits": r.cache_hits,
        "start_id": btf.start_id if btf else None,
        "vmlinux_end": t.vmlinux.end_id,
        "btf_obj": id(btf) if btf else None,
    }


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ko: dict[str, str] = cfg["ko"]

    def step(name: str, fn: Callable[[], Any]) -> None:
        try:
            out[name] = fn()
        except Exception:
            out[name] = {"exception": traceback.format_exc()[-1500:]}

    listener = UeventListener()
    listener.start()
    events = Events()
    listener.subscribe_modules(events)
    listener.subscribe_sched_ext(events)
    reg = KernelBtfRegistry(max_entries=8)
    attached = reg.attach(listener)
    assert reg.ids is not None

    def initial() -> dict[str, Any]:
        return {"names": reg.module_names(), "ids": reg.ids.names() if reg.ids else {}}

    step("initial", initial)

    def load_two() -> dict[str, Any]:
        r: dict[str, Any] = {"insmod": [sh("insmod", ko[MODULE]), sh("insmod", ko[SECOND])]}
        r["event_s"] = [events.wait("add", MODULE), events.wait("add", SECOND)]
        r["present"] = reg.module_names()
        r["id"] = obj_id(reg, MODULE)
        r["id_second"] = obj_id(reg, SECOND)
        r["report"] = report(reg, [MODULE, SECOND, "not_loaded_mod"])
        r["again"] = report(reg, [MODULE, SECOND])
        with reg.open_btf_object(MODULE) as fd:
            kernel_raw = syscall.btf_info(fd, data=True).data
        r["raw_equal"] = kernel_raw == Path("/sys/kernel/btf", MODULE).read_bytes()
        r["ids_stats"] = str(reg.stats().ids)
        return r

    step("load_two", load_two)

    def unload() -> dict[str, Any]:
        events.clear()
        r: dict[str, Any] = {"rmmod": sh("rmmod", MODULE), "event_s": events.wait("remove", MODULE)}
        r["cached"] = reg.cached_modules()
        r["report"] = report(reg, [MODULE])
        r["id"] = obj_id(reg, MODULE)
        return r

    step("unload", unload)

    def reload() -> dict[str, Any]:
        events.clear()
        r: dict[str, Any] = {
            "insmod": sh("insmod", ko[MODULE]),
            "event_s": events.wait("add", MODULE),
        }
        r["id"] = obj_id(reg, MODULE)
        r["report"] = report(reg, [MODULE])
        r["stats"] = {"uevents": reg.stats().module_uevents, "ids": str(reg.stats().ids)}
        return r

    step("reload", reload)

    def missed() -> dict[str, Any]:
        # Detach the registry: the next unload/reload happens without it hearing a thing.
        attached.cancel()
        before = reg.stats()
        events.clear()
        r: dict[str, Any] = {"rmmod": sh("rmmod", MODULE)}
        events.wait("remove", MODULE)
        r["insmod"] = sh("insmod", ko[MODULE])
        events.wait("add", MODULE)
        r["report"] = report(reg, [MODULE])
        r["id"] = obj_id(reg, MODULE)
        after = reg.stats()
        r["stale_dropped"] = after.stale_dropped - before.stale_dropped
        r["uevents_delta"] = after.module_uevents - before.module_uevents
        r["ids_stats"] = str(after.ids)
        return r

    step("missed", missed)

    def scx() -> dict[str, Any]:
        obj, ops = cfg.get("scheduler"), cfg.get("scx_ops")
        r: dict[str, Any] = {"before": str(sysfs.read_status())}
        if not obj:
            r["skipped"] = "no scheduler object"
            return r
        events.clear()
        r["register"] = sh("bpftool", "struct_ops", "register", obj)
        st = _wait_for_state("enabled", ops, listener)
        r["enabled"] = {"state": str(st.state), "ops": st.ops, "enable_seq": st.enable_seq}
        r["add_event_s"] = events.wait("add", "/kernel/sched_ext/root")
        r["unregister"] = sh("bpftool", "struct_ops", "unregister", "name", str(ops))
        st = _wait_for_state("disabled", None, listener)
        r["disabled"] = {"state": str(st.state), "ops": st.ops}
        r["remove_event_s"] = events.wait("remove", "/kernel/sched_ext/root")
        r["events"] = [e for e in events.seen if e[1] == "/kernel/sched_ext/root"]
        return r

    step("scx", scx)

    def load_fou(path: str) -> tuple[dict[str, Any], TargetBtfs]:
        spec = open_object(path)
        t = reg.targets(spec.kmod_btfs)
        with load_object(spec, t, open_btf_object=reg.open_btf_object) as obj:
            ext = obj.externs["bpf_skb_get_fou_encap"]
            run = syscall.prog_test_run(obj.programs["get_encap"].fd, data_in=bytes(64))
        got = {
            "kmod_btfs": spec.kmod_btfs,
            "extern": {"resolved": ext.resolved, "btf": ext.btf_name, "fd_index": ext.fd_index},
            "retval": run.retval,
            "read": t.report.read,
            "found": t.report.found,
            "searched": list(t.searched),
            "fallback": t.fallback,
        }
        return got, t

    def kfunc_module() -> dict[str, Any]:
        events.clear()
        r: dict[str, Any] = {"insmod": [sh("insmod", p) for p in cfg["fou_ko"]]}
        r["event_s"] = events.wait("add", "fou")
        r["present"] = reg.module_names()
        r["declared"], _ = load_fou(cfg["fou_obj"])
        r["fallback"], _ = load_fou(cfg["fou_nokmod_obj"])
        r["id_before"] = obj_id(reg, "fou")
        events.clear()
        r["rmmod"] = sh("rmmod", "fou")
        events.wait("remove", "fou")
        r["reinsmod"] = sh("insmod", cfg["fou_ko"][-1])
        events.wait("add", "fou")
        r["after_reload"], _ = load_fou(cfg["fou_obj"])
        r["id_after"] = obj_id(reg, "fou")
        return r

    step("kfunc_module", kfunc_module)

    def load_nokmod(path: str) -> dict[str, Any]:
        """Load (never attach) an object without .kmod_btfs; what it read, and the memo."""
        spec = open_object(path)
        before = reg.stats().lookups
        t = reg.targets(spec.kmod_btfs)
        with load_object(spec, t, open_btf_object=reg.open_btf_object) as obj:
            bss = obj.maps.get(".bss")
            loaded = sorted(obj.programs)
        after = reg.stats().lookups
        return {
            "fallback": t.fallback,
            "read": t.report.read,
            "hits_cache": t.report.cache_hits,
            "found": t.report.found,
            "programs": loaded,
            "bss": bss is not None,
            "memo": {
                k: getattr(after, k) - getattr(before, k)
                for k in ("hits", "misses", "walks", "invalidations")
            },
        }

    def memo() -> dict[str, Any]:
        # Objects without .kmod_btfs through the module lookup memo, events heard again.
        sub = reg.attach(listener)
        r: dict[str, Any] = {"insmod": [sh("insmod", p) for p in cfg["uinput_ko"]]}
        r["event_s"] = events.wait("add", "uinput")
        r["present"] = reg.module_names()
        obj = cfg["latency_nokmod_obj"]
        r["first"] = load_nokmod(obj)
        r["second"] = load_nokmod(obj)
        r["third"] = load_nokmod(obj)
        from schedswitchd.bpf.btf.types import Kind
        from schedswitchd.kernel.btf.module_memo import ModuleLookup

        lk = ModuleLookup("uinput_device", (Kind.STRUCT,), essential=True)
        r["holders_before"] = reg.holders([lk])[lk]
        r["id_before"] = obj_id(reg, "uinput")
        # rmmod + insmod with the registry listening
        events.clear()
        r["rmmod"] = sh("rmmod", "uinput")
        events.wait("remove", "uinput")
        r["reinsmod"] = sh("insmod", cfg["uinput_ko"][-1])
        events.wait("add", "uinput")
        r["after_reload"] = load_nokmod(obj)
        r["holders_after"] = reg.holders([lk])[lk]
        r["id_after"] = obj_id(reg, "uinput")
        r["warm_after_reload"] = load_nokmod(obj)
        # the same without events: only the module set's fingerprint can tell
        sub.cancel()
        events.clear()
        r["missed_rmmod"] = sh("rmmod", "uinput")
        events.wait("remove", "uinput")
        r["missed_insmod"] = sh("insmod", cfg["uinput_ko"][-1])
        events.wait("add", "uinput")
        r["after_missed"] = load_nokmod(obj)
        r["holders_missed"] = reg.holders([lk])[lk]
        r["id_missed"] = obj_id(reg, "uinput")
        # a kfunc that only a module has: the fou object without .kmod_btfs, warm
        fou = [load_fou(cfg["fou_nokmod_obj"])[0] for _ in range(2)]
        r["fou_warm"] = fou[1]
        # what checking the module set costs per load (one listing of /sys/kernel/btf)
        st = reg.stats().lookups
        r["check_ns_avg"] = st.check_ns // max(st.checks, 1)
        r["stats"] = dataclasses.asdict(st)
        return r

    if cfg.get("uinput_ko") and cfg.get("latency_nokmod_obj"):
        step("memo", memo)
    listener.stop()
    out["listener"] = {"running_after_stop": listener.running, **dataclasses.asdict(listener.stats)}
    return out


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[1]).read_text())
    Path(argv[2]).write_text(json.dumps(run(cfg), indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
