"""``schedswitchctl status|list|history|hint|release|switch|stop|reload``: talk to the daemon.

Tables for people; ``--json`` prints the daemon's reply as one JSON object for scripts.
Every command takes ``--socket PATH`` (default ``$SCHEDSWITCHD_SOCKET`` or
``/run/schedswitchd.sock``). Exit status (:mod:`schedswitchd.cli.exits`): 0 on success,
1 on an error reply, 2 for an argument that does not validate, 3 for an unreachable
daemon, 4 when the daemon refuses (``denied``, ``limit``); with ``--json`` an error is
also printed on stdout as ``{"error": {...}}``.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from schedswitchd.cli.exits import UsageError
from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.client import DEFAULT_SOCKET, DaemonClient, DaemonError


def register(sub: Any) -> None:
    """Add the daemon commands to ``schedswitchctl``'s sub-parsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--socket",
        metavar="PATH",
        help=f"daemon socket path (default: $SCHEDSWITCHD_SOCKET or {DEFAULT_SOCKET})",
    )
    common.add_argument("--json", action="store_true", help="print the raw reply as JSON")

    def add(name: str, help_text: str, handler: Callable[[argparse.Namespace], int]) -> Any:
        parser = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        parser.set_defaults(handler=handler)
        return parser

    add("status", "the kernel's sched_ext state and the daemon's", _status)
    add("list", "configured schedulers, hint rules and live leases", _list)
    history = add("history", "recent switches, oldest first", _history)
    history.add_argument("--limit", type=int, default=20, help="at most this many (20)")
    hint = add(
        "hint",
        "hold a hint for WORKLOAD until interrupted (the lease ends when this exits)",
        _hint,
    )
    hint.add_argument("workload", help="a workload with a hint rule (see `list`)")
    hint.add_argument("--pid", type=int, help="also end the lease when this process exits")
    hint.add_argument("--ttl", type=float, help="also end the lease after TTL seconds")
    prepare = add(
        "prepare",
        "announce WORKLOAD: its scheduler is prepared now (not switched to) and held as a "
        "standby for TTL seconds, so that a hint for it switches at once",
        _prepare,
    )
    prepare.add_argument("workload", help="a workload with a hint rule (see `list`)")
    prepare.add_argument("--ttl", type=float, default=30.0, help="hold it this long, seconds (30)")
    release = add("release", "end a lease", _release)
    release.add_argument("lease", help="the lease id a `hint` printed")
    switch = add(
        "switch",
        "admin: run SCHEDULER ('kernel': none, 'auto': follow hints); if the switch fails "
        "(or the kernel later ejects it) the override is dropped and hints rule again",
        _switch,
    )
    switch.add_argument("scheduler", help="a scheduler name of the config (see `list`)")
    add("stop", "admin: back to the kernel's own scheduler", _stop)
    add("reload", "admin: re-read the daemon's configuration", _reload)


def make_request(cls: type[BaseModel], **fields: Any) -> Any:
    """Build a request model; bad arguments become a one-line
    :class:`~schedswitchd.cli.exits.UsageError` (exit 2)."""
    try:
        return cls(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"{where}: {first['msg']}") from None


def _call(args: argparse.Namespace, request: Any) -> Any:
    with DaemonClient(args.socket) as client:
        reply = client.request(request)
    if args.json:
        print(reply.model_dump_json())
    return reply


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.1f} ms"


#: The counters a person reads in the status table; ``--json`` has all of them.
_STATUS_COUNTERS = (
    "btf_cache_hits",
    "btf_cache_misses",
    "module_btfs_read",
    "spec_cache_hits",
    "spec_cache_misses",
    "prepares",
    "attaches",
)


def _counters_text(counters: dict[str, int]) -> str:
    shown = [f"{n}={counters[n]}" for n in _STATUS_COUNTERS if n in counters]
    if len(counters) > len(shown):
        shown.append(f"(+{len(counters) - len(shown)} more with --json)")
    return " ".join(shown) or "-"


def _exit_text(exit_: proto.ExitInfo) -> str:
    """``KIND: reason: message``, leaving out empty parts (the kernel's own wording)."""
    return ": ".join(p for p in (exit_.kind_name, exit_.reason, exit_.message) if p)


