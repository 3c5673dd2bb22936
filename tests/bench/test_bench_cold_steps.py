"""bench/cold_steps.py on this machine (``--local``, tiny counts): each mode does what the
page says it did, in that order, a read row reads the line the partner sent for it, the
partner is a pinned process of its own that the run leaves behind neither it nor any
pinning, and the page reads every row against the reference (the figures themselves are
taken in the sched_ext VM: ``python bench/cold_steps.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture
def cold(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("cold_steps")


@pytest.fixture
def unpinned() -> Iterator[set[int]]:
    """This process free to run on every CPU it is allowed (as any process starts, whatever
    ran before in it); its affinity is put back after. Skips with one allowed CPU."""
    before = os.sched_getaffinity(0)
    with contextlib.suppress(OSError):  # a cpuset narrower than the CPUs: keep what it allows
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one allowed CPU: pinning to it would not show")
    try:
        yield os.sched_getaffinity(0)
    finally:
        os.sched_setaffinity(0, before)


def test_each_mode_runs_its_steps_in_order(
    cold: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per trial and row: warm (the step, then the step timed), again (the step, a round
    trip, the step), switch (a round trip, the step), rest (a sleep of ``rest_s``, a round
    trip, the step); the partner sends the line only before a read row's timed read."""
    events: list[tuple[str, ...]] = []
    real_trip, real_sleep, real_time_once = (
        cold.Partner.round_trip, time.sleep, cold._time_once
    )  # fmt: skip

    inside = [False]  # events count only inside a measurement (not the partner's wait)

    def trip(self: Any, send_line: bool = False) -> None:
        if inside[0]:
            events.append(("trip", "line" if send_line else ""))
        real_trip(self, send_line)

    def sleep(seconds: float) -> None:
        if inside[0]:
            events.append(("sleep", str(seconds)))
        real_sleep(0)

    def time_once(steps: Any, partner: Any, name: str, mode: str, rest_s: float) -> int:
        events.append(("measure", name, mode))
        inside[0] = True
        try:
            return int(real_time_once(steps, partner, name, mode, rest_s))
        finally:
            inside[0] = False

    monkeypatch.setattr(cold.Partner, "round_trip", trip)
    monkeypatch.setattr(cold.time, "sleep", sleep)
    monkeypatch.setattr(cold, "_time_once", time_once)
    samples = cold.measure(trials=2, rest_s=0.25)
    reads = {cold.FIRST_READ, cold.PLAIN_RECV}
    expected = {
        "warm": [],
        "again": [("trip", "")],
        "switch": [("trip", "")],
        "rest": [("sleep", "0.25"), ("trip", "")],
    }
    # after the untimed warm pass, each measurement's own events
    starts = [i for i, e in enumerate(events) if e[0] == "measure"]
    timed = starts[len(samples) :]
    assert len(timed) == 2 * len(samples) * len(cold.MODES)
    for at, end in zip(timed, [*timed[1:], len(events)], strict=True):
        _, name, mode = events[at]
        want = [
            (kind, "line" if kind == "trip" and name in reads else arg)
            for kind, arg in expected[mode]
        ]
        assert events[at + 1 : end] == want, (name, mode)
    for name, modes in samples.items():
        assert set(modes) == set(cold.MODES), name
        assert all(len(values) == 2 and min(values) > 0 for values in modes.values()), name


