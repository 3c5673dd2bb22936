"""bench/cold_steps.py on this machine (``--local``, tiny counts): each mode does what the
page says it did, a read row reads the line the partner sent for it, the run leaves no
partner and no pinning behind, and the page reads every row against the reference (the
figures themselves are taken in the sched_ext VM: ``python bench/cold_steps.py``)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture
def cold(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("cold_steps")


def test_each_mode_sleeps_and_switches_as_the_page_says(
    cold: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per trial and row: one round trip for the switch and one for the rest (the partner
    sending the line only for a read row), and one sleep of ``rest_s`` for the rest."""
    trips: list[bool] = []
    sleeps: list[float] = []
    real_trip, real_sleep = cold.Partner.round_trip, time.sleep

    def trip(self: Any, send_line: bool = False) -> None:
        trips.append(send_line)
        real_trip(self, send_line)

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        real_sleep(0)

    monkeypatch.setattr(cold.Partner, "round_trip", trip)
    monkeypatch.setattr(cold.time, "sleep", sleep)
    rows = cold.measure(trials=2, rest_s=0.25)
    reads = 2 * 2  # two read rows, two trials
    assert len(trips) == 2 * 2 * len(rows)
    assert trips.count(True) == 2 * reads
    assert sleeps.count(0.25) == 2 * len(rows)
    for name, medians in rows.items():
        assert set(medians) == set(cold.MODES), name
        assert all(value > 0 for value in medians.values()), (name, medians)


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


def test_the_run_leaves_no_partner_and_no_pinning(
    cold: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids: list[int] = []
    real_init = cold.Partner.__init__

    def init(self: Any, client: Any, cpu: int) -> None:
        real_init(self, client, cpu)
        pids.append(self.pid)

    monkeypatch.setattr(cold.Partner, "__init__", init)
    everywhere = set(range(os.cpu_count() or 1))
    if len(everywhere) < 2:
        pytest.skip("one CPU: pinning to it would not show")
    os.sched_setaffinity(0, everywhere)  # as any process starts, whatever ran before
    before = os.sched_getaffinity(0)
    cold.measure(trials=1, rest_s=0)
    assert os.sched_getaffinity(0) == before
    assert len(pids) == 1
    with pytest.raises(ChildProcessError):  # reaped already
        os.waitpid(pids[0], os.WNOHANG)


def test_a_partner_that_died_fails_its_round_trip(cold: ModuleType) -> None:
    with cold.Steps() as steps, cold.Partner(steps.client, min(os.sched_getaffinity(0))) as p:
        p.round_trip()
        os.kill(p.pid, signal.SIGKILL)
        os.waitpid(p.pid, 0)
        with pytest.raises(cold.PartnerGone):
            p.round_trip()


def test_the_page_reads_each_row_against_the_reference(cold: ModuleType) -> None:
    rows = {
        cold.REFERENCE: {"warm": 1.0, "switch": 3.0, "rest": 5.0},
        "a step": {"warm": 2.0, "switch": 10.0, "rest": 20.0},
    }
    meta = {
        "argv": "", "date": "d", "commit": "c", "where": "w", "load": "l",
        "interpreter": "i", "trials": "1", "rest_s": "0.5", "partner_bytes": str(16 << 20),
    }  # fmt: skip
    page = cold.report(rows, meta)
    assert "| a step | 2.0 | 10.0 | 20.0 | +6.0 | +14.0 | 10.0x |" in page
    assert f"| {cold.REFERENCE} | 1.0 | 3.0 | 5.0 | +0.0 | +0.0 | 5.0x |" in page
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
    assert saved["meta"]["argv"] == "--local --trials 1 --rest 0"
    for name, medians in saved["rows"].items():
        assert f"| {name} | {medians['warm']:.1f} |" in page
    again = tmp_path / "again"
    assert cold.main(["--from-json", str(tmp_path / "cold_steps.json"), "--out", str(again)]) == 0
    assert (again / "cold_steps.md").read_text() == page
    with pytest.raises(SystemExit):
        cold.main(["--local", "--trials", "1"])
