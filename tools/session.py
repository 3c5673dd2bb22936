"""Launcher sessions against a real daemon, run as root *inside* the sched_ext VM.

``python -m tools.session checks --config C --out FILE``: the end-to-end checks of the
daemon's VM tests (tests/vm/test_daemon_e2e.py); each check's observations go to FILE as
JSON, the pytest side asserts on them. ``python -m tools.session demo --config C``: the
session ``make demo`` shows (tools/demo.py boots the VM and runs it).

One Python process plays every client: launchers are ``fork()``ed children (a new
interpreter costs many seconds under TCG), each with its own connection, so a launcher's
death or another uid is the real thing for the daemon (``SO_PEERCRED``, pidfd). The
kernel's view is read from ``/sys/kernel/sched_ext`` directly, never from the daemon.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from schedswitchd.cli import ctl
from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.client import DaemonClient
from schedswitchd.daemon.launcher_wire import DaemonError, DaemonUnavailable

SCX = Path("/sys/kernel/sched_ext")
NOBODY = 65534
R = TypeVar("R")


def ask(client: DaemonClient, request: Any, cls: type[R]) -> R:
    """``client.request(request)``, checked to be a ``cls`` reply."""
    reply = client.request(request)
    if not isinstance(reply, cls):
        raise TypeError(f"expected {cls.__name__}, got {type(reply).__name__}")
    return reply


def config_variant(repo: Path, *, extra: str = "") -> str:
    """The shipped ``config/schedswitchd.toml`` with absolute object paths (so the text can
    live anywhere, e.g. in the VM's results directory) plus ``extra`` TOML appended."""
    text = (repo / "config" / "schedswitchd.toml").read_text()
    text = text.replace('object = "../', f'object = "{repo}/')
    return text + "\n" + extra


def kernel_view() -> dict[str, Any]:
    """``state``, ``ops`` (None when no scheduler) and ``enable_seq`` from sysfs."""
    ops_file = SCX / "root" / "ops"
    try:
        ops: str | None = ops_file.read_text().strip()
    except OSError:
        ops = None
    return {
        "state": (SCX / "state").read_text().strip(),
        "ops": ops,
        "enable_seq": int((SCX / "enable_seq").read_text()),
    }


def wait_for(pred: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll ``pred`` until true or ``timeout_s`` passes; returns the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        if pred():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


class Daemon:
    """``schedswitchd`` started as a child with ``config``, logging to ``log``."""

    def __init__(self, config: str, socket_path: str, log: Path) -> None:
        self.config, self.socket_path, self.log = config, socket_path, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> float:
        """Start it and wait until it answers ``status``; returns the seconds that took."""
        start = time.monotonic()
        exe = Path(sys.executable).with_name("schedswitchd")
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(exe), "--config", self.config, "--socket", self.socket_path],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"schedswitchd exited with {self.proc.returncode}")
            try:
                with DaemonClient(self.socket_path, timeout_s=5) as c:
                    c.request(proto.StatusRequest())
                return True
            except (DaemonUnavailable, DaemonError):
                return False

        if not wait_for(answers, timeout_s, 0.2):
            raise RuntimeError(f"schedswitchd did not answer within {timeout_s} s")
        return time.monotonic() - start

    def kill9(self) -> None:
        """``kill -9`` and reap."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        """SIGTERM and reap (the attached scheduler stays pinned)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


