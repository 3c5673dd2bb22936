"""Object paths that are not a BPF object's file: a FIFO (whose open would block), a symlink
loop, a NUL byte. Each is a typed error, in the configuration or at the open, and never
blocks the daemon's one switch worker."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.daemon.config import parse_config
from schedswitchd.errors import ConfigError, ObjectError
from schedswitchd.kernel.spec_cache import SpecCache

from .harness import Running
from .service_process import env

BIN = Path(sys.executable).parent


def _fifo(directory: Path) -> Path:
    path = directory / "fifo.bpf.o"
    os.mkfifo(path)
    return path


def _loop(directory: Path) -> Path:
    path = directory / "loop.bpf.o"
    path.symlink_to(path.name)
    return path


def _opened_within(opener: Callable[[str], object], fifo: Path, bound_s: float) -> BaseException:
    """What ``opener(fifo)`` raised, run on a thread; AssertionError if it was still in
    its open after ``bound_s`` s (the FIFO then gets a writer, so the thread ends)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            opener(str(fifo))
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound_s)
    if thread.is_alive():
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        raise AssertionError(f"{opener} blocked in the open of a FIFO")
    assert raised, f"{opener} opened a FIFO"
    return raised[0]


def test_a_fifo_is_refused_at_once_by_every_open(workdir: Path) -> None:
    fifo = _fifo(workdir)
    for opener in (SpecCache().open, open_object):
        raised = _opened_within(opener, fifo, 5.0)
        assert isinstance(raised, ObjectError) and "a FIFO" in str(raised), raised
    for device in ("/dev/null", str(workdir)):
        with pytest.raises(ObjectError, match=r"device|directory"):
            SpecCache().open(device)


@pytest.mark.parametrize(
    ("value", "why"),
    [("a\\u0000b.bpf.o", "NUL byte"), ("loop.bpf.o", "symlink loop")],
)
def test_unusable_object_paths_are_config_errors(workdir: Path, value: str, why: str) -> None:
    _loop(workdir)
    text = f'[schedulers.x]\nobject = "{value}"\n'
    with pytest.raises(ConfigError, match=rf"schedulers\.x\.object: .*{why}"):
        parse_config(text, str(workdir / "schedswitchd.toml"))


def test_check_config_refuses_a_fifo_and_a_loop(workdir: Path) -> None:
    """``--check-config`` (the real backend, or static checks without sched_ext) answers
    for a FIFO instead of blocking in its open, and a symlink loop is a configuration
    error, not a traceback."""
    _fifo(workdir)
    config = workdir / "fifo.toml"
    config.write_text('[schedulers.f]\nobject = "fifo.bpf.o"\n')
    done = subprocess.run(
        [str(BIN / "schedswitchd"), "--check-config", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "a FIFO" in done.stdout
    _loop(workdir)
    config.write_text('[schedulers.f]\nobject = "loop.bpf.o"\n')
    done = subprocess.run(
        [str(BIN / "schedswitchd"), "--check-config", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == os.EX_CONFIG  # the configuration itself does not load
    assert "schedulers.f.object: 'loop.bpf.o': a symlink loop" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.root  # the real backend
def test_the_daemon_with_a_fifo_object_still_switches_and_stops(workdir: Path) -> None:
    """The real backend pre-opens a FIFO as its default's object: refused, the worker goes
    on (``status`` answers, SIGTERM stops the daemon)."""
    _fifo(workdir)
    config = workdir / "d.toml"
    config.write_text('default = "f"\n[schedulers.f]\nobject = "fifo.bpf.o"\n')
    sock = workdir / "d.sock"
    proc = subprocess.Popen(
        [str(BIN / "schedswitchd"), "--config", str(config), "--socket", str(sock)],
        env=env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        # A reconcile pass, then the pre-open of f, then a pass the admin's switch starts.
        for _ in range(2):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(60)
            probe.connect(str(sock))
            probe.sendall(b'{"v":1,"op":"switch","scheduler":"f"}\n')
            reply = probe.makefile().readline()
            probe.close()
            assert '"ok":false' in reply.replace(" ", "") and "FIFO" in reply, reply
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_reload_with_an_unusable_object_path_is_refused_and_shown(workdir: Path) -> None:
    """A ``reload`` request and the SIGHUP path (``Server.reload``) meet a symlink loop as
    a configuration error: the reply's code is ``config`` and ``status.reload`` says it."""
    r = Running()
    try:
        _loop(r.dir)
        text = (r.dir / "schedswitchd.toml").read_text()
        (r.dir / "schedswitchd.toml").write_text(
            text.replace('object = "fifo.bpf.o"', 'object = "loop.bpf.o"')
        )
        c = r.client()
        reply = c.request(op="reload")
        assert reply["ok"] is False and reply["error"]["code"] == "config", reply
        assert "symlink loop" in reply["error"]["message"]
        status = c.request(op="status")["status"]
        assert status["reload"]["ok"] is False and "symlink loop" in status["reload"]["error"]
        assert r.server is not None
        with pytest.raises(ConfigError):
            r.run(r.server.reload())
    finally:
        r.stop()
