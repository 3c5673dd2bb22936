"""``schedswitchctl``'s daemon commands run on the standard library alone (target: ``status``
in at most 120 ms; pydantic and asyncio cost more than that to import on the dev host), and
what they build and print is what the protocol's pydantic models build and print.

Each command runs in a fresh interpreter against a live server (fake backend), so the
whole path counts: argument parsing, the request, the reply and its rendering.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schedswitchd.cli import daemon_cmds
from schedswitchd.cli.exits import UsageError
from schedswitchd.daemon import protocol as proto
from schedswitchd.daemon.launcher_wire import PID_MAX_LIMIT
from tests import fuzzing
from tests.daemon.fakes import FakeBackend
from tests.daemon.harness import Running

REPO = Path(__file__).resolve().parents[2]

HEAVY = ("pydantic", "pydantic_core", "asyncio")
#: Runs ``schedswitchctl ARGS...`` and then prints, on stderr's last line, which of HEAVY
#: the interpreter imported along the way.
PROBE = (
    "import sys\n"
    "from schedswitchd.cli import ctl\n"
    "try:\n"
    "    code = ctl.main(sys.argv[1:])\n"
    "finally:\n"
    f"    print('imported:' + ','.join(m for m in {HEAVY!r} if m in sys.modules),"
    " file=sys.stderr)\n"
    "sys.exit(code)\n"
)


@pytest.fixture(scope="module")
def srv() -> Iterator[Running]:
    running = Running(FakeBackend(verifier_reject={"broken"}))
    yield running
    running.stop()


def _ctl(*argv: str) -> tuple[int, str, str, str]:
    """Exit status, stdout, stderr (without the probe's line) and what was imported."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120
    )
    *err, probe = out.stderr.splitlines()
    assert probe.startswith("imported:"), out.stderr
    return out.returncode, out.stdout, "\n".join(err), probe.removeprefix("imported:")


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["status"], 0),
        (["status", "--json"], 0),
        (["list"], 0),
        (["history", "--limit", "5"], 0),
        (["switch", "fifo"], 0),
        (["switch", "broken"], 1),  # an error reply with a verifier log
        (["stop", "--json"], 0),
        (["reload"], 0),
        (["prepare", "gaming", "--ttl", "5"], 0),
        (["hint", "gaming", "--ttl", "0.2"], 0),  # held until the daemon's lease_ended
        (["release", "nope"], 1),
        (["hint", "nosuch", "--json"], 1),
    ],
)
def test_daemon_commands_import_neither_pydantic_nor_asyncio(
    srv: Running, argv: list[str], status: int
) -> None:
    code, out, err, imported = _ctl(argv[0], "--socket", srv.path, *argv[1:])
    assert code == status, out + err
    assert imported == "", f"{argv}: imported {imported}"


def test_an_unreachable_daemon_imports_neither() -> None:
    code, _, err, imported = _ctl("--socket", "/nonexistent/ssd-light.sock", "status")
    assert code == 3 and "cannot connect" in err
    assert imported == ""


def test_schedswitch_run_imports_neither(srv: Running, tmp_path: Path) -> None:
    """The launcher's whole path (hint, the command's start, its end, the release) in a
    fresh interpreter: none of HEAVY, nor ``subprocess``, ``typing`` or, on the usual
    line, ``argparse`` (its start is what a game's launch waits for)."""
    probe = (
        "import sys\n"
        "from schedswitchd.cli import run\n"
        "code = run.main(sys.argv[1:])\n"
        "heavy = ('pydantic', 'pydantic_core', 'asyncio', 'subprocess', 'typing', 'argparse')\n"
        "print('imported:' + ','.join(m for m in heavy if m in sys.modules), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    marker = tmp_path / "ran"
    argv = ["--socket", srv.path, "gaming", "--", "touch", str(marker)]
    out = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True)
    assert out.returncode == 0 and marker.exists(), out.stderr
    assert "lease " in out.stderr  # the hint was taken
    assert out.stderr.splitlines()[-1] == "imported:", out.stderr


