"""Checks of the shipped systemd units, run inside the VM booted by :mod:`tools.vm_systemd`.

``python -m tools.systemd_checks --out FILE`` runs as root from the test unit while systemd
(PID 1) has ``schedswitchd.socket`` listening and ``schedswitchd.service`` not started. It
drives the real units with ``systemctl`` and the installed CLIs (``/usr/bin/schedswitchctl``,
``/usr/bin/schedswitch-run``), reads the kernel's view from ``/sys/kernel/sched_ext`` and
the daemon's process state from ``/proc``, and writes what it saw to FILE as JSON after each
section (so a hang still leaves the earlier ones); tests/vm/test_systemd_unit.py judges it.
Sections, in order: ``boot``, ``socket``, ``activation``, ``hardening``, ``hint``,
``pid_lease``, ``reload``, ``watchdog``, ``restart``, ``mdwe``, ``stop``, ``bad_config``,
``socket_stop``; a section that raised has an ``error`` key.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.client import DaemonClient
from tools.session import kernel_view, wait_for

SERVICE = "schedswitchd.service"
SOCKET_UNIT = "schedswitchd.socket"
SOCK = "/run/schedswitchd.sock"
CONFIG = Path("/etc/schedswitchd/schedswitchd.toml")
PIN_DIR = Path("/sys/fs/bpf/schedswitchd")
NETLINK_KOBJECT_UEVENT = 15  # include/uapi/linux/netlink.h
#: Capability numbers (include/uapi/linux/capability.h) named in the unit.
CAP_NAMES = {
    0: "CAP_CHOWN",
    5: "CAP_KILL",
    21: "CAP_SYS_ADMIN",
    24: "CAP_SYS_RESOURCE",
    38: "CAP_PERFMON",
    39: "CAP_BPF",
}
RELOAD_HINT = "vmtest-reload"
BAD_DROPIN = "50-vmtest-broken.toml"
REPO = Path(__file__).resolve().parents[1]
#: A test object whose load maps a BPF arena (``make test-objects``).
ARENA_OBJECT = REPO / "build" / "tests" / "bpf" / "arena_rw.bpf.o"
#: An anonymous writable-and-executable mapping: what MemoryDenyWriteExecute= refuses.
WX_MMAP = "import mmap; mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)"


def sh(*argv: str, timeout: float = 120.0) -> dict[str, Any]:
    """Run ``argv``; ``{"rc", "out", "err", "s"}`` (seconds)."""
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return {"rc": p.returncode, "out": p.stdout, "err": p.stderr, "s": time.monotonic() - t0}


def show(unit: str, *props: str) -> dict[str, str]:
    """``systemctl show UNIT -p P ...`` as a dict."""
    out = sh("systemctl", "show", unit, *(f"-p{p}" for p in props))["out"]
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def main_pid() -> int:
    return int(show(SERVICE, "MainPID")["MainPID"])


def listening_inodes(path: str) -> list[int]:
    """Inodes of listening ``AF_UNIX`` sockets bound to ``path`` (``/proc/net/unix``: Flags
    ``00010000`` is ``__SO_ACCEPTCON``)."""
    found = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 8 and cols[7] == path and int(cols[3], 16) & 0x10000:
            found.append(int(cols[6]))
    return found


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets ``pid`` holds (``/proc/PID/fd`` links ``socket:[N]``)."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    return inodes


def uevent_sockets(pid: int) -> list[dict[str, int]]:
    """``pid``'s ``NETLINK_KOBJECT_UEVENT`` sockets with their multicast groups
    (``/proc/net/netlink``: sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode)."""
    mine = socket_inodes(pid)
    found = []
    for line in Path(f"/proc/{pid}/net/netlink").read_text().splitlines()[1:]:
        cols = line.split()
        if int(cols[1]) == NETLINK_KOBJECT_UEVENT and int(cols[9]) in mine:
            found.append({"groups": int(cols[3], 16), "inode": int(cols[9])})
    return found


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict((k, v.strip()) for k, _, v in (ln.partition(":") for ln in lines))


def cap_names(mask_hex: str) -> list[str]:
    mask = int(mask_hex, 16)
    return [CAP_NAMES.get(n, f"cap{n}") for n in range(64) if mask >> n & 1]


def mounts(pid: int) -> dict[str, dict[str, str]]:
    """Mount point -> ``{"root", "fstype", "options"}`` (root: the mounted subtree of its
    filesystem; options: per-mount then superblock ones) as seen by ``pid``; the last mount
    on a point wins (``proc(5)`` mountinfo)."""
    table = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        cols, rcols = left.split(), right.split()
        table[cols[4]] = {
            "root": cols[3],
            "fstype": rcols[0],
            "options": f"{cols[5]},{rcols[2]}",
        }
    return table


def pins() -> list[str]:
    if not PIN_DIR.is_dir():
        return []
    return sorted(str(p.relative_to(PIN_DIR)) for p in PIN_DIR.rglob("*"))


def journal(unit: str = SERVICE) -> list[dict[str, Any]]:
    out = sh("journalctl", "-u", unit, "-o", "json", "--no-pager")["out"]
    entries = []
    for line in out.splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def messages(entries: list[dict[str, Any]]) -> list[str]:
    return [str(e.get("MESSAGE", "")) for e in entries]


def status() -> proto.StatusBody:
    with DaemonClient(SOCK, timeout_s=30) as c:
        reply = c.request(proto.StatusRequest())
        assert isinstance(reply, proto.StatusReply)
        return reply.status


def hint_workloads() -> list[str]:
    with DaemonClient(SOCK, timeout_s=30) as c:
        reply = c.request(proto.ListRequest())
        assert isinstance(reply, proto.ListReply)
        return [h.workload for h in reply.hints]


def processes(word: str) -> list[str]:
    """Command lines of processes (other than this one) that mention ``word``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if word in cmd:
            found.append(f"{d.name}: {cmd}")
    return found


