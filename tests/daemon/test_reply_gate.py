"""The reply gate's one rule (:mod:`schedswitchd.daemon.reply_gate`): a switch's worker goes
on once each reply the switch released was taken by its client (each connection reports
that once), its wait bounded. The worker is a thread of the test's; the connections' side
of the rule (they wait for their clients) is tested in test_standby.py and
test_first_request.py against real sockets."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable

import pytest

from schedswitchd.daemon.reply_gate import ReplyGate, give_way


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


def _fifo_on(cpu: int) -> None:
    """This process on ``cpu`` alone, ``SCHED_FIFO`` at priority 1: a task woken on that
    CPU at the same priority waits until this one blocks or yields (``sched(7)``)."""
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))


#: How long a child of :func:`_when_read` may take at most, s (``alarm(2)``).
CHILD_LIMIT_S = 10


def _child(body: Callable[[], None]) -> int:
    """Fork; the child runs ``body`` under an alarm of :data:`CHILD_LIMIT_S` and exits 0,
    or 1 with its traceback on stderr."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's exit status is what counts
        status = 1
        try:
            signal.alarm(CHILD_LIMIT_S)
            body()
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    return pid


def _when_read(yields: bool) -> tuple[int, int]:
    """A reader and a writer on one CPU (forked, each ``SCHED_FIFO`` 1): the reader blocks
    in ``recv``, the writer sends it a reply, then calls :func:`give_way` if ``yields``,
    and notes the time it goes on. Returns (the reader's time of reading, the writer's time
    of going on), monotonic ns."""
    cpu = min(os.sched_getaffinity(0))
    reader_sock, writer_sock = socket.socketpair()
    ready_r, ready_w = os.pipe()
    times_r, times_w = os.pipe()
    fds = {reader_sock.fileno(), writer_sock.fileno(), ready_r, ready_w, times_r, times_w}

    def only(*kept: int) -> None:
        for fd in fds - set(kept):
            os.close(fd)

    def reader() -> None:
        only(reader_sock.fileno(), ready_w, times_w)
        _fifo_on(cpu)
        os.write(ready_w, b"r")  # wakes the writer, which waits until this blocks below
        reader_sock.recv(16)
        os.write(times_w, b"r%d\n" % time.monotonic_ns())

    def writer() -> None:
        only(writer_sock.fileno(), ready_r, times_w)
        _fifo_on(cpu)
        os.read(ready_r, 1)
        writer_sock.send(b"reply\n")
        if yields:
            give_way()
        os.write(times_w, b"w%d\n" % time.monotonic_ns())

    pids = [_child(reader), _child(writer)]
    statuses = []
    try:
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            statuses.append(os.waitstatus_to_exitcode(status))
    finally:
        for pid in pids[len(statuses) :]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        reader_sock.close()
        writer_sock.close()
        for fd in (ready_r, ready_w, times_w):
            os.close(fd)
        with os.fdopen(times_r, "rb") as out:
            lines = out.read().split()
    assert statuses == [0, 0], f"children ended with {statuses} (their stderr says why)"
    times = {line[:1]: int(line[1:]) for line in lines}
    return times[b"r"], times[b"w"]


def _fifo_allowed() -> bool:
    """Whether this process may make a child ``SCHED_FIFO`` (root without an RT budget in
    its cgroup, or without ``CAP_SYS_NICE``, may not)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


@pytest.mark.root  # SCHED_FIFO
def test_a_client_woken_by_its_reply_reads_it_before_the_writer_gives_way_and_goes_on() -> None:
    # The kernel's side of give_way: on a CPU both need, the reply's reader runs at the
    # writer's yield. Without the yield the writer goes on first (the control below), so
    # this fails if sched_yield(2) stops handing the CPU to a woken task.
    if not _fifo_allowed():
        pytest.skip("SCHED_FIFO is not allowed here (no RT budget or CAP_SYS_NICE)")
    read_ns, went_on_ns = _when_read(yields=True)
    assert read_ns < went_on_ns, "the reader did not run at the writer's give_way()"
    read_ns, went_on_ns = _when_read(yields=False)
    assert went_on_ns < read_ns, "without a yield the reader ran first: the test shows nothing"
