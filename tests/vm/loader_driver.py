"""Runs inside the sched_ext VM (``tests/vm/test_loader_vm.py``): our loader on the sample
schedulers, and the xlated comparison with Debian's libbpf (``bpftool prog loadall``).

Usage (in the VM): ``python -m tests.vm.loader_driver SCHED_DIR NAME OUT.json``. Records:
``cycle`` (load ``NAME.bpf.o`` -- the ``.struct_ops.link`` build --, attach, sched_ext
state and ops name, a workload, the ``nr_enqueued`` counter, detach, final state, phase
timings) and ``xlated`` (per program of ``NAME.legacy.bpf.o``: whether our xlated
instructions equal libbpf's, per-load values aside: see :mod:`tests.xlated`).
``python -m tests.vm.loader_driver --absent SCHED_DIR NAME OUT.json`` instead records what
loading ``NAME.bpf.o`` does while a module it declares in ``.kmod_btfs`` is not loaded
(``absent``: the registry's missing modules, the error's type, message and
``missing_modules``, sched_ext state before and after, and whether the load succeeded).
``python -m tests.vm.loader_driver --ops-flags SCHED_DIR NAME OUT.json`` records
``sched_ext_ops.flags`` by name through ``schedswitchctl object load`` (run in this
process): ``--ops-flag SCX_OPS_SWITCH_PARTIAL --ops-flag SCX_OPS_HAS_CGROUP_WEIGHT`` (the
second is gone from 7.x kernels) with ``--pin``, then the kernel's side -- the ``flags``
member of the struct_ops map's value (``BPF_MAP_LOOKUP_ELEM`` of the pinned map, laid out by
vmlinux BTF's ``struct bpf_struct_ops_sched_ext_ops``), ``switch_all``, ``state`` and
``root/ops`` --, unload; then ``--require-ops-flag SCX_OPS_HAS_CGROUP_WEIGHT`` (exit code,
stderr, state after).
Observations only; the host test asserts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from schedswitchd.bpf.object import open_object
from schedswitchd.cli.ctl import main as ctl_main
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.fd import MapFd, ProgFd
from schedswitchd.kernel.loader import load_object
from schedswitchd.kernel.struct_ops.value import find_struct_ops_kernel_type
from tests.xlated import differences

STATE = Path("/sys/kernel/sched_ext/state")
OPS = Path("/sys/kernel/sched_ext/root/ops")


def _state() -> str:
    return STATE.read_text().strip()


def _wait_state(want: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _state() == want:
            return True
        time.sleep(0.05)
    return False


def _workload() -> None:
    procs = [
        subprocess.Popen(["sh", "-c", "seq 1 20000 | sort -rn | tail -1 > /dev/null"])
        for _ in range(4)
    ]
    for p in procs:
        p.wait()


def cycle(reg: KernelBtfRegistry, path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"initial": _state()}
    spec = open_object(path)
    with load_object(spec, reg.targets(spec.kmod_btfs), open_btf_object=reg.open_btf_object) as obj:
        obj.attach_struct_ops()
        out["enabled"] = _wait_state("enabled", 10)
        out["ops"] = OPS.read_text().strip() if OPS.exists() else None
        _workload()
        out["state_after_workload"] = _state()
        raw = obj.read_variable("nr_enqueued")  # u64, or u64[levels]: sum them
        out["nr_enqueued"] = sum(
            int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw), 8)
        )
        obj.detach_struct_ops()
        out["disabled"] = _wait_state("disabled", 10)
        out["timings_ns"] = dict(obj.timings_ns)
    return out


def xlated(reg: KernelBtfRegistry, path: Path) -> dict[str, Any]:
    pins = Path("/sys/fs/bpf/ssd_loader_vm")
    run = subprocess.run(
        ["bpftool", "prog", "loadall", str(path), str(pins)], capture_output=True, text=True
    )
    if run.returncode != 0:
        return {"libbpf_error": run.stderr[-500:]}
    try:
        theirs: dict[str, bytes] = {}
        for pin in sorted(os.listdir(pins)):
            with syscall.obj_get(pins / pin, expect=ProgFd) as fd:
                info = syscall.prog_info(fd)
                theirs[info.name] = info.xlated_insns
    finally:
        shutil.rmtree(pins, ignore_errors=True)
    spec = open_object(path)
    with load_object(spec, reg.targets(spec.kmod_btfs), open_btf_object=reg.open_btf_object) as obj:
        ours = {
            syscall.prog_info(p.fd, xlated=False).name: syscall.prog_info(p.fd).xlated_insns
            for p in obj.programs.values()
        }
    diffs = {n: differences(ours.get(n, b""), x) for n, x in theirs.items()}
    return {
        "ours": sorted(ours),
        "theirs": sorted(theirs),
        "equal": {n: not d for n, d in diffs.items()},
        "insns": {n: len(x) // 8 for n, x in theirs.items()},
        "diffs": diffs,
    }


def absent(reg: KernelBtfRegistry, path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"initial": _state(), "loaded": False}
    spec = open_object(path)
    targets = reg.targets(spec.kmod_btfs)
    out["declared"] = list(targets.report.declared)
    out["report_missing"] = list(targets.report.missing)
    try:
        with load_object(spec, targets, open_btf_object=reg.open_btf_object):
            out["loaded"] = True
    except Exception as e:
        out["error_type"] = type(e).__name__
        out["error_mro"] = [c.__name__ for c in type(e).__mro__]
        out["message"] = str(e)
        out["missing_modules"] = list(getattr(e, "missing_modules", ()))
    out["final"] = _state()
    out["bpf_progs_left"] = subprocess.run(
        ["bpftool", "prog", "show", "name", "ss_latency_init"], capture_output=True, text=True
    ).stdout
    return out


def _ctl(argv: list[str]) -> tuple[int, str, str]:
    """``schedswitchctl ARGV`` in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = ctl_main(argv)
        except SystemExit as e:  # argparse
            rc = int(e.code or 0)
    return rc, out.getvalue(), err.getvalue()