RUN_SHOW = (
    "cat /sys/kernel/sched_ext/state /sys/kernel/sched_ext/root/ops; "
    f"systemctl show -pStatusText --value {SERVICE}"
)


def run_hint(workload: str) -> dict[str, Any]:
    """``schedswitch-run WORKLOAD -- sh -c ...`` printing the kernel's state, ops and the
    unit's StatusText while the hint is held."""
    r = sh("schedswitch-run", workload, "--", "/bin/sh", "-c", RUN_SHOW)
    lines = r["out"].splitlines()
    r["during"] = {
        "state": lines[0] if lines else None,
        "ops": lines[1] if len(lines) > 1 else None,
        "status_text": lines[2] if len(lines) > 2 else None,
    }
    return r


# --- sections ------------------------------------------------------------------------------


def boot() -> dict[str, Any]:
    return {
        "pid1": Path("/proc/1/comm").read_text().strip(),
        "uptime_s": float(Path("/proc/uptime").read_text().split()[0]),
        "failed_units": sh("systemctl", "--failed", "--plain", "--no-legend")["out"],
        "kernel": kernel_view(),
    }


def socket_before() -> dict[str, Any]:
    st = os.stat(SOCK)
    return {
        "socket_unit": show(SOCKET_UNIT, "ActiveState", "SubState", "Listen", "Triggers"),
        "service": show(SERVICE, "ActiveState", "MainPID"),
        "is_socket": (st.st_mode & 0o170000) == 0o140000,
        "mode": oct(st.st_mode & 0o777),
        "listening": listening_inodes(SOCK),
    }


def activation() -> dict[str, Any]:
    # the first connection starts the service (its start took over 120 s on a loaded host)
    r = sh("schedswitchctl", "status", "--json", timeout=400)
    props = show(
        SERVICE,
        "ActiveState",
        "SubState",
        "Type",
        "MainPID",
        "StatusText",
        "NRestarts",
        "WatchdogUSec",
        "ActiveEnterTimestampMonotonic",
        "TriggeredBy",
    )
    pid = int(props["MainPID"])
    listening = listening_inodes(SOCK)
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return {
        "ctl": r,
        "status": json.loads(r["out"]) if r["rc"] == 0 else None,
        "service": props,
        "listening": listening,
        "pid1_holds": sorted(set(listening) & socket_inodes(1)),
        "daemon_holds": sorted(set(listening) & socket_inodes(pid)),
        "listen_env": sorted(e.decode() for e in env if e.startswith(b"LISTEN_")),
    }


