"""Schedulers run as their own programs, on the real sched_ext kernel (one boot; the driver:
tests/vm/exec_driver.py). A lease holds ss_fifo (loaded by the daemon) throughout; the
programs are built by ``make test-objects`` from tests/vm/exec/*.c against the system's
libbpf: ``scx_ssfifo OBJECT`` loads a legacy ``.struct_ops`` object, attaches it through a
struct_ops link, serves until SIGINT, detaches and exits 0; ``scx_ssexit1`` exits 1 at start.

- ``vexec`` (scx_ssfifo with ss_vtime's object): the kernel runs ss_vtime; status says
  ``executable`` with the child's pid and argv; the lease's end switches back to ss_fifo,
  stopping the child with SIGINT: it detaches and exits 0 (its own and the daemon's lines).
- ``stubborn`` (the same, ignoring SIGINT): SIGKILLed after its ``stop_timeout_s``.
- ``broken`` (exits 1): a failed switch whose gap had opened (ss_fifo detached first), rolled
  back: ss_fifo runs again, the program is backed off and not started again.
- a running child killed from outside: the kernel's ``disabled`` is an ejection, backed off,
  and the lease below (ss_fifo) runs.
- the no-scheduler gap of a switch to ss_vtime loaded by the daemon (``vobj``) against one to
  ss_vtime run as a program, three each in the same boot (figures in the test's output and
  docs/performance.md).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.build_outputs import missing_build_output
from tools import vm
from tools.sidkernel import SidKernel

from .drivers import driver_line, driver_part

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
SCHED = REPO / "build" / "bpf"
EXEC = REPO / "build" / "tests" / "exec"

CONFIG = f"""
default = "kernel"
[auth]
admin_uids = [0]
hint_uids = [0]
[limits]
switch_timeout_s = 120.0
[backoff]
base_s = 120.0
max_s = 600.0
[standby]
max = 0
[daemon]
adopt_grace_s = 0.0
pin_dir = "/sys/fs/bpf/ssd-exec-vm"
[schedulers.fifo]
object = "{SCHED / "fifo.bpf.o"}"
[schedulers.vobj]
object = "{SCHED / "vtime.bpf.o"}"
[schedulers.vexec]
executable = "{EXEC / "scx_ssfifo"}"
args = ["{SCHED / "vtime.legacy.bpf.o"}"]
[schedulers.stubborn]
executable = "{EXEC / "scx_ssfifo"}"
args = ["{SCHED / "vtime.legacy.bpf.o"}", "--ignore-sigint"]
stop_timeout_s = 3.0
[schedulers.broken]
executable = "{EXEC / "scx_ssexit1"}"
[hints.desk]
scheduler = "fifo"
priority = 10
[hints.obj]
scheduler = "vobj"
priority = 20
[hints.game]
scheduler = "vexec"
priority = 20
[hints.stuck]
scheduler = "stubborn"
priority = 20
[hints.bad]
scheduler = "broken"
priority = 50
"""

SCRIPT = r"""
set -e
cd "$REPO"
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
""" + driver_line(
    "exec_driver", '"$RESULTS/e.toml"', '"$RESULTS/exec.json"', '"$RESULTS/daemon.log"'
)


@pytest.fixture(scope="module")
def run(sid_kernel: SidKernel, sched_objects: Path) -> dict[str, Any]:
    for exe in ("scx_ssfifo", "scx_ssexit1"):
        if not (EXEC / exe).is_file():
            missing_build_output(EXEC / exe, "test-objects")
    result = vm.run_in_vm(
        SCRIPT,
        kernel=sid_kernel,
        timeout=2400,
        cwd=str(REPO),
        inputs={"e.toml": CONFIG},
    )
    raw = result.files.get("exec.json")
    log = result.files.get("daemon.log", b"").decode(errors="replace")
    data: dict[str, Any] = json.loads(raw) if raw else {}
    if result.returncode != 0 or not data.get("done"):
        pytest.fail(
            f"the VM run failed (rc {result.returncode}, {result.elapsed_s:.0f} s)\n"
            f"{result.tail(40)}\n--- daemon log ---\n{log[-6000:]}"
        )
    return data


def test_a_switch_to_an_executable_runs_its_ops_and_status_names_the_child(
    run: dict[str, Any],
) -> None:
    assert driver_part(run, "fifo")["runs"] == {"way": "object", "pid": None, "argv": None}
    for r in driver_part(run, "gaps")["vexec"]:
        st, kernel = r["running"], r["kernel"]
        assert st["active"] == "vexec" and st["last_switch"]["result"] == "ok", st["last_switch"]
        assert kernel["state"] == "enabled" and kernel["ops"] == "ss_vtime"  # the kernel's word
        runs = st["runs"]
        assert runs["way"] == "executable" and runs["pid"] > 0 and r["pid_alive"]
        assert (
            r["cmdline"]
            == runs["argv"]
            == [str(EXEC / "scx_ssfifo"), str(SCHED / "vtime.legacy.bpf.o")]
        )
        # the gap holds the program's start, load and attach
        phases = st["last_switch"]["phases_ns"]
        assert st["last_switch"]["gap_ns"] >= phases["attach.enable"] > phases["attach.spawn"] > 0


def test_the_end_of_its_lease_stops_it_with_sigint_and_reverts(run: dict[str, Any]) -> None:
    rounds = driver_part(run, "gaps")["vexec"]
    for r in rounds:
        assert r["back"]["active"] == "fifo" and r["back"]["runs"]["way"] == "object"
        assert r["kernel_back"]["ops"] == "ss_fifo" and not r["pid_alive_after"]
        pid = r["running"]["runs"]["pid"]
        assert f"vexec (pid {pid}) ended: exit status 0" in run["log"]
    # the program's own words (its stdout, here the daemon's stderr: no journal in the VM)
    assert run["log"].count("scx_ssfifo: detached (ok)") >= len(rounds)
    assert "SIGKILL" not in "".join(
        line for line in run["log"].splitlines() if line.startswith("vexec")
    )


def test_a_child_that_ignores_sigint_is_killed_after_its_bound(run: dict[str, Any]) -> None:
    r = driver_part(run, "stubborn")
    assert r["running"]["runs"]["way"] == "executable" and r["kernel"]["ops"] == "ss_vtime"
    pid = r["running"]["runs"]["pid"]
    assert f"stubborn (pid {pid}) did not exit within 3.0 s of SIGINT: SIGKILL" in run["log"]
    assert f"stubborn (pid {pid}) ended: signal SIGKILL" in run["log"]
    assert r["back"]["active"] == "fifo" and r["kernel_back"]["ops"] == "ss_fifo"
    assert r["back"]["last_switch"]["phases_ns"]["detach"] >= 3_000_000_000


def test_a_program_that_exits_1_is_a_failed_switch_rolled_back_and_backed_off(
    run: dict[str, Any],
) -> None:
    r = driver_part(run, "broken")
    switch = r["status"]["last_switch"]
    # ss_fifo was detached before the program started (the gap opened); the failed attach
    # rolls back: ss_fifo is attached again.
    assert switch["target"] == "broken" and switch["result"] == "rolled_back", switch
    assert switch["error"]["code"] == "executable" and "exit status 1" in switch["error"]["message"]
    assert "detach" in switch["phases_ns"] and "rollback" in switch["phases_ns"]
    for status, kernel in ((r["status"], r["kernel"]), (r["later"], r["kernel_later"])):
        assert status["active"] == "fifo" and kernel["state"] == "enabled"
        assert kernel["ops"] == "ss_fifo"
        assert "broken" in [b["scheduler"] for b in status["backoff"]]
    assert r["starts_logged"] == 1  # backed off: not started again by later passes


def test_a_child_killed_from_outside_is_an_ejection_backed_off(run: dict[str, Any]) -> None:
    r = driver_part(run, "killed")
    assert r["kernel"]["ops"] == "ss_fifo" and r["back"]["active"] == "fifo"
    ejected = [e for e in r["history"] if e["result"] == "ejected" and e["previous"] == "vexec"]
    assert ejected, r["history"]
    assert [b["scheduler"] for b in r["back"]["backoff"]].count("vexec") == 1


def test_the_gaps_of_object_and_executable_switches_are_recorded(
    run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    gaps = driver_part(run, "gaps")
    ms = {
        kind: [r["running"]["last_switch"]["gap_ns"] / 1e6 for r in gaps[kind]]
        for kind in ("vobj", "vexec")
    }
    for kind, values in ms.items():
        assert all(v > 0 for v in values), ms
        with capsys.disabled():
            median = statistics.median(values)
            print(f"\n{kind} gap ms: {[round(v, 1) for v in values]} median {median:.1f}")
    # The figures go to bench/results/exec_gap.md and docs/performance.md by hand: no
    # timing is asserted here (the program's start sitting inside the gap is, above).
