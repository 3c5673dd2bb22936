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
(``bpftool map dump``, raw bytes decoded at the variables' offsets in the object). Kernel log
lines of sched_ext (``/dev/kmsg``) are kept with each run: they carry the kernel's exit reason
when a scheduler is ejected. Observations go to FILE as JSON after each step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedswitchd.bpf.object import open_object
from schedswitchd.daemon.client import DaemonError
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


def soak(sock: str, ops: str, seconds: float) -> dict[str, Any]:
    """Run the workload for ``seconds`` while sampling the kernel's view every second."""
    start = kernel_view()
    pids = workload(seconds)
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        samples.append(kernel_view())
    codes = reap(pids)
    after = kernel_view()
    same = all(
        s["state"] == "enabled" and s["ops"] == ops and s["enable_seq"] == start["enable_seq"]
        for s in [*samples, after]
    )
    return {
        "start": start,
        "after": after,
        "samples": len(samples),
        "seconds": seconds,
        "stayed_enabled": same and start["state"] == "enabled" and start["ops"] == ops,
        "workload_exit_codes": codes,
    }


def read_back(spec_path: Path, names: list[str]) -> dict[str, Any]:
    """The current values of ``names`` (globals of the object at ``spec_path``) in the
    running scheduler's data maps: each map found in the kernel by its kernel name (the
    newest id), dumped raw with bpftool, decoded at the variable's offset (little endian)."""
    spec = open_object(spec_path)
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
        # the daemon may open the object under another name: match the section suffix
        # (".rodata", ".bss"), newest map first -- only one scheduler is loaded at a time
        suffix = m.kernel_name[m.kernel_name.find(".") :] if "." in m.kernel_name else m.name
        ids = [e["id"] for e in shown if str(e.get("name", "")).endswith(suffix)]
        if not ids:
            for v in wanted:
                out[v.name] = {"error": f"no map {m.kernel_name!r} in the kernel"}
            continue
        dump = json.loads(
            subprocess.run(
                ["bpftool", "-j", "map", "dump", "id", str(max(ids))],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        raw = bytes(int(b, 16) for b in dump[0]["value"])
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
            r["soak"] = soak(sock, ops, soak_s)
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
                try:
                    m["read"] = read_back(Path(objects[key]), list(expected))
                except (subprocess.CalledProcessError, OSError, ValueError, KeyError) as exc:
                    m["read_error"] = repr(exc)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--objects", required=True, help="JSON: scheduler key -> object path")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--socket", default="/run/schedswitchd-profiles.sock")
    ap.add_argument("--soak-s", type=float, default=30.0)
    ap.add_argument("--modes", action="store_true")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    run(a.config, a.socket, a.out, a.log, a.soak_s, json.loads(a.objects), a.modes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