def hardening() -> dict[str, Any]:
    pid = main_pid()
    st = proc_status(pid)
    mnt = mounts(pid)

    def in_ns(*argv: str) -> dict[str, Any]:
        # the daemon's mount namespace, as root with every capability: only the mounts
        # (read-only binds, private /tmp and /dev) decide
        return sh("nsenter", f"--target={pid}", "--mount", *argv)

    probe = PIN_DIR.parent / "schedswitchd-vmtest-probe"  # bpffs allows only dirs and pins
    sec = sh("systemd-analyze", "security", "--no-pager", SERVICE)
    return {
        "cap_bounding": cap_names(st["CapBnd"]),
        "cap_effective": cap_names(st["CapEff"]),
        "no_new_privs": st["NoNewPrivs"],
        "seccomp": st["Seccomp"],
        "seccomp_filters": st.get("Seccomp_filters"),
        "own_mount_ns": os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/1/ns/mnt"),
        # PrivateNetwork=: only a loopback device, yet uevents still arrive (see hint)
        "own_net_ns": os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/1/ns/net"),
        "net_devices": sorted(
            line.split(":")[0].strip()
            for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
        ),
        "root_options": mnt["/"]["options"],
        "etc_options": mnt.get("/etc", mnt["/"])["options"],
        "bpffs": mnt.get("/sys/fs/bpf"),
        "tmp": mnt.get("/tmp"),
        "dev": mnt.get("/dev"),
        "write_etc": in_ns("touch", "/etc/schedswitchd-vmtest-probe"),
        "write_bpffs": in_ns("sh", "-c", f"mkdir {probe} && rmdir {probe}"),
        # RuntimeDirectory=schedswitchd: the expedited-RCU marker's directory
        "write_runtime_dir": in_ns(
            "sh", "-c", "touch /run/schedswitchd/vmtest-probe && rm /run/schedswitchd/vmtest-probe"
        ),
        "runtime_dir_mode": oct(os.stat("/run/schedswitchd").st_mode & 0o7777)
        if os.path.isdir("/run/schedswitchd")
        else None,
        "dev_listing": in_ns("ls", "/dev")["out"].split(),
        "uevent_sockets": uevent_sockets(pid),
        "security": sec["out"].strip().splitlines()[-1:] + sec["err"].strip().splitlines()[-3:],
    }


def hint() -> dict[str, Any]:
    # uinput (its BTF carries ss_latency's CO-RE targets) loaded while the daemon runs: the
    # module uevent reaches the daemon's registry through AF_NETLINK
    loaded_before = Path("/sys/module/uinput").exists()
    mod = sh("modprobe", "-d", os.environ["KMOD_ROOT"], "uinput")
    run = run_hint("gaming")
    reverted = wait_for(lambda: kernel_view()["state"] == "disabled", 20)
    st = status()
    entries = journal()
    fields = sorted({k for e in entries for k in ("SCHEDULER", "LEASE", "SWITCH_NS") if k in e})
    return {
        "uinput_loaded_before": loaded_before,
        "modprobe": mod,
        "run": run,
        "reverted": reverted,
        "after": kernel_view(),
        "status_text_after": show(SERVICE, "StatusText")["StatusText"],
        "active_after": st.active,
        "counters": st.counters,
        "history": [h.model_dump(mode="json") for h in st_history()],
        "journal_fields": fields,
    }


def pid_lease() -> dict[str, Any]:
    """A hint naming the pid of another user's process (uid 65534) ends when that process
    exits, while the hinting connection stays open: pidfd_open(2) and the liveness check
    (pidfd_send_signal(2), CAP_KILL) pass the unit's SystemCallFilter= and bounding set."""

    def drop() -> None:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    child = subprocess.Popen(["sleep", "600"], preexec_fn=drop)
    try:
        with DaemonClient(SOCK, timeout_s=60) as c:
            reply = c.request(proto.HintRequest(workload="battery", pid=child.pid))
            on = wait_for(lambda: kernel_view()["ops"] == "ss_fifo", 30, 0.2)
            child.kill()
            child.wait()
            ended = wait_for(lambda: status().leases == 0, 20, 0.2)
            reverted = wait_for(lambda: kernel_view()["state"] == "disabled", 20)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return {
        "reply": reply.model_dump(mode="json"),
        "attached": on,
        "ended_while_connected": ended,
        "reverted": reverted,
        "messages": [m for m in messages(journal()) if f"pid {child.pid}" in m],
    }


def st_history() -> list[proto.SwitchInfo]:
    with DaemonClient(SOCK, timeout_s=30) as c:
        reply = c.request(proto.HistoryRequest())
        assert isinstance(reply, proto.HistoryReply)
        return reply.entries


