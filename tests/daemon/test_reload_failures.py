"""A reload that fails in a way :func:`~schedswitchd.daemon.config.load_config` does not
type (a defect in reading, not a bad file) is still a refused reload: recorded in
``status.reload`` with its reason, the old configuration kept, the daemon serving. Driven
through the real serving path (:func:`schedswitchd.daemon.service.serve`): SIGHUP's task
and a ``reload`` request."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from schedswitchd.daemon import server as server_module
from schedswitchd.daemon.service import serve

from .fakes import FakeBackend
from .harness import Client, make_config


def _broken_load_config(path: str | Path) -> Any:
    raise RuntimeError(f"the reader fell over on {path}")


def test_an_untyped_failure_of_a_reload_is_recorded_and_the_daemon_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = Path(tempfile.mkdtemp(prefix="ssd-"))
    config = make_config(directory)
    path = str(directory / "s.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(16)
    failed_tasks: list[BaseException] = []

    def scenario() -> dict[str, Any]:
        c = Client(path)
        assert c.request(op="status")["status"]["reload"] is None
        os.kill(os.getpid(), signal.SIGHUP)  # serve()'s handler starts a reload task
        deadline = time.monotonic() + 10
        while (status := c.request(op="status")["status"])["reload"] is None:
            assert time.monotonic() < deadline, "SIGHUP's reload left no record"
            time.sleep(0.02)
        after_sighup = status
        reply = c.request(op="reload", id=7)
        after_request = c.request(op="status")["status"]
        listed = c.request(op="list")
        hint = c.request(op="hint", workload="battery")  # still serving, old rules
        c.close()
        return {
            "list": listed,
            "sighup": after_sighup,
            "reply": reply,
            "request": after_request,
            "hint": hint,
        }

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: failed_tasks.append(ctx["exception"]))
        serving = asyncio.create_task(serve(config, FakeBackend(), sock))
        try:
            return await asyncio.to_thread(scenario)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # serve()'s stop
            await asyncio.wait_for(serving, 10)

    monkeypatch.setattr(server_module, "load_config", _broken_load_config)
    try:
        seen = asyncio.run(main())
    finally:
        sock.close()
        shutil.rmtree(directory, ignore_errors=True)
    for status in (seen["sighup"], seen["request"]):
        record = status["reload"]
        assert record["ok"] is False, record
        assert "RuntimeError: the reader fell over" in record["error"], record
    reply = seen["reply"]
    assert reply["ok"] is False and (reply["op"], reply["id"]) == ("reload", 7)
    assert reply["error"]["code"] == "config", reply
    assert "RuntimeError: the reader fell over" in reply["error"]["message"]
    # the old configuration stays in force
    assert {s["name"] for s in seen["list"]["schedulers"]} >= {"fifo", "vtime", "gaming"}
    assert seen["hint"]["ok"] and seen["hint"]["active"] == "fifo", seen["hint"]
    assert failed_tasks == []  # no task died with an exception nobody read