def test_json_output_is_the_protocol_models_json(srv: Running) -> None:
    """``--json`` prints the reply line as received; it is what the pydantic client printed
    (``model_dump_json`` of the parsed reply), byte for byte."""
    for argv in (["status"], ["list"], ["history"], ["switch", "vtime"], ["stop"]):
        code, out, err, _ = _ctl(argv[0], "--socket", srv.path, "--json", *argv[1:])
        assert code == 0, err
        line = out.rstrip("\n")
        assert proto.parse_reply(line.encode()).model_dump_json() == line, argv


def test_an_argument_the_checks_refuse_is_judged_by_the_model() -> None:
    """A bad argument still gets the model's words (and exit 2)."""
    with pytest.raises(UsageError, match=r"^workload: String should match pattern"):
        daemon_cmds.make_request("hint", workload="Not A Name", pid=None, ttl_s=None)
    with pytest.raises(UsageError, match=r"^limit: Input should be greater than or equal to 1"):
        daemon_cmds.make_request("history", limit=0)
    with pytest.raises(UsageError, match=r"^ttl_s: Input should be less than or equal to 3600"):
        daemon_cmds.make_request("prepare", workload="gaming", ttl_s=4000.0)


_MODELS: dict[str, type[Any]] = {
    "hint": proto.HintRequest,
    "prepare": proto.PrepareRequest,
    "release": proto.ReleaseRequest,
    "history": proto.HistoryRequest,
    "switch": proto.SwitchRequest,
}
_NAMES = st.one_of(
    st.from_regex(r"[a-z0-9][a-z0-9_-]{0,33}", fullmatch=True),
    st.from_regex(r"[a-z0-9]{1,3}@[a-z0-9_-]{0,4}", fullmatch=True),
    st.text(max_size=40),
    st.sampled_from(["gaming", "lavd@gaming", "a" * 32, "a" * 33, "-x", "x\n", "gaming@"]),
)
_NUMBERS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=PID_MAX_LIMIT + 5),
    st.sampled_from([0, 1, 3600, 3601, 10000, 10001, PID_MAX_LIMIT, 10 * 365 * 86400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-300, 3600.0, 3600.0000001, 315360000.0, 315360000.5]),
)
_FIELDS = {
    "hint": {"workload": _NAMES, "pid": _NUMBERS, "ttl_s": _NUMBERS},
    "prepare": {"workload": _NAMES, "ttl_s": _NUMBERS},
    "release": {"lease": st.one_of(_NAMES, st.text(min_size=60, max_size=70))},
    "history": {"limit": _NUMBERS},
    "switch": {"scheduler": _NAMES},
}


