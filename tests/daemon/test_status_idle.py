"""``status``'s ``idle``: whether anything is under way or due in the daemon when it was read.

A bench (or a test) that wants its hint to meet the daemon at rest, as a launcher's usually
does, waits for ``idle``: a standby the pool holds already is not enough, since the round
that filled it (its heap trim, a further refill) may still run on the worker thread.

Through the live server (fake backend) whose safety-net poll stands still: only the test's
requests and kicks start passes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from schedswitchd.daemon.worker import SwitchWorker

from .fakes import FakeBackend
from .harness import Client, FakeTimer, Running


@pytest.fixture
def srv(start_server: Callable[..., Running]) -> Running:
    return start_server(FakeBackend(), poll_timer=FakeTimer(), default="fifo")


def _idle(c: Client) -> bool:
    value = c.request(op="status")["status"]["idle"]
    assert isinstance(value, bool)
    return value


def test_idle_at_rest_and_not_while_the_worker_has_a_call(srv: Running) -> None:
    c = srv.client()
    srv.passes(1)
    srv.wait_for(lambda s: s.reconciler.idle)
    assert _idle(c) is True
    busy = threading.Event()
    worker = srv.read(lambda s: s.reconciler.worker)
    held = worker.submit(busy.wait, 10)  # as a heap trim or a refill queued there
    try:
        assert _idle(c) is False
    finally:
        busy.set()
    held.result(10)
    assert _idle(c) is True
    c.close()


def test_not_idle_while_the_standby_refill_after_a_pass_prepares(srv: Running) -> None:
    """The lease's end switches back to fifo (from the pool) and the round then refills the
    pool with the recent hint's gaming, held here in its prepare: no pass and no direct
    switch is under way then (``busy`` is False), but the daemon is not idle."""
    c = srv.client()
    assert c.request(op="hint", workload="gaming")["active"] == "gaming"
    srv.wait_for(lambda s: s.reconciler.idle and "fifo" in s.switcher.standby.entries)
    gate = srv.backend.gate = threading.Event()
    srv.backend.preparing.clear()
    c.close()  # the lease ends
    try:
        assert srv.backend.preparing.wait(10), "no refill began"
        other = srv.client()
        assert srv.read(lambda s: s.switcher.active) == "fifo"
        assert srv.read(lambda s: s.reconciler.busy) is False
        assert _idle(other) is False
    finally:
        gate.set()
    srv.wait_for(lambda s: s.reconciler.idle)
    assert _idle(other) is True
    assert "gaming" in srv.read(lambda s: s.switcher.standby.entries)
    other.close()


def test_not_idle_while_a_pass_is_kicked(srv: Running) -> None:
    srv.passes(1)
    srv.wait_for(lambda s: s.reconciler.idle)

    def kick_and_look(s: object) -> bool:
        rec = srv.server.reconciler if srv.server is not None else None
        assert rec is not None
        rec.kick()  # the reconcile task runs the pass after this loop step
        return rec.idle

    assert srv.read(kick_and_look) is False
    srv.wait_for(lambda s: s.reconciler.idle)


def test_never_idle_inside_the_reconcile_round() -> None:
    """Whenever the reconcile task itself reads the clock (in its pass, between the pass
    and its refill, after the refill), the reconciler is not idle, though the worker may
    have nothing queued at that moment."""
    seen: list[bool] = []
    holder: list[Running] = []

    def clock() -> int:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # not on the loop's thread (the worker's switcher)
            task = None
        if task is not None and task.get_name() == "reconcile" and holder:
            server = holder[0].server
            if server is not None:
                seen.append(server.reconciler.idle)
        return time.monotonic_ns()

    running = Running(FakeBackend(), poll_timer=FakeTimer(), default="fifo", clock=clock)
    holder.append(running)
    try:
        c = running.client()
        assert c.request(op="hint", workload="gaming")["active"] == "gaming"
        running.wait_for(lambda s: s.reconciler.idle and "fifo" in s.switcher.standby.entries)
        c.close()
        running.wait_for(lambda s: "gaming" in s.switcher.standby.entries)
        running.wait_for(lambda s: s.reconciler.idle)
    finally:
        running.stop()
    assert len(seen) > 4 and not any(seen), seen


def _idle_soon(worker: SwitchWorker) -> bool:
    """The worker's count drops in its future's done callback, which runs just after the
    future's waiters were woken: look again for a moment."""
    deadline = time.monotonic() + 5
    while not worker.idle and time.monotonic() < deadline:
        time.sleep(0.001)
    return worker.idle


def test_the_worker_counts_calls_until_they_finish() -> None:
    worker = SwitchWorker()
    try:
        assert _idle_soon(worker)
        go = threading.Event()
        first = worker.submit(go.wait, 10)
        second = worker.submit(lambda: 2)
        assert worker._pending == 2  # one running, one queued
        go.set()
        assert first.result(10) is True and second.result(10) == 2
        assert _idle_soon(worker)
        failing = worker.submit(lambda: 1 // 0)
        with pytest.raises(ZeroDivisionError):
            failing.result(10)
        assert _idle_soon(worker)  # a call that raised is done too
        go.clear()
        running = worker.submit(go.wait, 10)
        queued = worker.submit(lambda: 3)
        assert queued.cancel()  # called off before it ran: no longer counted
        go.set()
        running.result(10)
        assert _idle_soon(worker)
    finally:
        worker.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        worker.submit(lambda: 0)  # refused after the shutdown: not counted
    assert _idle_soon(worker)


def test_the_status_table_says_idle_or_busy(
    srv: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    """``schedswitchctl status`` (the table, not ``--json``) shows ``idle`` as a row."""
    from schedswitchd.cli import ctl

    srv.passes(1)
    srv.wait_for(lambda s: s.reconciler.idle)
    assert ctl.main(["status", "--socket", srv.path]) == 0
    rows = dict(
        line.split(None, 1) for line in capsys.readouterr().out.splitlines() if line[:1] != " "
    )
    assert rows["work"].strip() == "idle"
    busy = threading.Event()
    held = srv.read(lambda s: s.reconciler.worker).submit(busy.wait, 10)
    try:
        assert ctl.main(["status", "--socket", srv.path]) == 0
        out = capsys.readouterr().out
    finally:
        busy.set()
    held.result(10)
    work = [line for line in out.splitlines() if line.startswith("work")]
    assert len(work) == 1 and "busy" in work[0] and "idle" not in work[0]


def test_a_held_call_is_counted_and_goes_before_any_later_submission() -> None:
    """A held call (:meth:`SwitchWorker.hold`) is not run, the worker counts as busy with it,
    and whatever is submitted next runs after it; :meth:`SwitchWorker.release` submits it (once)
    when nothing else did first."""
    worker = SwitchWorker()
    order: list[str] = []
    try:
        worker.hold(lambda: worker.submit(order.append, "held"))
        assert not worker.idle and order == []
        later = worker.submit(order.append, "later")
        later.result(10)
        assert order == ["held", "later"]
        assert _idle_soon(worker)
        worker.release()  # nothing held any more: no second run
        worker.hold(lambda: worker.submit(order.append, "held again"))
        assert not worker.idle
        worker.release()
        assert _idle_soon(worker) and order == ["held", "later", "held again"]
    finally:
        worker.shutdown(wait=True)
