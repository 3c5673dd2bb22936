"""The socket protocol: versioned JSON-lines request and reply models.

Framing: one UTF-8 JSON object per line (``\\n``-terminated) each way over a ``SOCK_STREAM``
Unix socket. Every object carries ``"v": 1``. Requests are told apart by ``"op"``; replies
echo the request's ``op`` and optional ``id`` and carry ``"ok"``. A failed request gets an
:class:`ErrorReply` (``ok: false`` with ``error.code`` and ``error.message``), never a silent
close.

This module is the only place that turns bytes into messages (:func:`parse_request`,
:func:`parse_reply`) and messages into bytes (:func:`encode`). Parsing is bounded:
requests longer than the configured cap are refused before any decoding, and JSON is
decoded by pydantic-core's parser (nesting-depth limited), so no input raises anything but
:class:`RequestError`.

Requests (``launcher_wire.REQUESTS`` is their one table; :data:`REQUEST_MODELS` their
models by ``op``)::

    {"v":1,"op":"hint","workload":"gaming","pid":1234,"ttl_s":3600}  -> HintReply (lease id)
    {"v":1,"op":"hint","workload":"gaming","pidfd":true} + a pidfd   -> HintReply (SCM_RIGHTS)
    {"v":1,"op":"prepare","workload":"gaming","ttl_s":30}            -> PrepareReply (standby)
    {"v":1,"op":"release","lease":"7-1f2e3d4c"}                      -> ReleaseReply
    {"v":1,"op":"status"} / {"v":1,"op":"list"} / {"v":1,"op":"history","limit":10}
        (a caller that is not an admin sees its own leases in full, other uids' only
        counted: ``hidden_leases``, ``lease_hidden``)
    {"v":1,"op":"watch"}  -> WatchReply, then a WatchEvent line per change until the
                             client leaves (see WatchRequest); a non-admin gets other
                             uids' lease events as {"hidden": true} only (WatchEvent)
    admin: {"v":1,"op":"switch","scheduler":"fifo"|"kernel"|"auto"},
           {"v":1,"op":"stop"}, {"v":1,"op":"reload"}
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, get_args

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from schedswitchd.daemon.launcher_wire import (
    MAX_HINT_TTL_S,
    MAX_HISTORY_LIMIT,
    MAX_LEASE_ID_CHARS,
    MAX_PREPARE_TTL_S,
    MAX_REPLY_BYTES,
    MODE_SEPARATOR,
    NAME_PATTERN,
    PID_MAX_LIMIT,
    REQUESTS,
)
from schedswitchd.errors import ProtocolError, SchedSwitchError
from schedswitchd.kernel.lru import BoundedLru

VERSION = 1
#: Default cap on one request line, bytes including the newline (config: limits).
DEFAULT_MAX_REQUEST_BYTES = 4096
# MAX_REPLY_BYTES, PID_MAX_LIMIT and the codes DENIED, LIMIT, SHUTTING_DOWN live in
# launcher_wire, which the pydantic-free clients share: import them from there.

# Error codes of this protocol (besides the ``code`` of each SchedSwitchError branch).
TOO_LARGE = "too_large"
BAD_JSON = "bad_json"
BAD_REQUEST = "bad_request"
UNKNOWN_OP = "unknown_op"
UNSUPPORTED_VERSION = "unsupported_version"
TIMEOUT = "timeout"
INCOMPLETE = "incomplete"
UNKNOWN_WORKLOAD = "unknown_workload"
UNKNOWN_LEASE = "unknown_lease"
UNKNOWN_SCHEDULER = "unknown_scheduler"
BAD_PID = "bad_pid"
INTERNAL = "internal"


class RequestError(ProtocolError):
    """A request refused at the protocol level; ``code`` is one of this module's codes."""

    def __init__(
        self, code: str, message: str, *, op: str | None = None, id: int | str | None = None
    ) -> None:
        self.code = code
        #: The request's ``op`` and ``id`` when they could be read, for the error reply.
        self.op = op
        self.id = id
        super().__init__(message)