class Launcher:
    """A forked child holding one hint on its own connection until killed.

    ``uid``: drop to this uid first (refused hints are reported, not raised). ``reply``
    is the child's report: ``{"lease": ...}`` or ``{"error": code, "message": ...}``."""

    def __init__(self, socket_path: str, workload: str, *, uid: int | None = None) -> None:
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(rfd)
            code = 0
            try:
                if uid is not None:
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
                client = DaemonClient(socket_path)
                try:
                    hint = proto.HintRequest(workload=workload, pid=os.getpid())
                    r = ask(client, hint, proto.HintReply)
                    report: dict[str, Any] = {"lease": r.lease, "active": r.active}
                except DaemonError as exc:
                    report = {"error": exc.code, "message": str(exc)}
                os.write(wfd, json.dumps(report).encode() + b"\n")
                os.close(wfd)
                if "lease" in report:
                    while True:
                        time.sleep(3600)
            except BaseException as exc:  # report anything, never run the parent's code
                with contextlib.suppress(OSError):
                    os.write(wfd, json.dumps({"error": "child", "message": repr(exc)}).encode())
                code = 1
            os._exit(code)
        os.close(wfd)
        self.pid = pid
        with os.fdopen(rfd, "rb") as pipe:
            line = pipe.readline()
        self.reply: dict[str, Any] = json.loads(line) if line else {"error": "no reply"}

    def kill(self) -> None:
        """``kill -9`` the launcher and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def status(sock: str) -> proto.StatusBody:
    with DaemonClient(sock) as c:
        return ask(c, proto.StatusRequest(), proto.StatusReply).status


def history(sock: str) -> list[proto.SwitchInfo]:
    with DaemonClient(sock) as c:
        return ask(c, proto.HistoryRequest(), proto.HistoryReply).entries


def runs(ops: str | None) -> Callable[[], bool]:
    """Predicate: the kernel runs ``ops`` (``None``: no BPF scheduler, ``disabled``)."""

    def check() -> bool:
        k = kernel_view()
        if ops is None:
            return bool(k["state"] == "disabled")
        return bool(k["state"] == "enabled" and k["ops"] == ops)

    return check


def settled(sock: str, ops: str | None, active: str) -> Callable[[], bool]:
    """Predicate: the kernel runs ``ops`` and the daemon's status says ``active``. The kernel
    reads ``enabled`` a little before the daemon's switch ends (it confirms, pins, then
    records the switch), so a status asked the moment sysfs changed can still name the
    previous scheduler."""
    kernel_runs = runs(ops)
    return lambda: kernel_runs() and status(sock).active == active


# --- checks (tests/vm/test_daemon_e2e.py) -----------------------------------------------------


def run_checks(config: str, sock: str, out: Path, log: Path) -> None:
    """Every end-to-end check, in order; observations to ``out`` as JSON after each."""
    results: dict[str, Any] = {}

    def save() -> None:
        out.write_text(json.dumps(results, indent=1, default=str))

    daemon = Daemon(config, sock, log)
    results["start_s"] = daemon.start()
    results["initial"] = kernel_view()
    save()

    # 1. a launcher hints battery (fifo); then a higher-priority hint (gaming -> latency)
    battery = Launcher(sock, "battery")
    ok = wait_for(runs("ss_fifo"), 30)
    results["battery"] = {"reply": battery.reply, "kernel": kernel_view(), "waited_ok": ok}
    save()
    admin = DaemonClient(sock)
    r = ask(admin, proto.HintRequest(workload="gaming"), proto.HintReply)
    gaming_lease = r.lease
    kernel_now = kernel_view()
    active_now = status(sock).active
    # The reply came once the kernel ran it; the daemon then pins it and frees ss_fifo:
    # the switch record is final in status after that.
    seq = r.switch.seq if r.switch is not None else -1

    def final() -> bool:
        last = status(sock).last_switch
        return last is not None and last.seq == seq and last.finished

    wait_for(final, 30)
    last = status(sock).last_switch
    results["gaming"] = {
        "reply": r.model_dump(mode="json"),
        "kernel": kernel_now,
        "status_active": active_now,
        "status_last_switch": last.model_dump(mode="json") if last is not None else None,
    }
    save()
    rel = admin.request(proto.ReleaseRequest(lease=gaming_lease))
    results["gaming_released"] = {"reply": rel.model_dump(mode="json"), "kernel": kernel_view()}
    save()

    # 2. the launcher dies: its lease ends, the default (kernel) returns
    battery.kill()
    ok = wait_for(settled(sock, None, "kernel"), 30)
    st = status(sock)
    results["launcher_died"] = {
        "kernel": kernel_view(),
        "waited_ok": ok,
        "active": st.active,
        "leases": st.leases,
    }
    save()

    # 3. an unauthorised uid is refused and nothing changes
    before = kernel_view()
    nobody = Launcher(sock, "gaming", uid=NOBODY)
    nobody.kill()
    results["unauthorised"] = {"reply": nobody.reply, "before": before, "after": kernel_view()}
    save()

    # 4. the error-injecting scheduler is ejected; the daemon says why and falls back to the
    #    live gaming lease's scheduler
    gamer = Launcher(sock, "gaming")
    wait_for(runs("ss_latency"), 30)
    faulty = Launcher(sock, "fault-test")

    def ejected() -> bool:
        return any(h.result == "ejected" for h in history(sock))

    ok = wait_for(ejected, 60, 0.2)
    wait_for(settled(sock, "ss_latency", "latency"), 30, 0.2)
    st = status(sock)
    results["ejection"] = {
        "faulty_reply": faulty.reply,
        "waited_ok": ok,
        "history": [h.model_dump(mode="json") for h in history(sock)],
        "status": st.model_dump(mode="json"),
        "kernel": kernel_view(),
    }
    save()
    faulty.kill()

    # 5. a scheduler the verifier rejects leaves the running one enabled
    before = kernel_view()
    try:
        sw = admin.request(proto.SwitchRequest(scheduler="broken"))
        broken: dict[str, Any] = {"reply": sw.model_dump(mode="json")}
    except DaemonError as exc:
        broken = {"error": exc.code, "message": str(exc), "verifier_log": exc.verifier_log}
    broken.update(before=before, after=kernel_view())
    with contextlib.suppress(DaemonError):
        admin.request(proto.SwitchRequest(scheduler="auto"))
    broken["after_auto"] = kernel_view()
    results["broken"] = broken
    save()

    # 6. kill -9 of the daemon leaves the scheduler enabled; a new daemon re-adopts it
    wait_for(runs("ss_latency"), 30)
    before = kernel_view()
    admin.close()
    daemon.kill9()
    time.sleep(2)
    during = kernel_view()
    pins = sorted(os.listdir("/sys/fs/bpf/schedswitchd"))
    daemon2 = Daemon(config, sock, log)
    results["restart_s"] = daemon2.start()
    st = status(sock)
    results["kill9"] = {
        "before": before,
        "during": during,
        "pins": pins,
        "status": st.model_dump(mode="json"),
        "history": [h.model_dump(mode="json") for h in history(sock)],
        "after": kernel_view(),
    }
    save()
    # the re-adopted scheduler detaches like any other (its link came from the pin)
    with DaemonClient(sock) as admin2:
        stopped = admin2.request(proto.StopRequest())
    ok = wait_for(runs(None), 30)
    results["stop_adopted"] = {
        "reply": stopped.model_dump(mode="json"),
        "waited_ok": ok,
        "kernel": kernel_view(),
        "pins": sorted(os.listdir("/sys/fs/bpf/schedswitchd")),
    }
    save()
    gamer.kill()
    defects: dict[str, Any] = {}
    results["defects"] = defects
    _defect_checks(config, sock, log, daemon2, defects, save)
    results["done"] = True
    save()


def _defect_checks(
    config: str, sock: str, log: Path, daemon: Daemon, out: dict[str, Any], save: Callable[[], None]
) -> None:
    """Defects found by trying the daemon as users and attackers would, on the real kernel
    (tests/vm/test_daemon_e2e.py): a reload, a failed admin switch, a restart, a release."""
    original = Path(config).read_text()
    pin_dir = "/sys/fs/bpf/schedswitchd"
    with DaemonClient(sock) as admin:
        admin.request(proto.SwitchRequest(scheduler="vtime"))
        wait_for(settled(sock, "ss_vtime", "vtime"), 30)
        before = kernel_view()
        # a reload that changes the running scheduler's tunables swaps in its new form
        Path(config).write_text(original.replace("slice_ns = 5000000", "slice_ns = 4000000"))
        reloaded = admin.request(proto.ReloadRequest())
        wait_for(lambda: status(sock).last_switch is not None, 30)
        last = status(sock).last_switch
        out["refresh"] = {
            "reply": reloaded.model_dump(mode="json"),
            "before": before,
            "after": kernel_view(),
            "last_switch": last.model_dump(mode="json") if last else None,
            "pins": sorted(os.listdir(pin_dir)),
        }
        save()
        # a failed admin switch (object missing) changes nothing
        before = kernel_view()
        try:
            admin.request(proto.SwitchRequest(scheduler="missing"))
            failed: dict[str, Any] = {"error": None}
        except DaemonError as exc:
            failed = {"error": exc.code, "message": str(exc)}
        time.sleep(1.5)  # a few reconcile passes
        st = status(sock)
        failed.update(
            before=before,
            after=kernel_view(),
            override=st.override,
            active=st.active,
            pins=sorted(os.listdir(pin_dir)),
        )
        out["failed_switch"] = failed
        save()
        launcher = Launcher(sock, "video-call")  # keeps vtime running without an override
        admin.request(proto.SwitchRequest(scheduler="auto"))
        wait_for(settled(sock, "ss_vtime", "vtime"), 30)
    # restart after the object was "rebuilt" (vtime's entry now names another object, whose
    # ops name differs): the running scheduler is adopted for what it is
    before = kernel_view()
    daemon.kill9()
    launcher.kill()
    rebuilt = _point_vtime_at_latency(original)
    Path(config).write_text(rebuilt)
    daemon3 = Daemon(config, sock, log)
    daemon3.start()
    st = status(sock)
    out["rebuilt_restart"] = {
        "before": before,
        "after": kernel_view(),
        "status": st.model_dump(mode="json"),
        "pins": sorted(os.listdir(pin_dir)),
    }
    save()
    # after the re-adoption, a hint then its release runs the default at once
    with DaemonClient(sock) as client:
        lease = ask(client, proto.HintRequest(workload="video-call"), proto.HintReply).lease
        released = ask(client, proto.ReleaseRequest(lease=lease), proto.ReleaseReply)
        ok = wait_for(runs(None), 5)
    out["grace_after_release"] = {
        "reply": released.model_dump(mode="json"),
        "waited_ok": ok,
        "kernel": kernel_view(),
        "status_active": status(sock).active,
    }
    save()
    daemon3.stop()
    Path(config).write_text(original)


def _point_vtime_at_latency(text: str) -> str:
    """``text`` with ``[schedulers.vtime]``'s object replaced by latency's (a stand-in for a
    rebuilt file whose scheduler has another ops name)."""
    head, sep, rest = text.partition("[schedulers.vtime]")
    entry, sep2, tail = rest.partition("\n[")
    lines = entry.splitlines()
    fixed = [
        line.replace("vtime.bpf.o", "latency.bpf.o") if line.startswith("object") else line
        for line in lines
    ]
    return head + sep + "\n".join(fixed) + sep2 + tail


# --- demo (make demo) ---------------------------------------------------------------------------


def _say(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def _ctl(*argv: str) -> None:
    sys.stdout.flush()
    ctl.main([*argv])
    sys.stdout.flush()


def _switch_line(info: proto.SwitchInfo | None) -> str:
    if info is None:
        return "no switch needed"
    if info.result == "ejected":
        line = f"{info.previous}: ejected by the kernel"
        if info.exit is not None:
            line += f" ({_exit_text(info.exit)})"
        return line
    gap = "-" if info.gap_ns is None else f"{info.gap_ns / 1e6:.1f} ms"
    phases = ", ".join(
        f"{k} {v / 1e6:.1f}"
        for k, v in info.phases_ns.items()
        if k in ("prepare", "detach", "attach", "pin", "rollback")
    )
    total = info.phases_ns.get("total")
    if total is not None:
        took = f" in {total / 1e6:.1f} ms"
    else:
        # A hint's reply comes once the kernel runs the new scheduler, before the pin: the
        # record is live and has no total yet (it printed "ok in 0.0 ms").
        until = info.phases_ns.get("until_enabled")
        took = ", no total yet" if until is None else f", enabled after {until / 1e6:.1f} ms"
        took += ", pin still to come" if not info.finished else ""
    line = f"{info.previous} -> {info.target}: {info.result}{took}"
    line += f" (gap {gap}; {phases} ms)"
    if info.error is not None:
        line += f"\n    error {info.error.code}: {info.error.message}"
    if info.exit is not None:
        line += f"\n    exit {_exit_text(info.exit)}"
    return line


def _exit_text(exit_info: proto.ExitInfo) -> str:
    """``KIND: reason: message`` (``struct scx_exit_info``), without empty parts."""
    parts = [exit_info.kind_name, exit_info.reason, exit_info.message]
    return ": ".join(p for p in parts if p)


def _kernel_line(k: dict[str, Any] | None = None) -> str:
    """One ``kernel:`` line: ``k`` or, by default, a sysfs read made now."""
    k = kernel_view() if k is None else k
    return f"kernel: sched_ext {k['state']}, ops {k['ops'] or '-'}, enable_seq {k['enable_seq']}"


class KernelLog:
    """New ``sched_ext`` lines of the kernel log (``/dev/kmsg``, read from the end at
    construction). Record format ``PRIO,SEQ,TS_US,FLAGS;TEXT`` (Documentation/ABI/testing/
    dev-kmsg)."""

    def __init__(self) -> None:
        self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)

    def sched_ext_lines(self) -> list[str]:
        """``[seconds since boot] text`` of every new ``sched_ext:`` record."""
        lines: list[str] = []
        while True:
            try:
                record = os.read(self.fd, 8192).decode(errors="replace")
            except BlockingIOError:
                return lines
            except OSError:  # EPIPE: records overwritten before we read them; go on
                continue
            head, _, text = record.partition(";")
            fields = head.split(",")
            text = text.split("\n", 1)[0]
            if text.startswith("sched_ext") and len(fields) >= 3:
                lines.append(f"[{int(fields[2]) / 1e6:9.3f}] {text}")

    def close(self) -> None:
        os.close(self.fd)


_COUNTERS = (
    ("btf_cache_hits", "module BTF cache hits {}"),
    ("btf_cache_misses", "misses {}"),
    ("module_btfs_read", "module BTFs read {}"),
    ("spec_cache_hits", "object spec cache hits {}"),
    ("spec_cache_misses", "misses {}"),
    ("prepares", "prepares {}"),
    ("attaches", "attaches {}"),
)


def _print_status(sock: str) -> None:
    """The daemon's ``status`` as the demo shows it: every lease, the last switch and exit,
    backoff and a few meaningful counters (``schedswitchctl status --json`` has them all)."""
    st = status(sock)
    with DaemonClient(sock) as c:
        leases = ask(c, proto.ListRequest(), proto.ListReply).leases
    print(f"daemon: active {st.active}, desired {st.desired}; {len(leases)} lease(s):")
    for lease in leases:
        pid = f", pid {lease.pid}" if lease.pid is not None else ""
        rule = f"{lease.workload} -> {lease.scheduler} (priority {lease.priority}{pid})"
        print(f"    {lease.lease}  {rule}")
    if st.last_exit is not None:
        print(f"daemon: last scheduler exit {_exit_text(st.last_exit)}")
    for b in st.backoff:
        fails = "failure" if b.failures == 1 else "failures"
        print(f"daemon: {b.scheduler} held back {b.remaining_s:.0f} s more ({b.failures} {fails})")
    counts = [fmt.format(st.counters[n]) for n, fmt in _COUNTERS if n in st.counters]
    if counts:
        print("daemon counters: " + ", ".join(counts))
    last = st.last_switch
    if last is not None and last.phases_ns:
        ms = {k: f"{v / 1e6:.1f}" for k, v in last.phases_ns.items()}
        parts = [f"{k} {ms[k]} ms" for k in ("prepare", "attach") if k in ms]
        if last.gap_ns is not None:
            parts.append(f"gap {last.gap_ns / 1e6:.1f} ms")
        if parts:
            print(f"daemon: last switch ({last.previous} -> {last.target}) " + ", ".join(parts))


def _launcher_text(launcher: Launcher) -> str:
    r = launcher.reply
    if "lease" in r:
        return f"launcher pid {launcher.pid}: lease {r['lease']}, active {r['active']}"
    return f"launcher pid {launcher.pid}: refused: {r.get('error')}: {r.get('message', '')}"


def run_demo(config: str, sock: str, log: Path) -> int:
    """The ``make demo`` session; prints as it goes, ends with one JSON summary line.

    Every ``kernel:`` line is a sysfs read made when it is printed; ``kernel log:`` lines
    come from ``/dev/kmsg``; ``daemon:`` lines are what the daemon reports."""
    problems: list[str] = []

    def expect(what: str, ops: str | None, timeout_s: float = 30) -> None:
        if not wait_for(runs(ops), timeout_s):
            problems.append(f"{what}: kernel shows {kernel_view()}, expected {ops or 'disabled'}")
        print(_kernel_line(), flush=True)

    def settled_last() -> proto.SwitchInfo | None:
        # the kernel can show the new scheduler just before the daemon closes its record
        wait_for(lambda: _closed(history(sock)), 10, 0.1)
        entries = history(sock)
        return entries[-1] if entries else None

    _say(f"starting schedswitchd --config {config}")
    daemon = Daemon(config, sock, log)
    print(f"daemon answering after {daemon.start():.1f} s", flush=True)
    print(_kernel_line())
    _ctl("list", "--socket", sock)

    _say("a video-call app hints 'video-call' (its launcher holds the lease while it runs)")
    call = Launcher(sock, "video-call")
    print(_launcher_text(call))
    print(_switch_line(settled_last()))
    expect("video-call hint", "ss_vtime")
    _print_status(sock)

    _say("a game starts: hint 'gaming' (priority 50 beats video-call's 30)")
    admin = DaemonClient(sock)
    r = ask(admin, proto.HintRequest(workload="gaming"), proto.HintReply)
    print(f"lease {r.lease}; active {r.active}")
    print(_switch_line(r.switch))
    # tools/demo.py may give the gaming hint a community scheduler (its profile) instead
    expect("gaming hint", os.environ.get("SCHEDSWITCHD_DEMO_GAMING_OPS", "ss_latency"))

    _say(f"the game ends: release {r.lease}; the video call's scheduler returns")
    released = ask(admin, proto.ReleaseRequest(lease=r.lease), proto.ReleaseReply)
    print(f"released; active {released.active}")
    print(_switch_line(settled_last()))
    expect("gaming release", "ss_vtime")

    _say("a higher-priority hint 'fault-test' (90) runs ss_fifo told to call scx_bpf_error()")
    kmsg = KernelLog()
    seen = len(history(sock))
    faulty = Launcher(sock, "fault-test")
    print(_launcher_text(faulty))
    print(_switch_line(settled_last()))
    if not wait_for(runs("ss_fifo"), 30):
        problems.append(f"faulty scheduler attached: kernel shows {kernel_view()}")
    for line in kmsg.sched_ext_lines():  # the switch as the kernel logged it
        print(f"kernel log: {line}")
    print(_kernel_line(), flush=True)
    fifo_seq = kernel_view()["enable_seq"]
    print("waiting for the kernel to eject it (it errors after 200 enqueues)...", flush=True)

    def left_fifo() -> bool:
        k = kernel_view()
        return bool(k["state"] != "enabled" or k["ops"] != "ss_fifo" or k["enable_seq"] != fifo_seq)

    if not wait_for(left_fifo, 90, 0.01):
        problems.append("the kernel did not eject the faulty scheduler within 90 s")
    print(_kernel_line(), flush=True)  # the first read after the kernel let go of ss_fifo
    log_lines: list[str] = []

    def logged() -> bool:
        log_lines.extend(kmsg.sched_ext_lines())
        return any('"ss_fifo" disabled' in line for line in log_lines)

    if not wait_for(logged, 10):
        problems.append(f"the kernel log does not say ss_fifo was disabled: {log_lines}")
    kmsg.close()
    for line in log_lines:
        print(f"kernel log: {line}")

    def daemon_saw_it() -> bool:
        return any(h.result == "ejected" for h in history(sock)[seen:])

    if not wait_for(daemon_saw_it, 30, 0.2):
        problems.append("the daemon recorded no ejection")
    if not wait_for(runs("ss_vtime"), 30):
        problems.append(f"no fallback to ss_vtime after the ejection: {kernel_view()}")
    settled_last()
    for h in history(sock)[seen + 1 :]:
        print("daemon: " + _switch_line(h))
    print(_kernel_line())
    _print_status(sock)
    faulty.kill()  # its scheduler is held back; the launcher gives up

    _say("release all: the video-call app exits, the default (the kernel's own) returns")
    call.kill()
    if not wait_for(runs(None), 30):
        problems.append(f"release all: kernel shows {kernel_view()}, expected disabled")
    print(_switch_line(settled_last()))
    print(_kernel_line())
    if os.environ.get("DBUS_SYSTEM_BUS_ADDRESS"):
        _dbus_steps(expect, settled_last, problems)
    if os.environ.get("DBUS_SESSION_BUS_ADDRESS"):
        _gamemode_steps(sock, log, expect, settled_last, problems)
    entries = history(sock)
    print("daemon history:")
    for n, h in enumerate(entries, 1):
        print(f"  #{n} " + _switch_line(h).replace("\n", "\n   "))
    admin.close()
    daemon.stop()
    return _summary(entries, problems)


#: ``busctl`` against the daemon's ``org.scx.Loader`` (scx_loader's D-Bus API).
_LOADER = ("org.scx.Loader", "/org/scx/Loader", "org.scx.Loader")


def _busctl(*args: str) -> subprocess.CompletedProcess[str]:
    """``busctl ARGS`` on ``$DBUS_SYSTEM_BUS_ADDRESS``, echoed as the demo's command line."""
    print("$ busctl " + " ".join(args), flush=True)
    out = subprocess.run(
        ["busctl", f"--address={os.environ['DBUS_SYSTEM_BUS_ADDRESS']}", "--", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    print((out.stdout + out.stderr).rstrip(), flush=True)
    return out


def _dbus_steps(
    expect: Callable[..., None],
    settled_last: Callable[[], proto.SwitchInfo | None],
    problems: list[str],
) -> None:
    """The desktop's tools switch over D-Bus, as they drive scx_loader: an override to
    ss_fifo (``scx_fifo`` in the demo's ``[dbus.scx_names]``), the kernel's view read back
    as a property, then ``RestoreDefault``: hints and the default (the kernel's) rule again."""
    _say("a desktop tool switches over D-Bus, as it drives scx_loader (org.scx.Loader)")
    call = _busctl("call", *_LOADER, "SwitchScheduler", "su", "scx_fifo", "0")
    if call.returncode != 0:
        problems.append(f"D-Bus SwitchScheduler failed: {call.stderr.strip()}")
    print(_switch_line(settled_last()))
    expect("D-Bus SwitchScheduler scx_fifo", "ss_fifo")
    got = _busctl("get-property", *_LOADER, "CurrentScheduler")
    if got.stdout.strip() != 's "scx_fifo"':
        problems.append(f"CurrentScheduler after the D-Bus switch: {got.stdout.strip()}")
    _busctl("call", *_LOADER, "RestoreDefault")
    print(_switch_line(settled_last()))
    expect("D-Bus RestoreDefault", None)
    got = _busctl("get-property", *_LOADER, "CurrentScheduler")
    if got.stdout.strip() != 's "unknown"':
        problems.append(f"CurrentScheduler after RestoreDefault: {got.stdout.strip()}")


def _gamemode_steps(
    sock: str,
    log: Path,
    expect: Callable[..., None],
    settled_last: Callable[[], proto.SwitchInfo | None],
    problems: list[str],
) -> None:
    """A game launched as Steam's ``gamemoderun %command%`` launches it: with
    ``schedswitch-gamemode`` serving GameMode's name on the session bus in gamemoded's
    place, the game holds the ``gaming`` hint while it runs, and its end ends it."""
    _say("a game launched with `gamemoderun` (Steam's launch option), no gamemoded")
    print("schedswitch-gamemode serves com.feralinteractive.GameMode on the session bus")
    agent_log = log.with_name("gamemode-agent.log")
    agent_exe = Path(sys.executable).with_name("schedswitch-gamemode")
    with open(agent_log, "ab") as out:
        agent = subprocess.Popen(
            [str(agent_exe), "--socket", sock, "--mode", "serve"], stdout=out, stderr=out
        )
    try:
        if not wait_for(lambda: b"serving" in agent_log.read_bytes(), 300, 0.2):
            problems.append(f"schedswitch-gamemode did not start: {agent_log.read_text()}")
            return
        print("$ gamemoderun sleep 20", flush=True)
        game = subprocess.Popen(["/usr/games/gamemoderun", "sleep", "20"])
        expect("gamemoderun game", os.environ.get("SCHEDSWITCHD_DEMO_GAMING_OPS", "ss_latency"))
        print(_switch_line(settled_last()))
        if game.poll() is not None:
            problems.append("the game ended before its scheduler ran")
        game.wait(120)
        print(f"the game exited ({game.returncode}): its lease ends with it", flush=True)
        expect("gamemoderun game's end", None)
        print(_switch_line(settled_last()))
    finally:
        agent.terminate()
        agent.wait(60)
    for line in agent_log.read_text().splitlines():
        print(f"agent: {line}")


def _closed(entries: list[proto.SwitchInfo]) -> bool:
    return not entries or entries[-1].result == "ejected" or "total" in entries[-1].phases_ns


def _summary(entries: list[proto.SwitchInfo], problems: list[str]) -> int:
    """Print the one-line JSON summary; 0 when every expectation held."""
    made = [e for e in entries if e.result == "ok"]
    totals = [e.phases_ns["total"] / 1e6 for e in made if "total" in e.phases_ns]
    gaps = [e.gap_ns / 1e6 for e in made if e.gap_ns is not None]
    summary = {
        "kernel": os.uname().release,
        "switches": len(made),
        "ejections": sum(e.result == "ejected" for e in entries),
        "median_switch_ms": round(statistics.median(totals), 1) if totals else None,
        "median_gap_ms": round(statistics.median(gaps), 1) if gaps else None,
        "result": "ok" if not problems else "failed: " + "; ".join(problems),
    }
    print(json.dumps(summary), flush=True)
    return 0 if not problems else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["checks", "demo"])
    parser.add_argument("--config", required=True)
    parser.add_argument("--socket", default="/run/schedswitchd-session.sock")
    parser.add_argument("--out", type=Path, default=Path("checks.json"))
    parser.add_argument(
        "--log", type=Path, default=Path(tempfile.gettempdir()) / "schedswitchd.log"
    )
    args = parser.parse_args(argv)
    if args.mode == "checks":
        run_checks(args.config, args.socket, args.out, args.log)
        return 0
    return run_demo(args.config, args.socket, args.log)


if __name__ == "__main__":
    sys.exit(main())
