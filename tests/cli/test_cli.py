"""schedswitchctl (tables and --json) and schedswitch-run against a live server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.cli import ctl, run
from tests.daemon.fakes import FakeBackend
from tests.daemon.harness import Running

BIN = Path(sys.executable).parent


@pytest.fixture
def srv(start_server: Callable[..., Running]) -> Running:
    return start_server(FakeBackend(verifier_reject={"broken"}))


def test_status_table_and_json(srv: Running, capsys: pytest.CaptureFixture[str]) -> None:
    holder = srv.client()
    holder.request(op="hint", workload="gaming")
    assert ctl.main(["status", "--socket", srv.path]) == 0
    table = capsys.readouterr().out
    assert "sched_ext    enabled  ops gaming_ops  enable_seq 1" in table
    assert "active       gaming" in table and "last switch  kernel -> gaming ok" in table
    assert ctl.main(["status", "--socket", srv.path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["status"]["kernel"]["ops"] == "gaming_ops"


def test_list_history_switch_stop(srv: Running, capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["switch", "vtime", "--socket", srv.path]) == 0
    assert "running vtime" in capsys.readouterr().out
    assert ctl.main(["list", "--socket", srv.path]) == 0
    out = capsys.readouterr().out
    assert "vtime" in out and "*active*" in out and "gaming       -> gaming (priority 50)" in out
    assert ctl.main(["stop", "--socket", srv.path]) == 0
    assert ctl.main(["history", "--socket", srv.path, "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    entries = json.loads(lines[-1])["entries"]
    assert [(e["previous"], e["target"]) for e in entries] == [
        ("kernel", "vtime"),
        ("vtime", "kernel"),
    ]


def test_errors_are_one_line_exit_1(srv: Running, capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["switch", "broken", "--socket", srv.path]) == 1
    err = capsys.readouterr().err
    assert "R1 invalid mem access" in err and "schedswitchctl: switch to broken failed" in err
    assert ctl.main(["release", "nope", "--socket", srv.path]) == 1
    assert "no live lease 'nope'" in capsys.readouterr().err
    assert ctl.main(["hint", "Not A Name", "--socket", srv.path]) == 2  # bad usage
    assert "workload: String should match" in capsys.readouterr().err
    assert ctl.main(["status", "--socket", "/nonexistent/sock"]) == 3  # unreachable
    assert "cannot connect to /nonexistent/sock" in capsys.readouterr().err


def test_release_by_id(srv: Running, capsys: pytest.CaptureFixture[str]) -> None:
    holder = srv.client()
    lease = holder.request(op="hint", workload="battery")["lease"]
    assert ctl.main(["release", lease, "--socket", srv.path]) == 0
    assert f"released {lease}; running kernel" in capsys.readouterr().out


def test_schedswitch_run_holds_hint_for_command(srv: Running) -> None:
    marker = srv.dir / "ran"
    proc = subprocess.Popen(
        [
            str(BIN / "schedswitch-run"),
            "--socket",
            srv.path,
            "gaming",
            "--",
            "sh",
            "-c",
            f"touch {marker}; sleep 0.5; exit 3",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    # the hint was taken before the command started
    assert srv.backend.kernel_state().ops == "gaming_ops"
    assert proc.wait(20) == 3
    srv.wait_for(lambda s: not s.policy.leases and s.switcher.active == "kernel")
    assert proc.stderr is not None and "gaming -> running gaming" in proc.stderr.read()


def test_schedswitch_run_command_inherits_fds_and_default_sigpipe(
    srv: Running, tmp_path: Path
) -> None:
    """The command starts as ``exec`` would leave it: an inheritable descriptor of the
    wrapper's is there (a launcher may pass one on), the daemon connection is not, and
    ``SIGPIPE`` is not ignored (Python ignores it; ``yes | head`` in a game's script must end)."""
    out = tmp_path / "seen"
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    try:
        script = f"ls -l /proc/$$/fd > {out}; grep SigIgn /proc/$$/status >> {out}"
        assert run.main(["-q", "--socket", srv.path, "gaming", "--", "sh", "-c", script]) == 0
    finally:
        os.close(read_end)
        os.close(write_end)
    seen = out.read_text()
    assert f" {write_end} -> pipe:" in seen, seen
    assert "socket:" not in seen, seen
    sig_ign = int(seen.split("SigIgn:")[1].split()[0], 16)
    assert not sig_ign & (1 << (signal.SIGPIPE - 1)), seen
    assert not sig_ign & (1 << (signal.SIGXFSZ - 1)), seen


def test_schedswitch_run_without_daemon_still_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code = run.main(["--socket", "/nonexistent/s", "gaming", "--", "sh", "-c", "exit 7"])
    assert code == 7
    assert "running without it" in capsys.readouterr().err


def test_schedswitch_run_refused_hint_still_runs(
    srv: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run.main(["--socket", srv.path, "no-such", "--", "true"]) == 0
    assert "unknown_workload" in capsys.readouterr().err


def test_schedswitch_run_signal_exit_status() -> None:
    assert (
        run.main(["-q", "--socket", "/nonexistent/s", "x", "--", "sh", "-c", "kill -9 $$"]) == 137
    )
    assert run.main(["-q", "--socket", "/nonexistent/s", "x", "--", "/nonexistent/cmd"]) == 127


def test_status_without_sched_ext(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="schedswitchd")
    r = Running(FakeBackend(state="unavailable"))
    try:
        assert "this kernel has no sched_ext" in caplog.text
        assert ctl.main(["status", "--socket", r.path]) == 0
        table = capsys.readouterr().out
        assert "sched_ext    not available in this kernel" in table
        assert "None" not in table
    finally:
        r.stop()


def test_hint_line_shows_a_failed_switch_and_status_shows_live_leases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from schedswitchd.daemon import launcher_wire
    from schedswitchd.daemon import protocol as proto

    r = Running(FakeBackend(fail_prepare={"gaming"}))
    try:
        holder = r.client()
        raw = holder.request(op="hint", workload="gaming")
        reply = proto.parse_reply(json.dumps(raw).encode())
        assert isinstance(reply, proto.HintReply) and reply.scheduler == "gaming"
        line = launcher_wire.hint_summary("gaming", raw)
        assert line.startswith(f"lease {reply.lease}: gaming -> running kernel")
        assert "(switch to gaming failed: gaming: kfunc scx_bpf_nope not found" in line
        assert ctl.main(["status", "--socket", r.path]) == 0
        table = capsys.readouterr().out
        assert "lease        none of the 1 live lease(s) decides what runs" in table
        assert f"  {reply.lease}  gaming -> gaming (priority 50)" in table
        assert "lease        -" not in table
    finally:
        r.stop()


def test_schedswitch_run_says_why_its_workloads_scheduler_does_not_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A gamer sees the failed switch and its cause on the launch line, as with
    ``schedswitchctl hint`` (it once said only "gaming -> kernel")."""
    r = Running(FakeBackend(fail_prepare={"gaming"}))
    try:
        assert run.main(["--socket", r.path, "gaming", "--", "true"]) == 0
        err = capsys.readouterr().err
        assert "gaming -> running kernel (switch to gaming failed: gaming: kfunc scx_bpf_nope" in (
            err
        ), err
    finally:
        r.stop()


def test_the_launch_line_says_why_the_policy_passed_its_scheduler_over(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """After a failed switch the next launch names the backoff; an admin override and a
    higher-ranked lease are named too (the line once offered all three as guesses)."""
    r = Running(FakeBackend(fail_prepare={"gaming"}))
    try:
        assert run.main(["--socket", r.path, "gaming", "--", "true"]) == 0
        assert "switch to gaming failed" in capsys.readouterr().err
        assert run.main(["--socket", r.path, "gaming", "--", "true"]) == 0
        err = capsys.readouterr().err
        assert "gaming -> running kernel (gaming not chosen: gaming is held back after 1 " in err
        assert " s left; the last: gaming: kfunc scx_bpf_nope not found in kernel BTF)" in err
        holder = r.client()
        lease = holder.request(op="hint", workload="video-call")["lease"]
        assert run.main(["--socket", r.path, "battery", "--", "true"]) == 0
        err = capsys.readouterr().err
        assert f"(fifo not chosen: lease {lease} (video-call, priority 30) ranks higher)" in err
        assert ctl.main(["switch", "fifo", "--socket", r.path]) == 0
        capsys.readouterr()
        assert run.main(["--socket", r.path, "video-call", "--", "true"]) == 0
        err = capsys.readouterr().err
        assert "(vtime not chosen: an admin override runs fifo)" in err, err
    finally:
        r.stop()


def test_the_launch_line_guesses_for_a_daemon_that_does_not_say_why() -> None:
    """A reply without ``passed_over`` (a daemon from before it) still gets a reason."""
    from schedswitchd.daemon.launcher_wire import hint_summary

    reply = {"lease": "1-ab", "scheduler": "gaming", "desired": "vtime", "active": "vtime"}
    assert hint_summary("gaming", reply) == (
        "lease 1-ab: gaming -> running vtime"
        " (gaming not chosen: a higher-priority lease, an override or backoff)"
    )
    said = hint_summary("gaming", {**reply, "passed_over": "an admin override runs vtime"})
    assert said.endswith("(gaming not chosen: an admin override runs vtime)")


def test_schedswitch_run_needs_workload_before_dashes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run.main(["--socket", "/nonexistent/s", "--", "echo", "hi"])
    assert info.value.code == 2
    assert "WORKLOAD is missing before '--'" in capsys.readouterr().err
    # A "--" after the command belongs to the command.
    code = run.main(["-q", "--socket", "/nonexistent/s", "x", "sh", "-c", "exit 3", "--"])
    assert code == 3


def test_exit_and_counter_texts() -> None:
    from schedswitchd.cli.daemon_cmds import _counters_text, _exit_text
    from schedswitchd.daemon.protocol import ExitInfo

    # The objects as the daemon sends them: ExitInfo's JSON.
    e = ExitInfo(kind=1025, kind_name="ERROR_BPF", reason="scx_bpf_error", message="boom")
    assert _exit_text(e.model_dump(mode="json")) == "ERROR_BPF: scx_bpf_error: boom"
    assert _exit_text(ExitInfo(kind=64).model_dump(mode="json")) == "UNREG"
    text = _counters_text({"btf_cache_hits": 3, "prepares": 2, "attach.link_ns": 5})
    assert text == "btf_cache_hits=3 prepares=2 (+1 more with --json)"
    assert _counters_text({}) == "-"


def _caught_signals(pid: int) -> set[int]:
    """The signals process ``pid`` has a handler for (``SigCgt`` of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            mask = int(line.split()[1], 16)
            return {n + 1 for n in range(64) if mask >> n & 1}
    raise AssertionError("no SigCgt line")


@pytest.mark.parametrize("answered", [True, False])
def test_hint_cli_takes_sigterm_from_the_moment_it_asks(tmp_path: Path, answered: bool) -> None:
    """A launcher may stop ``schedswitchctl hint`` as soon as the reply line is out: the
    SIGTERM handler is in place when the request reaches the daemon (a listening socket
    here, which reads the client's SigCgt), so SIGTERM right after the reply ends the hold
    with 0 (with the handler set after the print, that was a death by SIGTERM, -15), and
    SIGTERM before any reply gives 130 with a line saying so."""
    path = tmp_path / "d.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)
        listener.settimeout(120)  # a hang guard
        proc = subprocess.Popen(
            [str(BIN / "schedswitchctl"), "hint", "gaming", "--socket", str(path), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(120)
                request = json.loads(conn.makefile("rb").readline())
                assert request["op"] == "hint"
                assert signal.SIGTERM in _caught_signals(proc.pid)
                if answered:
                    reply = {"v": 1, "ok": True, "op": "hint", "lease": "l1", "active": "gaming"}
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                    assert proc.stdout is not None
                    assert json.loads(proc.stdout.readline())["lease"] == "l1"
                proc.send_signal(signal.SIGTERM)
                out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
            proc.wait()
    if answered:
        assert proc.returncode == 0, err
    else:
        assert proc.returncode == 130, err
        assert out == "" and "interrupted before the daemon answered" in err


def test_list_columns_fit_the_longest_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mode variant's name (``bpfland@lowlatency``) is longer than the old fixed column:
    every scheduler's object and every hint's arrow still start in one column."""
    from schedswitchd.cli import daemon_cmds

    reply = {
        "default": "kernel",
        "schedulers": [
            {"name": "fifo", "object": "/o/fifo.bpf.o"},
            {"name": "bpfland@lowlatency", "object": "/o/bpfland.bpf.o", "active": True},
        ],
        "hints": [{"workload": "gaming", "scheduler": "bpfland", "priority": 50}],
        "leases": [],
    }
    monkeypatch.setattr(daemon_cmds, "_call", lambda args, request: reply)
    assert ctl.main(["list", "--socket", "unused"]) == 0
    lines = capsys.readouterr().out.splitlines()
    objects = {line.index("/o/") for line in lines if "/o/" in line}
    assert objects == {len("  bpfland@lowlatency ")}, lines
    [hint] = [line for line in lines if "->" in line]
    assert hint.index("->") == len("  bpfland@lowlatency "), lines