def reload() -> dict[str, Any]:
    pid = main_pid()
    before = hint_workloads()
    with CONFIG.open("a") as f:
        f.write(f'\n[hints.{RELOAD_HINT}]\nscheduler = "vtime"\npriority = 20\n')
    r = sh("systemctl", "reload", SERVICE)
    # ExecReload= only sends SIGHUP: the daemon re-reads the file a moment later
    seen = wait_for(lambda: RELOAD_HINT in hint_workloads(), 20, 0.5)
    run = run_hint(RELOAD_HINT)
    reverted = wait_for(lambda: kernel_view()["state"] == "disabled", 20)
    return {
        "before": before,
        "systemctl": r,
        "seen": seen,
        "after": hint_workloads(),
        "pid_same": main_pid() == pid,
        "service": show(SERVICE, "ActiveState", "SubState"),
        "run": run,
        "reverted": reverted,
    }


def watchdog() -> dict[str, Any]:
    """WATCHDOG=1 pings: systemd moves WatchdogTimestamp on each one (it is first set when
    the service starts), so once the daemon has lived past one ping interval (half of
    WatchdogSec) the timestamp must be later than that start."""
    props = show(SERVICE, "WatchdogUSec", "ActiveEnterTimestampMonotonic")
    start_us = int(props["ActiveEnterTimestampMonotonic"])
    # the daemon pings every WatchdogSec/2 (30 s in the unit; systemctl prints "30s")
    interval_s = 15.0
    uptime_us = float(Path("/proc/uptime").read_text().split()[0]) * 1e6
    wait_s = max(0.0, (start_us + (interval_s + 3) * 1e6 - uptime_us) / 1e6)
    time.sleep(wait_s)
    after = show(SERVICE, "WatchdogTimestampMonotonic", "NRestarts", "WatchdogUSec")
    return {
        "active_enter_us": start_us,
        "watchdog_usec": props["WatchdogUSec"],
        "waited_s": wait_s,
        "watchdog_ts_us": int(after["WatchdogTimestampMonotonic"]),
        "nrestarts": after["NRestarts"],
    }