class SwitchFailed(RequestError):
    """An admin switch that failed (:meth:`schedswitchd.daemon.server.Server.override`):
    ``code`` and message from the failed switch, its ``verifier_log`` (or ``None``) and
    its ``record`` (:class:`SwitchInfo`)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        verifier_log: str | None = None,
        record: SwitchInfo | None = None,
    ) -> None:
        super().__init__(code, message)
        self.verifier_log = verifier_log
        self.record = record


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


ClientTag = int | Annotated[str, Field(max_length=64)] | None
Workload = Annotated[str, Field(pattern=NAME_PATTERN)]
#: A configured scheduler, or a mode variant of one (``lavd@gaming``, see
#: :data:`~schedswitchd.daemon.launcher_wire.MODE_SEPARATOR`).
SchedulerName = Annotated[
    str,
    Field(pattern=NAME_PATTERN.removesuffix("$") + f"(?:{MODE_SEPARATOR}"
          + NAME_PATTERN.removeprefix("^").removesuffix("$") + ")?$"),
]  # fmt: skip
LeaseId = Annotated[str, Field(min_length=1, max_length=MAX_LEASE_ID_CHARS)]


class _Request(_Wire):
    v: Literal[1] = 1
    id: ClientTag = Field(default=None, description="Echoed in the reply, for the client's use.")


class HintRequest(_Request):
    """Ask for a workload's scheduler; the lease lasts until release, connection close,
    the hinted process's exit or ``ttl_s`` (seconds), whichever comes first.

    The hinted process is named by ``pid`` (the caller or a descendant of it) or, with
    ``pidfd: true``, by a pidfd passed as ``SCM_RIGHTS`` ancillary data on this request's
    bytes (a process of the caller's own uid; :mod:`schedswitchd.daemon.passed_fds`), not
    both. Admins may name any process either way."""

    op: Literal["hint"] = "hint"
    workload: Workload
    pid: Annotated[int, Field(ge=1, le=PID_MAX_LIMIT)] | None = None
    pidfd: bool = False
    ttl_s: Annotated[float, Field(gt=0, le=MAX_HINT_TTL_S)] | None = None

    @model_validator(mode="after")
    def _one_process(self) -> HintRequest:
        if self.pidfd and self.pid is not None:
            raise ValueError("name the process by pid or by a passed pidfd, not both")
        return self


class PrepareRequest(_Request):
    """A launcher's intent: ``workload`` is about to start (the user opened a game's page
    or pressed Play). Its scheduler is prepared now, without switching, and held as a
    standby for ``ttl_s`` seconds (default 30), so that the hint that follows switches at
    once. Same authorisation as ``hint``; the reply comes once the scheduler is held."""

    op: Literal["prepare"] = "prepare"
    workload: Workload
    ttl_s: Annotated[float, Field(gt=0, le=MAX_PREPARE_TTL_S)] = 30.0


class ReleaseRequest(_Request):
    """End a lease the caller owns (admins may end any)."""

    op: Literal["release"] = "release"
    lease: LeaseId


class StatusRequest(_Request):
    """The kernel's view and the daemon's state."""

    op: Literal["status"] = "status"


class ListRequest(_Request):
    """Configured schedulers and hint rules, live leases."""

    op: Literal["list"] = "list"


class HistoryRequest(_Request):
    """Recent switches, newest last; ``limit`` caps how many."""

    op: Literal["history"] = "history"
    limit: Annotated[int, Field(ge=1, le=MAX_HISTORY_LIMIT)] | None = None


class SwitchRequest(_Request):
    """Admin: run ``scheduler`` regardless of leases (``kernel``: none; ``auto``: follow
    the leases again). If the switch fails (or the scheduler is later ejected) the
    override is dropped: the reply is an error, the failure is in the history once, the
    scheduler is backed off, and the daemon follows the leases and default again."""

    op: Literal["switch"] = "switch"
    scheduler: SchedulerName


class StopRequest(_Request):
    """Admin: back to the kernel's own scheduler (same as ``switch kernel``)."""

    op: Literal["stop"] = "stop"


class ReloadRequest(_Request):
    """Admin: re-read the configuration file; on error the old one stays."""

    op: Literal["reload"] = "reload"


class WatchRequest(_Request):
    """Follow the daemon's changes: a :class:`WatchReply` (what runs now), then one
    :class:`WatchEvent` line per change (a switch, an ejection, a lease added or ended, an
    admin override; :mod:`schedswitchd.daemon.feed`) for as long as the client stays
    connected; the connection takes no further requests. Anyone who may connect may
    watch. A client that falls :data:`~schedswitchd.daemon.feed.QUEUE_MAX` changes behind
    (or does not take a line within ``read_timeout_s``) is dropped: an error reply
    (``limit``) as its last line when it can still be written, then the close."""

    op: Literal["watch"] = "watch"


