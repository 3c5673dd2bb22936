"""What a reconcile pass does with an ejection: back the scheduler off, or load it again.

The kernel ejects a scheduler (an error, a stall, a CPU going on- or offline) and its exit
record (``uei``, :mod:`schedswitchd.kernel.sched_ext.exit_info`) says why. A pass that
notices it (:meth:`Switcher.check_ejected
<schedswitchd.daemon.switcher.Switcher.check_ejected>`, or a standby hit's late check)
hands it to :meth:`Ejections.note`: a restart the exit asked for
(``SCX_ECODE_ACT_RESTART``) is honoured, bounded by rate (:meth:`Ejections.restart_asked`),
the kernel's CPU-hotplug restarts past the bound held a while instead (:attr:`Ejections.
holds`); any other ejection backs the scheduler off in the
:class:`~schedswitchd.daemon.policy.Policy` and drops an admin override of it. Each is
published on the change feed and logged.
"""

from __future__ import annotations

import logging

from schedswitchd.daemon.feed import ChangeFeed
from schedswitchd.daemon.policy import NS_PER_S, Policy
from schedswitchd.daemon.protocol import SwitchInfo

log = logging.getLogger("schedswitchd")

#: ``SCX_ECODE_ACT_RESTART`` (``enum scx_exit_code``, ``kernel/sched/ext_internal.h``, and
#: ``include/linux/sched/ext.h`` before it moved): the "action" bits 48-55 of an exit code
#: say what user space should do; this one asks it to load the scheduler again.
SCX_ECODE_ACT_RESTART = 1 << 48
#: ``SCX_ECODE_RSN_HOTPLUG`` (same enum): the "reason" bits 32-47 say a CPU went on- or
#: offline.
SCX_ECODE_RSN_HOTPLUG = 1 << 32
#: ``SCX_EXIT_UNREG_KERN`` (``enum scx_exit_kind``): the kernel unregistered the
#: scheduler; a scheduler's own ``scx_bpf_exit()`` is ``SCX_EXIT_UNREG_BPF`` instead, so
#: this kind with :data:`SCX_ECODE_RSN_HOTPLUG` is the kernel's CPU-hotplug ejection.
SCX_EXIT_UNREG_KERN = 66
#: Restarts at once per scheduler within :data:`RESTART_WINDOW_NS`. Past that, a restart
#: a scheduler asked for itself is an ejection like any other (backed off), so a
#: scheduler that asks for one at every start cannot loop; the kernel's CPU-hotplug
#: restarts are no failure of the scheduler: they wait instead (:data:`RESTART_HOLD_NS`).
MAX_RESTARTS = 5
RESTART_WINDOW_NS = 60 * NS_PER_S
#: How long the first CPU-hotplug restart past :data:`MAX_RESTARTS` in the window waits
#: (ns; each further one twice as long, at most :data:`RESTART_HOLD_MAX_NS`): the kernel's
#: own scheduler runs meanwhile, the lease keeps its scheduler, and hotplug events that
#: come during the wait are met by one load instead of one each.
RESTART_HOLD_NS = 1 * NS_PER_S
RESTART_HOLD_MAX_NS = 30 * NS_PER_S