def test_a_read_row_fails_the_run_when_its_line_never_came(
    cold: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partner that does not send the line: the read after its round trip finds none,
    and the run fails instead of timing a read of nothing."""
    real_trip = cold.Partner.round_trip
    monkeypatch.setattr(cold.Partner, "round_trip", lambda self, send_line=False: real_trip(self))
    with pytest.raises(BlockingIOError):
        cold.measure(trials=1, rest_s=0)


def test_a_read_row_reads_the_one_line_sent_for_it(cold: ModuleType) -> None:
    with cold.Steps() as steps:
        for name in (cold.FIRST_READ, cold.PLAIN_RECV):
            steps.send_line()
            assert steps.rows[name]() == cold.LINE
            with pytest.raises(BlockingIOError):
                steps.rows[name]()


def test_the_partner_is_pinned_sends_the_line_and_is_gone_after(
    cold: ModuleType, unpinned: set[int]
) -> None:
    cpu = max(unpinned)
    with cold.Steps() as steps:
        with cold.Partner(steps.client, cpu) as partner:
            partner.round_trip(send_line=True)
            assert os.sched_getaffinity(partner.pid) == {cpu}
            assert steps.rows[cold.FIRST_READ]() == cold.LINE
            pid = partner.pid
        assert partner.process.returncode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_run_leaves_no_pinning_and_no_partner(
    cold: ModuleType, monkeypatch: pytest.MonkeyPatch, unpinned: set[int]
) -> None:
    partners: list[Any] = []
    real_init = cold.Partner.__init__

    def init(self: Any, client: Any, cpu: int) -> None:
        real_init(self, client, cpu)
        partners.append(self)

    monkeypatch.setattr(cold.Partner, "__init__", init)
    me = os.getpid()
    cold.measure(trials=1, rest_s=0)
    assert os.getpid() == me
    assert os.sched_getaffinity(0) == unpinned
    assert [p.process.returncode for p in partners] == [0]


def test_a_partner_that_died_fails_its_round_trip(cold: ModuleType) -> None:
    with cold.Steps() as steps, cold.Partner(steps.client, min(os.sched_getaffinity(0))) as p:
        p.round_trip()
        os.kill(p.pid, signal.SIGKILL)
        p.process.wait()
        with pytest.raises(cold.PartnerGone):
            p.round_trip()


def test_the_page_reads_each_row_against_the_reference(cold: ModuleType) -> None:
    samples = {
        cold.REFERENCE: {"warm": [1.0], "again": [2.0], "switch": [3.0], "rest": [5.0]},
        "a step": {"warm": [2.0], "again": [4.0], "switch": [10.0], "rest": [19.0, 21.0]},
    }
    meta = {
        "argv": "", "date": "d", "commit": "c", "where": "w", "load": "l",
        "interpreter": "i", "trials": "1", "rest_s": "0.5", "partner_bytes": str(16 << 20),
    }  # fmt: skip
    page = cold.report(samples, meta)
    assert "| a step | +1.0 | +6.0 | +14.0 | 10.0x |" in page
    assert f"| {cold.REFERENCE} | +0.0 | +0.0 | +0.0 | 5.0x |" in page
    assert "| a step | 2.0 (2.0-2.0) | 4.0 (4.0-4.0) | 10.0 (10-10) | 20.0 (18-22) |" in page
    assert "`python bench/cold_steps.py` on d (checkout c)" in page
    assert "16 MiB" in page


def test_the_local_run_writes_its_page_and_json_and_needs_an_out(
    cold: ModuleType, tmp_path: Path
) -> None:
    argv = ["--local", "--trials", "1", "--rest", "0", "--out", str(tmp_path)]
    assert cold.main(argv) == 0
    saved = json.loads((tmp_path / "cold_steps.json").read_text())
    page = (tmp_path / "cold_steps.md").read_text()
    assert saved["meta"]["where"] == "on this machine (--local)"
    assert saved["meta"]["argv"] == "--local --trials 1 --rest 0 --out DIR"
    assert {cold.REFERENCE, cold.FIRST_READ, cold.PLAIN_RECV} <= set(saved["samples"])
    for name in saved["samples"]:
        assert f"| {name} | " in page
    (tmp_path / "cold_steps.md").unlink()
    assert cold.main(["--from-json", str(tmp_path / "cold_steps.json")]) == 0
    assert (tmp_path / "cold_steps.md").read_text() == page  # beside its JSON
    for bad in (["--local", "--trials", "1"], ["--local", "--out", "x", "--trials", "0"]):
        with pytest.raises(SystemExit):
            cold.main(bad)
