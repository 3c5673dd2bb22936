"""``schedswitchctl``'s exit statuses tell apart a failed request (1), bad usage (2), an
unreachable daemon (3) and a refusal (4); with ``--json`` every error is one
``{"error": {"code", "message", "verifier_log"}}`` document on stdout (bpftool's way) and
one text line on stderr. Against a live server with the fake backend."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from schedswitchd.cli import ctl, exits
from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.launcher_wire import DENIED, LIMIT, SHUTTING_DOWN, DaemonError
from tests.daemon.fakes import FakeBackend
from tests.daemon.harness import Running

NO_SOCKET = "/nonexistent/schedswitchd-exits.sock"


@pytest.fixture
def srv(start_server: Callable[..., Running]) -> Running:
    return start_server(FakeBackend(verifier_reject={"broken"}), max_leases=1)


def _json_error(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 1, out
    doc = json.loads(lines[0])
    assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message", "verifier_log"}
    assert "schedswitchctl: " in err, err  # the text line (after any verifier log)
    return dict(doc["error"])


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["list"],
        ["history"],
        ["switch", "fifo"],
        ["stop"],
        ["reload"],
        ["hint", "gaming"],
        ["prepare", "gaming"],
        ["release", "L1"],
    ],
)
def test_unreachable_daemon_is_3_with_a_json_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert ctl.main([*argv, "--json", "--socket", NO_SOCKET]) == exits.EXIT_UNREACHABLE
    err = _json_error(capsys)
    assert err["code"] == "unavailable" and NO_SOCKET in err["message"]


def test_refusal_is_4(srv: Running, capsys: pytest.CaptureFixture[str]) -> None:
    holder = srv.client()
    assert holder.request(op="hint", workload="battery")["ok"]  # the uid's one lease
    assert ctl.main(["hint", "gaming", "--json", "--socket", srv.path]) == exits.EXIT_REFUSED
    err = _json_error(capsys)
    assert err["code"] == LIMIT and "leases already" in err["message"]
    holder.close()


def test_failed_requests_are_1(srv: Running, capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["release", "nope", "--json", "--socket", srv.path]) == exits.EXIT_FAILED
    err = _json_error(capsys)
    assert err["code"] == proto.UNKNOWN_LEASE and err["verifier_log"] is None
    assert ctl.main(["switch", "broken", "--json", "--socket", srv.path]) == exits.EXIT_FAILED
    err = _json_error(capsys)
    assert "switch to broken failed" in err["message"]
    assert err["verifier_log"] and "R1 invalid mem access" in err["verifier_log"]


def test_bad_usage_is_2(srv: Running, capsys: pytest.CaptureFixture[str]) -> None:
    # an argument value the request model refuses: nothing is sent
    assert ctl.main(["hint", "Not A Name", "--json", "--socket", srv.path]) == exits.EXIT_USAGE
    err = _json_error(capsys)
    assert err["code"] == "usage" and "workload" in err["message"]
    # argparse's own errors: its usage text on stderr, the document on stdout
    with pytest.raises(SystemExit) as info:
        ctl.main(["status", "--json", "--no-such-option"])
    assert info.value.code == exits.EXIT_USAGE
    out, err_text = capsys.readouterr()
    doc = json.loads(out)
    assert doc["error"]["code"] == "usage" and "--no-such-option" in doc["error"]["message"]
    assert "usage: schedswitchctl" in err_text and "unrecognized arguments" in err_text
    # without --json, stdout stays empty
    with pytest.raises(SystemExit):
        ctl.main(["status", "--no-such-option"])
    assert capsys.readouterr().out == ""


def test_local_errors_with_json(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.bpf.o"
    bad.write_bytes(b"not an ELF file")
    assert ctl.main(["object", "inspect", "--json", str(bad)]) == exits.EXIT_FAILED
    err = _json_error(capsys)
    assert err["code"] == "object" and "not an ELF file" in err["message"]
    assert ctl.main(["object", "inspect", "--json", str(tmp_path / "absent.o")]) == 1
    assert _json_error(capsys)["code"] == "object"


def test_success_prints_the_reply_and_is_0(
    srv: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ctl.main(["status", "--json", "--socket", srv.path]) == exits.EXIT_OK
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_status_mapping_and_help() -> None:
    def err(code: str) -> DaemonError:
        return DaemonError(code, "m")

    assert exits.exit_status(err(DENIED)) == exits.EXIT_REFUSED
    assert exits.exit_status(err(LIMIT)) == exits.EXIT_REFUSED
    assert exits.exit_status(err(SHUTTING_DOWN)) == exits.EXIT_UNREACHABLE
    assert exits.exit_status(err(proto.UNKNOWN_SCHEDULER)) == exits.EXIT_FAILED
    text = ctl.build_parser().format_help()
    for phrase in ("Exit status:", "2 bad usage", "3 the daemon is unreachable", "4 the daemon"):
        assert phrase in " ".join(text.split()), text