class Ejections:
    """The ejections of one daemon: ``policy`` (backoff, the admin override) and ``feed``
    (``ejection`` and ``override`` changes) are the reconciler's. Loop thread only."""

    def __init__(self, policy: Policy, feed: ChangeFeed) -> None:
        self.policy = policy
        self.feed = feed
        #: Restarts honoured per scheduler (monotonic ns), see :meth:`restart_asked`.
        self._restarts: dict[str, list[int]] = {}
        #: CPU-hotplug restarts held past the rate bound: scheduler -> when it may be
        #: loaded again (``clock`` ns), see :meth:`restart_asked`.
        self.holds: dict[str, int] = {}

    def note(self, ejected: tuple[SwitchInfo, int], now: int) -> None:
        """What a pass does on an ejection :meth:`Switcher.check_ejected` found: a restart
        the exit asked for is honoured (no backoff), else the scheduler is backed off (and
        an admin override of it dropped); logged either way."""
        if self.restart_asked(ejected[0], now):
            gone = ejected[0]
            exit_ = gone.exit
            self._publish(gone, None)
            held = self.holds.get(gone.previous, now) - now
            log.warning(
                "scheduler %s exited asking for a restart (%s: %s); loading it again%s, its "
                "profile resolved for the topology then",
                gone.previous,
                exit_.reason if exit_ else "",
                exit_.message if exit_ else "",
                f" in {held / NS_PER_S:.1f} s (over {MAX_RESTARTS} restarts within "
                f"{RESTART_WINDOW_NS // NS_PER_S} s)"
                if held > 0
                else "",
                extra={"SCHEDULER": gone.previous, "EXIT_KIND": "restart"},
            )
        else:
            gone, ran_for = ejected
            exit_ = gone.exit
            why = "ejected by the kernel" + (
                f": {exit_.kind_name} ({exit_.reason}: {exit_.message})" if exit_ else ""
            )
            hold = self.policy.record_failure(gone.previous, now, ran_for, reason=why)
            self._publish(gone, (hold.until_ns - now) / NS_PER_S)
            if self.policy.override == gone.previous:
                self.drop_override(gone.previous, "it was ejected by the kernel")
            log.warning(
                "scheduler %s ejected by the kernel: %s%s; held back %.1f s",
                gone.previous,
                exit_.kind_name if exit_ else "no exit info",
                f" ({exit_.reason}: {exit_.message})" if exit_ else "",
                (hold.until_ns - now) / NS_PER_S,
                extra={
                    "SCHEDULER": gone.previous,
                    "EXIT_KIND": exit_.kind_name if exit_ else "",
                },
            )

    def _publish(self, gone: SwitchInfo, backoff_s: float | None) -> None:
        """An ejection on the feed; ``backoff_s``: its hold, ``None`` for a restart."""
        exit_ = gone.exit
        self.feed.publish(
            "ejection",
            scheduler=gone.previous,
            exit_kind=exit_.kind_name if exit_ else None,
            reason=exit_.reason if exit_ else None,
            message=exit_.message if exit_ else None,
            restart=backoff_s is None,
            backoff_s=backoff_s,
        )

    def restart_asked(self, gone: SwitchInfo, now: int) -> bool:
        """True when the ejected scheduler's exit code carries ``SCX_ECODE_ACT_RESTART``
        (``kernel/sched/ext.c``: a CPU going on- or offline ejects a scheduler without
        hotplug ops with ``SCX_EXIT_UNREG_KERN`` and ``SCX_ECODE_ACT_RESTART |
        SCX_ECODE_RSN_HOTPLUG``; a scheduler may ask for it through ``scx_bpf_exit()``) and
        either the scheduler has not restarted :data:`MAX_RESTARTS` times within
        :data:`RESTART_WINDOW_NS` or the exit is the kernel's CPU-hotplug ejection
        (:data:`SCX_EXIT_UNREG_KERN` with :data:`SCX_ECODE_RSN_HOTPLUG`): then it is loaded
        again (no backoff), and its profile sees the new topology -- at once, or, for a
        hotplug restart past the bound, once its hold (:attr:`holds`) ends:
        :data:`RESTART_HOLD_NS` doubling per restart over the bound, at most
        :data:`RESTART_HOLD_MAX_NS`; the policy still wants the scheduler meanwhile.
        Counts the restart."""
        exit_ = gone.exit
        if exit_ is None or not (exit_.exit_code & SCX_ECODE_ACT_RESTART):
            return False
        name = gone.previous
        recent = [t for t in self._restarts.get(name, []) if now - t < RESTART_WINDOW_NS]
        if len(recent) >= MAX_RESTARTS:
            if exit_.kind != SCX_EXIT_UNREG_KERN or not exit_.exit_code & SCX_ECODE_RSN_HOTPLUG:
                return False
            over = min(len(recent) - MAX_RESTARTS, 16)  # 16: far past the cap, no huge shift
            self.holds[name] = now + min(RESTART_HOLD_NS << over, RESTART_HOLD_MAX_NS)
        self._restarts[name] = [*recent, now]
        return True

    def held(self, target: str, now: int) -> bool:
        """Whether ``target``'s hotplug restart still waits for its hold to end (the
        deadline then kicks a pass); a hold that ended is dropped."""
        until = self.holds.get(target)
        if until is None:
            return False
        if until > now:
            return True
        del self.holds[target]
        return False

    def drop_override(self, target: str, why: str) -> None:
        """End a failed admin override: the daemon follows hints and the default again."""
        self.policy.override = None
        self.feed.publish("override", override=None, why=f"{target} dropped: {why}")
        log.warning(
            "admin override %s dropped: %s; following hints again",
            target,
            why,
            extra={"SCHEDULER": target},
        )

    def next_hold_end(self, now: int) -> int | None:
        """When the first held restart may load again (``clock`` ns), dropping the holds
        that ended by ``now``; ``None`` without one."""
        self.holds = {k: v for k, v in self.holds.items() if v > now}
        return min(self.holds.values()) if self.holds else None