Request = Annotated[
    HintRequest
    | PrepareRequest
    | ReleaseRequest
    | StatusRequest
    | ListRequest
    | HistoryRequest
    | SwitchRequest
    | StopRequest
    | ReloadRequest
    | WatchRequest,
    Field(discriminator="op"),
]
#: Each request model by its ``op``, in the order of ``launcher_wire.REQUESTS``, the one
#: table of the protocol's requests (a request of that table without a model in
#: :data:`Request` fails this module's import; a model the table lacks fails
#: ``tests/daemon/test_request_table.py``).
REQUEST_MODELS: dict[str, type[_Request]] = {
    op: {cls.model_fields["op"].default: cls for cls in get_args(get_args(Request)[0])}[op]
    for op in REQUESTS
}
#: The requests only an admin may send (``[auth] admin_uids``/``admin_gids``).
ADMIN_OPS = frozenset(op for op, who in REQUESTS.items() if who == "admin")
#: The request models :func:`parse_request` keeps by line.
_KEPT = frozenset({HintRequest, PrepareRequest, StatusRequest, ListRequest})
#: Each request model's keys as they appear in a line, quoted (see :func:`_keys_once`).
_QUOTED_FIELDS: dict[type[BaseModel], tuple[bytes, ...]] = {
    cls: tuple(f'"{f.alias or name}"'.encode() for name, f in cls.model_fields.items())
    for cls in REQUEST_MODELS.values()
}
#: pydantic-core keeps every short string it decodes (keys and values) in a process-wide
#: cache of 16384 entries by default. Requests carry unique values (lease ids, tags), so
#: a burst of clients fills that cache with objects that live on, scattered over the
#: allocator's arenas, which then cannot be given back after the burst: keys only.
_JSON_CACHE: Literal["keys"] = "keys"
_REQUEST: TypeAdapter[Request] = TypeAdapter(Request, config=ConfigDict(cache_strings=_JSON_CACHE))


# --- reply payloads ------------------------------------------------------------------------


class ErrorBody(_Wire):
    """``code``: stable machine name; ``message``: for people; ``verifier_log``: the BPF
    verifier's text when a program load failed."""

    code: str
    message: str
    verifier_log: str | None = None

    @classmethod
    def of(cls, exc: SchedSwitchError) -> ErrorBody:
        """The body of a typed error: its ``code``, its text, its verifier log if any."""
        return cls(code=exc.code, message=str(exc), verifier_log=exc.verifier_log)


class KernelInfo(_Wire):
    """What ``/sys/kernel/sched_ext`` says (the backend's ``kernel_state()``,
    :class:`~schedswitchd.daemon.backend.SchedulerBackend`). ``state``: the ``state`` file
    (``enabled``, ``disabled``, ``enabling``, ``disabling``) or ``unavailable`` when the
    kernel has no sched_ext; ``ops``: ``root/ops`` (the enabled scheduler's
    ``sched_ext_ops.name``) or ``None``; ``enable_seq``: the ``enable_seq`` counter (only
    grows; each enable adds one) or ``None`` if unreadable."""

    state: str
    ops: str | None = None
    enable_seq: int | None = None


#: ``enum scx_exit_kind`` (kernel ``kernel/sched/ext.c``/``ext_internal.h``).
EXIT_KINDS = {
    0: "NONE",
    1: "DONE",
    64: "UNREG",
    65: "UNREG_BPF",
    66: "UNREG_KERN",
    67: "SYSRQ",
    1024: "ERROR",
    1025: "ERROR_BPF",
    1026: "ERROR_STALL",
}


def exit_kind_name(kind: int) -> str:
    """``SCX_EXIT_*`` name of an exit kind number, or ``KIND_<n>`` when unknown."""
    return EXIT_KINDS.get(kind, f"KIND_{kind}")


class ExitInfo(_Wire):
    """``struct scx_exit_info`` fields as the scheduler's ``ops.exit`` recorded them (the
    ``uei`` pattern of ``tools/sched_ext/include/scx/user_exit_info.h``): ``kind`` (``enum
    scx_exit_kind``), ``kind_name`` (e.g. ``ERROR_STALL``; filled from ``kind`` when not
    given), ``exit_code``, ``reason``, ``message``. The daemon's record and the wire form
    are this one class."""

    kind: int
    kind_name: str = ""
    exit_code: int = 0
    reason: str = ""
    message: str = ""

    @model_validator(mode="before")
    @classmethod
    def _name_the_kind(cls, data: Any) -> Any:
        if isinstance(data, dict) and "kind_name" not in data and type(data.get("kind")) is int:
            return {**data, "kind_name": exit_kind_name(data["kind"])}
        return data


#: ``SwitchInfo.result`` values.
OK = "ok"
FAILED = "failed"
ROLLED_BACK = "rolled_back"
ROLLBACK_FAILED = "rollback_failed"
EJECTED = "ejected"
ADOPTED = "adopted"


