"""Leases and backoff -> the scheduler that should run. Pure logic: no I/O, no clock.

Time is passed in by the caller as monotonic nanoseconds (``time.monotonic_ns()``), so the
rules can be tested exhaustively. The rules:

- A lease names a workload; the workload's :class:`~schedswitchd.daemon.config.HintRule`
  gives a scheduler and a priority. A lease whose workload has no rule (after a reload) is
  kept but ignored.
- An admin override (a scheduler or ``kernel``) beats every lease (the server drops it
  when its switch fails or its scheduler is ejected).
- Otherwise the live lease with the highest priority wins, ties going to the newest lease;
  a lease whose scheduler is held back by backoff is skipped, and the next one is tried.
- With no usable lease the default runs, unless the default is held back too, in which
  case the kernel's own scheduler runs.
- Backoff: each failure (kernel ejection or failed switch) doubles a scheduler's hold,
  from ``base`` up to ``cap``. A scheduler that ran for ``stable`` or longer before failing
  starts over at one failure; a successful switch does not reset the count (a scheduler
  that is attached and ejected at once would otherwise never back off).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from schedswitchd.daemon.config import KERNEL, HintRule

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class Lease:
    """A hint held by a client.

    ``owner_uid``/``owner_pid``: from ``SO_PEERCRED`` of the connection that made it;
    ``pid``: the hinted process (lease ends when it exits) or ``None``; ``created_ns`` and
    ``expires_ns``: monotonic ns (``expires_ns`` ``None`` = no TTL); ``seq``: creation order,
    breaks priority ties (newer wins).
    """

    id: str
    workload: str
    owner_uid: int
    owner_pid: int
    pid: int | None
    created_ns: int
    expires_ns: int | None
    seq: int


@dataclass(frozen=True)
class Backoff:
    """``failures`` consecutive failures; held back until monotonic ``until_ns``;
    ``reason``: the last failure's, for people (a failed switch's error, an ejection's
    exit), or empty when the caller gave none."""

    failures: int
    until_ns: int
    reason: str = ""

    def describe(self, scheduler: str, now_ns: int) -> str:
        """``scheduler`` (the one held) held back as a phrase for people: the failures,
        the whole seconds left at ``now_ns`` (rounded up) and the last reason, if any."""
        left_s = -(-(self.until_ns - now_ns) // NS_PER_S)
        plural = "s" if self.failures != 1 else ""
        text = f"{scheduler} is held back after {self.failures} failure{plural}, {left_s} s left"
        return f"{text}; the last: {self.reason}" if self.reason else text


def _rank(pair: tuple[Lease, HintRule]) -> tuple[int, int]:
    """A ranked pair's sort key: the rule's priority, then the lease's creation order."""
    return pair[1].priority, pair[0].seq


@dataclass(frozen=True)
class Decision:
    """What should run: ``scheduler`` (a configured name or ``kernel``), the ``lease`` that
    chose it (``None`` for default/override), and ``why`` (``override``, ``lease``,
    ``default``, ``default-held``: the default is backed off so the kernel runs)."""

    scheduler: str
    lease: Lease | None
    why: str


