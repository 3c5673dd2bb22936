"""The ``schedswitchctl`` commands that talk to the daemon (status, list, history, hint, ...

Tables for people; ``--json`` prints the daemon's reply as one JSON object for scripts.
Every command takes ``--socket PATH`` (default ``$SCHEDSWITCHD_SOCKET`` or
``/run/schedswitchd.sock``). Exit status (:mod:`schedswitchd.cli.exits`): 0 on success,
1 on an error reply, 2 for an argument that does not validate, 3 for an unreachable
daemon, 4 when the daemon refuses (``denied``, ``limit``); with ``--json`` an error is
also printed on stdout as ``{"error": {...}}``.

It imports the standard library and :mod:`schedswitchd.daemon.launcher_wire` only (no
pydantic, no asyncio: ``status`` has a time budget, docs/performance.md): requests are
built as dicts, checked against the protocol's bounds here, and replies are read as the
JSON objects the daemon sends. Only an argument these checks do
not accept brings in the protocol's pydantic model, so that the usage error says what the
model says. ``--json`` prints the reply line as the daemon sent it (the daemon's own
pydantic JSON of the reply).
"""

from __future__ import annotations

import sys

from schedswitchd.cli.exits import EXIT_INTERRUPTED, UsageError
from schedswitchd.cpython_internals import TYPE_CHECKING
from schedswitchd.daemon.launcher_wire import (
    DEFAULT_SOCKET,
    MAX_HINT_TTL_S,
    MAX_HISTORY_LIMIT,
    MAX_LEASE_ID_CHARS,
    MAX_PREPARE_TTL_S,
    MODE_SEPARATOR,
    NAME_PATTERN,
    PID_MAX_LIMIT,
    ControlConnection,
    DaemonError,
    hint_summary,
)
from schedswitchd.errors import ProtocolError

# typing is not imported at run time: the start of this command has a time budget
# (docs/performance.md, "`schedswitchctl status`"); annotations are strings (PEP 563).
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import Any

    #: A reply object as the daemon sent it (``schedswitchd.daemon.protocol``'s reply models).
    Reply = dict[str, Any]


def register(sub: Any) -> None:
    """Add the daemon commands to ``schedswitchctl``'s sub-parsers."""
    import argparse

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

    add("status", PLAIN_COMMANDS["status"][0], _status)
    add("list", PLAIN_COMMANDS["list"][0], _list)
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
    add("stop", PLAIN_COMMANDS["stop"][0], _stop)
    add("reload", PLAIN_COMMANDS["reload"][0], _reload)
    add("watch", PLAIN_COMMANDS["watch"][0], _watch)


def _name_check(pattern: str) -> Callable[[Any], bool]:
    compiled: list[Any] = []  # re.Pattern, compiled at the first check (re, with enum, is
    # milliseconds of the start of a command that checks no name, such as status)

    def check(value: Any) -> bool:
        if not compiled:
            import re

            compiled.append(re.compile(pattern))
        return isinstance(value, str) and compiled[0].fullmatch(value) is not None

    return check


def _int_in(low: int, high: int, *, optional: bool = False) -> Callable[[Any], bool]:
    return lambda v: (optional and v is None) or (type(v) is int and low <= v <= high)


def _seconds_upto(high: float, *, optional: bool = False) -> Callable[[Any], bool]:
    return lambda v: (optional and v is None) or (type(v) in (int, float) and 0 < v <= high)