def _switch_line(info: proto.SwitchInfo) -> str:
    # Top-level phases only; the backend's prepare.<phase> breakdown is in --json.
    phases = " ".join(
        f"{k} {v / 1e6:.1f}" for k, v in info.phases_ns.items() if k != "total" and "." not in k
    )
    line = (
        f"{info.previous} -> {info.target} {info.result}  total "
        f"{_ms(info.phases_ns.get('total'))}  gap {_ms(info.gap_ns)}"
    )
    if phases:
        line += f"  [{phases} ms]"
    if info.error is not None:
        line += f"  error {info.error.code}: {info.error.message}"
    if info.exit is not None:
        line += f"  exit {_exit_text(info.exit)}"
    return line


def _lease_line(lease: proto.LeaseInfo) -> str:
    text = (
        f"{lease.lease}  {lease.workload} -> {lease.scheduler} (priority {lease.priority})  "
        f"uid {lease.uid}  pid {lease.pid if lease.pid is not None else '-'}"
    )
    if lease.ttl_remaining_s is not None:
        text += f"  ttl {lease.ttl_remaining_s:.0f} s"
    return text


def _table(rows: list[tuple[str, str]]) -> None:
    width = max((len(k) for k, _ in rows), default=0)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _status(args: argparse.Namespace) -> int:
    reply = _call(args, proto.StatusRequest())
    if args.json:
        return 0
    s: proto.StatusBody = reply.status
    k = s.kernel
    if k.state == "unavailable":
        kernel = "not available in this kernel (no /sys/kernel/sched_ext): schedulers cannot run"
    else:
        seq = "-" if k.enable_seq is None else str(k.enable_seq)
        kernel = f"{k.state}  ops {k.ops or '-'}  enable_seq {seq}"
    rows = [
        ("sched_ext", kernel),
        ("active", s.active + ("  (re-adopted)" if s.adopted else "")),
        ("desired", s.desired + (f"  (admin override {s.override})" if s.override else "")),
        ("lease", _lease_line(s.lease) if s.lease else _no_deciding_lease(s)),
        ("leases", str(s.leases)),
        *(("", "  " + _lease_line(lease)) for lease in s.live_leases),
        ("last switch", _switch_line(s.last_switch) if s.last_switch else "-"),
        (
            "last exit",
            _exit_text(s.last_exit) if s.last_exit else "-",
        ),
        (
            "backoff",
            ", ".join(
                f"{b.scheduler} ({b.failures} failure{'s' if b.failures != 1 else ''}, "
                f"{b.remaining_s:.0f} s left)"
                for b in s.backoff
            )
            or "-",
        ),
        (
            "standby",
            ", ".join(
                f"{e.scheduler} ({e.reason}, {e.kernel_bytes / 1024:.0f} KiB kernel, "
                f"prepared in {e.prepare_ms:.0f} ms)"
                for e in s.standby
            )
            or "-",
        ),
        ("profile", _profile_text(s.profile) if s.profile else "-"),
        ("counters", _counters_text(s.counters)),
        ("daemon", f"pid {s.pid}  version {s.version}  up {s.uptime_s:.0f} s"),
    ]
    _table(rows)
    return 0


def _prepare(args: argparse.Namespace) -> int:
    reply: proto.PrepareReply = _call(
        args, make_request(proto.PrepareRequest, workload=args.workload, ttl_s=args.ttl)
    )
    if args.json:
        return 0
    if reply.scheduler == reply.active:
        print(f"{reply.workload} -> {reply.scheduler}: already running")
    else:
        print(
            f"{reply.workload} -> {reply.scheduler}: prepared, held {reply.until_s:.0f} s "
            f"({reply.kernel_bytes / 1024:.0f} KiB of kernel memory)"
        )
    return 0


def _profile_text(p: proto.ProfileStatus) -> str:
    """The ``profile`` row: name, mode and the scheduler's own counters."""
    mode = f"  mode {p.mode}" if p.mode else ""
    stats = "  " + " ".join(f"{k}={v}" for k, v in p.stats.items()) if p.stats else ""
    return f"{p.name}{mode}{stats}"


def _no_deciding_lease(s: proto.StatusBody) -> str:
    """The ``lease`` row when no lease decides what runs: say why, if leases are live."""
    if not s.leases:
        return "-"
    if s.override is not None:
        why = f"the admin override {s.override} wins"
    elif s.backoff:
        why = "their schedulers are held back after failures"
    else:
        why = f"the default {s.desired} runs"
    return f"none of the {s.leases} live lease(s) decides what runs ({why})"


