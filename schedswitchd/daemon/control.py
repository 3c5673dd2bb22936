"""The daemon as its other faces drive it, in process: the D-Bus faces of
:mod:`schedswitchd.desktop` call this, never the server's or the reconciler's insides.

Everything here runs on the daemon's event loop. What it offers is what the socket offers
an admin and a hinting client, without a connection: an admin override (:meth:`switch`,
:meth:`stop`, :meth:`auto`, :meth:`restart`), the status and the kernel's view, the change
feed (:meth:`subscribe`), and leases a face holds for the daemon itself (:meth:`hold`,
:meth:`end`; e.g. the power profile's hint). Who may ask is the face's to decide (its
callers are not socket peers); :meth:`is_admin` applies ``[auth]`` to a uid and its groups.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.config import AUTO, KERNEL, Config
from schedswitchd.daemon.feed import QUEUE_MAX, ChangeFeed, Subscription
from schedswitchd.daemon.launcher_wire import MODE_SEPARATOR
from schedswitchd.daemon.peer import Peer

if TYPE_CHECKING:
    from schedswitchd.daemon.server import Server

log = logging.getLogger("schedswitchd")

#: The mode name of the variant :meth:`DaemonControl.switch_args` runs (not a profile's).
ARGS_MODE = "args"


class DaemonControl:
    """The in-process interface over a running :class:`~schedswitchd.daemon.server.Server`."""

    def __init__(self, server: Server) -> None:
        self._server = server

    @property
    def config(self) -> Config:
        """The configuration in force (replaced on reload)."""
        return self._server.config

    @property
    def feed(self) -> ChangeFeed:
        """The daemon's change feed (:mod:`schedswitchd.daemon.feed`)."""
        return self._server.reconciler.feed

    @property
    def active(self) -> str:
        """The configured name of what the daemon attached (``kernel``: none); what the
        kernel runs is :meth:`kernel_state`'s."""
        return self._server.switcher.active

    @property
    def override(self) -> str | None:
        """The admin override in force (a scheduler, ``kernel``) or ``None``: hints rule."""
        return self._server.policy.override

    def subscribe(self, maxsize: int = QUEUE_MAX) -> Subscription:
        """A subscription to the change feed (bounded: dropped when ``maxsize`` behind)."""
        return self.feed.subscribe(maxsize)

    def is_admin(self, uid: int, groups: frozenset[int] = frozenset()) -> bool:
        """Whether ``uid`` (with ``groups``, its gids) is an admin per ``[auth]``."""
        gid = min(groups) if groups else uid
        return self._server.is_admin(Peer(0, uid, gid, frozenset(groups)))

    async def kernel_state(self) -> proto.KernelInfo:
        """``/sys/kernel/sched_ext`` as read now (on the daemon's kernel-view thread)."""
        server = self._server
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(server.reconciler.reader, server.backend.kernel_state)

    def kernel_state_now(self) -> proto.KernelInfo:
        """``/sys/kernel/sched_ext`` read now, on the calling thread (a few small sysfs
        reads: for an answer that must say what the kernel says at that moment)."""
        return self._server.backend.kernel_state()

    async def status(self) -> proto.StatusBody:
        """What ``schedswitchctl status`` shows (the kernel's view read fresh)."""
        return await self._server.status()

    async def switch(self, target: str) -> proto.SwitchInfo | None:
        """Admin override to ``target`` (a configured scheduler, a mode variant
        ``NAME@MODE``, ``kernel``, or ``auto``: follow hints again), as ``schedswitchctl
        switch``; returns the switch record (``None``: nothing had to change). Raises
        :class:`~schedswitchd.daemon.protocol.RequestError` for an unknown name and
        :class:`~schedswitchd.daemon.protocol.SwitchFailed` with the reason when the
        switch failed (what ran before runs on)."""
        return await self._server.override(target)

    async def switch_args(self, scheduler: str, argv: list[str]) -> proto.SwitchInfo | None:
        """Admin override to ``scheduler`` (one run as its own executable) with ``argv``
        after its program instead of its configured ``args``: its variant
        ``SCHEDULER@ARGS_MODE`` (:data:`ARGS_MODE`) is added to the configuration in force
        (replaced by the next call; a reload drops it, and the override with it), then
        switched to as :meth:`switch` does. Raises
        :class:`~schedswitchd.daemon.protocol.RequestError` (``bad_request``) for a
        scheduler that is not configured or not run as its executable, and as
        :meth:`switch` does."""
        config = self.config
        spec = config.schedulers.get(scheduler)
        if spec is None or not spec.runs_executable:
            raise proto.RequestError(
                proto.BAD_REQUEST, f"{scheduler} is not a scheduler run as its own executable"
            )
        variant = f"{scheduler.split(MODE_SEPARATOR)[0]}{MODE_SEPARATOR}{ARGS_MODE}"
        entry = spec.model_copy(update={"args": list(argv), "modes": {}})
        if config.schedulers.get(variant) != entry:
            schedulers = {**config.schedulers, variant: entry}
            self._server.reconciler.apply_config(
                config.model_copy(update={"schedulers": schedulers})
            )
        return await self.switch(variant)

    async def stop(self) -> proto.SwitchInfo | None:
        """Admin override to the kernel's own scheduler (detach the BPF one)."""
        return await self.switch(KERNEL)

    async def auto(self) -> proto.SwitchInfo | None:
        """Drop the admin override: follow hints and the default again."""
        return await self.switch(AUTO)

    async def restart(self) -> proto.SwitchInfo | None:
        """Load the running scheduler again, from its file and configuration as they are
        now: the kernel's scheduler runs in between (a detach, then a fresh load and
        attach). The override in force before stays (or hints rule, as before). Raises
        :class:`~schedswitchd.daemon.protocol.RequestError` (``bad_request``) when no
        scheduler of the daemon's runs, and :class:`~schedswitchd.daemon.protocol.
        SwitchFailed` when the new load fails (the kernel's scheduler then runs)."""
        running = self.active
        if running == KERNEL:
            raise proto.RequestError(proto.BAD_REQUEST, "no scheduler is running")
        before = self.override
        await self.switch(KERNEL)
        return await self.switch(AUTO if before is None else before)

    def hold(self, workload: str, *, why: str) -> str:
        """Hold a lease of ``workload`` (a configured hint) for the daemon itself (uid 0,
        no process: it lasts until :meth:`end`), ranked by its hint rule's priority like
        any other; returns its id. ``why`` names the face in the log. Raises
        :class:`~schedswitchd.daemon.protocol.RequestError` (``unknown_workload``)."""
        if workload not in self.config.hints:
            raise proto.RequestError(
                proto.UNKNOWN_WORKLOAD,
                f"no hint rule for {workload!r} (known: {', '.join(self.config.hints)})",
            )
        lease = self._server.new_lease(workload, 0, os.getpid(), None, None)
        log.info(
            "lease %s: %s held by %s",
            lease.id,
            workload,
            why,
            extra={"LEASE": lease.id, "SCHEDULER": self.config.hints[workload].scheduler},
        )
        self._server.reconciler.kick()
        return lease.id

    def end(self, lease_id: str, why: str) -> bool:
        """End a lease :meth:`hold` made; False if it had ended already."""
        return self._server.end_lease(lease_id, why) is not None

    async def settle(self) -> None:
        """Wait for the reconcile pass that covers every change so far (e.g. after
        :meth:`hold`), bounded by the switch timeout."""
        await self._server.reconciler.settle()
