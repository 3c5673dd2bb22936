"""Driver of tests/vm/test_switch_vm.py, run inside the sched_ext VM: the switcher with the
real backend, as a standby hit uses it (:meth:`Switcher.begin_standby`, then
:meth:`PendingSwitch.finish`), and what the kernel leaves in a scheduler's exit record.

``ours``: ss_fifo runs, ss_vtime is a standby; the hit's first half, the kernel's state,
the second half (no ejection found: the old one's record says ``SCX_EXIT_UNREG``).
``ejected``: ss_fifo with ``error_after`` runs until the kernel ejects it (nobody watches);
a standby hit to ss_vtime then reads no kernel state before the detach, and its second half
finds the ejection from the old scheduler's exit record (``SCX_EXIT_ERROR_BPF``).
``confirm``: the backend's confirmation of an enable. A handle attached for the first time
is confirmed from ``state`` and its own (empty) exit record, without opening ``root/ops``;
one attached again (its record holds the earlier exit) from ``state`` and ``root/ops``; and
an enable the kernel fails (a ``hotplug_seq`` one off: ``check_hotplug_seq()`` exits it) is
reported as failed, not enabled.
Observations only (JSON to the path given); the host test asserts.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.kernel_backend import KernelBackend
from schedswitchd.daemon.switcher import Switcher
from schedswitchd.errors import SchedSwitchError
from schedswitchd.kernel.sched_ext import sysfs as scx

PIN_DIR = Path("/sys/fs/bpf/ssd-switch-test")


def _kernel() -> dict[str, Any]:
    st = scx.read_status()
    return {"state": str(st.state), "ops": st.ops, "enable_seq": st.enable_seq}


def _until(pred: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


def _hit(sw: Switcher, vtime: SchedulerConfig, out: dict[str, Any]) -> None:
    sw.fill_standby([("vtime", vtime, "test")])
    out["held"] = "vtime" in sw.standby.entries
    out["late_check_ok"] = sw.late_check_ok()
    reads = {"n": 0}
    real = sw.backend.kernel_state

    def counted() -> Any:
        reads["n"] += 1
        return real()

    sw.backend.kernel_state = counted  # type: ignore[method-assign]
    pending = sw.begin_standby("vtime", vtime, "test hit")
    sw.backend.kernel_state = real  # type: ignore[method-assign]
    out["kernel_reads_in_first_half"] = reads["n"]
    assert pending is not None
    out["running"] = pending.running
    out["kernel_after_first_half"] = _kernel()
    gone = pending.finish()
    rec = pending.record
    out["record"] = {"result": rec.result, "previous": rec.previous, "finished": rec.finished}
    out["gone"] = (
        None
        if gone is None
        else {
            "previous": gone[0].previous,
            "result": gone[0].result,
            "kind": gone[0].exit.kind if gone[0].exit else None,
            "kind_name": gone[0].exit.kind_name if gone[0].exit else None,
            "ran_for_ns": gone[1],
        }
    )
    out["kernel_after"] = _kernel()


def ours(objects: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"initial": _kernel()}
    sw = Switcher(KernelBackend(pin_dir=PIN_DIR), 10.0, 16)
    sw.configure_standby(1, 1 << 30)
    fifo = SchedulerConfig.model_validate({"object": str(objects / "fifo.bpf.o")})
    vtime = SchedulerConfig.model_validate({"object": str(objects / "vtime.bpf.o")})
    first = sw.switch_to("fifo", fifo, "test")
    out["first"] = first.result if first else None
    _hit(sw, vtime, out)
    last = sw.switch_to("kernel", None, "test end")
    out["end"] = last.result if last else None
    return out


def ejected(objects: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"initial": _kernel()}
    sw = Switcher(KernelBackend(pin_dir=PIN_DIR), 10.0, 16)
    sw.configure_standby(1, 1 << 30)
    faulty = SchedulerConfig.model_validate(
        {"object": str(objects / "fifo.bpf.o"), "rodata": {"error_after": 50}}
    )
    vtime = SchedulerConfig.model_validate({"object": str(objects / "vtime.bpf.o")})
    first = sw.switch_to("faulty", faulty, "test")
    out["first"] = first.result if first else None
    out["ejected_by_kernel"] = _until(lambda: scx.read_state() is not scx.ScxState.ENABLED, 30)
    out["kernel_before_hit"] = _kernel()
    _hit(sw, vtime, out)
    out["history"] = [(r.previous, r.target, r.result) for r in sw.history]
    last = sw.switch_to("kernel", None, "test end")
    out["end"] = last.result if last else None
    return out


def confirm(objects: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"initial": _kernel()}
    backend = KernelBackend(pin_dir=PIN_DIR)
    fifo = SchedulerConfig.model_validate({"object": str(objects / "fifo.bpf.o")})
    files = backend.scx_files
    real_ops = files.ops
    reads = {"ops": 0}

    def counted_ops() -> str | None:
        reads["ops"] += 1
        return real_ops()

    files.ops = counted_ops  # type: ignore[method-assign]
    h = backend.prepare("fifo", fifo)
    backend.attach(h, 10.0)
    out["ops_reads_first"] = reads["ops"]
    out["kernel_first"] = _kernel()
    backend.detach(h, 10.0)
    reads["ops"] = 0
    backend.attach(h, 10.0)
    out["ops_reads_again"] = reads["ops"]
    out["kernel_again"] = _kernel()
    backend.detach(h, 10.0)
    backend.discard(h)
    files.ops = real_ops  # type: ignore[method-assign]
    # the backend's prepare reads it through this module: a CPU hotplug "since" the load
    real_seq = scx.read_hotplug_seq
    setattr(scx, "read_hotplug_seq", lambda root=scx.SCHED_EXT_ROOT: real_seq(root) + 7)  # noqa: B010
    try:
        stale = backend.prepare(
            "stale", SchedulerConfig.model_validate({"object": str(objects / "fifo.bpf.o")})
        )
    finally:
        setattr(scx, "read_hotplug_seq", real_seq)  # noqa: B010
    try:
        backend.attach(stale, 10.0)
        out["failed_enable"] = "reported enabled"
    except SchedSwitchError as exc:
        out["failed_enable"] = f"{type(exc).__name__}: {exc}"
    out["kernel_after_failed"] = _kernel()
    info = backend.exit_info(stale)
    out["failed_exit"] = info.kind_name if info is not None else None
    backend.discard(stale)
    return out


def main() -> int:
    objects, dest = Path(sys.argv[1]), Path(sys.argv[2])
    result: dict[str, Any] = {}
    for name, part in (("ours", ours), ("ejected", ejected), ("confirm", confirm)):
        try:
            result[name] = part(objects)
        except Exception as exc:
            result[name] = {"exception": repr(exc), "tb": traceback.format_exc()}
    dest.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
