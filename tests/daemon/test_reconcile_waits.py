"""Which reconcile pass answers a request: the first one whose decision read it.

A hint changes the lease table and waits for a pass that *covers* it: one that asked the
policy after the lease was recorded. A pass already under way covers a hint that landed
before its decision (while it was still waiting for the worker, or while a failed switch's
next candidate was not chosen yet), and then answers it the moment its switch runs; a hint
that landed after the decision is answered by the next pass, with that pass's switch.

Observed through the live server (fake backend): the reconciler's worker is held by a call
of the test's own (as a refill or a heap trim queued there holds it) so that a pass waits in
its first step; the backend's ``gate`` holds a switch in its prepare; the backend's
``on_call`` holds a switch at its pin, after its ``on_enabled``, and the hint's reply is
looked for on the client's socket meanwhile.
"""

from __future__ import annotations

import json
import select
import threading
from collections.abc import Callable
from typing import Any

import pytest

from .fakes import FakeBackend
from .harness import POLL_S, Client, FakeTimer, Running

#: How long a reply that should be there already is looked for, s (only a failing run waits).
REPLY_S = 5.0


@pytest.fixture
def srv(start_server: Callable[..., Running]) -> Running:
    """A server whose safety-net poll stands still (until the test moves it): only the
    test's kicks and requests start passes."""
    return start_server(FakeBackend(fail_attach={"broken"}), poll_timer=FakeTimer())


def _quiet(srv: Running) -> Client:
    """fifo runs for a battery lease (held by the returned client), and a pass after it
    has settled."""
    keep = srv.client()
    assert keep.request(op="hint", workload="battery")["active"] == "fifo"
    srv.passes(1)
    # and the rounds' tails: the start's pre-open, which the hint put off, goes on after it
    srv.wait_for(lambda s: s.reconciler.idle)
    return keep


def _send_hint(srv: Running, workload: str) -> Client:
    """Send a hint for ``workload`` and wait until the server recorded its lease."""
    c = srv.client()
    c.send_raw(json.dumps({"v": 1, "op": "hint", "workload": workload}).encode() + b"\n")
    srv.wait_for(lambda s: any(lease.workload == workload for lease in s.policy.leases.values()))
    return c


def _hold_pin(srv: Running, name: str) -> tuple[threading.Event, threading.Event]:
    """(pinning, release): the switch to ``name`` stops as its pin begins (after the kernel
    runs it and its ``on_enabled``) until ``release`` is set; ``pinning`` says it got there."""
    pinning, release = threading.Event(), threading.Event()

    def on_call(call: str) -> None:
        if call == f"pin {name}":
            pinning.set()
            release.wait(10)

    srv.backend.on_call = on_call
    return pinning, release


def _reply_while_held(c: Client, pinning: threading.Event, release: threading.Event) -> bool:
    """True if ``c``'s reply is on its socket while the held switch waits in its pin."""
    try:
        assert pinning.wait(10), "the switch never reached its pin"
        readable, _, _ = select.select([c.sock], [], [], REPLY_S)
        return bool(readable)
    finally:
        release.set()


def _reply(c: Client) -> dict[str, Any]:
    reply = c.recv_line()
    assert reply is not None
    return reply


def _gaming_during_a_prepare(
    srv: Running, first: str, pinned: str
) -> tuple[Client, Client, threading.Event, threading.Event]:
    """A pass's switch for a ``first`` hint is held in its prepare when a gaming hint
    lands; the switch to ``pinned`` will stop as its pin begins (:func:`_hold_pin`).
    -> (the first hint's client, the gaming one's, pinning, release)."""
    gate = srv.backend.gate = threading.Event()
    srv.backend.preparing.clear()
    before = _send_hint(srv, first)
    pinning, release = _hold_pin(srv, pinned)
    try:
        assert srv.backend.preparing.wait(10), "the pass's switch never began its prepare"
        gaming = _send_hint(srv, "gaming")
    finally:
        gate.set()
    return before, gaming, pinning, release


def _gaming_answered_in_the_pin(
    srv: Running, c: Client, pinning: threading.Event, release: threading.Event
) -> dict[str, Any]:
    """``c``'s gaming hint is answered while the switch to gaming waits in its pin (not by
    a later pass): its reply, which says gaming runs."""
    assert _reply_while_held(c, pinning, release), "the hint waited for a later pass"
    srv.backend.on_call = None
    reply = _reply(c)
    assert reply["active"] == "gaming" and reply["switch"]["target"] == "gaming", reply
    return reply


def test_a_hint_before_the_passs_decision_is_answered_by_that_passs_switch(
    srv: Running,
) -> None:
    """A pass has begun and waits for the worker (busy with other work) before it asks the
    policy; a hint lands meanwhile. That pass switches to the hint's scheduler, and the
    reply goes out as the kernel runs it, while the pass's switch is in its pin: not only
    from a later pass."""
    keep = _quiet(srv)
    rec = srv.read(lambda s: s.reconciler)
    busy = threading.Event()
    rec.worker.submit(busy.wait, 10)  # the worker's queue: the pass's first step waits
    passes = srv.read(lambda s: s.reconciler.passes)
    srv.read(lambda s: s.reconciler.kick())  # a pass begins, as the poll's does
    srv.wait_for(lambda s: s.reconciler.passes == passes + 1)
    pinning, release = _hold_pin(srv, "gaming")
    try:
        c = _send_hint(srv, "gaming")
    finally:
        busy.set()
    reply = _gaming_answered_in_the_pin(srv, c, pinning, release)
    assert reply["switch"]["finished"] is False  # answered from the running switch
    history = srv.read(lambda s: [(r.target, r.result) for r in s.switcher.history])
    assert history[-1] == ("gaming", "ok") and [t for t, _ in history].count("gaming") == 1
    keep.close()
    c.close()


