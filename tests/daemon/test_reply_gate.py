"""The reply gate's one rule (:mod:`schedswitchd.daemon.reply_gate`): a switch's worker goes
on once each reply the switch released was taken by its client (each connection reports
that once), its wait bounded. The worker is a thread of the test's; the connections' side
of the rule (they wait for their clients) is tested in test_standby.py and
test_first_request.py against real sockets."""

from __future__ import annotations

import threading
import time

from schedswitchd.daemon.reply_gate import ReplyGate


class Worker:
    """A thread waiting on ``gate`` as a switch's worker does; ``result`` once it went on."""

    def __init__(self, gate: ReplyGate, timeout_s: float = 10.0) -> None:
        self.result: bool | None = None
        self.thread = threading.Thread(target=self._run, args=(gate, timeout_s))
        self.thread.start()

    def _run(self, gate: ReplyGate, timeout_s: float) -> None:
        self.result = gate.wait(timeout_s)

    def still_waiting(self) -> bool:
        self.thread.join(0.1)
        return self.thread.is_alive()

    def went_on(self) -> bool:
        self.thread.join(10)
        return not self.thread.is_alive()


def _is_open(gate: ReplyGate) -> bool:
    return gate.open


def test_the_worker_goes_on_once_every_reply_is_taken() -> None:
    gate = ReplyGate()
    worker = Worker(gate)
    gate.expect(2)
    assert worker.still_waiting()
    assert gate.taken() is False  # one of two
    assert worker.still_waiting()
    assert gate.open is False
    assert gate.taken() is True
    assert _is_open(gate)
    assert worker.went_on() and worker.result is True


def test_an_open_gate_counts_no_more() -> None:
    gate = ReplyGate()
    gate.expect(1)
    assert gate.taken() is True
    assert gate.taken() is False  # a later reply is not this switch's


def test_no_reply_released_opens_the_gate_at_once() -> None:
    gate = ReplyGate()
    gate.expect(0)
    assert gate.open
    assert gate.wait(0.0) is True


def test_release_lets_the_worker_go_on_whatever_the_count() -> None:
    gate = ReplyGate()
    worker = Worker(gate)
    gate.expect(3)
    assert worker.still_waiting()
    gate.release()  # a later switch's gate replaces it
    assert worker.went_on() and worker.result is True


def test_the_wait_is_bounded() -> None:
    """A reply never taken holds the worker ``timeout_s``; then it goes on anyway (False)."""
    never = ReplyGate()
    never.expect(1)
    t0 = time.monotonic()
    assert never.wait(0.2) is False
    assert 0.2 <= time.monotonic() - t0 < 5.0