class SwitchInfo(_Wire):
    """One attempt to change what runs (or one ejection noticed): the switcher's record as
    it fills it and its wire form. Times: unix seconds; durations: ns.

    ``time``: wall-clock start; ``previous``/``target``: scheduler names or ``kernel``;
    ``result``: ``ok``, ``failed`` (prepare failed; nothing changed), ``rolled_back`` (new
    one failed, the previous one runs again), ``rollback_failed`` (the kernel's own
    scheduler runs), ``ejected`` (the kernel disabled the scheduler), ``adopted`` (taken
    over at start); ``reason``: why the switch was made (free text from the caller, e.g.
    ``lease 3-ab gaming``); ``phases_ns``: ``prepare`` (with the backend's own
    ``prepare.<phase>`` breakdown), ``detach``, ``attach`` (with the backend's
    ``detach.<phase>``/``attach.<phase>``, e.g. ``detach.link_detach``, ``attach.link``,
    ``attach.confirm``, ``attach.pin``), ``until_enabled`` (from the start to the new
    scheduler confirmed running), ``pin``, ``rollback``, ``total`` as they
    happened; ``gap_ns``: upper bound on the time no BPF scheduler ran (start of detach to
    the moment by which the backend's confirmation shows the new one was ``enabled``: for
    the kernel backend, the return of ``BPF_LINK_CREATE``; ``None`` when no gap was
    opened); ``expedited``: RCU grace periods were expedited during the gap; ``standby``:
    the target came prepared from the standby pool (no ``prepare`` phase); ``error``: the
    failure (:meth:`ErrorBody.of`); ``exit``: the kernel's exit record for ejections and
    failed attaches; ``finished``: False while the switcher is still at it -- a hint's
    reply is sent the moment the kernel confirmed the new scheduler ``enabled``, before
    it is pinned (phase ``pin``) and the previous one freed; should the pin fail, the
    record turns ``rolled_back`` then, as ``status`` and ``history`` show.
    """

    # Not frozen: the switcher fills phases and the outcome in as the switch goes.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=False)

    seq: int
    time: float
    previous: str
    target: str
    result: str
    reason: str
    phases_ns: dict[str, int] = Field(default_factory=dict)
    gap_ns: int | None = None
    expedited: bool = False
    standby: bool = False
    error: ErrorBody | None = None
    exit: ExitInfo | None = None
    finished: bool = True

    @property
    def ok(self) -> bool:
        """True if ``target`` runs now."""
        return self.result in (OK, ADOPTED)


class LeaseInfo(_Wire):
    """A live lease. ``ttl_remaining_s`` is ``None`` without a TTL."""

    lease: str
    workload: str
    scheduler: str
    priority: int
    uid: int
    owner_pid: int
    pid: int | None = None
    age_s: float
    ttl_remaining_s: float | None = None


class BackoffInfo(_Wire):
    """A scheduler held back after ``failures`` consecutive ejections/load failures."""

    scheduler: str
    failures: int
    remaining_s: float


class SchedulerInfo(_Wire):
    """A configured scheduler."""

    name: str
    object: str
    description: str = ""
    active: bool = False
    backoff_remaining_s: float | None = None


class HintRuleInfo(_Wire):
    """A configured hint rule."""

    workload: str
    scheduler: str
    priority: int


class StandbyInfo(_Wire):
    """A scheduler held prepared (everything but the link): ``reason`` it is held
    (``intent WORKLOAD``, ``default``, ``recent hint``); ``kernel_bytes``: kernel memory it
    holds, bytes (maps' and programs' memlock); ``prepare_ms``: what preparing it took;
    ``age_s``: since when it is held."""

    scheduler: str
    reason: str
    kernel_bytes: int
    prepare_ms: float
    age_s: float


class ReloadInfo(_Wire):
    """The last reload (``reload`` request or SIGHUP): when (unix s), from which file,
    whether it was taken and, when refused, why (the old configuration then stays)."""

    time: float
    source: str | None = None
    ok: bool
    error: str | None = None


class ProfileStatus(_Wire):
    """The running scheduler's profile (``docs/profiles.md``): its ``name`` (the profile
    file's ``[profile] name``, also when the configuration names it by path), ``mode``
    (``None``: the base) and the ``stats`` its ``[[stats]]`` name, read from the loaded
    maps when status was asked (integers, in the scheduler's own units)."""

    name: str
    mode: str | None = None
    stats: dict[str, int] = Field(default_factory=dict)


class RunsInfo(_Wire):
    """How the attached scheduler runs: ``way`` ``object`` (its BPF object loaded by the
    daemon) or ``executable`` (its own program, a child of the daemon: ``pid``, ``argv``;
    ``docs/executables.md``)."""

    way: Literal["object", "executable"]
    pid: int | None = None
    argv: list[str] | None = None


