"""A standby whose prepare fails is held back, not prepared again on every pass.

The daemon's safety-net pass asks for its standbys every second. On a kernel without
sched_ext (or with a scheduler the verifier rejects) every standby prepare fails; the pool
prepared it again and logged a warning each second, forever (first seen by running the
README's by-hand daemon on the host: 115 warnings in two minutes after one hint). The pool
now waits RETRY_BASE_S, doubling per failure up to RETRY_MAX_S, unless the configuration
or the object file changes. The first tests drive the pool with the fake backend and a
fake clock; the last runs the real daemon on the host kernel, which answers "no sched_ext".
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from schedswitchd.cli.ctl import main as ctl_main
from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.standby import RETRY_BASE_S, RETRY_MAX_S, StandbyPool
from tests.build_outputs import missing_build_output

from .fakes import FakeBackend
from .harness import FakeClock

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _pool(tmp_path: Path) -> tuple[StandbyPool, FakeBackend, FakeClock, SchedulerConfig, Path]:
    obj = tmp_path / "gaming.bpf.o"
    obj.write_bytes(b"not really an object: the fake backend never reads it")
    backend = FakeBackend(fail_prepare={"gaming"})
    clock = FakeClock()
    return (
        StandbyPool(backend, 2, 1 << 30, clock=clock),
        backend,
        clock,
        SchedulerConfig(object=str(obj)),
        obj,
    )


def test_a_failed_standby_waits_doubling_up_to_the_cap(tmp_path: Path) -> None:
    pool, backend, clock, spec, _ = _pool(tmp_path)
    assert pool.fill("gaming", spec, "recent hint") is None
    for _ in range(5):  # five more passes, one a second: no prepare
        clock.advance(1)
        assert pool.fill("gaming", spec, "recent hint") is None
    assert backend.calls.count("prepare gaming") == 1 and pool.failures == 1
    assert pool.last_error is not None and "next try in" in pool.last_error[1]
    assert "kfunc scx_bpf_nope" in pool.last_error[1]  # the cause stays in the message
    clock.advance(RETRY_BASE_S)  # the first hold is over
    pool.fill("gaming", spec, "recent hint")
    assert backend.calls.count("prepare gaming") == 2
    clock.advance(RETRY_BASE_S + 1)  # the second hold is twice as long
    pool.fill("gaming", spec, "recent hint")
    assert backend.calls.count("prepare gaming") == 2
    clock.advance(RETRY_BASE_S)
    pool.fill("gaming", spec, "recent hint")
    assert backend.calls.count("prepare gaming") == 3
    for _ in range(20):  # many failures later the hold stops growing at the cap
        clock.advance(RETRY_MAX_S)
        pool.fill("gaming", spec, "recent hint")
    assert backend.calls.count("prepare gaming") == 23
    # and once it prepares, it is held as any other
    backend.fail_prepare.clear()
    clock.advance(RETRY_MAX_S)
    entry = pool.fill("gaming", spec, "recent hint")
    assert entry is not None and backend.calls.count("prepare gaming") == 24


def test_a_changed_configuration_or_object_ends_the_hold(tmp_path: Path) -> None:
    pool, backend, clock, spec, obj = _pool(tmp_path)
    pool.fill("gaming", spec, "intent gaming")
    clock.advance(1)
    other = SchedulerConfig(object=spec.object, rodata={"slice_ns": 1000})
    pool.fill("gaming", other, "intent gaming")  # reloaded with other tunables
    assert backend.calls.count("prepare gaming") == 2
    clock.advance(1)
    pool.fill("gaming", other, "intent gaming")
    assert backend.calls.count("prepare gaming") == 2
    st = obj.stat()
    os.utime(obj, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # `make schedulers` again
    backend.fail_prepare.clear()
    assert pool.fill("gaming", other, "intent gaming") is not None
    assert backend.calls.count("prepare gaming") == 3


def _status(sock: Path) -> dict[str, object] | None:
    out = io.StringIO()
    with redirect_stdout(out):
        code = ctl_main(["status", "--socket", str(sock), "--json"])
    return json.loads(out.getvalue())["status"] if code == 0 else None


def _counter(status: dict[str, object], name: str) -> int:
    counters = status["counters"]
    assert isinstance(counters, dict)
    return int(counters.get(name, 0))


def _prepare_failures(sock: Path) -> int:
    status = _status(sock)
    assert status is not None, "the daemon stopped answering"
    return _counter(status, "prepare_failures")


@pytest.mark.root
def test_the_real_daemon_on_a_kernel_without_sched_ext_does_not_retry_every_pass(
    tmp_path: Path,
) -> None:
    if Path("/sys/kernel/sched_ext").exists():
        pytest.skip("this kernel has sched_ext: a standby prepare does not fail here")
    fifo = ROOT / "build" / "bpf" / "fifo.bpf.o"
    if not fifo.is_file():
        missing_build_output(fifo, "schedulers")
    shutil.copy(fifo, tmp_path / "fifo.bpf.o")
    config = tmp_path / "schedswitchd.toml"
    config.write_text(
        'default = "kernel"\n[schedulers.fifo]\nobject = "fifo.bpf.o"\n'
        '[hints.battery]\nscheduler = "fifo"\npriority = 10\n'
        # one failure backs the switch off for 1 s only: the standby's hold is what is tested
        "[backoff]\nbase_s = 1.0\nmax_s = 1.0\n"
    )
    sock = tmp_path / "ssd.sock"
    proc = subprocess.Popen(
        [str(BIN / "schedswitchd"), "--config", str(config), "--socket", str(sock)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        # Until the start's pre-open is done (its vmlinux indexing takes the worker for a
        # while): the hint below lives 0.1 s only, and its switch must come in that time.
        while (status := _status(sock)) is None or not _counter(status, "preopens"):
            assert proc.poll() is None and time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.1)
        out = io.StringIO()
        with redirect_stdout(out):
            # the switch fails (no sched_ext); the hint ends at once (--ttl)
            ctl_main(["hint", "battery", "--ttl", "0.1", "--socket", str(sock), "--json"])
        # the switch's own prepare fails, then (after the 1 s backoff) the standby's
        while (failures := _prepare_failures(sock)) < 2:
            assert time.monotonic() < deadline + 30, f"{failures} prepare failures"
            time.sleep(0.2)
        time.sleep(4.0)  # four more safety-net passes: the standby is held back (10 s)
        assert _prepare_failures(sock) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert err.count("standby fifo not prepared") == 1, err
    assert "next try in 10 s" in err, err
