"""Runs inside the sched_ext VM for ``tests/vm/test_corpus.py``: objects of
``../shared/corpus`` each taken as far as the kernel lets it, by our loader and by libbpf,
with the kernel's own account of what happened.

    python -m tests.vm.corpus_driver OUT_DIR [--libbpf LIB] [--run-s S] [--timeout-s T] OBJ...

writes ``OUT_DIR/NAME.ours.json`` (and ``NAME.libbpf.json`` with ``--libbpf``) per object.
Each object and loader runs in a child forked from this process (:func:`isolated`), so that
one loader's crash or time limit (``T`` seconds, then SIGKILL) loses only its own record, while
the Python start and imports (half a minute under TCG) are paid once.

Ours does what a libbpf skeleton's user space does without scheduler-specific code: open;
``hotplug_seq`` from sysfs (scx's ``SCX_OPS_OPEN``); load (the loader fills the ``__SCX_*``
enum variables from the kernel BTF by default); attach: the auto-attachable programs, then the
``sched_ext_ops`` struct_ops link. ``--libbpf LIB`` does what ``bpftool struct_ops register``
does (the corpus README's column) with the libbpf shared object ``LIB``
(:func:`tests.libbpf_ref.loaded`): open, load, ``bpf_map__attach_struct_ops`` of each
struct_ops map; no user space, so no enum variables and no ``hotplug_seq``.

Both then: if enabled, the mixed workload of :func:`tools.profiles_soak.soak` for ``S``
seconds; detach; wait for ``disabled``. Recorded: the stage reached and its error, durations
(s), ``enable_seq`` before and after the attach (an ``ops.init`` failure can still return 0
from ``BPF_LINK_CREATE``: ``scx_enable()`` reports it through the exit path, so the counter
says whether the scheduler was ever enabled), the sched_ext lines of ``/dev/kmsg`` written
meanwhile and, for ours, the scheduler's exit record (``uei``, ``struct scx_exit_info`` as its
``ops.exit`` copied it, read once the kernel is done disabling). Observations only: the
host-side test judges them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedswitchd.bpf.customize import set_struct_ops_member
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.scheduler import sched_ext_map
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import LoadedObject, load_object
from schedswitchd.kernel.sched_ext import sysfs as scx
from schedswitchd.kernel.sched_ext.exit_info import uei_layout
from tests.libbpf_ref import MAP_TYPE_STRUCT_OPS, LibbpfError, is_err, loaded
from tools.profiles_soak import KmsgTail, soak
from tools.session import kernel_view, wait_for


def _since(t: float) -> float:
    return round(time.monotonic() - t, 2)


def _error(e: BaseException) -> dict[str, Any]:
    log = getattr(e, "verifier_log", None) or ""
    return {
        "type": type(e).__name__,
        "message": str(e)[-4000:],
        "errno": getattr(e, "errno", None),
        "verifier_tail": log.splitlines()[-25:],
    }


def _attached(out: dict[str, Any], run_s: float) -> None:
    """What follows a successful attach call, the same for both loaders."""
    out["stage"] = "run"
    view = kernel_view()
    out["after_attach"] = view
    if view["state"] == "enabled" and view["ops"]:
        out["soak"] = soak(view["ops"], run_s)
    out["enable_seq_after"] = int(scx.read_enable_seq() or 0)


def _finish(out: dict[str, Any], kmsg: KmsgTail) -> None:
    # the disable work (ops.exit, the kernel's log lines) runs after the link is gone
    wait_for(lambda: kernel_view()["state"] == "disabled", 20, 0.1)
    out["final"] = kernel_view()["state"]
    out["kmsg"] = kmsg.lines()[:200]


def _uei(obj: LoadedObject) -> dict[str, Any] | None:
    layout = uei_layout(obj.spec)
    if layout is None or layout.map_name not in obj.maps:
        return None
    rec = layout.decode(obj.read_variable_map(obj.maps[layout.map_name]))
    if rec is None:
        return {"recorded": False}
    return {"recorded": True, "kind": rec.kind, "reason": rec.reason, "message": rec.message}


def ours(path: Path, run_s: float) -> dict[str, Any]:
    """Our loader's record for ``path`` (see the module docstring)."""
    out: dict[str, Any] = {"loader": "ours", "initial": kernel_view(), "stage": "open"}
    kmsg = KmsgTail()
    t = time.monotonic()
    try:
        spec = open_object(path)
        out["open_s"] = _since(t)
        ops_map = sched_ext_map(spec)
        spec = set_struct_ops_member(spec, ops_map, "hotplug_seq", scx.read_hotplug_seq())
        out["stage"] = "load"
        t = time.monotonic()
        reg = KernelBtfRegistry()
        obj = load_object(spec, reg.targets(spec.kmod_btfs), open_btf_object=reg.open_btf_object)
        out["load_s"] = _since(t)
    except Exception as e:
        out["error"] = _error(e)
        _finish(out, kmsg)
        return out
    with obj:
        out["enum_fill"] = obj.enum_fill.as_dict()
        out["stage"] = "attach"
        out["enable_seq_before"] = int(scx.read_enable_seq() or 0)
        t = time.monotonic()
        try:
            obj.attach_struct_ops(ops_map)
        except Exception as e:
            out["error"] = _error(e)
        else:
            out["attach_s"] = _since(t)
            out["program_links"] = sorted(obj.program_links)
            out["skipped_programs"] = dict(obj.skipped)
            _attached(out, run_s)
            if kernel_view()["state"] != "enabled":  # ops.exit writes uei while disabling
                wait_for(lambda: kernel_view()["state"] == "disabled", 20, 0.1)
        out["uei"] = _uei(obj)
        obj.detach_struct_ops()
    _finish(out, kmsg)
    return out