class StatusBody(_Wire):
    """What ``status`` returns; ``active`` is what the daemon attached (``kernel``: none)
    and ``kernel`` is what the kernel itself reports, which is the truth."""

    kernel: KernelInfo
    active: str
    desired: str
    override: str | None = None
    adopted: bool = False
    lease: LeaseInfo | None = Field(
        default=None,
        description="The live lease that decides what runs; to a caller that is not an admin "
        "only its own (another uid's: None, and lease_hidden true).",
    )
    lease_hidden: bool = Field(
        default=False,
        description="A lease of another uid, not shown to this caller, decides what runs.",
    )
    leases: int = Field(default=0, description="Live leases, of every uid.")
    live_leases: list[LeaseInfo] = Field(
        default_factory=list,
        description="Every live lease, best first, whether or not it decides what runs; to a "
        "caller that is not an admin only its own.",
    )
    hidden_leases: int = Field(
        default=0,
        description="Live leases of other uids left out of live_leases (callers that are not "
        "admins see those only as this count).",
    )
    last_switch: SwitchInfo | None = None
    last_exit: ExitInfo | None = Field(
        default=None,
        description="The newest exit record the daemon read (an ejection, a failed attach, "
        "a detach to the kernel's own scheduler).",
    )
    active_stale: bool = Field(
        default=False,
        description="The running scheduler was loaded from an earlier form of its "
        "configuration entry: switching it to the reloaded one failed (see last_switch).",
    )
    reload: ReloadInfo | None = None
    backoff: list[BackoffInfo] = Field(default_factory=list)
    standby: list[StandbyInfo] = Field(default_factory=list)
    idle: bool = Field(
        default=False,
        description="Nothing was under way or due when status was read: no reconcile pass "
        "(nor the standby refill after it) running or kicked, no standby hit's switch, no "
        "call queued or running on the switch worker. A hint then meets the daemon at rest.",
    )
    counters: dict[str, int] = Field(default_factory=dict)
    profile: ProfileStatus | None = Field(
        default=None, description="The active scheduler's profile, mode and counters."
    )
    runs: RunsInfo | None = Field(
        default=None,
        description="How the active scheduler runs (object or executable, with its pid); "
        "None: the kernel's own scheduler.",
    )
    pid: int
    version: str
    uptime_s: float


# --- replies ---------------------------------------------------------------------------------


class _Reply(_Wire):
    v: Literal[1] = 1
    id: ClientTag = None
    ok: bool = True


class ErrorReply(_Reply):
    """A refused or failed request. ``op`` is the request's op when it parsed that far."""

    ok: bool = False
    op: str | None = None
    error: ErrorBody


class HintReply(_Reply):
    """``lease``: its id; ``scheduler``: the workload's scheduler per the hint rule;
    ``desired``: what policy wants now; ``active``: what runs now; ``switch``: the switch
    this hint caused, if any (a failed attempt at ``scheduler`` is preferred over a later
    fallback, so its ``error`` says why ``scheduler`` does not run); ``pending``: the
    switch was still running when the reply was sent; ``passed_over``: when ``desired`` is
    not ``scheduler``, why, for people (:meth:`~schedswitchd.daemon.policy.Policy.passed_over`:
    the lease ended, an override, the rule dropped by a reload, a higher-ranked lease,
    backoff), else null."""

    op: Literal["hint"] = "hint"
    lease: str
    scheduler: str | None = None
    desired: str
    active: str
    switch: SwitchInfo | None = None
    pending: bool = False
    passed_over: str | None = None


class PrepareReply(_Reply):
    """``scheduler`` is held as a standby until ``until_s`` seconds from now (or already
    runs: ``active``); ``kernel_bytes``: what holding it costs, bytes."""

    op: Literal["prepare"] = "prepare"
    workload: str
    scheduler: str
    active: str
    kernel_bytes: int = 0
    until_s: float


class ReleaseReply(_Reply):
    """The lease ended; ``active`` is what runs after the resulting switch."""

    op: Literal["release"] = "release"
    lease: str
    active: str


class StatusReply(_Reply):
    """Reply to ``status``."""

    op: Literal["status"] = "status"
    status: StatusBody


class ListReply(_Reply):
    """Reply to ``list``."""

    op: Literal["list"] = "list"
    default: str
    schedulers: list[SchedulerInfo]
    hints: list[HintRuleInfo]
    leases: list[LeaseInfo] = Field(
        description="Live leases, best first; to a caller that is not an admin only its own."
    )
    hidden_leases: int = Field(
        default=0, description="Live leases of other uids left out of leases (non-admins)."
    )


class HistoryReply(_Reply):
    """Reply to ``history``: oldest first."""

    op: Literal["history"] = "history"
    entries: list[SwitchInfo]