def restart() -> dict[str, Any]:
    launcher = subprocess.Popen(
        ["schedswitch-run", "gaming", "--", "sleep", "600"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        on = wait_for(lambda: kernel_view()["ops"] == "ss_latency", 60, 0.2)
        # root/ops appears a moment before enable_seq counts the enable: read the view once
        # the daemon has confirmed the switch
        on = on and wait_for(lambda: status().active == "latency", 30, 0.5)
        time.sleep(0.5)
        before = kernel_view()
        pid = main_pid()
        seen = len(journal())
        r = sh("systemctl", "restart", SERVICE)
        during = kernel_view()
        new_pid = main_pid()
        # schedswitch-run takes its hint again on the new daemon
        retaken = wait_for(lambda: status().leases == 1, 30, 0.5)
        st = status()
        pinned = pins()
    finally:
        launcher.terminate()
        _, err = launcher.communicate(timeout=30)
    # the new daemon holds an adopted scheduler for [daemon] adopt_grace_s (30 s) after
    # adopting it unless a lease wants it: the revert may wait for that
    reverted = wait_for(lambda: kernel_view()["state"] == "disabled", 60)
    return {
        "attached": on,
        "messages": messages(journal()[seen:]),
        "before": before,
        "systemctl": r,
        "during": during,
        "pid_changed": new_pid != pid,
        "retaken": retaken,
        "adopted": st.adopted,
        "active": st.active,
        "pins_while_attached": pinned,
        "launcher_err": err,
        "reverted": reverted,
        "after": kernel_view(),
        "service": show(SERVICE, "ActiveState", "NRestarts"),
    }


def mdwe() -> dict[str, Any]:
    """MemoryDenyWriteExecute= and the loader: a transient unit with the service's memory and
    syscall restrictions loads an object whose load maps a BPF arena (``object load``, the
    loader's own code path), while a writable-and-executable mapping fails there (the
    property is in effect) and works outside it (the control)."""
    props = [
        "-p", "MemoryDenyWriteExecute=yes",
        "-p", "NoNewPrivileges=yes",
        "-p", "SystemCallArchitectures=native",
        "-p", "SystemCallFilter=@system-service bpf perf_event_open",
        "-p", "SystemCallErrorNumber=EPERM",
    ]  # fmt: skip

    def transient(*argv: str) -> dict[str, Any]:
        return sh("systemd-run", "--wait", "--pipe", "--collect", "--quiet", *props, *argv)

    py = os.environ["PY"]
    return {
        "arena_object": str(ARENA_OBJECT) if ARENA_OBJECT.exists() else None,
        "arena_load": transient(
            "/usr/bin/schedswitchctl", "object", "load", str(ARENA_OBJECT), "--json"
        )
        if ARENA_OBJECT.exists()
        else None,
        "wx_in_unit": transient(py, "-c", WX_MMAP),
        "wx_outside": sh(py, "-c", WX_MMAP),
    }


def stop() -> dict[str, Any]:
    pid = main_pid()
    before = {"kernel": kernel_view(), "pins": pins()}
    r = sh("systemctl", "stop", SERVICE)
    cgroup = Path("/sys/fs/cgroup/system.slice") / SERVICE
    props = show(
        SERVICE, "ActiveState", "SubState", "Result", "ExecMainCode", "ExecMainStatus", "MainPID"
    )
    entries = journal()
    bpftool = sh("bpftool", "-j", "struct_ops", "show")
    return {
        "before": before,
        "systemctl": r,
        "service": props,
        "pid_gone": not Path(f"/proc/{pid}").exists(),
        "cgroup_procs": (cgroup / "cgroup.procs").read_text().split() if cgroup.is_dir() else [],
        "processes": processes("schedswitchd --config"),
        "pins": pins(),
        "kernel": kernel_view(),
        "struct_ops": json.loads(bpftool["out"] or "[]") if bpftool["rc"] == 0 else bpftool,
        "socket_unit": show(SOCKET_UNIT, "ActiveState", "SubState"),
        "last_messages": messages(entries)[-5:],
        # the daemon's own warnings and errors over the whole run: a sandbox that silently
        # degrades something (no uevents, a failed pin) shows up here
        "daemon_warnings": [
            str(e.get("MESSAGE"))
            for e in entries
            if e.get("SYSLOG_IDENTIFIER") == "schedswitchd" and int(e.get("PRIORITY", 6)) <= 4
        ],
        "watchdog_timeouts": [m for m in messages(journal("init.scope")) if "atchdog" in m],
    }


def bad_config() -> dict[str, Any]:
    """A drop-in with an unknown key (``conf.d/`` beside the config): the start fails with
    exit status 78 and, by ``RestartPreventExitStatus=78``, is not restarted (without it,
    ``Restart=on-failure`` starts it again after ``RestartSec=1s``). The drop-in is removed
    and the failure reset afterwards."""
    dropin = CONFIG.parent / "conf.d" / BAD_DROPIN
    dropin.parent.mkdir(exist_ok=True)
    dropin.write_text("[limits]\nmax_conections = 1\n")
    try:
        r = sh("systemctl", "start", SERVICE, timeout=400)
        failed = wait_for(lambda: show(SERVICE, "ActiveState")["ActiveState"] == "failed", 300)
        time.sleep(4)  # a restart would be scheduled 1 s after the failure
        props = show(
            SERVICE, "ActiveState", "Result", "ExecMainStatus", "NRestarts", "ConditionResult"
        )
        said = [m for m in messages(journal()) if str(dropin) in m]
    finally:
        dropin.unlink()
        reset = sh("systemctl", "reset-failed", SERVICE)
    return {
        "systemctl": r,
        "failed": failed,
        "service": props,
        "messages": said,
        "reset": reset,
        "socket_condition": show(SOCKET_UNIT, "ConditionResult")["ConditionResult"],
    }


def socket_stop() -> dict[str, Any]:
    r = sh("systemctl", "stop", SOCKET_UNIT)
    return {
        "systemctl": r,
        "socket_unit": show(SOCKET_UNIT, "ActiveState"),
        "path_exists": os.path.lexists(SOCK),
    }


SECTIONS: list[tuple[str, Callable[[], dict[str, Any]]]] = [
    ("boot", boot),
    ("socket", socket_before),
    ("activation", activation),
    ("hardening", hardening),
    ("hint", hint),
    ("pid_lease", pid_lease),
    ("reload", reload),
    ("watchdog", watchdog),
    ("restart", restart),
    ("mdwe", mdwe),
    ("stop", stop),
    ("bad_config", bad_config),
    ("socket_stop", socket_stop),
]


def run(out: Path) -> None:
    results: dict[str, Any] = {}
    for name, fn in SECTIONS:
        t0 = time.monotonic()
        try:
            results[name] = fn()
        except Exception:
            results[name] = {"error": traceback.format_exc()}
        results[name]["_s"] = round(time.monotonic() - t0, 2)
        print(f"{name}: {results[name]['_s']} s", flush=True)
        out.write_text(json.dumps(results, indent=1, default=str))
    results["done"] = True
    out.write_text(json.dumps(results, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    run(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
