"""Runs inside the sched_ext VM (``tests/vm/test_programs_vm.py``): programs beside a
scheduler's struct_ops, through the loader and through the daemon's backend.

Usage (in the VM): ``python -m tests.vm.progs_driver HOOKED.bpf.o ATTACH.bpf.o KPROBES.bpf.o
OUT.json``.
Records ``loader`` (ss_hooked: programs loaded and skipped, a ``SEC("syscall")`` run before
and after attach, the ``fentry``/``fexit`` counters of ``bpf_scx_reg`` once the struct_ops
link exists, link ids, a workload's ``tp_btf/sched_switch`` count, links left after close),
``fentry`` (tests/bpf/attach.bpf.o's fentry/fexit on getpgid(2): counters and the return
value seen), ``kprobe`` (tests/bpf/kprobes.bpf.o's kprobe/kretprobe, the same) and
``backend`` (KernelBackend prepare/attach: the pins under ``progs/``, a
restart that adopts them, detach and discard). Observations only; the host test asserts.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedswitchd.bpf.customize import set_variable
from schedswitchd.bpf.object import open_object
from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.kernel_backend import KernelBackend
from schedswitchd.daemon.kernel_handle import KernelPrepared
from schedswitchd.errors import BpfSyscallError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import LoadedObject, load_object

STATE = Path("/sys/kernel/sched_ext/state")
OPS = Path("/sys/kernel/sched_ext/root/ops")
PIN_DIR = Path("/sys/fs/bpf/ssd-progs-test")


def _state() -> str:
    return STATE.read_text().strip()


def _until(pred: Callable[[], bool], timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def _u64(obj: LoadedObject, name: str) -> int:
    return int(struct.unpack("<Q", obj.read_variable(name))[0])


def _s64(obj: LoadedObject, name: str) -> int:
    return int(struct.unpack("<q", obj.read_variable(name))[0])


def _link_ids_of(prog_ids: set[int]) -> list[int]:
    out, start = [], 0
    while (nxt := syscall.link_get_next_id(start)) is not None:
        start = nxt
        try:
            with syscall.link_get_fd_by_id(nxt) as fd:
                if syscall.link_info(fd).prog_id in prog_ids:
                    out.append(nxt)
        except BpfSyscallError:
            continue
    return out


def _link_alive(link_id: int) -> bool:
    try:
        syscall.link_get_fd_by_id(link_id).close()
    except BpfSyscallError:
        return False
    return True


def _workload() -> None:
    procs = [
        subprocess.Popen(["sh", "-c", "seq 1 20000 | sort -rn | tail -1 > /dev/null"])
        for _ in range(3)
    ]
    for p in procs:
        p.wait()


def loader(reg: KernelBtfRegistry, path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"initial": _state()}
    spec = open_object(path)
    obj = load_object(spec, reg.targets(spec.kmod_btfs), open_btf_object=reg.open_btf_object)
    with obj:
        out["programs"] = sorted(obj.programs)
        out["skipped"] = dict(obj.skipped)
        out["notes"] = list(obj.notes)
        before = obj.run_program_result("setup", {"seed": 42})
        out["run_before"] = {
            "retval": before.retval,
            "ctx_enqueued": struct.unpack("<QQ", before.ctx)[1],
            "seed": _u64(obj, "seed"),
            "reg_calls": _u64(obj, "reg_calls"),
        }
        obj.attach_struct_ops()  # attach_programs first
        out["enabled"] = _until(lambda: _state() == "enabled")
        out["ops"] = OPS.read_text().strip() if OPS.exists() else None
        out["reg_calls"] = _u64(obj, "reg_calls")
        out["reg_exits"] = _u64(obj, "reg_exits")
        out["reg_ret"] = _s64(obj, "reg_ret")
        out["enq_at_reg"] = _u64(obj, "enq_at_reg")
        out["program_links"] = {n: syscall.link_info(fd).id for n, fd in obj.program_links.items()}
        out["ops_link"] = syscall.link_info(obj.links["ss_hooked"]).id
        _workload()
        out["switches"] = _u64(obj, "switches")
        out["nr_enqueued"] = _u64(obj, "nr_enqueued")
        after = obj.run_program_result("setup", {"seed": 7})
        out["run_after"] = {
            "retval": after.retval,
            "ctx_enqueued": struct.unpack("<QQ", after.ctx)[1],
            "seed": _u64(obj, "seed"),
        }
        prog_ids = {p.id for p in obj.programs.values()}
        out["links_while_loaded"] = len(_link_ids_of(prog_ids))
    out["disabled"] = _until(lambda: _state() == "disabled")
    _until(lambda: not _link_ids_of(prog_ids), 5)  # links are freed by a work item
    out["links_left"] = _link_ids_of(prog_ids)
    return out


def fentry(reg: KernelBtfRegistry, path: Path) -> dict[str, Any]:
    spec = set_variable(open_object(path), "target_tgid", os.getpid())
    only = {p.name: p.name in ("on_getpgid_entry", "on_getpgid_exit") for p in spec.programs}
    libc = ctypes.CDLL(None, use_errno=True)
    with load_object(
        spec, reg.targets(spec.kmod_btfs), open_btf_object=reg.open_btf_object, autoload=only
    ) as obj:
        pgid = os.getpgid(0)  # before attaching: it is a getpgid(2) too
        links = obj.attach_programs()
        # getpgid(0) twice, then of a pid that does not exist: the kernel returns -ESRCH
        rets = [int(libc.syscall(121, 0)) for _ in range(2)] + [int(libc.syscall(121, 1 << 22))]
        return {
            "links": sorted(links),
            "pgid": pgid,
            "rets": rets,
            "fentry_hits": _u64(obj, "fentry_hits"),
            "fexit_hits": _u64(obj, "fexit_hits"),
            "fexit_last_ret": _s64(obj, "fexit_last_ret"),
        }


def kprobe(reg: KernelBtfRegistry, path: Path) -> dict[str, Any]:
    spec = set_variable(open_object(path), "target_tgid", os.getpid())
    libc = ctypes.CDLL(None, use_errno=True)
    with load_object(spec, reg.targets(spec.kmod_btfs), open_btf_object=reg.open_btf_object) as obj:
        pgid = os.getpgid(0)
        links = obj.attach_programs()
        rets = [int(libc.syscall(121, 0)) for _ in range(2)] + [int(libc.syscall(121, 1 << 22))]
        return {
            "links": sorted(links),
            "link_types": sorted({int(syscall.link_info(fd).type) for fd in links.values()}),
            "pgid": pgid,
            "rets": rets,
            "kprobe_hits": _u64(obj, "kprobe_hits"),
            "kretprobe_hits": _u64(obj, "kretprobe_hits"),
            "kretprobe_last_ret": _s64(obj, "kretprobe_last_ret"),
        }


def backend(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"initial": _state()}
    cfg = SchedulerConfig.model_validate({"object": str(path)})
    first = KernelBackend(pin_dir=PIN_DIR)
    h = first.prepare("hooked", cfg)
    out["links_before_attach"] = h.program_links() != {}
    first.attach(h, 10.0)
    first.pin(h)
    d = first.pins.path("hooked")
    out["pins"] = sorted(os.listdir(d))
    out["prog_pins"] = sorted(os.listdir(d / "progs"))
    ids = {n: syscall.link_info(fd).id for n, fd in h.program_links().items()}
    out["attach_phases"] = sorted(k for k in h.timings_ns if k.startswith("attach."))
    h.close()  # the daemon dies without unpinning: the pins hold everything
    out["enabled_after_death"] = _state() == "enabled"
    out["links_alive_after_death"] = all(_link_alive(i) for i in ids.values())
    second = KernelBackend(pin_dir=PIN_DIR)
    got = second.adopt({"hooked": cfg})
    out["adopted"] = isinstance(got, KernelPrepared)
    if isinstance(got, KernelPrepared):
        adopted = got.program_links()
        out["adopted_links"] = {n: syscall.link_info(fd).id for n, fd in adopted.items()}
        second.detach(got, 10.0)
        out["after_detach"] = _state()
        second.discard(got)
    out["pins_left"] = second.pins.names()
    out["links_gone"] = _until(lambda: not any(_link_alive(i) for i in ids.values()), 5)
    out["prog_link_ids"] = ids
    out["final"] = _state()
    return out


def main(argv: list[str]) -> int:
    hooked, attach, kprobes, dest = (Path(a) for a in argv[1:5])
    reg = KernelBtfRegistry()
    result: dict[str, Any] = {}
    steps: tuple[tuple[str, Callable[[], dict[str, Any]]], ...] = (
        ("loader", lambda: loader(reg, hooked)),
        ("fentry", lambda: fentry(reg, attach)),
        ("kprobe", lambda: kprobe(reg, kprobes)),
        ("backend", lambda: backend(hooked)),
    )
    for key, fn in steps:
        try:
            result[key] = fn()
        except Exception as exc:  # recorded for the host test to show
            tb = traceback.format_exc()
            result[key] = {"exception": f"{type(exc).__name__}: {exc}", "tb": tb}
    dest.write_text(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