class SwitchReply(_Reply):
    """Reply to ``switch`` and ``stop``: the switch made (``None``: nothing to do)."""

    op: Literal["switch", "stop"] = "switch"
    active: str
    switch: SwitchInfo | None = None


class ReloadReply(_Reply):
    """Reply to ``reload``: the configured scheduler names now."""

    op: Literal["reload"] = "reload"
    schedulers: list[str]
    source: str | None = None


class WatchReply(_Reply):
    """Reply to ``watch``, before its events: ``active`` (what the daemon attached),
    ``override`` (an admin's, or ``None``), ``desired`` (what the policy wants now),
    ``seq`` (the last change published before the watch began: its first event is
    ``seq + 1``)."""

    op: Literal["watch"] = "watch"
    active: str
    override: str | None = None
    desired: str
    seq: int


class WatchEvent(_Reply):
    """One change, sent unasked to a ``watch`` client: ``seq`` (1, 2, ... per daemon run;
    a gap means changes were missed), ``time`` (s since the epoch), ``kind`` (``switch``,
    ``ejection``, ``lease_added``, ``lease_ended``, ``override``) and ``data``, the
    kind's fields as :mod:`schedswitchd.daemon.feed` lists them. A watcher that is not an
    admin gets another uid's ``lease_added`` and ``lease_ended`` with ``data``
    ``{"hidden": true}`` only (no lease id, workload, uid, pid or reason), as ``status``
    counts such leases in ``hidden_leases``; its own leases' events are in full."""

    op: Literal["event"] = "event"
    seq: int
    time: float
    kind: Literal["switch", "ejection", "lease_added", "lease_ended", "override"]
    data: dict[str, Any]


class LeaseEnded(_Reply):
    """Sent unasked, as the last line, when the connection's last lease ended on its own
    (``why``: ``ttl`` or ``pid <n> exited``); the daemon then closes the connection."""

    op: Literal["lease_ended"] = "lease_ended"
    lease: str
    why: str


OkReply = (
    HintReply
    | PrepareReply
    | ReleaseReply
    | StatusReply
    | ListReply
    | HistoryReply
    | SwitchReply
    | ReloadReply
    | WatchReply
    | WatchEvent
    | LeaseEnded
)
Reply = ErrorReply | OkReply
_OK_REPLY: TypeAdapter[OkReply] = TypeAdapter(
    Annotated[OkReply, Field(discriminator="op")], config=ConfigDict(cache_strings=_JSON_CACHE)
)


# --- bytes <-> messages --------------------------------------------------------------------


def _describe(err: Any) -> str:
    loc = ".".join(str(p) for p in err["loc"][1:]) or "request"
    return f"{loc}: {err['msg']}"


#: Request lines parsed lately, by their exact bytes (:func:`parse_request`): a launcher
#: sends the same line for the same workload every time (``{"v":1,"op":"hint",
#: "workload":"gaming"}``), and its parse is on the standby hit's path
#: (docs/performance.md). Only untagged hint, prepare, status and list
#: requests, whose models are immutable and whose lines do not carry per-request values
#: (a tag, a lease id) that would churn it; at most :data:`PARSED_LINES_MAX` lines.
PARSED_LINES_MAX = 32
#: The longest line kept in :data:`_PARSED`, bytes.
PARSED_LINE_MAX_BYTES = 256
_PARSED: BoundedLru[bytes, Request] = BoundedLru(
    max_entries=PARSED_LINES_MAX, max_bytes=PARSED_LINES_MAX * PARSED_LINE_MAX_BYTES
)


