"""The asyncio Unix-socket front end: connections, limits, authorisation, requests, leases.

One event loop serves every client; nothing on it blocks on the kernel (``kernel_state``
reads run on the default executor, switching on the
:class:`~schedswitchd.daemon.reconcile.Reconciler`'s worker thread). Data flow: a request
changes the :class:`~schedswitchd.daemon.policy.Policy` (lease added or ended, admin
override) and kicks the reconciler, then waits (bounded) for the pass that covers it, so a
hint's reply says what runs.

Identity is the kernel's (:mod:`schedswitchd.daemon.peer`). A hinted pid must be the caller
or a descendant of it unless the caller is admin; it is pinned with a pidfd
(``pidfd_open(2)``) before the ancestry check and confirmed alive after it, so pid reuse
cannot redirect a lease. A launcher that is not the game's ancestor (the GameMode agent)
passes a pidfd of it instead (``SCM_RIGHTS``, :mod:`schedswitchd.daemon.passed_fds`), of a
process of its own uid. The pidfd becomes readable when the process exits
(``loop.add_reader``), which ends the lease with no polling.

Limits: request line size, time to finish a begun request, idle time of a connection that
holds no lease, reply write time (framing and timeouts per connection:
:mod:`schedswitchd.daemon.connection`), connections (total and per uid) and leases per uid.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass

from schedswitchd import __version__
from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.acceptor import Acceptor
from schedswitchd.daemon.collector import frozen_objects
from schedswitchd.daemon.config import AUTO, KERNEL, AuthConfig, Config, load_config
from schedswitchd.daemon.connection import REPLY_TAKEN_WAIT_S, Connection
from schedswitchd.daemon.exec_backend import runs_info
from schedswitchd.daemon.launcher_wire import DENIED, LIMIT
from schedswitchd.daemon.lease_notices import LeaseNotices
from schedswitchd.daemon.lease_pids import pin_pid, take_passed_pidfd
from schedswitchd.daemon.peer import Peer
from schedswitchd.daemon.policy import NS_PER_S, Lease
from schedswitchd.daemon.reconcile import Reconciler
from schedswitchd.daemon.timer import Cancellable, LoopTimer, Timer
from schedswitchd.errors import ConfigError, SchedSwitchError

log = logging.getLogger("schedswitchd")

#: Random bytes fetched at a time for lease ids (4 per lease).
LEASE_ID_POOL = 256


@dataclass(eq=False)
class _LeaseRuntime:
    conn: Connection
    pidfd: int | None = None
    timer: Cancellable | None = None


class Server:
    """The daemon's socket front end over a :class:`Reconciler`, which holds the config,
    the backend, the clock (monotonic ns), the policy and the switcher; ``config`` and the
    others here are the reconciler's.
    """

    def __init__(
        self,
        reconciler: Reconciler,
        *,
        timer: Timer | None = None,
        reply_taken_wait_s: float = REPLY_TAKEN_WAIT_S,
    ) -> None:
        """``timer``: where connection timeouts and lease TTLs are scheduled (default: the
        event loop :meth:`start` runs on; tests pass one they move);
        ``reply_taken_wait_s``: how long a connection waits, at most, for its client to take
        a reply a switch released before it goes on (s,
        :data:`~schedswitchd.daemon.connection.REPLY_TAKEN_WAIT_S`)."""
        self.reconciler = reconciler
        #: The leases' log lines and feed changes.
        self.notices = LeaseNotices(reconciler.feed)
        #: How long a connection waits, at most, for its client to take a reply marked
        #: ``early_reply`` (s; :class:`~schedswitchd.daemon.connection.ConnectionOwner`).
        self.reply_taken_wait_s = reply_taken_wait_s
        self._timer = timer
        self.backend = reconciler.backend
        self.clock = reconciler.clock
        self.policy = reconciler.policy
        self.switcher = reconciler.switcher
        self.connections: dict[int, Connection] = {}
        self.leases: dict[str, _LeaseRuntime] = {}
        self.started_ns = self.clock()
        self._conn_ids = itertools.count(1)
        self._lease_seq = itertools.count(1)
        #: Random bytes for lease ids, fetched ahead (:meth:`_lease_token`).
        self._id_bytes = secrets.token_bytes(LEASE_ID_POOL)
        #: The listening socket's reader: accepts, serves each connection's first step.
        self.acceptor = Acceptor(lambda: Connection(self, next(self._conn_ids)))
        self._auth_gids: tuple[AuthConfig, frozenset[int], frozenset[int]] | None = None
        self._closing = False
        #: The last reload's outcome (``status``), ``None`` before any.
        self.last_reload: proto.ReloadInfo | None = None

    @property
    def adopted(self) -> bool:
        """True if the running scheduler was taken over from a previous daemon's pin."""
        return self.reconciler.adopted

    @property
    def last_pass_ns(self) -> int:
        """When the last reconcile pass ended (``clock`` ns): the watchdog's heartbeat."""
        return self.reconciler.last_pass_ns

    def summary(self) -> str:
        """One line for systemd's ``STATUS=``."""
        return self.reconciler.summary()

    # --- life cycle ---------------------------------------------------------------------------

    async def start(self, sock: socket.socket) -> None:
        """Adopt a pinned scheduler if any, start the reconcile task, serve on ``sock`` (a
        listening ``AF_UNIX`` ``SOCK_STREAM`` socket)."""
        await self.reconciler.adopt()
        self.reconciler.start()
        if self._timer is None:
            self._timer = LoopTimer(asyncio.get_running_loop())
        await self.acceptor.start(sock)
        self.reconciler.begin_grace()

    async def close(self) -> None:
        """Stop serving, end every lease without switching (a pinned scheduler stays
        attached, so a restart does not drop it), finish any switch in progress."""
        self._closing = True
        self.acceptor.close()
        await self.reconciler.close()
        for lease_id in list(self.leases):
            self._end_lease(lease_id, "daemon stopping", kick=False)
        handlers = [conn.task for conn in self.connections.values() if conn.task is not None]
        for conn in list(self.connections.values()):
            conn.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await self.acceptor.wait_closed()

    # --- connections ----------------------------------------------------------------------------

    @property
    def timer(self) -> Timer:
        """Where connection timeouts and lease TTLs are scheduled (set by :meth:`start`)."""
        assert self._timer is not None, "the server has not started"
        return self._timer

    def admit(self, conn: Connection) -> proto.Reply | None:
        """Take ``conn`` (accepted, ``peer`` read) into :attr:`connections`, or the refusal
        to send it when the connection caps are full (``limit``). Admins get a reserve
        beyond both caps, so that status and stop still work while someone floods the
        socket."""
        if self._closing:
            return proto.error_reply(proto.INTERNAL, "the daemon is stopping")
        limits = self.config.limits
        peer = conn.peer
        per_uid = 0
        for c in self.connections.values():  # a loop, not a generator (see Policy)
            if c.peer.uid == peer.uid:
                per_uid += 1
        reserve = limits.admin_reserve if self.is_admin(peer) else 0
        if (
            len(self.connections) >= limits.max_connections + reserve
            or per_uid >= limits.max_connections_per_uid + reserve
        ):
            return proto.error_reply(LIMIT, "too many connections")
        self.connections[conn.id] = conn
        return None

    def forget(self, conn: Connection) -> None:
        """``conn`` is gone and no request of it is being answered: its leases end."""
        if self.connections.pop(conn.id, None) is None:
            return  # refused at the accept
        for lease_id in list(conn.leases):
            self._end_lease(lease_id, "connection closed")

    def reply_sent(self) -> None:
        """A connection's reply marked ``early_reply`` was taken by its client: tell the
        reconciler (:meth:`Reconciler.reply_sent
        <schedswitchd.daemon.reconcile.Reconciler.reply_sent>`)."""
        self.reconciler.reply_sent()

    async def dispatch(self, line: bytes, conn: Connection) -> proto.Reply | bytes:
        """The reply to one request ``line`` of ``conn``: parsed, checked against ``[auth]``
        (admin requests), answered; a bad line or a refused request is an error reply,
        never an exception. A standby hit's reply comes encoded already
        (:func:`~schedswitchd.daemon.protocol.encode_hint_hit`)."""
        try:
            request = proto.parse_request(line, self.config.limits.max_message_bytes)
        except proto.RequestError as exc:
            return proto.error_reply(exc.code, str(exc), op=exc.op, id=exc.id)
        try:
            if request.op in proto.ADMIN_OPS and not self.is_admin(conn.peer):
                raise proto.RequestError(
                    DENIED,
                    f"{request.op} is for admins only ([auth] admin_uids, admin_gids)",
                )
            reply: proto.Reply | bytes
            match request:
                case proto.HintRequest():
                    reply = await self._hint(request, conn)
                case proto.PrepareRequest():
                    reply = await self._prepare(request, conn)
                case proto.ReleaseRequest():
                    reply = await self._release(request, conn)
                case proto.StatusRequest():
                    reply = proto.StatusReply(
                        id=request.id, status=await self.status(viewer=self._viewer(conn.peer))
                    )
                case proto.ListRequest():
                    reply = self._list(request, self._viewer(conn.peer))
                case proto.HistoryRequest():
                    # list() copies the deque in one C call, so the switcher thread's
                    # appends cannot interleave with the iteration
                    entries = list(self.switcher.history)
                    if request.limit is not None:
                        entries = entries[-request.limit :]
                    reply = proto.HistoryReply(id=request.id, entries=entries)
                case proto.SwitchRequest() | proto.StopRequest():
                    reply = await self._switch(request)
                case proto.ReloadRequest():
                    reply = await self._reload(request)
                case proto.WatchRequest():
                    reply = self._watch(request, conn)
            return reply
        except SchedSwitchError as exc:
            return proto.error_reply(
                exc.code,
                str(exc),
                op=request.op,
                id=request.id,
                verifier_log=exc.verifier_log,
            )
        except Exception:
            log.exception("internal error handling %s", request.op)
            return proto.error_reply(
                proto.INTERNAL,
                "internal error (see the daemon's log)",
                op=request.op,
                id=request.id,
            )

    # --- authorisation -------------------------------------------------------------------------

    def is_admin(self, peer: Peer) -> bool:
        """Admin per ``[auth] admin_uids/admin_gids``."""
        auth = self.config.auth
        if peer.uid in auth.admin_uids:
            return True
        gids = self._gid_sets(auth)[1]
        return bool(gids) and not gids.isdisjoint(peer.groups)

    def may_hint(self, peer: Peer) -> bool:
        """Hint rights per ``[auth] hint_uids/hint_gids`` (admins may always)."""
        auth = self.config.auth
        if peer.uid in auth.hint_uids or self.is_admin(peer):
            return True
        gids = self._gid_sets(auth)[0]
        return bool(gids) and not gids.isdisjoint(peer.groups)

    def _gid_sets(self, auth: AuthConfig) -> tuple[frozenset[int], frozenset[int]]:
        """``auth``'s hint and admin gids as numbers, resolved once per configuration (a
        group name is looked up in the group database: a read of ``/etc/group`` per
        admission and per hint otherwise; a group renumbered since applies at the next
        reload), so that a peer's groups are read only when a group rule could grant
        something."""
        cached = self._auth_gids
        if cached is None or cached[0] is not auth:
            cached = self._auth_gids = (auth, auth.hint_gid_set(), auth.admin_gid_set())
        return cached[1], cached[2]

    # --- requests -------------------------------------------------------------------------------

    def _standby_counters(self) -> dict[str, int]:
        pool = self.switcher.standby
        return {
            "standby_hits": pool.hits,
            "standby_misses": pool.misses,
            "standby_dropped_stale": pool.dropped_stale,
            "standby_failures": pool.failures,
            "standby_kernel_bytes": pool.kernel_bytes,
        }

    def _check_hint(self, peer: Peer, workload: str) -> None:
        """What ``hint`` and ``prepare`` both require: ``peer`` may send hints and
        ``workload`` has a hint rule. Raises :class:`~schedswitchd.daemon.protocol.
        RequestError` (``denied`` / ``unknown_workload``)."""
        if not self.may_hint(peer):
            raise proto.RequestError(
                DENIED,
                f"uid {peer.uid} may not send hints (the configuration's [auth] hint_uids, "
                "hint_gids)",
            )
        if workload not in self.config.hints:
            raise proto.RequestError(
                proto.UNKNOWN_WORKLOAD,
                f"no hint rule for {workload!r} (known: {', '.join(self.config.hints)})",
            )

    async def _prepare(self, request: proto.PrepareRequest, conn: Connection) -> proto.Reply:
        peer = conn.peer
        self._check_hint(peer, request.workload)
        log.info("intent: %s for uid %d, %.0f s", request.workload, peer.uid, request.ttl_s)
        name = await self.reconciler.prepare_intent(request.workload, request.ttl_s)
        entry = self.switcher.standby.entries.get(name)
        return proto.PrepareReply(
            id=request.id,
            workload=request.workload,
            scheduler=name,
            active=self.switcher.active,
            kernel_bytes=entry.kernel_bytes if entry is not None else 0,
            until_s=request.ttl_s,
        )

    async def _hint(self, request: proto.HintRequest, conn: Connection) -> proto.Reply | bytes:
        peer = conn.peer
        self._check_hint(peer, request.workload)
        limits = self.config.limits
        if self.policy.count_for_uid(peer.uid) >= limits.max_leases_per_uid:
            raise proto.RequestError(
                LIMIT, f"uid {peer.uid} holds {limits.max_leases_per_uid} leases already"
            )
        if request.ttl_s is not None and request.ttl_s > limits.max_ttl_s:
            raise proto.RequestError(LIMIT, f"ttl_s is capped at {limits.max_ttl_s}")
        pidfd = None
        pid = request.pid
        if pid is not None:
            pidfd = pin_pid(pid, peer.pid, lambda: self.is_admin(peer))
        elif request.pidfd:
            pidfd, pid = take_passed_pidfd(conn.passed, peer.uid, lambda: self.is_admin(peer))
        # Announced on the feed once a standby hit's client took its reply, or below.
        lease = self.new_lease(
            request.workload, peer.uid, peer.pid, pid, request.ttl_s, announce=False
        )
        runtime = _LeaseRuntime(conn, pidfd)
        self.leases[lease.id] = runtime
        conn.leases.add(lease.id)
        if pidfd is not None:
            asyncio.get_running_loop().add_reader(
                pidfd, self._end_itself, lease.id, f"pid {pid} exited"
            )
        if request.ttl_s is not None:
            runtime.timer = self.timer.call_at(
                self.timer.time() + request.ttl_s, self._end_itself, lease.id, "ttl"
            )
        wanted = self.config.hints[lease.workload].scheduler
        # Answered once the kernel runs what the pass chose (see reconcile's docstring).
        conn.early_reply = True
        hits = self.reconciler.direct
        direct = hits.standby_hit(lease)
        if direct is not None:
            # A standby hit: straight to the switch; the lease's announcement and log line
            # wait until the client took the reply.
            changes = self.reconciler.changes
            made, settled = await hits.switch(*direct)
            hits.after_reply(self.notices.in_force, lease, wanted)
            hit = hits.hit_decision
            if (
                hit is not None
                and changes == self.reconciler.changes
                and len(made) == 1
                and made[0].ok
                and made[0].target == direct[0]
                and self._decision_holds(hit[1])
            ):
                # It runs what the policy chose for this lease in standby_hit, and nothing
                # that changes the decision came since: no lease, override, reload, backoff
                # or notification (each kicks), no TTL or backoff hold ending meanwhile.
                # The reply's line is made without its model (docs/performance.md).
                return proto.encode_hint_hit(
                    request.id, lease.id, wanted, hit[0].scheduler, direct[0], made[0], not settled
                )
        else:
            self.notices.in_force(lease, wanted)
            self.reconciler.kick()
            made, settled = await self.reconciler.settle_records(early=True)
        failed = [r for r in made if r.target == wanted and not r.ok]
        record = failed[0] if failed else (made[-1] if made else None)
        now = self.clock()
        return proto.HintReply(
            id=request.id,
            lease=lease.id,
            scheduler=wanted,
            desired=self.policy.decide(now).scheduler,
            active=self.switcher.active,
            switch=record,
            pending=not settled,
            passed_over=self.policy.passed_over(lease, wanted, now),
        )

    def new_lease(
        self,
        workload: str,
        uid: int,
        owner_pid: int,
        pid: int | None,
        ttl_s: float | None,
        *,
        announce: bool = True,
    ) -> Lease:
        """A new lease of ``workload`` for ``uid`` (made by process ``owner_pid``; ``pid``:
        the hinted process, or ``None``; ``ttl_s``: when it ends by itself, s, or ``None``),
        added to the policy and announced on the feed -- with ``announce`` False, once the
        caller says (:class:`~schedswitchd.daemon.lease_notices.LeaseNotices`). Ending it
        (:meth:`end_lease`) and kicking the reconciler are the caller's."""
        now = self.clock()
        seq = next(self._lease_seq)
        lease = Lease(
            id=f"{seq}-{self._lease_token()}",
            workload=workload,
            owner_uid=uid,
            owner_pid=owner_pid,
            pid=pid,
            created_ns=now,
            expires_ns=None if ttl_s is None else now + int(ttl_s * NS_PER_S),
            seq=seq,
        )
        self.policy.add(lease)
        self.notices.added(lease, announce=announce)
        return lease

    def end_lease(self, lease_id: str, why: str) -> Lease | None:
        """End a lease (any, also one made by :meth:`new_lease` without a connection) and
        kick the reconciler; ``None`` if it had ended already."""
        return self._end_lease(lease_id, why)

    def _decision_holds(self, decided_ns: int) -> bool:
        """Whether a policy decision made at ``decided_ns`` (``clock`` ns) is still what
        the policy would decide now, as far as time goes: no lease's TTL and no backoff
        hold ended since."""
        deadline = self.policy.next_deadline(decided_ns)
        return deadline is None or deadline > self.clock()

    def _lease_token(self) -> str:
        """8 hex digits of ``secrets`` randomness for a lease id, from bytes fetched
        :data:`LEASE_ID_POOL` at a time: a ``getrandom(2)`` per lease was slow in the
        emulated VM, on the hint's path to its switch."""
        if len(self._id_bytes) < 4:
            self._id_bytes = secrets.token_bytes(LEASE_ID_POOL)
        token, self._id_bytes = self._id_bytes[:4], self._id_bytes[4:]
        return token.hex()

    def _end_lease(
        self, lease_id: str, why: str, *, kick: bool = True, by_itself: bool = False
    ) -> Lease | None:
        """End a lease (any cause); idempotent. Runs on the loop. ``by_itself``: its TTL
        passed or its process exited; a connection left without leases then gets a final
        :class:`~schedswitchd.daemon.protocol.LeaseEnded` and is closed, so the client
        holding it learns that the hint is gone."""
        runtime = self.leases.pop(lease_id, None)
        lease = self.policy.remove(lease_id)
        if runtime is not None:
            conn = runtime.conn
            conn.leases.discard(lease_id)
            if by_itself and not conn.leases and conn.id in self.connections:
                conn.end_with(proto.LeaseEnded(lease=lease_id, why=why))
            if runtime.pidfd is not None:
                asyncio.get_running_loop().remove_reader(runtime.pidfd)
                os.close(runtime.pidfd)
            if runtime.timer is not None:
                runtime.timer.cancel()
        if lease is not None:
            self.notices.ended(lease, why)
            if kick:
                self.reconciler.kick()
        return lease

    def _end_itself(self, lease_id: str, why: str) -> None:
        self._end_lease(lease_id, why, by_itself=True)

    async def _release(self, request: proto.ReleaseRequest, conn: Connection) -> proto.Reply:
        lease = self.policy.leases.get(request.lease)
        if lease is None:
            raise proto.RequestError(proto.UNKNOWN_LEASE, f"no live lease {request.lease!r}")
        if lease.owner_uid != conn.peer.uid and not self.is_admin(conn.peer):
            raise proto.RequestError(DENIED, "the lease belongs to another user")
        self._end_lease(request.lease, "released")
        await self.reconciler.settle()
        return proto.ReleaseReply(id=request.id, lease=request.lease, active=self.switcher.active)

    async def _switch(self, request: proto.SwitchRequest | proto.StopRequest) -> proto.Reply:
        target = KERNEL if isinstance(request, proto.StopRequest) else request.scheduler
        record = await self.override(target)
        return proto.SwitchReply(
            op=request.op,
            id=request.id,
            active=self.switcher.active,
            switch=record,
        )

    async def override(self, target: str) -> proto.SwitchInfo | None:
        """An admin override: run ``target`` (a configured scheduler or ``kernel``) whatever
        the leases say, or follow them again (``auto``); returns once the pass covering it
        ends, with the switch record it made (``None``: nothing had to change).

        Raises :class:`~schedswitchd.daemon.protocol.RequestError` (``unknown_scheduler``)
        for a name that is not configured, and :class:`~schedswitchd.daemon.protocol.
        SwitchFailed` (the failed switch's code, reason and verifier log) when the switch
        failed: then what ran before runs on, and the override before it rules again."""
        if target not in (KERNEL, AUTO) and target not in self.config.schedulers:
            known = ", ".join([*self.config.schedulers, KERNEL, AUTO])
            raise proto.RequestError(
                proto.UNKNOWN_SCHEDULER, f"no scheduler {target!r} (known: {known})"
            )
        log.info("admin override: %s", target, extra={"SCHEDULER": target})
        self.reconciler.set_override(None if target == AUTO else target)
        made, _ = await self.reconciler.settle_records()
        # The override's own attempt decides the reply, not a fallback switch made after it.
        failed = [r for r in made if r.target == target and not r.ok and r.error is not None]
        record = failed[0] if failed else (made[-1] if made else None)
        if record is not None and not record.ok and record.error is not None:
            err = record.error
            before = self.policy.override
            dropped = (
                ""
                if target == KERNEL
                else f"; override not taken, {'override ' + before if before else 'hints'} rule"
            )
            raise proto.SwitchFailed(
                err.code,
                f"switch to {record.target} {record.result}: {err.message}{dropped} "
                f"(running {self.switcher.active})",
                verifier_log=err.verifier_log,
                record=record,
            )
        return record

    def _watch(self, request: proto.WatchRequest, conn: Connection) -> proto.Reply:
        """Subscribe ``conn`` to the change feed; the connection streams it after this
        reply (:meth:`Connection.stream <schedswitchd.daemon.connection.Connection.stream>`).
        A caller that is not an admin sees other uids' lease changes only as hidden
        (:func:`~schedswitchd.daemon.feed.visible_fields`)."""
        feed = self.reconciler.feed
        seq = feed.last_seq
        conn.watching = feed.subscribe(viewer=self._viewer(conn.peer))
        return proto.WatchReply(
            id=request.id,
            active=self.switcher.active,
            override=self.policy.override,
            desired=self.policy.decide(self.clock()).scheduler,
            seq=seq,
        )

    async def _reload(self, request: proto.ReloadRequest) -> proto.Reply:
        if self.config.source is None:
            raise proto.RequestError(proto.BAD_REQUEST, "the configuration has no file to re-read")
        config = await self.reload()
        await self.reconciler.settle()
        return proto.ReloadReply(
            id=request.id, schedulers=list(config.schedulers), source=config.source
        )

    async def reload(self) -> Config:
        """Re-read ``config.source`` and take it (``reload`` request, SIGHUP), unless it is
        invalid or would take away what a live lease needs (:meth:`refusal`); either way
        the outcome is in ``status``'s ``reload``. Raises :class:`ConfigError` when refused
        (the old configuration stays), also when reading the file failed in a way
        :func:`load_config` does not type: a reload is never a defect that ends its caller
        (SIGHUP's task, a ``reload`` request) while the daemon goes on."""
        source = self.config.source
        try:
            try:
                if source is None:
                    raise ConfigError("no configuration file to re-read")
                config = await asyncio.to_thread(load_config, source)
                refused = self.refusal(config)
                if refused is not None:
                    raise ConfigError(f"{source}: {refused}")
            except ConfigError:
                raise
            except Exception as exc:
                log.exception("reading %s failed", source)
                raise ConfigError(
                    f"{source}: could not be read ({type(exc).__name__}: {exc})"
                ) from exc
        except ConfigError as exc:
            log.error("reload refused, keeping the old configuration: %s", exc)
            self.last_reload = proto.ReloadInfo(
                time=time.time(), source=source, ok=False, error=str(exc)
            )
            raise
        self.apply_config(config)
        self.last_reload = proto.ReloadInfo(time=time.time(), source=source, ok=True)
        return config

    def refusal(self, config: Config) -> str | None:
        """Why ``config`` must not replace the running one, or ``None``: a file that
        configures no scheduler while this one has some (an empty or all-default file
        would drop them all), or one that drops the hint rule of a live lease (the
        scheduler that lease holds would be detached under it)."""
        if self.config.schedulers and not config.schedulers:
            return (
                "configures no scheduler (empty or all-default file); refusing to drop "
                f"{', '.join(self.config.schedulers)}"
            )
        orphaned = sorted(
            {lease.workload for lease in self.policy.leases.values()} - set(config.hints)
        )
        live = [w for w in orphaned if w in self.config.hints]
        if live:
            return f"drops the hint rule of live leases: {', '.join(live)}"
        return None

    @property
    def config(self) -> Config:
        """The config in force (the reconciler's; replaced by :meth:`apply_config`)."""
        return self.reconciler.config

    def apply_config(self, config: Config) -> None:
        """Take a newly loaded config: rules, default, limits, auth. The socket and BTF cache
        bounds apply at the next start. Leases of workloads that vanished stay, ignored."""
        self.reconciler.apply_config(config)
        log.info("configuration reloaded from %s", config.source)

    # --- views ------------------------------------------------------------------------------------

    def _viewer(self, peer: Peer) -> int | None:
        """Whose leases ``peer`` may see in full: ``None`` (every uid's) for an admin, else
        its own uid's: a lease's uid and pids are the holder's business (which user runs
        what, and when) and not every uid that may connect."""
        return None if self.is_admin(peer) else peer.uid

    async def status(self, *, viewer: int | None = None) -> proto.StatusBody:
        """The status reply body (the kernel's view is read fresh). ``viewer``: a uid that
        sees only its own leases in full (others' are counted, ``hidden_leases``), or
        ``None`` for every lease (an admin, the daemon's own faces)."""
        loop = asyncio.get_running_loop()
        reader = self.reconciler.reader
        kernel = await loop.run_in_executor(reader, self.backend.kernel_state)
        counters = dict(await loop.run_in_executor(reader, self.backend.counters))
        # The backend reports the attached scheduler's [[stats]] as profile.<name>.
        stats = {
            k.removeprefix("profile."): counters.pop(k)
            for k in [k for k in counters if k.startswith("profile.")]
        }
        active_cfg = self.config.schedulers.get(self.switcher.active)
        profile = (
            proto.ProfileStatus(
                name=active_cfg.profile_name or active_cfg.profile,
                mode=active_cfg.mode,
                stats=stats,
            )
            if active_cfg is not None and active_cfg.profile is not None
            else None
        )
        now = self.clock()
        decision = self.policy.decide(now)
        history = self.switcher.history
        shown = [x for x in self._live_leases() if viewer in (None, x.owner_uid)]
        return proto.StatusBody(
            kernel=kernel,
            active=self.switcher.active,
            desired=decision.scheduler,
            override=self.policy.override,
            adopted=self.adopted,
            lease=lease_info(decision.lease, self.config, now)
            if decision.lease and viewer in (None, decision.lease.owner_uid)
            else None,
            lease_hidden=decision.lease is not None
            and viewer not in (None, decision.lease.owner_uid),
            leases=len(self.policy.leases),
            live_leases=[lease_info(lease, self.config, now) for lease in shown],
            hidden_leases=len(self.policy.leases) - len(shown),
            last_switch=history[-1] if history else None,
            last_exit=self.switcher.last_exit,
            active_stale=self.reconciler.active_stale,
            reload=self.last_reload,
            backoff=[
                proto.BackoffInfo(
                    scheduler=name, failures=b.failures, remaining_s=(b.until_ns - now) / NS_PER_S
                )
                for name, b in sorted(self.policy.backoff.items())
                if b.until_ns > now
            ],
            standby=[
                proto.StandbyInfo(
                    scheduler=e.name,
                    reason=e.reason,
                    kernel_bytes=e.kernel_bytes,
                    prepare_ms=e.prepared_ns / 1e6,
                    age_s=max(0.0, time.time() - e.since),
                )
                for e in self.switcher.standby
            ],
            idle=self.reconciler.idle,
            counters={
                **counters,
                **self._standby_counters(),
                "reconcile_passes": self.reconciler.passes,
                "notifications_held": self.reconciler.notes_held,
                "connections_accepted": self.acceptor.accepted,
                "first_read_at_accept": self.acceptor.first_read_at_accept,
                "gc_frozen_objects": frozen_objects(),
            },
            profile=profile,
            runs=runs_info(self.switcher.current),
            pid=os.getpid(),
            version=__version__,
            uptime_s=(now - self.started_ns) / NS_PER_S,
        )

    def _live_leases(self) -> list[Lease]:
        """Every live lease, best first; leases of workloads without a rule last."""
        ranked = [lease for lease, _ in self.policy.ranked()]
        seen = {lease.id for lease in ranked}
        return ranked + [lease for lease in self.policy.leases.values() if lease.id not in seen]

    def _list(self, request: proto.ListRequest, viewer: int | None = None) -> proto.ListReply:
        """The ``list`` reply; ``viewer`` as :meth:`status` takes it."""
        now = self.clock()
        ranked = [lease for lease, _ in self.policy.ranked()]
        shown = [lease for lease in ranked if viewer in (None, lease.owner_uid)]
        schedulers = []
        for name, spec in self.config.schedulers.items():
            hold = self.policy.backoff.get(name)
            schedulers.append(
                proto.SchedulerInfo(
                    name=name,
                    object=spec.object,
                    description=spec.description,
                    active=name == self.switcher.active,
                    backoff_remaining_s=(hold.until_ns - now) / NS_PER_S
                    if hold is not None and hold.until_ns > now
                    else None,
                )
            )
        return proto.ListReply(
            id=request.id,
            default=self.config.default,
            schedulers=schedulers,
            hints=[
                proto.HintRuleInfo(workload=w, scheduler=r.scheduler, priority=r.priority)
                for w, r in self.config.hints.items()
            ],
            leases=[lease_info(lease, self.config, now) for lease in shown],
            hidden_leases=len(ranked) - len(shown),
        )


# --- wire conversions -----------------------------------------------------------------------------


def lease_info(lease: Lease, config: Config, now: int) -> proto.LeaseInfo:
    """:class:`Lease` -> wire model (scheduler/priority per the current rules)."""
    rule = config.hints.get(lease.workload)
    return proto.LeaseInfo(
        lease=lease.id,
        workload=lease.workload,
        scheduler=rule.scheduler if rule else "(no rule)",
        priority=rule.priority if rule else 0,
        uid=lease.owner_uid,
        owner_pid=lease.owner_pid,
        pid=lease.pid,
        age_s=(now - lease.created_ns) / NS_PER_S,
        ttl_remaining_s=(lease.expires_ns - now) / NS_PER_S if lease.expires_ns else None,
    )
