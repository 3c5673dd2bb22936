"""The corpus schedulers, each switched to through the daemon with its shipped profile, run
as root *inside* the sched_ext VM (tests/vm/test_profiles_corpus.py).

``python -m tools.profiles_soak --config C --out FILE --log LOG [--soak-s N]``: starts
``schedswitchd`` with ``C`` (a config whose ``[schedulers.X]`` point at ``../shared/corpus``
objects with ``profile = "X"`` and whose ``[hints.p-X]`` pick them), then for each scheduler
in turn: a launcher (a forked child holding the hint) asks for it; the kernel's view
(``/sys/kernel/sched_ext``: state, ops, enable_seq) is read until it runs that ops or the
switch is over; a mixed workload (CPU-bound spinners, a pipe ping-pong, a fork loop) runs for
``--soak-s`` seconds while the kernel's view is sampled every second; the launcher dies and
the kernel is read until it is back to no BPF scheduler. Mode checks (``--modes``) hint a
scheduler with a mode and read the mode's values back from the loaded maps in the kernel
(:func:`running_data_maps`: the maps of the object whose struct_ops link is active, found by
its BTF object id, read with ``BPF_MAP_LOOKUP_ELEM`` and decoded at the variables' offsets in
the object). Kernel log lines of sched_ext (``/dev/kmsg``) are kept with each run: they carry
the kernel's exit reason when a scheduler is ejected. Observations go to FILE as JSON after
each step.

``python -m tools.profiles_soak --object-load --objects JSON --out FILE [--soak-s N]
[--timeout-ms MS] [--modes]``: the same without the daemon (:func:`run_object_load`): each
scheduler loaded by ``schedswitchctl object load OBJ --profile X [--mode M] --pin DIR``,
soaked, its modes read back through the pinned maps, detached by ``object unload DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.daemon.launcher_wire import DaemonError
from schedswitchd.errors import BpfSyscallError
from schedswitchd.kernel import bpf_uapi, syscall
from schedswitchd.kernel.fd import MapFd
from schedswitchd.kernel.pins import pin_name
from tools.session import Daemon, Launcher, history, kernel_view, status, wait_for

# (scheduler key in the config, ops name the kernel shows)
SCHEDULERS = [
    ("scx_simple", "simple"),
    ("scx_qmap", "qmap"),
    ("scx_flatcg", "flatcg"),
    ("scx_central", "central"),
    ("bpfland", "bpfland"),
    ("flash", "flash"),
    ("tickless", "tickless"),
    ("lavd", "lavd"),
    ("p2dq", "p2dq"),
]

# Mode checks: (scheduler, mode, {variable: expected}) -- the values each mode's profile sets
# (config/profiles/NAME.toml), read back from the running scheduler's data maps.
MODE_CHECKS: list[tuple[str, str, dict[str, int]]] = [
    ("bpfland", "gaming", {"slice_max": 1_000_000, "throttle_ns": 0, "cpufreq_perf_lvl": 1024}),
    (
        "bpfland",
        "powersave",
        {
            "slice_max": 20_000_000,
            "throttle_ns": 100_000,
            "local_kthreads": 1,
            "cpufreq_perf_lvl": 0,
        },
    ),
    ("lavd", "gaming", {"is_autopilot_on": 0, "no_core_compaction": 1, "power_mode": 0}),
    ("lavd", "powersave", {"is_autopilot_on": 0, "is_powersave_mode": 1, "power_mode": 2}),
]


class KmsgTail:
    """Non-blocking reader of ``/dev/kmsg`` from now on, keeping sched_ext lines."""

    def __init__(self) -> None:
        self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)

    def lines(self) -> list[str]:
        out: list[str] = []
        while True:
            try:
                rec = os.read(self.fd, 8192)
            except BlockingIOError:
                return out
            except OSError:  # EPIPE: records overwritten; keep going
                continue
            text = rec.decode(errors="replace").split(";", 1)[-1].strip()
            if "sched_ext" in text or "scx" in text:
                out.append(text)


def _spin(end: float) -> None:
    x = 0
    while time.monotonic() < end:
        x += 1


def _pingpong(end: float) -> None:
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        # drop the other ends, or the read below never sees EOF (we would hold a_w open)
        os.close(a_w)
        os.close(b_r)
        while True:
            if not os.read(a_r, 1):
                os._exit(0)
            os.write(b_w, b"x")
    os.close(a_r)
    os.close(b_w)
    while time.monotonic() < end:
        os.write(a_w, b"x")
        os.read(b_r, 1)
    os.close(a_w)
    os.waitpid(pid, 0)


def _forker(end: float) -> None:
    while time.monotonic() < end:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)


def workload(seconds: float) -> list[int]:
    """Start the mixed workload (2 spinners, 1 ping-pong pair, 1 fork loop) for ``seconds``;
    returns the pids to reap."""
    end = time.monotonic() + seconds
    pids = []
    for job in (_spin, _spin, _pingpong, _forker):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                job(end)
            except BaseException:
                code = 1
            os._exit(code)
        pids.append(pid)
    return pids


def reap(pids: list[int]) -> list[int]:
    codes = []
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            _, st = os.waitpid(pid, 0)
            codes.append(os.waitstatus_to_exitcode(st))
    return codes


def _switch_over(sock: str, key: str, ops: str, since: int) -> Callable[[], bool]:
    """Predicate: the kernel runs ``ops``, or the daemon recorded a switch to ``key`` since
    history entry ``since`` that did not end ``ok`` (failed, ejected...)."""

    def check() -> bool:
        if kernel_view()["ops"] == ops:
            return True
        with contextlib.suppress(DaemonError, OSError):
            return any(h.target == key and h.result != "ok" for h in history(sock)[since:])
        return False

    return check


def _wait_enabled(sock: str, key: str, ops: str, reply: dict[str, Any], since: int) -> bool:
    """Wait (up to 240 s: TCG) for the hinted scheduler; False at once for a refused hint."""
    if "lease" not in reply:
        return False
    wait_for(_switch_over(sock, key, ops, since), 240, 0.2)
    return bool(kernel_view()["ops"] == ops)


def _history_len(sock: str) -> int:
    with contextlib.suppress(DaemonError, OSError):
        return len(history(sock))
    return 0


def soak(ops: str, seconds: float) -> dict[str, Any]:
    """Run the workload for ``seconds`` while sampling the kernel's view about every second.

    Under TCG a sample can take much longer than a second (the spinners and the fork loop
    compete with the sampler), so what counts is time, not samples: ``elapsed_s`` is the
    monotonic time from the workload's start to the last reading, ``enabled_s`` how long of
    it the kernel showed the same scheduler enabled with the starting ``enable_seq`` (up to
    the first reading that did not)."""
    start = kernel_view()
    t0 = time.monotonic()
    pids = workload(seconds)
    samples: list[dict[str, Any]] = []
    end = t0 + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        samples.append({**kernel_view(), "t": time.monotonic() - t0})
    codes = reap(pids)
    after = {**kernel_view(), "t": time.monotonic() - t0}

    def same(v: dict[str, Any]) -> bool:
        return bool(
            v["state"] == "enabled" and v["ops"] == ops and v["enable_seq"] == start["enable_seq"]
        )

    enabled_s = 0.0
    if same(start):
        for v in [*samples, after]:
            if not same(v):
                break
            enabled_s = v["t"]
    return {
        "start": start,
        "after": after,
        "samples": len(samples),
        "seconds": seconds,
        "elapsed_s": after["t"],
        "enabled_s": enabled_s,
        "first_change": next(({**v} for v in [*samples, after] if not same(v)), None),
        "stayed_enabled": same(start) and all(same(v) for v in [*samples, after]),
        "workload_exit_codes": codes,
    }


def _suffix(kernel_name: str) -> str:
    # the daemon may open an object under another name than the file's: the part from the
    # first "." (".rodata", ".bss", ".data.LAVD") is what identifies a data section's map
    return kernel_name[kernel_name.find(".") :] if "." in kernel_name else kernel_name


def decode_globals(spec: ObjectSpec, names: list[str], fds: dict[str, MapFd]) -> dict[str, Any]:
    """The current values of globals ``names`` of ``spec``, read with ``BPF_MAP_LOOKUP_ELEM``
    (key 0) from ``fds`` (the loaded data maps by the spec's section name, ``.rodata``) and
    decoded at each variable's offset (little endian, signed). A variable whose map is not
    in ``fds`` gets ``{"error": ...}``."""
    out: dict[str, Any] = {}
    for m in spec.maps:
        wanted = [v for v in m.variables if v.name in names]
        if not wanted:
            continue
        fd = fds.get(m.name)
        if fd is None:
            for v in wanted:
                out[v.name] = {"error": f"no loaded map for {m.name} ({m.kernel_name!r})"}
            continue
        raw = syscall.map_lookup_elem(fd, bytes(4), syscall.map_info(fd).value_size) or b""
        for v in wanted:
            out[v.name] = int.from_bytes(raw[v.offset : v.offset + v.size], "little", signed=True)
    return out


def pinned_data_maps(spec: ObjectSpec, pin_dir: Path) -> dict[str, MapFd]:
    """The data maps ``object load --pin DIR`` pinned (``map_<section>``), by section name."""
    out: dict[str, MapFd] = {}
    for m in spec.maps:
        path = pin_dir / pin_name(f"map_{m.name}")
        if m.variables and path.exists():
            out[m.name] = syscall.obj_get(path, expect=MapFd)
    return out


def running_data_maps(spec: ObjectSpec) -> tuple[dict[str, MapFd], dict[str, Any]]:
    """The data maps of the scheduler the kernel runs, found from the kernel alone: the
    struct_ops link (``BPF_LINK_TYPE_STRUCT_OPS``) whose map has ``spec``'s struct_ops map
    name gives that map's BTF object id; the data maps of the same loaded object share it
    (they are created with the object's BTF), so other objects' ``.rodata``/``.bss`` maps --
    a standby the daemon prepared, or one whose freeing the kernel deferred -- never match.
    Returns the maps by section name and what was found (ids), for the report."""
    so_names = {m.kernel_name[:15] for m in spec.struct_ops_maps}
    found: dict[str, Any] = {"links": []}
    btf_id = None
    lid = 0
    while (nxt := syscall.link_get_next_id(lid)) is not None:
        lid = nxt
        with contextlib.suppress(BpfSyscallError):
            with syscall.link_get_fd_by_id(lid) as lfd:
                li = syscall.link_info(lfd)
            if li.type != bpf_uapi.LinkType.STRUCT_OPS or not li.map_id:
                continue
            with syscall.map_get_fd_by_id(li.map_id) as sfd:
                mi = syscall.map_info(sfd)
            found["links"].append({"link": lid, "map": li.map_id, "name": mi.name})
            if mi.name in so_names:
                btf_id = mi.btf_id
    found["btf_id"] = btf_id
    out: dict[str, MapFd] = {}
    if not btf_id:
        return out, found
    by_suffix = {_suffix(m.kernel_name): m.name for m in spec.maps if m.variables}
    mid = 0
    while (nxt := syscall.map_get_next_id(mid)) is not None:
        mid = nxt
        with contextlib.suppress(BpfSyscallError):
            fd = syscall.map_get_fd_by_id(mid)
            mi = syscall.map_info(fd)
            name = by_suffix.get(_suffix(mi.name))
            if mi.btf_id == btf_id and name is not None and name not in out:
                out[name] = fd
                found.setdefault("maps", {})[name] = mid
            else:
                fd.close()
    return out, found


def read_back_bpftool(spec: ObjectSpec, names: list[str]) -> dict[str, Any]:
    """Last session's reading, kept to show why it failed: every map in the kernel whose
    name ends like the section's, the newest id taken, dumped with ``bpftool``."""
    out: dict[str, Any] = {}
    for m in spec.maps:
        wanted = [v for v in m.variables if v.name in names]
        if not wanted:
            continue
        shown = json.loads(
            subprocess.run(
                ["bpftool", "-j", "map", "show"], check=True, capture_output=True, text=True
            ).stdout
        )
        ids = [e["id"] for e in shown if str(e.get("name", "")).endswith(_suffix(m.kernel_name))]
        out[f"{m.name}.candidates"] = ids
        if not ids:
            continue
        proc = subprocess.run(
            ["bpftool", "-j", "map", "dump", "id", str(max(ids))], capture_output=True, text=True
        )
        if proc.returncode != 0:
            out[f"{m.name}.error"] = proc.stderr.strip()[-500:]
            continue
        dump = json.loads(proc.stdout)
        entry = dump[0] if isinstance(dump, list) and dump else dump
        out[f"{m.name}.keys"] = sorted(entry) if isinstance(entry, dict) else repr(entry)[:200]
        if not isinstance(entry, dict) or "value" not in entry:
            continue
        raw = bytes(int(b, 16) for b in entry["value"])
        for v in wanted:
            out[v.name] = int.from_bytes(raw[v.offset : v.offset + v.size], "little", signed=True)
    return out


def run(
    config: str,
    sock: str,
    out: Path,
    log: Path,
    soak_s: float,
    objects: dict[str, str],
    with_modes: bool,
) -> None:
    results: dict[str, Any] = {"soak_s": soak_s, "schedulers": {}, "modes": []}

    def save() -> None:
        out.write_text(json.dumps(results, indent=1, default=str))

    kmsg = KmsgTail()
    daemon = Daemon(config, sock, log)
    results["start_s"] = daemon.start(timeout_s=300)
    results["initial"] = kernel_view()
    save()
    for key, ops in SCHEDULERS:
        if key not in objects:
            continue
        t0 = time.monotonic()
        r: dict[str, Any] = {"ops": ops}
        since = _history_len(sock)
        launcher = Launcher(sock, f"p-{key}")
        r["reply"] = launcher.reply
        r["enabled"] = _wait_enabled(sock, key, ops, launcher.reply, since)
        r["switch_s"] = time.monotonic() - t0
        r["kernel"] = kernel_view()
        with contextlib.suppress(DaemonError, OSError):
            st = status(sock)
            r["status"] = st.model_dump(mode="json")
        if r["enabled"]:
            r["soak"] = soak(ops, soak_s)
        launcher.kill()
        r["released"] = wait_for(lambda: kernel_view()["state"] == "disabled", 120, 0.2)
        r["after_release"] = kernel_view()
        with contextlib.suppress(DaemonError, OSError):
            r["history"] = [h.model_dump(mode="json") for h in history(sock)[since:]]
        time.sleep(0.5)
        r["kmsg"] = kmsg.lines()
        r["elapsed_s"] = time.monotonic() - t0
        results["schedulers"][key] = r
        save()
    if with_modes:
        for key, mode, expected in MODE_CHECKS:
            if key not in objects:
                continue
            m: dict[str, Any] = {"scheduler": key, "mode": mode, "expected": expected}
            since = _history_len(sock)
            launcher = Launcher(sock, f"p-{key}-{mode}")
            m["reply"] = launcher.reply
            ops = dict(SCHEDULERS)[key]
            m["enabled"] = _wait_enabled(sock, key, ops, launcher.reply, since)
            if m["enabled"]:
                time.sleep(2.0)  # after_attach runs (set_power_profile) happen within the switch
                m["kernel_at_read"] = kernel_view()
                spec = open_object(objects[key])
                fds, m["running_found"] = running_data_maps(spec)
                try:
                    m["read"] = decode_globals(spec, list(expected), fds)
                except (BpfSyscallError, OSError) as exc:
                    m["read_error"] = repr(exc)
                finally:
                    for fd in fds.values():
                        fd.close()
                try:  # last session's way, kept to compare (it failed there)
                    m["read_bpftool"] = read_back_bpftool(spec, list(expected))
                except (subprocess.CalledProcessError, OSError, ValueError) as exc:
                    m["read_bpftool"] = {"exception": repr(exc)}
                with contextlib.suppress(DaemonError, OSError):
                    st = status(sock)
                    m["status_mode"] = st.model_dump(mode="json")
            launcher.kill()
            m["released"] = wait_for(lambda: kernel_view()["state"] == "disabled", 120, 0.2)
            m["kmsg"] = kmsg.lines()
            results["modes"].append(m)
            save()
    daemon.stop()
    results["done"] = True
    save()


PIN_ROOT = Path("/sys/fs/bpf/schedswitchd-profiles-soak")


def object_load(
    obj: str, profile: str, mode: str | None, pin: Path, timeout_ms: int
) -> dict[str, Any]:
    """``schedswitchctl object load OBJ --profile P [--mode M] --pin DIR --json`` with the
    struct_ops variable's ``timeout_ms`` raised (``--set``; TCG), as a child process: its
    exit code, time (s), JSON output (or stdout/stderr tails)."""
    spec = open_object(obj)
    sets: list[str] = []
    for m in spec.struct_ops_maps:
        sets += ["--set", f"{m.name}.timeout_ms={timeout_ms}"]
    argv = [sys.executable, "-m", "schedswitchd.cli.ctl", "object", "load", obj]
    argv += ["--profile", profile, "--pin", str(pin), "--json", *sets]
    if mode:
        argv += ["--mode", mode]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    r: dict[str, Any] = {"argv": argv[2:], "rc": proc.returncode, "s": time.monotonic() - t0}
    try:
        info = json.loads(proc.stdout)
        r["profile"] = info.get("profile")
        r["links"] = info.get("links")
        r["notes"] = info.get("notes")
        r["error"] = info.get("error", {}).get("message") if "error" in info else None
    except ValueError:
        r["stdout"] = proc.stdout[-3000:]
    r["stderr"] = proc.stderr[-4000:]
    return r


def object_unload(pin: Path) -> dict[str, Any]:
    """``schedswitchctl object unload DIR``: its exit code and output tail."""
    argv = [sys.executable, "-m", "schedswitchd.cli.ctl", "object", "unload", str(pin)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return {"rc": proc.returncode, "out": (proc.stdout + proc.stderr)[-2000:]}


def run_object_load(
    out: Path, soak_s: float, objects: dict[str, str], timeout_ms: int, with_modes: bool
) -> None:
    """Without the daemon: each scheduler loaded and attached by ``object load --profile``
    (pinned, so it stays), checked enabled, soaked, read back (modes) through its pinned
    maps, then detached by ``object unload`` and checked gone."""
    results: dict[str, Any] = {"soak_s": soak_s, "timeout_ms": timeout_ms, "schedulers": {}}
    results["modes"] = []
    results["initial"] = kernel_view()

    def save() -> None:
        out.write_text(json.dumps(results, indent=1, default=str))

    kmsg = KmsgTail()
    subprocess.run(["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"], capture_output=True)
    runs: list[tuple[str, str | None, dict[str, int] | None]] = [
        (key, None, None) for key, _ in SCHEDULERS
    ]
    if with_modes:
        runs += [(key, mode, expected) for key, mode, expected in MODE_CHECKS]
    for key, mode, expected in runs:
        if key not in objects:
            continue
        ops = dict(SCHEDULERS)[key]
        t0 = time.monotonic()
        pin = PIN_ROOT / (f"{key}-{mode}" if mode else key)
        r: dict[str, Any] = {"scheduler": key, "mode": mode, "ops": ops}
        r["before"] = kernel_view()
        r["load"] = object_load(objects[key], key, mode, pin, timeout_ms)
        r["kernel"] = kernel_view()
        r["enabled"] = bool(
            r["load"]["rc"] == 0 and r["kernel"]["state"] == "enabled" and r["kernel"]["ops"] == ops
        )
        if r["enabled"] and expected is None:
            r["soak"] = soak(ops, soak_s)
        if r["enabled"] and expected is not None:
            spec = open_object(objects[key])
            names = list(expected)
            fds = pinned_data_maps(spec, pin)
            try:
                r["read"] = decode_globals(spec, names, fds)
            finally:
                for fd in fds.values():
                    fd.close()
            running, r["running_found"] = running_data_maps(spec)
            try:
                r["read_running"] = decode_globals(spec, names, running)
            finally:
                for fd in running.values():
                    fd.close()
            try:
                r["read_bpftool"] = read_back_bpftool(spec, names)
            except (subprocess.CalledProcessError, OSError, ValueError) as exc:
                r["read_bpftool"] = {"exception": repr(exc)}
        r["unload"] = object_unload(pin) if pin.exists() else {"rc": None, "out": "no pins"}
        r["released"] = wait_for(lambda: kernel_view()["state"] == "disabled", 120, 0.2)
        r["after_release"] = kernel_view()
        time.sleep(0.5)
        r["kmsg"] = kmsg.lines()
        r["elapsed_s"] = time.monotonic() - t0
        if mode is None:
            results["schedulers"][key] = r
        else:
            r["expected"] = expected
            results["modes"].append(r)
        save()
    results["done"] = True
    save()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="daemon config (the daemon path)")
    ap.add_argument(
        "--object-load",
        action="store_true",
        help="no daemon: `schedswitchctl object load --profile --pin`, soak, `object unload`",
    )
    ap.add_argument("--timeout-ms", type=int, default=30000, help="struct_ops timeout_ms")
    ap.add_argument("--objects", required=True, help="JSON: scheduler key -> object path")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--log", type=Path, help="daemon log (the daemon path)")
    ap.add_argument("--socket", default="/run/schedswitchd-profiles.sock")
    ap.add_argument("--soak-s", type=float, default=30.0)
    ap.add_argument("--modes", action="store_true")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    objects = json.loads(a.objects)
    if a.object_load:
        run_object_load(a.out, a.soak_s, objects, a.timeout_ms, a.modes)
    elif a.config is None:
        ap.error("--config is needed without --object-load")
    else:
        run(a.config, a.socket, a.out, a.log or Path("daemon.log"), a.soak_s, objects, a.modes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