def _list(args: argparse.Namespace) -> int:
    reply: proto.ListReply = _call(args, proto.ListRequest())
    if args.json:
        return 0
    print(f"default: {reply.default}")
    print("schedulers:")
    for sched in reply.schedulers:
        flags = " *active*" if sched.active else ""
        if sched.backoff_remaining_s is not None:
            flags += f" (held back {sched.backoff_remaining_s:.0f} s)"
        print(f"  {sched.name:<12} {sched.object}{flags}")
        if sched.description:
            print(f"  {'':<12} {sched.description}")
    print("hints:")
    for rule in reply.hints:
        print(f"  {rule.workload:<12} -> {rule.scheduler} (priority {rule.priority})")
    print("leases:" + ("" if reply.leases else " none"))
    for lease in reply.leases:
        print("  " + _lease_line(lease))
    return 0


def _history(args: argparse.Namespace) -> int:
    reply: proto.HistoryReply = _call(args, make_request(proto.HistoryRequest, limit=args.limit))
    if args.json:
        return 0
    import time

    for entry in reply.entries:
        stamp = time.strftime("%H:%M:%S", time.localtime(entry.time))
        print(f"#{entry.seq} {stamp} {_switch_line(entry)}  [{entry.reason}]")
    if not reply.entries:
        print("no switches yet")
    return 0


def _hint(args: argparse.Namespace) -> int:
    request = make_request(proto.HintRequest, workload=args.workload, pid=args.pid, ttl_s=args.ttl)
    with DaemonClient(args.socket) as client:
        reply = client.request(request)
        assert isinstance(reply, proto.HintReply)
        if args.json:
            print(reply.model_dump_json(), flush=True)
        else:
            print(_hint_line(args.workload, reply), flush=True)
            print("holding the hint; Ctrl-C to release", file=sys.stderr, flush=True)
        # SIGTERM ends the hold like Ctrl-C does: the connection closes, the lease ends.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            final = client.wait_closed()
        except KeyboardInterrupt:
            return 0
    if final is not None:  # --ttl passed or --pid exited: the hold did its job
        print(f"lease {final.lease} ended: {final.why}", file=sys.stderr)
        return 0
    print("the daemon closed the connection; the lease has ended", file=sys.stderr)
    return 1


def _hint_line(workload: str, reply: proto.HintReply) -> str:
    """What a hint achieved, for people: the running scheduler and, when it is not the
    workload's, why (a failed switch and its error, a better lease, backoff, pending)."""
    text = f"lease {reply.lease}: {workload} -> running {reply.active}"
    wanted = reply.scheduler
    sw = reply.switch
    if sw is not None and sw.result not in ("ok", "adopted"):
        error = f": {sw.error.message}" if sw.error is not None else ""
        text += f" (switch to {sw.target} {sw.result}{error})"
    elif reply.pending:
        text += f" (switch to {reply.desired} still in progress)"
    elif wanted is not None and reply.active != wanted:
        if reply.desired != wanted:
            text += f" ({wanted} not chosen: a higher-priority lease, an override or backoff)"
        else:
            text += f" (not {wanted}: see `schedswitchctl status`)"
    return text


def _release(args: argparse.Namespace) -> int:
    reply = _call(args, make_request(proto.ReleaseRequest, lease=args.lease))
    if not args.json:
        print(f"released {reply.lease}; running {reply.active}")
    return 0


def _print_switch(args: argparse.Namespace, reply: proto.SwitchReply) -> int:
    if not args.json:
        print(f"running {reply.active}")
        if reply.switch is not None:
            print(_switch_line(reply.switch))
    return 0


def _switch(args: argparse.Namespace) -> int:
    try:
        return _print_switch(
            args, _call(args, make_request(proto.SwitchRequest, scheduler=args.scheduler))
        )
    except DaemonError as exc:
        if exc.verifier_log:
            print(exc.verifier_log, file=sys.stderr)
        raise


def _stop(args: argparse.Namespace) -> int:
    return _print_switch(args, _call(args, proto.StopRequest()))


def _reload(args: argparse.Namespace) -> int:
    reply: proto.ReloadReply = _call(args, proto.ReloadRequest())
    if not args.json:
        print(f"reloaded {reply.source}: schedulers {', '.join(reply.schedulers)}")
    return 0