def test_a_hint_during_a_failed_switch_is_answered_by_the_same_passs_next_candidate(
    srv: Running,
) -> None:
    """A pass switches to ``broken`` (held in its prepare) when a gaming hint lands; the
    attach fails, and the same pass asks the policy again: gaming now, whose switch answers
    the gaming hint at once (and the broken hint, with its failure)."""
    keep = _quiet(srv)
    broken, gaming, pinning, release = _gaming_during_a_prepare(srv, "broken", "gaming")
    _gaming_answered_in_the_pin(srv, gaming, pinning, release)
    first = _reply(broken)
    assert (first["switch"]["target"], first["switch"]["result"]) == ("broken", "rolled_back")
    keep.close()
    broken.close()
    gaming.close()


def test_a_hint_after_the_passs_decision_is_answered_by_the_next_pass(srv: Running) -> None:
    """A pass decided for video-call (vtime) and switches (held in its prepare) when a
    gaming hint lands: vtime's switch answers the video-call hint only; the gaming hint's
    reply is the next pass's, and reports the switch to gaming."""
    keep = _quiet(srv)
    video, gaming, pinning, release = _gaming_during_a_prepare(srv, "video-call", "vtime")
    try:
        assert pinning.wait(10), "the switch to vtime never reached its pin"
        assert select.select([video.sock], [], [], REPLY_S)[0], "no video-call reply"
        # released with vtime's, the gaming reply would be written in the same turn
        assert not select.select([gaming.sock], [], [], 0.2)[0], "gaming answered by vtime's"
    finally:
        release.set()
    first = _reply(video)
    assert first["switch"]["target"] == "vtime", first
    srv.backend.on_call = None
    reply = _reply(gaming)
    assert reply["active"] == "gaming" and reply["switch"]["target"] == "gaming", reply
    assert reply["switch"]["previous"] == "vtime"
    keep.close()
    video.close()
    gaming.close()


def test_the_safety_net_poll_runs_a_pass_on_its_timer(srv: Running) -> None:
    """The poll is armed on the reconciler's timer: a pass begins once that timer reaches
    ``poll_s`` (and then every ``poll_s``), and it notices an ejection no event announced."""
    keep = _quiet(srv)
    assert srv.poll_timer is not None
    timer = srv.poll_timer
    due = srv.read(lambda s: timer.pending())
    assert len(due) == 1 and timer.now < due[0] <= timer.now + POLL_S, due
    watchers = srv.backend.watchers
    srv.backend.watchers = []  # no uevent reaches the daemon
    try:
        srv.backend.eject()
    finally:
        srv.backend.watchers = watchers
    passes = srv.read(lambda s: s.reconciler.passes)
    srv.advance_poll(due[0] - timer.now - 0.01)
    assert srv.read(lambda s: timer.pending()) == due  # not yet
    srv.advance_poll(0.01)
    # ran, and the next one is armed (the pass it kicked may already have backed the
    # ejected fifo off, whose hold's end is armed too)
    after = srv.read(lambda s: timer.pending())
    assert due[0] not in after and due[0] + POLL_S in after, after
    srv.wait_for(lambda s: s.reconciler.passes == passes + 1)
    srv.wait_for(lambda s: any(r.result == "ejected" for r in s.switcher.history))
    keep.close()


def test_a_hint_during_a_direct_switch_is_answered_by_the_pass_after_it(srv: Running) -> None:
    """A standby hit's direct switch to gaming is under way (its reply is out, the worker
    is held in the pin) when a broken hint lands: that one takes a normal pass, which
    begins only after the direct switch, and its reply reports its own (failed) switch."""
    keep = _quiet(srv)
    assert keep.request(op="prepare", workload="gaming", ttl_s=30)["ok"]
    srv.passes(1)
    pinning, release = _hold_pin(srv, "gaming")
    gaming = srv.client()
    gaming.send_raw(json.dumps({"v": 1, "op": "hint", "workload": "gaming"}).encode() + b"\n")
    try:
        assert pinning.wait(10)
        first = _reply(gaming)  # answered as the kernel runs it, before its pin
        assert first["switch"]["standby"] is True and first["switch"]["finished"] is False
        broken = _send_hint(srv, "broken")
        assert not select.select([broken.sock], [], [], 0.2)[0], "answered by the direct switch"
    finally:
        release.set()
    srv.backend.on_call = None
    reply = _reply(broken)
    assert (reply["switch"]["target"], reply["switch"]["result"]) == ("broken", "rolled_back")
    assert reply["switch"]["previous"] == "gaming" and reply["active"] == "gaming", reply
    keep.close()
    gaming.close()
    broken.close()