@st.composite
def _requests(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    op = draw(st.sampled_from(sorted(_FIELDS)))
    fields = {name: draw(strategy) for name, strategy in _FIELDS[op].items()}
    return op, fields


@settings(max_examples=fuzzing.examples(3000), deadline=None)
@given(_requests())
def test_the_quick_checks_accept_only_what_the_model_accepts(
    case: tuple[str, dict[str, Any]],
) -> None:
    """The stdlib checks of :func:`daemon_cmds.make_request` are sound: whatever they let
    through (the fast path, no pydantic) the protocol's request model accepts too, and the
    request sent parses as that model on the daemon's side."""
    op, fields = case
    checks = daemon_cmds._CHECKS[op]
    if not all(check(fields[name]) for name, check in checks.items()):
        return
    model = _MODELS[op](**fields)  # must not raise
    request = daemon_cmds.make_request(op, **fields)
    line = json.dumps({"v": 1, **request}).encode()
    assert proto.parse_request(line) == model


def test_the_usual_arguments_take_the_fast_path() -> None:
    usual: list[tuple[str, dict[str, Any]]] = [
        ("hint", {"workload": "gaming", "pid": 4242, "ttl_s": 60.0}),
        ("hint", {"workload": "video-call", "pid": None, "ttl_s": None}),
        ("prepare", {"workload": "gaming", "ttl_s": 30.0}),
        ("release", {"lease": "7-1f2e3d4c"}),
        ("history", {"limit": 20}),
        ("switch", {"scheduler": "lavd@gaming"}),
        ("switch", {"scheduler": "kernel"}),
    ]
    for op, fields in usual:
        checks = daemon_cmds._CHECKS[op]
        assert all(check(fields[name]) for name, check in checks.items()), (op, fields)


def test_what_the_models_refuse_the_checks_refuse() -> None:
    """The other direction on the edges (not needed for soundness, but a check that
    refuses everything would pass the property test and always import pydantic)."""
    edges: list[tuple[str, dict[str, Any]]] = [
        ("hint", {"workload": "gaming", "pid": 0, "ttl_s": None}),
        ("hint", {"workload": "gaming", "pid": None, "ttl_s": 0.0}),
        ("hint", {"workload": "x" * 33, "pid": None, "ttl_s": None}),
        ("prepare", {"workload": "gaming", "ttl_s": 3600.5}),
        ("release", {"lease": ""}),
        ("history", {"limit": 10001}),
        ("switch", {"scheduler": "a@b@c"}),
    ]
    for op, fields in edges:
        with pytest.raises(ValidationError):
            _MODELS[op](**fields)
        checks = daemon_cmds._CHECKS[op]
        assert not all(check(fields[name]) for name, check in checks.items()), (op, fields)


_RUN_WORDS = st.sampled_from(
    ["-q", "--quiet", "--socket", "--socket=/s", "/s", "gaming", "x", "--", "-", "", "--ttl",
     "5", "--prepare-only", "--sock", "--qu", "-x", "-qq", "cmd", "arg", "--help"]
)  # fmt: skip


@settings(max_examples=fuzzing.examples(2000), deadline=None)
@given(st.lists(_RUN_WORDS, max_size=8))
# Found by this test in a make test run: an option after WORKLOAD belongs to the command.
@example(["/s", "-q", "--", "-q"])
@example(["gaming", "--socket", "/s", "--", "true"])
def test_schedswitch_runs_quick_parse_agrees_with_argparse(argv: list[str]) -> None:
    """Whatever launch line ``_quick_parse`` reads (without argparse), the argparse path of
    ``schedswitch-run`` reads the same: workload, socket, quiet and command."""
    from unittest import mock

    from schedswitchd.cli import run

    quick = run._quick_parse(list(argv))
    if quick is None:
        return
    with (
        mock.patch.object(run, "_quick_parse", return_value=None),
        mock.patch.object(run, "_run", return_value=0) as slow_run,
    ):
        assert run._main(list(argv)) == 0
    slow_run.assert_called_once_with(*quick)


def test_the_usual_launch_lines_are_read_quickly() -> None:
    from schedswitchd.cli import run

    assert run._quick_parse(["gaming", "--", "true"]) == ("gaming", None, False, ["true"])
    assert run._quick_parse(["-q", "--socket", "/s", "g", "--", "a", "--", "b"]) == (
        "g", "/s", True, ["a", "--", "b"]
    )  # fmt: skip
    for slow in (["g", "cmd", "--"], ["--prepare-only", "g", "--", "x"], ["g", "--"]):
        assert run._quick_parse(slow) is None


#: What the usual launch line does not import before the command starts, nor ``status``
#: at all (targets: start to exec at most 60 ms, status 120 ms): each is milliseconds of a
#: start on the dev host (``python -X importtime``).
_NOT_ON_THE_QUICK_PATHS = (
    "argparse", "json", "re", "enum", "functools", "collections", "socket", "signal",
    "threading", "typing", "subprocess", "contextlib", "shutil", "locale", "gettext",
)  # fmt: skip


def _no_site(code: str) -> list[str]:
    """``python -S -c code`` with this checkout first on sys.path: a fresh interpreter
    without site, whose hooks in the development venv (its editable-install finder) import
    some of :data:`_NOT_ON_THE_QUICK_PATHS` themselves; a regular install has no such hook."""
    return [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n{code}"]


def test_the_launch_line_imports_little_before_the_command_starts(
    srv: Running, tmp_path: Path
) -> None:
    """What ``sys.modules`` holds when ``schedswitch-run``'s usual line spawns its command
    (a hint taken, the reply read): none of :data:`_NOT_ON_THE_QUICK_PATHS`."""
    probe = (
        "import os\n"
        "spawn, seen = os.posix_spawnp, []\n"
        "def spy(*args, **kwargs):\n"
        f"    seen.extend(m for m in {_NOT_ON_THE_QUICK_PATHS!r} if m in sys.modules)\n"
        "    return spawn(*args, **kwargs)\n"
        "os.posix_spawnp = spy\n"
        "from schedswitchd.cli import run\n"
        "code = run.main(sys.argv[1:])\n"
        "print('imported:' + ','.join(seen), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    marker = tmp_path / "ran"
    argv = ["--socket", srv.path, "gaming", "--", "touch", str(marker)]
    out = subprocess.run([*_no_site(probe), *argv], capture_output=True, text=True)
    assert out.returncode == 0 and marker.exists(), out.stderr
    assert "lease " in out.stderr  # the hint was taken
    assert out.stderr.splitlines()[-1] == "imported:", out.stderr


@pytest.mark.parametrize(
    "argv",
    [["status"], ["--socket", "{sock}", "status", "--json"], ["list", "--socket", "{sock}"]],
)
def test_status_imports_little(srv: Running, argv: list[str]) -> None:
    """``schedswitchctl status`` (and the other commands of the common options alone)
    imports none of :data:`_NOT_ON_THE_QUICK_PATHS`, through its whole run."""
    probe = (
        "from schedswitchd.cli import ctl\n"
        "code = ctl.main(sys.argv[1:])\n"
        f"seen = [m for m in {_NOT_ON_THE_QUICK_PATHS!r} if m in sys.modules]\n"
        "print('imported:' + ','.join(seen), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    words = [w.format(sock=srv.path) for w in argv]
    env = {**os.environ, "SCHEDSWITCHD_SOCKET": srv.path}
    out = subprocess.run([*_no_site(probe), *words], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("{" if "--json" in words else ("sched_ext", "default:"))
    assert out.stderr.splitlines()[-1] == "imported:", out.stderr


_CTL_WORDS = st.sampled_from(
    ["--socket", "--socket=/s", "/s", "/t", "", "status", "list", "stop", "reload", "hint",
     "history", "object", "--json", "--js", "-h", "--help", "--version", "--", "-", "-x", "x"]
)  # fmt: skip


@settings(max_examples=fuzzing.examples(2000), deadline=None)
@given(st.lists(_CTL_WORDS, max_size=7))
@example(["--socket", "/s", "status", "--socket", "/t", "--json"])
@example(["--socket", "/s", "--socket", "", "list"])
def test_schedswitchctls_quick_parse_agrees_with_argparse(argv: list[str]) -> None:
    """Whatever command line ``ctl._quick_parse`` reads (without argparse), the argparse
    path reads the same: the command's handler, the socket and ``--json``."""
    from unittest import mock

    from schedswitchd.cli import ctl

    quick = ctl._quick_parse(list(argv))
    if quick is None:
        return
    with (
        mock.patch.object(ctl, "_quick_parse", return_value=None),
        mock.patch.object(ctl, "_run", return_value=0) as slow_run,
    ):
        assert ctl._main(list(argv)) == 0
    (handler, args), kwargs = slow_run.call_args
    command, socket, as_json = quick
    assert handler is daemon_cmds.PLAIN_COMMANDS[command][1]
    assert (args.command, args.socket, args.json, kwargs) == (
        command, socket, as_json, {"as_json": as_json}
    )  # fmt: skip


def test_the_usual_ctl_lines_are_read_quickly() -> None:
    from schedswitchd.cli import ctl

    assert ctl._quick_parse(["status"]) == ("status", None, False)
    assert ctl._quick_parse(["--socket", "/a", "status", "--json"]) == ("status", "/a", True)
    assert ctl._quick_parse(["--socket", "/a", "list", "--socket", "/b"]) == ("list", "/b", False)
    for slow in (["--json", "status"], ["status", "--js"], ["hint", "g"], ["status", "x"], []):
        assert ctl._quick_parse(slow) is None
