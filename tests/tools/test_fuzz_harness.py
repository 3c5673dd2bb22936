"""The fuzz harness's oracle (``tools/fuzz.py``), on surfaces made to break it: one that
raises an untyped error, one that spins, one that allocates 2 GiB, one whose worker dies;
each must be reported as its kind of finding with its input saved, the worker replaced
and the run continued; a typed error is counted, not reported. Then a short run of each
of ``make fuzz``'s five surfaces: inputs made again from their index alone, and each
surface's inputs ending both accepted and refused (a generator that only makes garbage,
or only valid files, tests little)."""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

import pytest

from schedswitchd.errors import ObjectError
from tests.build_outputs import missing_build_output
from tools import fuzz
from tools.fuzz import Surface

BAD_INDEX = 5
INPUTS = 12


def _gen(_: object, rng: random.Random) -> bytes:
    return rng.randbytes(8)


def _bad_on(index_input: bytes, action: str) -> None:
    if action == "untyped":
        raise KeyError("not a SchedSwitchError")
    if action == "spin":
        while True:
            pass
    if action == "alloc":
        bytearray(2 << 30)  # 2 GiB, over the worker's 1 GiB of headroom
    if action == "die":
        os._exit(7)


def _surface(action: str) -> Surface:
    bad = fuzz.input_rng(1, BAD_INDEX).randbytes(8)

    def run(_: object, data: bytes) -> str:
        if data == bad:
            _bad_on(data, action)
        if data[0] & 1:
            raise ObjectError("typed: allowed")
        return "ok"

    return Surface(action, lambda: None, _gen, run)


UNTYPED = _surface("untyped")
SPIN = _surface("spin")
ALLOC = _surface("alloc")
DIE = _surface("die")


def _run(
    tmp_path: Path, refs: list[str], inputs: int, jobs: int = 2, shards: int = 1
) -> list[fuzz.SurfaceResult]:
    args = argparse.Namespace(
        surfaces=refs, inputs=inputs, seed=1, jobs=jobs, cpu_limit=0.5,
        mem_headroom=1 << 30, out=str(tmp_path), shards=shards,
    )  # fmt: skip
    return fuzz.supervise(args)


@pytest.mark.parametrize(
    ("attr", "kind", "workers"),
    [("UNTYPED", "untyped", 1), ("SPIN", "hang", 2), ("ALLOC", "memory", 2), ("DIE", "crash", 2)],
)
def test_each_kind_of_finding_is_reported_and_the_run_goes_on(
    tmp_path: Path, attr: str, kind: str, workers: int
) -> None:
    (r,) = _run(tmp_path, [f"tests.tools.test_fuzz_harness:{attr}"], INPUTS, jobs=1)
    assert r.findings == {kind: 1}, r.as_dict()
    assert r.inputs == INPUTS, r.as_dict()
    assert r.workers == workers  # replaced after a hang, an allocation, a death
    typed = sum(1 for i in range(INPUTS) if fuzz.input_rng(1, i).randbytes(8)[0] & 1)
    bad_typed = fuzz.input_rng(1, BAD_INDEX).randbytes(8)[0] & 1
    if kind != "crash":  # a dead worker's counts since its last report are lost with it
        assert r.outcomes["ObjectError"] == typed - bad_typed
    (saved,) = r.saved
    assert Path(saved).read_bytes() == fuzz.input_rng(1, BAD_INDEX).randbytes(8)
    assert Path(saved).name.startswith(f"{kind}-") and Path(saved).name.endswith(
        f"-{BAD_INDEX}.bin"
    )
    if kind in ("untyped", "memory", "hang"):
        text = Path(saved).with_suffix(".txt").read_text()
        assert {"untyped": "KeyError", "memory": "MemoryError", "hang": "_CpuLimit"}[kind] in text


def test_a_run_with_findings_exits_1_and_writes_its_counts(tmp_path: Path) -> None:
    argv = ["run", "tests.tools.test_fuzz_harness:UNTYPED", "--inputs", str(INPUTS),
            "--out", str(tmp_path), "--cpu-limit", "1"]  # fmt: skip
    assert fuzz.main(argv) == 1
    (surface,) = json.loads((tmp_path / "report.json").read_text())["surfaces"]
    assert surface["inputs"] == INPUTS and surface["findings"] == {"untyped": 1}
    assert "| untyped | 12 |" in (tmp_path / "report.md").read_text()


def test_shards_run_every_input_once(tmp_path: Path) -> None:
    (one,) = _run(tmp_path / "1", ["tests.tools.test_fuzz_harness:UNTYPED"], 30)
    (three,) = _run(tmp_path / "3", ["tests.tools.test_fuzz_harness:UNTYPED"], 30, jobs=3, shards=3)
    assert three.inputs == 30 and three.workers == 3
    assert three.outcomes == one.outcomes and three.findings == {"untyped": 1}


def test_typed_errors_only_exit_0(tmp_path: Path) -> None:
    assert fuzz.main(["run", "tests.tools.test_fuzz_harness:CLEAN", "--inputs", "30",
                      "--out", str(tmp_path)]) == 0  # fmt: skip


CLEAN = _surface("none")


def test_the_five_surfaces_make_inputs_that_pass_and_fail(tmp_path: Path) -> None:
    if not any((fuzz.ROOT / "build/tests/bpf").glob("*.bpf.o")):
        missing_build_output(fuzz.ROOT / "build/tests/bpf/maps.bpf.o", "test-objects")
    for name in fuzz.SURFACES:
        surface = fuzz.load_surface(name)
        state = surface.setup()
        assert surface.generate(state, fuzz.input_rng(3, 9)) == surface.generate(
            state, fuzz.input_rng(3, 9)
        ), name
        if surface.teardown is not None:
            surface.teardown(state)
    results = _run(tmp_path, list(fuzz.SURFACES), 150)
    assert sorted(r.name for r in results) == sorted(fuzz.SURFACES)
    for r in results:
        accepted = sum(n for o, n in r.outcomes.items() if o[0].islower() and ":" not in o)
        refused = sum(n for o, n in r.outcomes.items() if "Error" in o and "untyped" not in o)
        assert r.inputs == 150 and accepted and refused, r.as_dict()
