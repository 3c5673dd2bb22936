"""The reply gate's one rule (:mod:`schedswitchd.daemon.reply_gate`): a switch's worker goes
on once every reply the switch released was written and each client read its reply from
its socket, each wait bounded. Real ``AF_UNIX`` socket pairs; the worker is a thread of
the test's."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from schedswitchd.daemon.reply_gate import ReplyGate

REPLY = b'{"v":1,"ok":true}\n'


@pytest.fixture
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    made = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
    yield made
    for a, b in made:
        a.close()
        b.close()


class Worker:
    """A thread waiting on ``gate`` as a switch's worker does; ``result`` once it went on."""

    def __init__(self, gate: ReplyGate, written_s: float = 10.0, taken_s: float = 10.0) -> None:
        self.result: bool | None = None
        self.thread = threading.Thread(target=self._run, args=(gate, written_s, taken_s))
        self.thread.start()

    def _run(self, gate: ReplyGate, written_s: float, taken_s: float) -> None:
        self.result = gate.wait(written_s, taken_s)

    def still_waiting(self) -> bool:
        self.thread.join(0.1)
        return self.thread.is_alive()

    def went_on(self) -> bool:
        self.thread.join(10)
        return not self.thread.is_alive()


def test_the_worker_goes_on_once_every_reply_is_written_and_taken(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    (s1, c1), (s2, c2) = pairs
    gate = ReplyGate()
    worker = Worker(gate)
    gate.expect(2)
    assert worker.still_waiting()
    s1.sendall(REPLY)
    assert gate.sent(s1) is False  # one of two
    assert worker.still_waiting()
    s2.sendall(REPLY)
    assert gate.sent(s2) is True and gate.written
    assert gate.untaken() == [s1, s2]
    assert worker.still_waiting()  # written, not yet read
    c1.recv(100)
    assert gate.untaken() == [s2]
    assert worker.still_waiting()
    c2.recv(100)
    assert worker.went_on() and worker.result is True
    assert gate.untaken() == []


def test_a_written_gate_takes_no_more_sockets(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    (s1, _), (s2, _) = pairs
    gate = ReplyGate()
    gate.expect(1)
    assert gate.sent(s1) is True
    assert gate.sent(s2) is False
    assert gate.sockets == (s1,)


def test_a_reply_without_a_socket_is_not_waited_for() -> None:
    gate = ReplyGate()
    worker = Worker(gate)
    gate.expect(1)
    assert gate.sent(None) is True and gate.sockets == ()
    assert worker.went_on() and worker.result is True


def test_no_reply_released_opens_the_gate_at_once() -> None:
    gate = ReplyGate()
    gate.expect(0)
    assert gate.written
    assert gate.wait(0.0, 0.0) is True


def test_release_lets_the_worker_go_on_whatever_the_count() -> None:
    gate = ReplyGate()
    worker = Worker(gate)
    gate.expect(3)
    assert worker.still_waiting()
    gate.release()  # a later switch's gate replaces it
    assert worker.went_on() and worker.result is True


def test_each_wait_is_bounded(pairs: list[tuple[socket.socket, socket.socket]]) -> None:
    """A reply never written holds the worker ``written_s``; a client that never reads
    its reply holds it ``taken_s`` more; then it goes on anyway (False)."""
    never = ReplyGate()
    never.expect(1)
    t0 = time.monotonic()
    assert never.wait(0.2, 10.0) is False
    assert 0.2 <= time.monotonic() - t0 < 5.0
    server, _client = pairs[0]
    unread = ReplyGate()
    unread.expect(1)
    server.sendall(REPLY)
    unread.sent(server)
    t0 = time.monotonic()
    assert unread.wait(10.0, 0.2) is False
    assert 0.2 <= time.monotonic() - t0 < 5.0