_WORKLOAD = _name_check(NAME_PATTERN)
_BARE_NAME = NAME_PATTERN.removeprefix("^").removesuffix("$")
#: A configured scheduler or a mode variant of one (``lavd@gaming``), as the protocol's
#: ``SchedulerName``.
_SCHEDULER = _name_check(f"^{_BARE_NAME}(?:{MODE_SEPARATOR}{_BARE_NAME})?$")
#: Per op, a check per request field that accepts only what the protocol's request model
#: accepts (tests/cli/test_cli_light.py holds them to the models). Ops not listed
#: have no fields.
_CHECKS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "hint": {
        "workload": _WORKLOAD,
        "pid": _int_in(1, PID_MAX_LIMIT, optional=True),
        "ttl_s": _seconds_upto(MAX_HINT_TTL_S, optional=True),
    },
    "prepare": {"workload": _WORKLOAD, "ttl_s": _seconds_upto(MAX_PREPARE_TTL_S)},
    "release": {
        "lease": lambda v: isinstance(v, str) and 1 <= len(v) <= MAX_LEASE_ID_CHARS,
    },
    "history": {"limit": _int_in(1, MAX_HISTORY_LIMIT, optional=True)},
    "switch": {"scheduler": _SCHEDULER},
}


def make_request(op: str, **fields: Any) -> dict[str, Any]:
    """The request object for ``op`` with ``fields`` (``None``: left out, the model's
    default). Raises :class:`~schedswitchd.cli.exits.UsageError` (exit 2), in the
    protocol model's words, for a field the daemon would refuse."""
    checks = _CHECKS.get(op, {})
    if set(fields) <= set(checks) and all(check(fields.get(k)) for k, check in checks.items()):
        return {"op": op, **{k: v for k, v in fields.items() if v is not None}}
    return _model_checked(op, fields)


