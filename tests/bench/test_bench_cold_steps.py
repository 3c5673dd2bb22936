"""bench/cold_steps.py measured on this machine (``--local``): every step runs in each of
its three ways, and the page and JSON carry every step (the figures themselves are taken
in the sched_ext VM: ``python bench/cold_steps.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


def test_every_step_is_measured_in_each_way(bench_script: Callable[[str], ModuleType]) -> None:
    cold = bench_script("cold_steps")
    rows = cold.measure(trials=2, rest_s=0.0)
    steps = cold.Steps()
    try:
        assert list(rows) == list(steps.rows)
    finally:
        steps.close()
    for name, medians in rows.items():
        assert set(medians) == set(cold.MODES), name
        assert all(value > 0 for value in medians.values()), (name, medians)


def test_a_step_that_fails_fails_the_run(bench_script: Callable[[str], ModuleType]) -> None:
    """A read with no line waiting would raise: the client sends one before each read,
    and a read row that read two lines at once would leave the next without one."""
    cold = bench_script("cold_steps")
    steps = cold.Steps()
    try:
        steps.client.send(cold.LINE)
        assert steps.rows["recv"]() == cold.LINE
        try:
            steps.rows["recv"]()
        except BlockingIOError:
            pass
        else:
            raise AssertionError("a read found a line nobody sent")
    finally:
        steps.close()


def test_the_local_run_writes_its_page_and_json(
    bench_script: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    cold = bench_script("cold_steps")
    assert cold.main(["--local", "--trials", "1", "--rest", "0", "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "cold_steps.json").read_text())
    page = (tmp_path / "cold_steps.md").read_text()
    assert saved["meta"]["where"] == "on this machine (--local)"
    for name, medians in saved["rows"].items():
        assert f"| {name} | {medians['warm']:.1f} |" in page
