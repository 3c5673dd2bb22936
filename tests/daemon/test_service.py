"""The service: CLI flags, its own and systemd's sockets, sd_notify, journal fields, units."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from schedswitchd.cli.ctl import main as ctl_main
from schedswitchd.daemon import service
from schedswitchd.errors import ConfigError

from .harness import make_config
from .service_process import daemon_cmd, env

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def try_ctl(sock: Path, *args: str) -> Any | None:
    """``schedswitchctl ARGS --socket SOCK --json`` run in this process (the client code,
    without a Python start-up per query): its JSON document, or ``None`` when it exits
    non-zero (e.g. the daemon does not answer yet)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = ctl_main([*args, "--socket", str(sock), "--json"])
    return json.loads(out.getvalue()) if status == 0 else None


def ctl(sock: Path, *args: str) -> Any:
    reply = try_ctl(sock, *args)
    assert reply is not None, f"schedswitchctl {' '.join(args)} failed"
    return reply


def wait_socket(path: Path, proc: subprocess.Popen[Any], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "daemon died"
        time.sleep(0.05)
    raise AssertionError("daemon socket did not appear")


# The one-shot modes run in this process (service.main; the console script is that
# function, and tests/cli/test_cli_pipes.py runs it as a process): they leave it untuned
# (tests/daemon/test_memory_tuning.py), so later tests see the process as it was.


def test_print_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert service.main(["--print-schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "Config"


def test_check_config_on_shipped_file_says_what_it_checked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = service.main(["--check-config", "--config", str(ROOT / "config/schedswitchd.toml")])
    out = capsys.readouterr().out
    assert "configuration file is valid; checking schedulers..." in out
    last = out.splitlines()[-1]
    assert last.startswith(("config/schedswitchd.toml", str(ROOT))), last
    assert ("FAILED" in last) == (status == 1), out
    assert "NOT checked" in out or "prepared with" in out
    if not Path("/sys/kernel/sched_ext").exists():  # the host: said first, no kfunc noise
        first = out.splitlines()[0]
        assert first.startswith("NOTE: this kernel has no sched_ext"), out
        assert "kfunc" not in out
    for name in ("fifo", "vtime", "latency", "faulty"):
        assert f"  {name}: " in out
    built = all((ROOT / f"build/bpf/{n}.bpf.o").exists() for n in ("fifo", "vtime", "latency"))
    if not built:
        assert status == 1 and "No such file or directory" in out


def test_check_config_verdict_agrees_with_exit_status(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A valid file naming an unusable object: the first line claims only the file's
    validity, the last gives the verdict, and neither contradicts the exit status."""
    conf = workdir / "sched.toml"
    conf.write_text('[schedulers.broken]\nobject = "missing.o"\n')
    assert service.main(["--check-config", "--config", str(conf)]) == 1
    lines = capsys.readouterr().out.splitlines()
    first = next(line for line in lines if str(conf) in line)
    assert first == f"{conf}: configuration file is valid; checking schedulers...", lines
    assert any(line.startswith("  broken: FAILED [object] ") for line in lines), lines
    assert lines[-1] == f"{conf}: FAILED: 1 of 1 schedulers have problems (broken)", lines
    assert not any("configuration is valid" in line for line in lines)


def test_check_config_reports_config_errors(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = workdir / "bad.toml"
    bad.write_text("[limits]\nmax_conections = 1\n")
    assert service.main(["--check-config", "--config", str(bad)]) == os.EX_CONFIG
    assert f"{bad}: limits.max_conections: unknown key" in capsys.readouterr().err


class NotifyListener:
    """A stand-in for systemd's notify socket that keeps draining it (as systemd does)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self.running = True
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while self.running:
            with contextlib.suppress(TimeoutError):
                self.messages.append(self.sock.recv(4096).decode())

    def wait(self, predicate: Callable[[str], bool], timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in list(self.messages):
                if predicate(message):
                    return message
            time.sleep(0.02)
        raise AssertionError(f"no such notification in {self.messages[-10:]}")

    def close(self) -> None:
        self.running = False
        self.thread.join(2)
        self.sock.close()


def test_runs_with_own_socket_notifies_and_stops(workdir: Path) -> None:
    config = make_config(workdir)
    sock = workdir / "own.sock"
    notify_path = workdir / "notify"
    listener = NotifyListener(notify_path)
    proc = subprocess.Popen(
        daemon_cmd(Path(config.source or ""), "--socket", str(sock)),
        env=env(NOTIFY_SOCKET=str(notify_path), WATCHDOG_USEC="200000"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # A guard against a hang, not a bound: the daemon's start-up took over 10 s at load 11.
        ready = listener.wait(lambda m: m.startswith("READY=1"), timeout=120)
        assert "STATUS=running kernel" in ready
        assert oct(sock.stat().st_mode & 0o777) == oct(0o660)
        holder = subprocess.Popen(
            [str(BIN / "schedswitchctl"), "hint", "gaming", "--socket", str(sock), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert holder.stdout is not None
        assert json.loads(holder.stdout.readline())["active"] == "gaming"
        assert ctl(sock, "list")["leases"][0]["workload"] == "gaming"
        listener.wait(lambda m: m.startswith("STATUS=running gaming; 1 lease"))
        holder.terminate()  # the hint is held until schedswitchctl exits
        assert holder.wait(10) == 0
        status = ctl(sock, "status")["status"]
        assert status["pid"] == proc.pid
        assert status["leases"] == 0 and status["active"] == "kernel"
        # the start-up's objects frozen once it served (collector.freeze_startup_objects)
        assert status["counters"]["gc_frozen_objects"] > 1000, status["counters"]
        listener.wait(lambda m: m == "WATCHDOG=1")
        proc.send_signal(signal.SIGHUP)  # reload: still serving afterwards
        time.sleep(0.2)
        assert ctl(sock, "list")["default"] == "kernel"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        listener.wait(lambda m: m == "STOPPING=1")
        assert not sock.exists()
        _, stderr = proc.communicate()
        assert "schedswitchd: INFO: lease" in stderr and "switched kernel -> gaming" in stderr
        assert "configuration reloaded" in stderr
        assert "stopping; no scheduler is attached" in stderr and "stays pinned" not in stderr
    finally:
        proc.kill()
        listener.close()


def test_socket_activation(workdir: Path) -> None:
    config = make_config(workdir)  # its [socket] path is /run/...: must not be touched
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = workdir / "activated.sock"
    listener.bind(str(path))
    listener.listen(8)
    fd = listener.fileno()

    def to_fd3() -> None:
        os.dup2(fd, 3)

    proc = subprocess.Popen(
        [
            "sh",
            "-c",
            'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"',
            "sh",
            *daemon_cmd(Path(config.source or "")),
        ],
        env=env(),
        preexec_fn=to_fd3,
        close_fds=False,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        listener.close()
        deadline = time.monotonic() + 120  # a guard against a hang (start-up under load)
        while (reply := try_ctl(path, "status")) is None:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert reply["status"]["pid"] == proc.pid
        assert not Path("/run/schedswitchd.sock").exists() or not config.socket.path
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert path.exists()  # systemd's socket is systemd's to remove
    finally:
        proc.kill()


def test_restart_readopts_pinned_scheduler(workdir: Path) -> None:
    config = make_config(workdir)
    sock = workdir / "s.sock"
    proc = subprocess.Popen(
        daemon_cmd(Path(config.source or ""), "--socket", str(sock)),
        env=env(FAKE_PRELOAD="gaming"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_socket(sock, proc)
        status = ctl(sock, "status")["status"]
        assert status["adopted"] and status["active"] == "gaming"
        assert status["last_switch"]["result"] == "adopted"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_own_socket_refuses_live_and_non_socket_replaces_stale(workdir: Path) -> None:
    path = workdir / "x.sock"
    first = service.own_socket(str(path), 0o600, None)
    try:
        with pytest.raises(ConfigError, match="already listening"):
            service.own_socket(str(path), 0o600, None)
    finally:
        first.close()
    second = service.own_socket(str(path), 0o640, 0)  # stale file from `first`: replaced
    assert oct(path.stat().st_mode & 0o777) == oct(0o640)
    second.close()
    plain = workdir / "plain"
    plain.write_text("keep me")
    with pytest.raises(ConfigError, match="not a socket"):
        service.own_socket(str(plain), 0o600, None)
    assert plain.read_text() == "keep me"


def test_own_socket_listens_before_its_path_is_finished(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sees the socket's path connects: the daemon listens before it sets
    the file's mode (clients, and this suite's waits, take the path as the sign)."""
    path = workdir / "early.sock"
    refused: list[OSError] = []
    real_chmod = os.chmod

    def chmod_then_connect(target: str, mode: int) -> None:
        real_chmod(target, mode)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(target)
        except OSError as exc:
            refused.append(exc)
        finally:
            probe.close()

    monkeypatch.setattr(os, "chmod", chmod_then_connect)
    sock = service.own_socket(str(path), 0o600, None)
    sock.close()
    assert refused == []


def test_the_backend_is_not_a_command_line_option(workdir: Path) -> None:
    """Tests inject their backend from Python; ``--help`` shows no test seam."""
    config = make_config(workdir)
    with pytest.raises(SystemExit) as exit_:
        service.main(["--config", str(config.source), "--backend", "tests.daemon.fakes:x"])
    assert exit_.value.code == 2
    help_text = subprocess.run(
        [str(BIN / "schedswitchd"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--backend" not in help_text


def test_journal_handler_sends_structured_fields() -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    handler = service.JournalFieldsHandler(send=lambda msg, **kw: sent.append((msg, kw)))
    logger = logging.getLogger("test.journal")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning(
            "ejected", extra={"SCHEDULER": "gaming", "EXIT_KIND": "ERROR_STALL", "SWITCH_NS": 5}
        )
    finally:
        logger.removeHandler(handler)
    [(message, fields)] = sent
    assert message == "ejected"
    assert fields["PRIORITY"] == "4" and fields["SYSLOG_IDENTIFIER"] == "schedswitchd"
    assert (fields["SCHEDULER"], fields["EXIT_KIND"], fields["SWITCH_NS"]) == (
        "gaming",
        "ERROR_STALL",
        "5",
    )
    assert not any(k.islower() for k in fields)


def test_under_journal_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    st = os.fstat(2)
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    assert service.under_journal()
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")
    assert not service.under_journal()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_units_pass_systemd_analyze_verify(workdir: Path) -> None:
    # verify insists that ExecStart= exists: point it at this venv's script, nothing else
    for unit in ("schedswitchd.service", "schedswitchd.socket"):
        text = (ROOT / "systemd" / unit).read_text()
        (workdir / unit).write_text(
            text.replace("/usr/bin/schedswitchd", str(BIN / "schedswitchd"))
        )
    proc = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            str(workdir / "schedswitchd.socket"),
            str(workdir / "schedswitchd.service"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "schedswitchd" not in proc.stderr, proc.stderr
    service_text = (ROOT / "systemd/schedswitchd.service").read_text()
    for needle in ("Type=notify", "WatchdogSec=", "CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN"):
        assert needle in service_text


def test_socket_path_agrees_everywhere() -> None:
    from schedswitchd.daemon.config import SocketConfig, load_config
    from schedswitchd.daemon.launcher_wire import DEFAULT_SOCKET

    unit = (ROOT / "systemd/schedswitchd.socket").read_text()
    shipped = load_config(ROOT / "config/schedswitchd.toml")
    assert f"ListenStream={DEFAULT_SOCKET}" in unit
    assert SocketConfig().path == shipped.socket.path == DEFAULT_SOCKET
    assert (
        f"--config {service.DEFAULT_CONFIG}" in (ROOT / "systemd/schedswitchd.service").read_text()
    )