def _model_checked(op: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The slow path of :func:`make_request`: the protocol's request model judges."""
    from pydantic import ValidationError

    from schedswitchd.daemon import protocol as proto

    try:
        model = proto.REQUEST_MODELS[op](**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"{where}: {first['msg']}") from None
    request: dict[str, Any] = model.model_dump(mode="json", exclude={"v", "id"})
    return request


def _reads_reply(handler: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """A command whose reply lacks a field it shows fails as a malformed reply (exit 1),
    as it did when replies were validated against the protocol's models."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ProtocolError(f"malformed reply from the daemon: {exc!r}") from None

    # functools.wraps's part that shows (functools, with collections, is milliseconds of
    # the start of status).
    run.__name__, run.__qualname__ = handler.__name__, handler.__qualname__
    run.__doc__, run.__wrapped__ = handler.__doc__, handler  # type: ignore[attr-defined]
    return run


def _call(args: argparse.Namespace, request: dict[str, Any]) -> Reply:
    with ControlConnection(args.socket) as client:
        reply, line = client.exchange_line(request)
    if args.json:
        print(line.decode())
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


def _exit_text(exit_: Reply) -> str:
    """``KIND: reason: message`` of an ``ExitInfo`` object, leaving out empty parts (the
    kernel's own wording)."""
    parts = (exit_.get("kind_name"), exit_.get("reason"), exit_.get("message"))
    return ": ".join(p for p in parts if p)


def _switch_line(info: Reply) -> str:
    """One ``SwitchInfo`` object as a line."""
    # Top-level phases only; the backend's prepare.<phase> breakdown is in --json.
    phases_ns: dict[str, int] = info.get("phases_ns") or {}
    phases = " ".join(
        f"{k} {v / 1e6:.1f}" for k, v in phases_ns.items() if k != "total" and "." not in k
    )
    line = (
        f"{info['previous']} -> {info['target']} {info['result']}  total "
        f"{_ms(phases_ns.get('total'))}  gap {_ms(info.get('gap_ns'))}"
    )
    if phases:
        line += f"  [{phases} ms]"
    if (error := info.get("error")) is not None:
        line += f"  error {error['code']}: {error['message']}"
    if (exit_ := info.get("exit")) is not None:
        line += f"  exit {_exit_text(exit_)}"
    return line


def _lease_line(lease: Reply) -> str:
    """One ``LeaseInfo`` object as a line."""
    pid = lease.get("pid")
    text = (
        f"{lease['lease']}  {lease['workload']} -> {lease['scheduler']} "
        f"(priority {lease['priority']})  uid {lease['uid']}  pid {pid if pid is not None else '-'}"
    )
    if (ttl := lease.get("ttl_remaining_s")) is not None:
        text += f"  ttl {ttl:.0f} s"
    return text


def _work_text(idle: bool | None) -> str:
    """``status``'s ``idle`` for a person: whether a hint sent now meets the daemon at rest."""
    if idle is None:  # a daemon from before the field
        return "-"
    if idle:
        return "idle"
    return "busy (a reconcile pass, a standby refill, a switch or a worker call is under way)"


def _table(rows: list[tuple[str, str]]) -> None:
    width = max((len(k) for k, _ in rows), default=0)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


@_reads_reply
def _status(args: argparse.Namespace) -> int:
    reply = _call(args, make_request("status"))
    if args.json:
        return 0
    s: Reply = reply["status"]
    k: Reply = s["kernel"]
    if k["state"] == "unavailable":
        kernel = "not available in this kernel (no /sys/kernel/sched_ext): schedulers cannot run"
    else:
        seq = "-" if k.get("enable_seq") is None else str(k["enable_seq"])
        kernel = f"{k['state']}  ops {k.get('ops') or '-'}  enable_seq {seq}"
    override = s.get("override")
    rows = [
        ("sched_ext", kernel),
        ("active", s["active"] + ("  (re-adopted)" if s.get("adopted") else "")),
        ("runs as", _runs_text(s.get("runs"))),
        ("desired", s["desired"] + (f"  (admin override {override})" if override else "")),
        ("lease", _lease_line(s["lease"]) if s.get("lease") else _no_deciding_lease(s)),
        ("leases", _leases_count(s.get("leases", 0), s.get("hidden_leases", 0))),
        *(("", "  " + _lease_line(lease)) for lease in s.get("live_leases", [])),
        ("last switch", _switch_line(s["last_switch"]) if s.get("last_switch") else "-"),
        (
            "last exit",
            _exit_text(s["last_exit"]) if s.get("last_exit") else "-",
        ),
        (
            "backoff",
            ", ".join(
                f"{b['scheduler']} ({b['failures']} failure{'s' if b['failures'] != 1 else ''}, "
                f"{b['remaining_s']:.0f} s left)"
                for b in s.get("backoff", [])
            )
            or "-",
        ),
        (
            "standby",
            ", ".join(
                f"{e['scheduler']} ({e['reason']}, {e['kernel_bytes'] / 1024:.0f} KiB kernel, "
                f"prepared in {e['prepare_ms']:.0f} ms)"
                for e in s.get("standby", [])
            )
            or "-",
        ),
        ("profile", _profile_text(s["profile"]) if s.get("profile") else "-"),
        ("counters", _counters_text(s.get("counters", {}))),
        ("work", _work_text(s.get("idle"))),
        ("daemon", f"pid {s['pid']}  version {s['version']}  up {s['uptime_s']:.0f} s"),
    ]
    _table(rows)
    return 0


@_reads_reply
def _prepare(args: argparse.Namespace) -> int:
    reply = _call(args, make_request("prepare", workload=args.workload, ttl_s=args.ttl))
    if args.json:
        return 0
    if reply["scheduler"] == reply["active"]:
        print(f"{reply['workload']} -> {reply['scheduler']}: already running")
    else:
        print(
            f"{reply['workload']} -> {reply['scheduler']}: prepared, held "
            f"{reply['until_s']:.0f} s ({reply.get('kernel_bytes', 0) / 1024:.0f} KiB of "
            "kernel memory)"
        )
    return 0


def _runs_text(runs: Reply | None) -> str:
    """The ``runs as`` row (a ``RunsInfo`` object): ``object``, or ``executable`` with the
    child's pid and argv; ``-`` for the kernel's own scheduler."""
    if not runs:
        return "-"
    if runs["way"] != "executable":
        return str(runs["way"])
    return f"executable  pid {runs.get('pid') or '-'}  {' '.join(runs.get('argv') or [])}"


def _profile_text(p: Reply) -> str:
    """The ``profile`` row (a ``ProfileStatus`` object): name, mode and the scheduler's own
    counters."""
    mode = f"  mode {p['mode']}" if p.get("mode") else ""
    stats: dict[str, int] = p.get("stats") or {}
    shown = "  " + " ".join(f"{k}={v}" for k, v in stats.items()) if stats else ""
    return f"{p['name']}{mode}{shown}"


def _leases_count(leases: int, hidden: int) -> str:
    """The ``leases`` row: how many, and how many of other users were not shown."""
    return f"{leases}  ({hidden} of other users, not shown)" if hidden else str(leases)


def _no_deciding_lease(s: Reply) -> str:
    """The ``lease`` row when no lease shown decides what runs: say why, if leases are live."""
    if s.get("lease_hidden"):
        return "another user's lease decides what runs (not shown)"
    leases = s.get("leases", 0)
    if not leases:
        return "-"
    if s.get("override") is not None:
        why = f"the admin override {s['override']} wins"
    elif s.get("backoff"):
        why = "their schedulers are held back after failures"
    else:
        why = f"the default {s['desired']} runs"
    return f"none of the {leases} live lease(s) decides what runs ({why})"


@_reads_reply
def _list(args: argparse.Namespace) -> int:
    reply = _call(args, make_request("list"))
    if args.json:
        return 0
    print(f"default: {reply['default']}")
    # One name column for both tables, as wide as the longest name (a mode variant such
    # as bpfland@lowlatency is longer than most), so every row stays in line.
    names = [sched["name"] for sched in reply["schedulers"]]
    names += [rule["workload"] for rule in reply["hints"]]
    width = max([12, *map(len, names)])
    print("schedulers:")
    for sched in reply["schedulers"]:
        flags = " *active*" if sched.get("active") else ""
        if (held := sched.get("backoff_remaining_s")) is not None:
            flags += f" (held back {held:.0f} s)"
        print(f"  {sched['name']:<{width}} {sched['object']}{flags}")
        if sched.get("description"):
            print(f"  {'':<{width}} {sched['description']}")
    print("hints:")
    for rule in reply["hints"]:
        print(f"  {rule['workload']:<{width}} -> {rule['scheduler']} (priority {rule['priority']})")
    hidden = reply.get("hidden_leases", 0)
    print("leases:" + ("" if reply["leases"] or hidden else " none"))
    for lease in reply["leases"]:
        print("  " + _lease_line(lease))
    if hidden:
        print(f"  ({hidden} of other users, not shown)")
    return 0


@_reads_reply
def _history(args: argparse.Namespace) -> int:
    reply = _call(args, make_request("history", limit=args.limit))
    if args.json:
        return 0
    import time

    for entry in reply["entries"]:
        stamp = time.strftime("%H:%M:%S", time.localtime(entry["time"]))
        print(f"#{entry['seq']} {stamp} {_switch_line(entry)}  [{entry['reason']}]")
    if not reply["entries"]:
        print("no switches yet")
    return 0


@_reads_reply
def _hint(args: argparse.Namespace) -> int:
    request = make_request("hint", workload=args.workload, pid=args.pid, ttl_s=args.ttl)
    import signal

    # SIGTERM ends the hold like Ctrl-C does: the connection closes, the lease ends. Set
    # before the request: a launcher that reads the reply line and stops the hold at once
    # must not find SIGTERM's default action still in place (that death was exit -15).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    held = False
    try:
        with ControlConnection(args.socket) as client:
            reply, line = client.exchange_line(request)
            held = True
            if args.json:
                print(line.decode(), flush=True)
            else:
                print(hint_summary(args.workload, reply), flush=True)
                print("holding the hint; Ctrl-C to release", file=sys.stderr, flush=True)
            final = client.wait_closed()
    except KeyboardInterrupt:
        if held:
            return 0
        print("interrupted before the daemon answered", file=sys.stderr)
        return EXIT_INTERRUPTED
    if final is not None:  # --ttl passed or --pid exited: the hold did its job
        print(f"lease {final.get('lease')} ended: {final.get('why')}", file=sys.stderr)
        return 0
    print("the daemon closed the connection; the lease has ended", file=sys.stderr)
    return 1


@_reads_reply
def _release(args: argparse.Namespace) -> int:
    reply = _call(args, make_request("release", lease=args.lease))
    if not args.json:
        print(f"released {reply['lease']}; running {reply['active']}")
    return 0


def _print_switch(args: argparse.Namespace, reply: Reply) -> int:
    if not args.json:
        print(f"running {reply['active']}")
        if reply.get("switch") is not None:
            print(_switch_line(reply["switch"]))
    return 0


@_reads_reply
def _switch(args: argparse.Namespace) -> int:
    try:
        return _print_switch(args, _call(args, make_request("switch", scheduler=args.scheduler)))
    except DaemonError as exc:
        if exc.verifier_log:
            print(exc.verifier_log, file=sys.stderr)
        raise


@_reads_reply
def _stop(args: argparse.Namespace) -> int:
    return _print_switch(args, _call(args, make_request("stop")))


@_reads_reply
def _reload(args: argparse.Namespace) -> int:
    reply = _call(args, make_request("reload"))
    if not args.json:
        print(f"reloaded {reply['source']}: schedulers {', '.join(reply['schedulers'])}")
    return 0


def event_line(event: Reply) -> str:
    """One line for people on a ``watch`` event (the protocol's ``WatchEvent``)."""
    import time

    d = event["data"]
    kind = event["kind"]
    if kind == "switch":
        gap = "" if d.get("gap_ns") is None else f", gap {_ms(d['gap_ns'])}"
        text = f"switch {d['previous']} -> {d['target']}: {d['result']}{gap} [{d['reason']}]"
        if d.get("error"):
            text += f": {d['error']}"
    elif kind == "ejection":
        what = "restarting" if d.get("restart") else f"held back {d.get('backoff_s') or 0:.1f} s"
        text = (
            f"ejected {d['scheduler']}: {d.get('exit_kind')} ({d.get('reason')}: "
            f"{d.get('message')}); {what}"
        )
    elif kind in ("lease_added", "lease_ended") and d.get("hidden"):
        what = "added" if kind == "lease_added" else "ended"
        text = f"another user's lease {what} (not shown)"
    elif kind == "lease_added":
        pid = "" if d.get("pid") is None else f" pid {d['pid']}"
        text = f"lease {d['lease']}: {d['workload']} for uid {d['uid']}{pid}"
    elif kind == "lease_ended":
        text = f"lease {d['lease']} ({d['workload']}) ended: {d['why']}"
    else:
        override = d.get("override")
        rule = f"override {override}" if override is not None else "following hints"
        text = f"{rule} ({d['why']})"
    stamp = time.strftime("%H:%M:%S", time.localtime(event["time"]))
    return f"{stamp} #{event['seq']} {text}"


@_reads_reply
def _watch(args: argparse.Namespace) -> int:
    try:
        with ControlConnection(args.socket) as client:
            reply, line = client.exchange_line(make_request("watch"))
            if args.json:
                print(line.decode(), flush=True)
            else:
                override = reply.get("override")
                rule = f"; admin override {override}" if override is not None else ""
                print(f"running {reply['active']}{rule}; watching (Ctrl-C ends)", flush=True)
            for event, raw in client.events():
                print(raw.decode() if args.json else event_line(event), flush=True)
    except KeyboardInterrupt:
        return 0
    print("the daemon closed the connection", file=sys.stderr)
    return 1


#: The commands that take the common options alone (``--socket PATH``, ``--json``): their
#: help line and handler. ``schedswitchctl`` runs such a command line without argparse
#: (see :func:`schedswitchd.cli.ctl._quick_parse`).
PLAIN_COMMANDS: dict[str, tuple[str, Callable[..., int]]] = {
    "status": ("the kernel's sched_ext state and the daemon's", _status),
    "list": ("configured schedulers, hint rules and live leases", _list),
    "stop": ("admin: back to the kernel's own scheduler", _stop),
    "reload": ("admin: re-read the daemon's configuration", _reload),
    "watch": ("follow the daemon's changes as they happen, until interrupted", _watch),
}