@dataclass
class Policy:
    """Mutable lease table + backoff table; :meth:`decide` is a pure function of them.

    ``rules``: workload -> rule; ``default``: scheduler name or ``kernel``; backoff
    ``base_ns``/``cap_ns``/``stable_ns`` as in :class:`~schedswitchd.daemon.config.BackoffConfig`.

    What a standby hit asks of it (``count_for_uid``, ``expire``, ``decide`` through
    ``ranked``, ``next_deadline``) walks the tables in plain loops: a generator or a
    comprehension is a function call of its own, which in the emulated sched_ext VM cost a
    hit's reply its time (docs/performance.md, "Standby hit").
    """

    rules: Mapping[str, HintRule]
    default: str = KERNEL
    base_ns: int = 5 * NS_PER_S
    cap_ns: int = 600 * NS_PER_S
    stable_ns: int = 300 * NS_PER_S
    override: str | None = None
    leases: dict[str, Lease] = field(default_factory=dict)
    backoff: dict[str, Backoff] = field(default_factory=dict)

    # --- leases -----------------------------------------------------------------------------

    def add(self, lease: Lease) -> None:
        """Add a lease. ``ValueError`` if its id is taken (ids are the caller's to make unique)."""
        if lease.id in self.leases:
            raise ValueError(f"lease id {lease.id!r} already exists")
        self.leases[lease.id] = lease

    def remove(self, lease_id: str) -> Lease | None:
        """Remove and return a lease; ``None`` if it is not live (already ended)."""
        return self.leases.pop(lease_id, None)

    def expire(self, now_ns: int) -> list[Lease]:
        """Remove and return every lease whose TTL has passed at ``now_ns``."""
        gone = []
        for lease in self.leases.values():
            if lease.expires_ns is not None and lease.expires_ns <= now_ns:
                gone.append(lease)
        for lease in gone:
            del self.leases[lease.id]
        return gone

    def count_for_uid(self, uid: int) -> int:
        """Number of live leases owned by ``uid``."""
        count = 0
        for lease in self.leases.values():
            if lease.owner_uid == uid:
                count += 1
        return count

    def next_deadline(self, now_ns: int) -> int | None:
        """Earliest future moment (monotonic ns) at which :meth:`decide` may change on its
        own: a lease TTL or a backoff hold ending. ``None`` if there is none."""
        first: int | None = None
        for lease in self.leases.values():
            at = lease.expires_ns
            if at is not None and (first is None or at < first):
                first = at
        for hold in self.backoff.values():
            at = hold.until_ns
            if at > now_ns and (first is None or at < first):
                first = at
        return first

    # --- backoff ----------------------------------------------------------------------------

    def held(self, scheduler: str, now_ns: int) -> bool:
        """True if ``scheduler`` is held back at ``now_ns``. ``kernel`` is never held."""
        state = self.backoff.get(scheduler)
        return state is not None and now_ns < state.until_ns

    def record_failure(
        self, scheduler: str, now_ns: int, ran_for_ns: int = 0, reason: str = ""
    ) -> Backoff:
        """Count a failure of ``scheduler`` (ejected after running ``ran_for_ns``, or 0 for a
        failed switch; ``reason`` kept for :meth:`Backoff.describe`) and return its new
        hold: ``base * 2**(failures-1)``, at most ``cap``."""
        previous = self.backoff.get(scheduler)
        failures = 1 if previous is None or ran_for_ns >= self.stable_ns else previous.failures + 1
        # Cap the exponent too, so a long-lived flapping scheduler cannot build huge ints.
        hold = min(self.cap_ns, self.base_ns << min(failures - 1, 62))
        state = Backoff(failures=failures, until_ns=now_ns + hold, reason=reason)
        self.backoff[scheduler] = state
        return state

    def clear_backoff(self, scheduler: str | None = None) -> None:
        """Forget the failures of one scheduler (or all, e.g. after an admin reload)."""
        if scheduler is None:
            self.backoff.clear()
        else:
            self.backoff.pop(scheduler, None)

    # --- the decision -------------------------------------------------------------------------

    def ranked(self) -> list[tuple[Lease, HintRule]]:
        """Live leases that have a rule, best first (priority, then newest)."""
        pairs = []
        for lease in self.leases.values():
            rule = self.rules.get(lease.workload)
            if rule is not None:
                pairs.append((lease, rule))
        if len(pairs) > 1:
            pairs.sort(key=_rank, reverse=True)
        return pairs

    def decide(self, now_ns: int) -> Decision:
        """The scheduler that should run at ``now_ns`` (see the module docstring).

        An admin override is obeyed even when that scheduler is backed off: an admin asked.
        The server drops an override whose switch fails or whose scheduler is ejected, so a
        failed override is tried once, not on every pass.
        """
        if self.override is not None:
            return Decision(self.override, None, "override")
        for lease, rule in self.ranked():
            if lease.expires_ns is not None and lease.expires_ns <= now_ns:
                continue
            if rule.scheduler == KERNEL or not self.held(rule.scheduler, now_ns):
                return Decision(rule.scheduler, lease, "lease")
        if self.default != KERNEL and self.held(self.default, now_ns):
            return Decision(KERNEL, None, "default-held")
        return Decision(self.default, None, "default")

    def passed_over(self, lease: Lease, scheduler: str, now_ns: int) -> str | None:
        """Why :meth:`decide` at ``now_ns`` does not run ``scheduler``, the one ``lease``'s
        hint asked for (its rule's, read when the hint came), as a phrase for people
        (``schedswitchctl hint`` prints it); ``None`` when it runs it, whichever lease
        chose it.

        The first that applies: the lease has ended (removed or past its TTL); an admin
        override; the workload has no rule now (a reload dropped it); a lease that ranks
        higher (its id, workload and priority; at the same priority, newer); the scheduler
        is held back by backoff (:meth:`Backoff.describe`).
        """
        decision = self.decide(now_ns)
        if decision.scheduler == scheduler:
            return None
        if lease.id not in self.leases or (
            lease.expires_ns is not None and lease.expires_ns <= now_ns
        ):
            return f"lease {lease.id} has ended"
        if decision.why == "override":
            return f"an admin override runs {decision.scheduler}"
        rule = self.rules.get(lease.workload)
        if rule is None:
            return f"the configuration has no hint rule for {lease.workload} now"
        winner = decision.lease
        if winner is not None:
            theirs = self.rules[winner.workload]
            if _rank((winner, theirs)) > _rank((lease, rule)):
                how = "is newer" if theirs.priority == rule.priority else "ranks higher"
                return f"lease {winner.id} ({winner.workload}, priority {theirs.priority}) {how}"
        hold = self.backoff.get(rule.scheduler)
        if rule.scheduler != KERNEL and hold is not None and now_ns < hold.until_ns:
            return hold.describe(rule.scheduler, now_ns)
        return None