def parse_request(line: bytes, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> Request:
    """One request line (with or without its ``\\n``) -> a request model.

    Raises :class:`RequestError` with code ``too_large`` (longer than ``max_bytes``),
    ``bad_json`` (not UTF-8 JSON), ``unsupported_version``, ``unknown_op`` or
    ``bad_request`` (fields missing, unknown or of the wrong type). Nothing else. A line
    parsed lately gives the same (immutable) model again (:data:`_PARSED`).
    """
    if len(line) > max_bytes:
        raise RequestError(TOO_LARGE, f"request longer than {max_bytes} bytes")
    request = _PARSED.get(line)
    if request is None:
        request = _parse_request(line)
        if len(line) <= PARSED_LINE_MAX_BYTES and request.id is None and type(request) in _KEPT:
            _PARSED.put(bytes(line), request, len(line))
    return request


def _parse_request(line: bytes) -> Request:
    """:func:`parse_request` of a line no longer than its bound, every time."""
    try:
        try:
            request = _validate(line)
        except RequestError:
            # A repeated key is the error to report when there is one, as it always was.
            _refuse_duplicate_keys(line)
            raise
        if _keys_once(line, request):
            # The usual request: its one ``v`` is read from the bytes, and the envelope
            # (a second JSON decode, for an error's op and id) is not needed.
            if _V_IS_1.search(line) is not None:
                return request
        else:
            _refuse_duplicate_keys(line)
    except RequestError as exc:
        exc.op, exc.id, _ = _envelope(line)
        raise
    op, tag, version = _envelope(line)
    # The model's ``v`` has a default (so requests are easy to build) and JSON ``true``
    # equals 1 in Python: insist on the integer 1 actually being on the wire.
    if type(version) is not int or version != VERSION:
        raise RequestError(
            UNSUPPORTED_VERSION,
            f"'v' must be the integer {VERSION}: this daemon speaks protocol v{VERSION}",
            op=op,
            id=tag,
        )
    return request


def _envelope(line: bytes) -> tuple[str | None, int | str | None, object]:
    """``op`` (if a known one), ``id`` (if a valid tag) and raw ``v`` of a request line,
    read leniently so that an error reply can echo them. ``(None, None, None)`` if the
    line is not a JSON object."""
    try:
        raw = pydantic_core.from_json(line, cache_strings=_JSON_CACHE)
    except ValueError:  # bad JSON, or nested deeper than pydantic-core's limit
        return None, None, None
    if not isinstance(raw, dict):
        return None, None, None
    op = raw.get("op")
    tag = raw.get("id")
    if not (type(tag) is int or (type(tag) is str and len(tag) <= 64)):
        tag = None
    return (op if isinstance(op, str) and op in REQUESTS else None), tag, raw.get("v")


#: In a line that validated and holds each key once without an escape (:func:`_keys_once`):
#: its ``v`` is the JSON integer 1 (not ``true``, ``1.0``, ``1e0`` or ``10``). ``"v"``
#: there is the key or a whole string value, and only the key is followed by a colon; the
#: line is valid JSON, so ``\s`` matches only JSON's whitespace.
_V_IS_1 = re.compile(rb'"v"\s*:\s*1(?![0-9.eE])')


def _keys_once(line: bytes, request: _Request) -> bool:
    """True when ``line``, which validated as ``request``, holds no key twice: a fast
    check that spares the full one (:func:`_refuse_duplicate_keys`, a JSON decode in
    Python, half of a hint's parse) for the usual request. A valid request is one flat
    object of scalars whose keys are all its model's fields (unknown keys are refused);
    without a backslash no key is written with an escape, so each key's every occurrence
    is its quoted name in the bytes. False (the full check decides) when the line has a
    backslash or any field's quoted name occurs twice, e.g. also inside a value."""
    if b"\\" in line:
        return False
    names = _QUOTED_FIELDS.get(type(request))
    if names is None:
        return False
    for name in names:  # noqa: SIM110 (a generator in all() cost as much again)
        if line.count(name) > 1:
            return False
    return True


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


_DUPLICATE_CHECKER = json.JSONDecoder(object_pairs_hook=_no_duplicates)


def _refuse_duplicate_keys(line: bytes) -> None:
    """Raise ``bad_request`` when any object of the line repeats a key. RFC 8259 leaves
    repeated names' meaning open; pydantic-core keeps the last one, so ``{"op":"status",
    "op":"stop"}`` would run ``stop`` while a log or a proxy that reads the first sees
    ``status``. Lines that are not JSON are left to :func:`_validate` to refuse."""
    try:
        # One decoder for all lines: json.loads(..., object_pairs_hook=...) builds a decoder
        # and a C scanner per call, small blocks that under a flood were left scattered
        # over allocator arenas and kept them resident (docs/performance.md, memory).
        _DUPLICATE_CHECKER.decode(line.decode(json.detect_encoding(line), "surrogatepass"))
    except _DuplicateKey as dup:
        raise RequestError(BAD_REQUEST, f"duplicate key {dup.key!r} in the request") from None
    except (ValueError, RecursionError):
        return


def _validate(line: bytes) -> Request:
    try:
        return _REQUEST.validate_json(line)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
    except (ValueError, RecursionError) as exc:  # defensive: pydantic-core raises the above
        raise RequestError(BAD_JSON, f"not a JSON object: {exc}") from None
    first = errors[0]
    kind = first["type"]
    if kind == "json_invalid":
        raise RequestError(BAD_JSON, f"not valid JSON: {first['msg']}")
    if kind in ("model_attributes_type", "model_type"):
        raise RequestError(BAD_REQUEST, "a request must be a JSON object")
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        raise RequestError(UNKNOWN_OP, "'op' must be one of " + ", ".join(REQUESTS))
    if any(len(e["loc"]) == 2 and e["loc"][1] == "v" for e in errors):
        raise RequestError(UNSUPPORTED_VERSION, f"this daemon speaks protocol v{VERSION}")
    raise RequestError(BAD_REQUEST, "; ".join(_describe(e) for e in errors[:5]))


def parse_reply(line: bytes) -> Reply:
    """One reply line -> a reply model (client side).

    Raises :class:`ProtocolError` if the daemon's line is not a reply of this version.
    A successful reply (no ``"ok":false`` in the line, as :func:`encode` writes an error)
    is validated straight from the bytes, one pass of pydantic-core instead of a JSON
    decode and a validation of the Python objects (half the instructions for a hint's
    reply); whatever that does not take as a successful reply goes the general way
    (:func:`_parse_reply_general`), so the outcome and every error are the same.
    """
    if len(line) > MAX_REPLY_BYTES:
        raise ProtocolError(f"reply longer than {MAX_REPLY_BYTES} bytes")
    if b'"ok":false' not in line:
        try:
            reply = _OK_REPLY.validate_json(line)
        except (ValidationError, ValueError):
            pass
        else:
            if reply.ok is True:
                return reply
    return _parse_reply_general(line)


def _parse_reply_general(line: bytes) -> Reply:
    """:func:`parse_reply` for any line: decoded, then an error reply when ``ok`` is
    false, else one of the successful replies (by ``op``)."""
    try:
        data = pydantic_core.from_json(line, cache_strings=_JSON_CACHE)
    except ValueError as exc:
        raise ProtocolError(f"reply from the daemon is not JSON: {exc}") from None
    try:
        if isinstance(data, dict) and data.get("ok") is False:
            return ErrorReply.model_validate(data)
        return _OK_REPLY.validate_python(data)
    except ValidationError as exc:
        raise ProtocolError(f"malformed reply from the daemon: {exc.errors()[0]['msg']}") from None


def encode(message: BaseModel) -> bytes:
    """A request or reply as one JSON line (UTF-8, ``\\n``-terminated, no newline inside).
    The model's serializer called as ``model_dump_json`` calls it (every option at its
    default: ``None`` fields written), for its bytes: ``model_dump_json`` decodes them to
    ``str``, which would be encoded back."""
    return message.__pydantic_serializer__.to_json(message) + b"\n"


#: A JSON string of a ``str`` as pydantic-core writes one (non-ASCII as is, ``"``, ``\\``
#: and control characters escaped): the standard library's C encoder.
_json_str = json.encoder.encode_basestring
#: A switch record's line, by its model's own serializer.
_switch_json = SwitchInfo.__pydantic_serializer__.to_json
#: :class:`HintReply`'s line, its fields in their order.
_HINT_HIT = (
    b'{"v":1,"id":%s,"ok":true,"op":"hint","lease":%s,"scheduler":%s,"desired":%s,'
    b'"active":%s,"switch":%s,"pending":%s,"passed_over":null}\n'
)


def encode_hint_hit(
    id: int | str | None,
    lease: str,
    scheduler: str | None,
    desired: str,
    active: str,
    switch: SwitchInfo,
    pending: bool,
) -> bytes:
    """The line :func:`encode` writes for ``HintReply(id=id, lease=lease, ...,
    switch=switch, pending=pending)``, byte for byte, without making the reply's model:
    its envelope formatted here around the record's own serialization. A standby hit's
    reply is written this way, in the time between the kernel running the new scheduler
    and the client having its answer (docs/performance.md, "Standby hit"). The arguments
    are taken as they are, unvalidated: the daemon's own values and the request's ``id``
    its parse validated. ``passed_over`` is always null: a hit runs the scheduler that
    the policy chose for this lease. ``tests/daemon/test_protocol_fast.py`` holds the two
    equal and fails when :class:`HintReply` gains a field or its fields change order."""
    return _HINT_HIT % (
        b"null" if id is None else (_json_str(id) if isinstance(id, str) else str(id)).encode(),
        _json_str(lease).encode(),
        b"null" if scheduler is None else _json_str(scheduler).encode(),
        _json_str(desired).encode(),
        _json_str(active).encode(),
        _switch_json(switch),
        b"true" if pending else b"false",
    )


def error_reply(
    code: str,
    message: str,
    *,
    op: str | None = None,
    id: int | str | None = None,
    verifier_log: str | None = None,
) -> ErrorReply:
    """An :class:`ErrorReply`."""
    return ErrorReply(
        op=op, id=id, error=ErrorBody(code=code, message=message, verifier_log=verifier_log)
    )
