"""Policy: leases and backoff -> the scheduler to run (pure; examples and properties)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schedswitchd.daemon.config import KERNEL, HintRule
from schedswitchd.daemon.policy import NS_PER_S, Lease, Policy
from tests import fuzzing

RULES = {
    "gaming": HintRule(scheduler="gaming", priority=50),
    "video-call": HintRule(scheduler="vtime", priority=30),
    "battery": HintRule(scheduler="fifo", priority=10),
    "plain": HintRule(scheduler=KERNEL, priority=40),
}


def lease(seq: int, workload: str, *, uid: int = 1000, expires: int | None = None) -> Lease:
    return Lease(
        id=f"L{seq}",
        workload=workload,
        owner_uid=uid,
        owner_pid=100,
        pid=None,
        created_ns=seq,
        expires_ns=expires,
        seq=seq,
    )


def test_no_leases_runs_default() -> None:
    assert Policy(RULES).decide(0).scheduler == KERNEL
    decision = Policy(RULES, default="fifo").decide(0)
    assert (decision.scheduler, decision.lease, decision.why) == ("fifo", None, "default")


def test_highest_priority_wins_and_release_restores() -> None:
    p = Policy(RULES, default="fifo")
    p.add(lease(1, "video-call"))
    assert p.decide(0).scheduler == "vtime"
    p.add(lease(2, "gaming"))
    assert p.decide(0).scheduler == "gaming"
    assert p.decide(0).lease == lease(2, "gaming")
    p.add(lease(3, "battery"))  # lower priority, newer: does not win
    assert p.decide(0).scheduler == "gaming"
    assert p.remove("L2") is not None
    assert p.decide(0).scheduler == "vtime"
    assert p.remove("L2") is None
    p.remove("L1")
    p.remove("L3")
    assert p.decide(0).scheduler == "fifo"


def test_tie_goes_to_newest() -> None:
    p = Policy(RULES)
    p.add(lease(1, "gaming"))
    p.add(lease(2, "gaming"))
    assert p.decide(0).lease is not None and p.decide(0).lease.id == "L2"  # type: ignore[union-attr]


def test_kernel_rule_can_win() -> None:
    p = Policy(RULES, default="fifo")
    p.add(lease(1, "plain"))
    p.add(lease(2, "video-call"))
    assert p.decide(0).scheduler == KERNEL


def test_duplicate_id_rejected() -> None:
    p = Policy(RULES)
    p.add(lease(1, "gaming"))
    try:
        p.add(lease(1, "battery"))
    except ValueError:
        pass
    else:
        raise AssertionError("duplicate lease id accepted")


def test_ttl_expiry_and_deadline() -> None:
    p = Policy(RULES)
    p.add(lease(1, "gaming", expires=10 * NS_PER_S))
    p.add(lease(2, "battery"))
    assert p.next_deadline(0) == 10 * NS_PER_S
    assert p.decide(9 * NS_PER_S).scheduler == "gaming"
    # decide() already ignores an expired lease, even before expire() removes it
    assert p.decide(10 * NS_PER_S).scheduler == "fifo"
    assert [x.id for x in p.expire(10 * NS_PER_S)] == ["L1"]
    assert p.next_deadline(10 * NS_PER_S) is None


def test_unknown_workload_is_ignored() -> None:
    p = Policy(RULES, default="fifo")
    p.add(lease(1, "removed-by-reload"))
    assert p.decide(0).scheduler == "fifo"


def test_override_beats_leases_and_backoff() -> None:
    p = Policy(RULES)
    p.add(lease(1, "gaming"))
    p.record_failure("vtime", 0)
    p.override = "vtime"
    assert p.decide(0).scheduler == "vtime"
    assert p.decide(0).why == "override"
    p.override = KERNEL
    assert p.decide(0).scheduler == KERNEL
    p.override = None
    assert p.decide(0).scheduler == "gaming"


def test_backoff_skips_to_next_candidate_then_returns() -> None:
    p = Policy(RULES, default="fifo", base_ns=5 * NS_PER_S)
    p.add(lease(1, "video-call"))
    p.add(lease(2, "gaming"))
    p.record_failure("gaming", 0)
    assert p.decide(1).scheduler == "vtime"
    assert p.next_deadline(1) == 5 * NS_PER_S
    assert p.decide(5 * NS_PER_S).scheduler == "gaming"


def test_backoff_of_default_falls_to_kernel() -> None:
    p = Policy(RULES, default="fifo")
    p.record_failure("fifo", 0)
    d = p.decide(1)
    assert (d.scheduler, d.why) == (KERNEL, "default-held")


def test_backoff_doubles_caps_and_resets_after_stable_run() -> None:
    p = Policy(RULES, base_ns=1, cap_ns=100, stable_ns=1000)
    holds = [p.record_failure("gaming", 0).until_ns for _ in range(10)]
    assert holds == [1, 2, 4, 8, 16, 32, 64, 100, 100, 100]
    assert p.backoff["gaming"].failures == 10
    assert p.record_failure("gaming", 0, ran_for_ns=1000).failures == 1
    p.clear_backoff("gaming")
    assert not p.held("gaming", 0)


def test_count_for_uid() -> None:
    p = Policy(RULES)
    p.add(lease(1, "gaming", uid=1))
    p.add(lease(2, "gaming", uid=1))
    p.add(lease(3, "gaming", uid=2))
    assert (p.count_for_uid(1), p.count_for_uid(2), p.count_for_uid(3)) == (2, 1, 0)


def test_passed_over_names_what_keeps_a_leases_scheduler_off() -> None:
    """The first reason that applies, in order: the lease ended, an override, its rule gone,
    a lease that ranks higher (or is newer at the same priority), backoff (failures and
    whole seconds left, rounded up); ``None`` when the lease's scheduler is what runs, even
    when another lease chose it."""
    p = Policy(dict(RULES), base_ns=5 * NS_PER_S)

    def over(held: Lease, now: int) -> str | None:
        return p.passed_over(held, RULES[held.workload].scheduler, now)

    video, gaming = lease(1, "video-call"), lease(2, "gaming")
    p.add(video)
    assert over(video, 0) is None
    p.add(gaming)
    assert over(gaming, 0) is None
    assert over(video, 0) == "lease L2 (gaming, priority 50) ranks higher"
    p.record_failure("vtime", 0)  # held and outranked: the lease that runs is the reason
    assert over(video, 0) == "lease L2 (gaming, priority 50) ranks higher"
    p.clear_backoff()
    p.record_failure("gaming", 0)
    p.record_failure("gaming", 0)  # two failures: held 10 s; no reason given
    assert over(gaming, NS_PER_S // 2) == "gaming is held back after 2 failures, 10 s left"
    assert over(video, NS_PER_S) is None  # vtime runs while gaming is held
    p.override = "fifo"
    assert over(gaming, 0) == "an admin override runs fifo"
    p.override = None
    p.remove("L1")
    assert over(video, 0) == "lease L1 has ended"
    short = lease(3, "video-call", expires=5)
    p.add(short)
    assert over(short, 5) == "lease L3 has ended"
    second = lease(4, "gaming")  # the held scheduler's second lease: outranks L3, still held
    p.add(second)
    assert over(second, 0) == "gaming is held back after 2 failures, 10 s left"
    p.clear_backoff()
    assert over(gaming, 0) is None and over(second, 0) is None
    p.remove("L4")
    p.remove("L2")
    p.add(lease(5, "video-call"))  # newer, same priority as L3
    assert over(short, 0) is None  # it chose the same scheduler: L3's runs
    p.rules = {**RULES, "quiet": HintRule(scheduler="fifo", priority=50)}
    early, late = lease(6, "quiet"), lease(7, "gaming")
    p.add(early)
    p.add(late)
    assert p.passed_over(early, "fifo", 0) == "lease L7 (gaming, priority 50) is newer"
    p.rules = {w: r for w, r in p.rules.items() if w != "quiet"}  # a reload dropped it
    assert p.passed_over(early, "fifo", 0) == "the configuration has no hint rule for quiet now"


# --- properties ------------------------------------------------------------------------------

WORKLOADS = [*RULES, "unknown"]
SCHEDULERS = ["gaming", "vtime", "fifo"]

lease_specs = st.lists(
    st.tuples(st.sampled_from(WORKLOADS), st.none() | st.integers(0, 100)),
    max_size=12,
)


@settings(max_examples=fuzzing.examples(300), deadline=None)
@given(
    specs=lease_specs,
    held=st.sets(st.sampled_from(SCHEDULERS)),
    default=st.sampled_from([KERNEL, *SCHEDULERS]),
    now=st.integers(0, 120),
)
def test_decision_matches_brute_force(
    specs: list[tuple[str, int | None]], held: set[str], default: str, now: int
) -> None:
    p = Policy(RULES, default=default, base_ns=1000)
    for i, (workload, expires) in enumerate(specs):
        p.add(lease(i, workload, expires=expires))
    for name in held:
        p.record_failure(name, now)
    decision = p.decide(now)

    usable = [
        (RULES[w].priority, i, RULES[w].scheduler)
        for i, (w, exp) in enumerate(specs)
        if w in RULES
        and (exp is None or exp > now)
        and (RULES[w].scheduler == KERNEL or RULES[w].scheduler not in held)
    ]
    if usable:
        expected = max(usable)[2]
    elif default in held:
        expected = KERNEL
    else:
        expected = default
    assert decision.scheduler == expected
    # the deciding lease, if any, is live and maps to the decision
    if decision.lease is not None:
        assert RULES[decision.lease.workload].scheduler == decision.scheduler
    # expire() removes exactly the dead leases and does not change the decision
    p.expire(now)
    assert all(x.expires_ns is None or x.expires_ns > now for x in p.leases.values())
    assert p.decide(now).scheduler == expected


@settings(max_examples=fuzzing.examples(200), deadline=None)
@given(
    events=st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 10**12)), max_size=40),
    base=st.integers(1, 10**10),
    cap_mult=st.integers(1, 1000),
)
def test_backoff_bounds(events: list[tuple[int, int]], base: int, cap_mult: int) -> None:
    p = Policy(RULES, base_ns=base, cap_ns=base * cap_mult, stable_ns=10**11)
    previous_failures = 0
    for now, ran in events:
        state = p.record_failure("gaming", now, ran_for_ns=ran)
        hold = state.until_ns - now
        assert base <= hold <= base * cap_mult
        if ran >= 10**11:
            assert state.failures == 1
        else:
            assert state.failures == previous_failures + 1
            assert hold == min(base * cap_mult, base * 2 ** (state.failures - 1))
        previous_failures = state.failures
        assert p.held("gaming", now) and not p.held("gaming", state.until_ns)