def with_libbpf(path: Path, run_s: float, library: str) -> dict[str, Any]:
    """libbpf's record for ``path``, ``bpftool struct_ops register``'s steps."""
    out: dict[str, Any] = {"loader": "libbpf", "initial": kernel_view(), "stage": "load"}
    kmsg = KmsgTail()
    log: list[str] = []
    links: list[int] = []
    t = time.monotonic()
    try:
        with loaded(path, library=library, log=log, debug=False) as (lib, obj):
            out["load_s"] = _since(t)
            out["library"] = library
            out["version"] = (lib.libbpf_version_string() or b"").decode()
            out["stage"] = "attach"
            out["enable_seq_before"] = int(scx.read_enable_seq() or 0)
            t = time.monotonic()
            m = lib.bpf_object__next_map(obj, None)
            while m:
                if lib.bpf_map__type(m) == MAP_TYPE_STRUCT_OPS:
                    link = lib.bpf_map__attach_struct_ops(m)
                    if is_err(link):
                        name = lib.bpf_map__name(m).decode()
                        out["error"] = {"message": f"bpf_map__attach_struct_ops({name}) failed"}
                        break
                    links.append(link)
                m = lib.bpf_object__next_map(obj, m)
            else:
                out["attach_s"] = _since(t)
                _attached(out, run_s)
            for link in links:
                lib.bpf_link__destroy(link)
    except LibbpfError as e:
        out["stage"] = e.stage
        out["error"] = {"message": str(e).splitlines()[0]}
    out["log"] = log[-30:]
    _finish(out, kmsg)
    return out


def isolated(fn: Callable[[], dict[str, Any]], dest: Path, timeout_s: float) -> float:
    """Run ``fn`` in a forked child that writes its record (or the exception it raised) to
    ``dest`` as JSON; the child is killed after ``timeout_s`` seconds, and a child that dies
    without a record gets one saying how. Returns the wall time in seconds."""
    t = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            try:
                res = fn()
            except Exception as e:  # recorded, so that the host test says what went wrong
                res = {"exception": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}
            dest.write_text(json.dumps(res, indent=1))
        except BaseException:
            code = 1
        os._exit(code)
    status = None
    while time.monotonic() - t < timeout_s:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.2)
    else:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        dest.write_text(json.dumps({"exception": f"killed after the {timeout_s:g} s limit"}))
    if not dest.exists():
        why = f"child exited without a record (wait status {status})"
        dest.write_text(json.dumps({"exception": why}))
    # a killed child's links close with its fds: let the kernel finish disabling
    wait_for(lambda: kernel_view()["state"] == "disabled", 20, 0.1)
    return round(time.monotonic() - t, 2)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("objects", type=Path, nargs="+")
    ap.add_argument("--libbpf", metavar="LIB", help="also load with this libbpf shared object")
    ap.add_argument("--run-s", type=float, default=5.0)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    args = ap.parse_args(argv)
    # seconds from this process's start (``/proc/self/stat`` field 22, clock ticks since
    # boot) to here: the interpreter's start and the imports, paid once
    started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    up = time.clock_gettime(time.CLOCK_BOOTTIME) - started / os.sysconf("SC_CLK_TCK")
    walls: dict[str, float] = {"startup": round(up, 2)}
    for path in args.objects:
        name = path.name.removesuffix(".bpf.o")
        runs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("ours", functools.partial(ours, path, args.run_s))
        ]
        if args.libbpf:
            runs.append(("libbpf", functools.partial(with_libbpf, path, args.run_s, args.libbpf)))
        for who, fn in runs:
            key = f"{name}.{who}"
            walls[key] = isolated(fn, args.out_dir / f"{key}.json", args.timeout_s)
            print(f"{key}: {walls[key]} s", flush=True)
    (args.out_dir / "walls.json").write_text(json.dumps(walls, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