def ops_flags(reg: KernelBtfRegistry, path: Path) -> dict[str, Any]:
    pins = Path("/sys/fs/bpf/ssd_loader_vm_flags")
    out: dict[str, Any] = {"initial": _state()}
    base = ["object", "load", str(path)]
    rc, text, err = _ctl(
        [
            *base,
            "--ops-flag",
            "SCX_OPS_SWITCH_PARTIAL",
            "--ops-flag",
            "SCX_OPS_HAS_CGROUP_WEIGHT",
            "--pin",
            str(pins),
            "--json",
        ]
    )
    out["rc"], out["stderr"] = rc, err
    if rc == 0:
        info = json.loads(text)
        out["ops_flags"] = info.get("ops_flags")
        out["enabled"] = _wait_state("enabled", 10)
        out["ops"] = OPS.read_text().strip() if OPS.exists() else None
        out["switch_all"] = Path("/sys/kernel/sched_ext/switch_all").read_text().strip()
        btf = reg.vmlinux
        kt = find_struct_ops_kernel_type(btf, "sched_ext_ops")
        assert kt is not None
        found = btf.find_member(kt.type_id, "flags")
        assert found is not None
        ops_map = next(m["name"] for m in info["maps"] if m["kind"] == "struct_ops")
        with syscall.obj_get(info["pinned"][f"map_{ops_map}"], expect=MapFd) as fd:
            value = syscall.map_lookup_elem(fd, bytes(4), kt.value_size)
        assert value is not None
        start = kt.data_offset + found[0] // 8
        out["kernel_flags"] = int.from_bytes(value[start : start + 8], "little")
        out["unload_rc"] = _ctl(["object", "unload", str(pins)])[0]
        out["disabled"] = _wait_state("disabled", 10)
    rc, text, err = _ctl([*base, "--require-ops-flag", "SCX_OPS_HAS_CGROUP_WEIGHT"])
    out["required"] = {"rc": rc, "stdout": text, "stderr": err, "state_after": _state()}
    out["final"] = _state()
    return out


def verdicts(sched_dir: Path) -> dict[str, Any]:
    """``schedswitchctl object load --json`` of ss_fifo three ways: left to run (exit 0,
    enabled), ejected by its own scx_bpf_error() while --watch holds it (exit 1, the exit
    record), and refused because another scheduler runs (exit 1, never enabled)."""
    fifo, vtime = str(sched_dir / "fifo.bpf.o"), str(sched_dir / "vtime.bpf.o")
    out: dict[str, Any] = {"initial": _state()}

    def load(*argv: str) -> dict[str, Any]:
        rc, text, err = _ctl(["object", "load", *argv, "--json"])
        return {"rc": rc, "doc": json.loads(text) if text.strip() else None, "stderr": err}

    out["runs"] = load(fifo, "--watch", "1")
    out["after_runs"] = _state()
    worker = subprocess.Popen(
        ["sh", "-c", "for i in $(seq 200); do seq 1 2000 | sort -rn > /dev/null; done"]
    )
    out["ejected"] = load(fifo, "--set", "error_after=200", "--watch", "20")
    worker.kill()
    worker.wait()
    _wait_state("disabled", 10)
    out["after_ejected"] = _state()
    pins = Path("/sys/fs/bpf/ssd_loader_vm_busy")
    out["holder"] = load(fifo, "--pin", str(pins))
    out["refused"] = load(vtime)
    out["unload_rc"] = _ctl(["object", "unload", str(pins)])[0]
    _wait_state("disabled", 10)
    out["final"] = _state()
    return out


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--verdicts":
        try:
            res = verdicts(Path(argv[1]))
        except Exception as e:
            res = {"exception": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}
        Path(argv[2]).write_text(json.dumps(res))
        return 0
    if argv and argv[0] == "--ops-flags":
        try:
            res = ops_flags(KernelBtfRegistry(), Path(argv[1]) / f"{argv[2]}.bpf.o")
        except Exception as e:
            res = {"exception": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}
        Path(argv[3]).write_text(json.dumps(res))
        return 0
    if argv and argv[0] == "--absent":
        out = Path(argv[3])
        try:
            res = absent(KernelBtfRegistry(), Path(argv[1]) / f"{argv[2]}.bpf.o")
        except Exception as e:
            res = {"exception": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}
        out.write_text(json.dumps(res))
        return 0
    sched_dir, name, out_path = Path(argv[0]), argv[1], Path(argv[2])
    reg = KernelBtfRegistry()
    result: dict[str, Any] = {}
    for key, fn, obj in (
        ("cycle", cycle, sched_dir / f"{name}.bpf.o"),
        ("xlated", xlated, sched_dir / f"{name}.legacy.bpf.o"),
    ):
        try:
            result[key] = fn(reg, obj)
        except Exception as e:  # record, so one failure does not hide the rest
            result[key] = {"exception": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}
    out_path.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
