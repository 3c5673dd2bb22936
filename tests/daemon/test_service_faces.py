"""The serving path's hook for extra faces (:class:`schedswitchd.daemon.service.FaceStarter`):
started once on the in-process interface when the configuration has a ``[dbus]`` table,
closed at stop; without a table never called; a ``[dbus]`` table served by an entry point
that passes no starter is logged, not silently dropped. Driven through the real
:func:`schedswitchd.daemon.service.serve` with the fake backend (the D-Bus faces themselves:
tests/desktop; the ``schedswitchd`` command passing them: tests/daemon/test_start_path.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedswitchd.daemon.config import Config, parse_config
from schedswitchd.daemon.control import DaemonControl
from schedswitchd.daemon.service import FaceStarter, StartedFaces, serve

from .fakes import FakeBackend
from .harness import Client, make_config


class _Recorder:
    """A starter that records its calls and what was closed."""

    def __init__(self) -> None:
        self.controls: list[DaemonControl] = []
        self.closed = 0

    async def __call__(self, control: DaemonControl) -> StartedFaces:
        self.controls.append(control)
        return self

    async def close(self) -> None:
        self.closed += 1


def _config(directory: Path, dbus: bool) -> Config:
    config = make_config(directory)
    if not dbus:
        return config
    assert config.source is not None
    text = Path(config.source).read_text() + "\n[dbus]\n"
    return parse_config(text, config.source)


def _serve_once(config: Config, start_faces: FaceStarter | None, directory: Path) -> str:
    """Serve until one ``status`` was answered, then stop as SIGTERM does; the status's
    active scheduler."""
    path = str(directory / "s.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(16)

    def ask() -> str:
        c = Client(path)
        try:
            return str(c.request(op="status")["status"]["active"])
        finally:
            c.close()

    async def main() -> str:
        serving = asyncio.create_task(serve(config, FakeBackend(), sock, start_faces=start_faces))
        try:
            return await asyncio.to_thread(ask)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # serve()'s stop
            await asyncio.wait_for(serving, 10)

    try:
        return asyncio.run(main())
    finally:
        sock.close()


@pytest.fixture
def directory() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ssd-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_dbus_table_starts_the_faces_once_and_stop_closes_them(directory: Path) -> None:
    faces = _Recorder()
    _serve_once(_config(directory, dbus=True), faces, directory)
    assert len(faces.controls) == 1
    assert isinstance(faces.controls[0], DaemonControl)
    assert faces.closed == 1


def test_without_a_dbus_table_the_starter_is_not_called(directory: Path) -> None:
    faces = _Recorder()
    _serve_once(_config(directory, dbus=False), faces, directory)
    assert faces.controls == [] and faces.closed == 0


def test_a_dbus_table_without_a_starter_is_logged(
    directory: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="schedswitchd"):
        _serve_once(_config(directory, dbus=True), None, directory)
    assert any("serves no D-Bus faces" in r.getMessage() for r in caplog.records), caplog.text
