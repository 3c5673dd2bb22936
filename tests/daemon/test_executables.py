"""Schedulers run as their own executables, on the host: the configuration's names and their
refusals, the child supervisor with real processes (SIGINT, SIGKILL after the bound), and the
backend's attach/detach against a kernel view the child itself drives (a marker file that a
shell child writes as a scheduler's program would make the kernel enabled). The real
kernel's side is tests/vm/test_executables_vm.py."""

from __future__ import annotations

import signal
import textwrap
import time
from pathlib import Path
from typing import Any, cast

import pytest

from schedswitchd.daemon.backend import SchedulerBackend
from schedswitchd.daemon.config import exec_argv, parse_config
from schedswitchd.daemon.exec_backend import ExecPrepared, runs_info, with_executables
from schedswitchd.daemon.exec_child import ChildScheduler
from schedswitchd.daemon.launcher_wire import MODE_SEPARATOR
from schedswitchd.daemon.protocol import KernelInfo
from schedswitchd.errors import ConfigError, ExecutableError, SchedExtError

PROFILE = """
[profile]
name = "poller"
userspace = "none"

[modes.polling]
userspace = "its user space polls CPU utilisation every 250 ms (-p)"

[modes.quiet]
"""


def program(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def error_of(text: str, path: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, str(path))
    return str(exc.value)


def test_an_executable_scheduler_with_modes_and_hint_variants(tmp_path: Path) -> None:
    exe = program(tmp_path, "scx_demo", "exit 0\n")
    config = parse_config(
        '[schedulers.demo]\nexecutable = "scx_demo"\nargs = ["-a"]\n'
        '[schedulers.demo.modes.gaming]\nargs = ["-m", "all"]\n'
        '[hints.game]\nscheduler = "demo"\nmode = "gaming"\n[dbus]\n',
        str(tmp_path / "s.toml"),
    )
    base, variant = config.schedulers["demo"], config.schedulers[f"demo{MODE_SEPARATOR}gaming"]
    assert base.runs_executable and variant.runs_executable
    assert exec_argv(base) == [str(exe), "-a"]  # relative to the file naming it
    assert exec_argv(variant) == [str(exe), "-m", "all"]  # the mode's args replace args
    assert config.hints["game"].scheduler == f"demo{MODE_SEPARATOR}gaming"
    # offered on org.scx.Loader under its program's name, as scx_loader names it
    assert config.dbus is not None and config.dbus.scx_names == {"scx_demo": "demo"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[schedulers.x]\n", "needs an 'object' (a BPF object) or an 'executable'"),
        ('[schedulers.x]\nexecutable = "missing"\n', "schedulers.x.executable: "),
        ('[schedulers.x]\nexecutable = "plain"\n', "not executable (no execute permission)"),
        ('[schedulers.x]\nexecutable = "."\n', "not a regular file"),
        ('[schedulers.x]\nobject = "a.o"\nexecutable = "run"\n',
         "both 'object' and 'executable' without a 'profile'"),
        ('[schedulers.x]\nobject = "a.o"\nargs = ["-k"]\n', "'args' is for an 'executable'"),
        ('[schedulers.x]\nexecutable = "run"\nrodata = { a = 1 }\n', "'rodata' customises"),
        ('[schedulers.x]\nexecutable = "run"\nmode = "fast"\n', "'fast' is not one of its modes"),
        ('[schedulers.x]\nexecutable = "run"\n[hints.h]\nscheduler = "x"\nmode = "fast"\n',
         "scheduler 'x' has no mode 'fast'"),
        ('[schedulers.x]\nexecutable = "run"\nargs = ["a\\u0000b"]\n', "schedulers.x.args.0"),
        ('[schedulers.x]\nexecutable = "run"\nstop_timeout_s = 0\n', "stop_timeout_s"),
        ('[schedulers.x]\nobject = "a.o"\nprofile = "profiles/poller.toml"\nexecutable = "run"\n'
         '[schedulers.x.modes.nope]\nargs = []\n', "has no mode 'nope'"),
    ],
)  # fmt: skip
def test_config_refuses_what_cannot_run(tmp_path: Path, text: str, problem: str) -> None:
    program(tmp_path, "run", "exit 0\n")
    (tmp_path / "plain").write_text("")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "poller.toml").write_text(PROFILE)
    assert problem in error_of(text, tmp_path / "s.toml")


def test_a_profile_runs_as_its_executable_exactly_where_its_userspace_needs_it(
    tmp_path: Path,
) -> None:
    program(tmp_path, "scx_poller", "exit 0\n")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "poller.toml").write_text(PROFILE)
    text = (
        '[schedulers.p]\nobject = "p.o"\nprofile = "poller"\nexecutable = "scx_poller"\n'
        '[schedulers.p.modes.polling]\nargs = ["-p"]\n'
        '[hints.poll]\nscheduler = "p"\nmode = "polling"\n'
        '[hints.calm]\nscheduler = "p"\nmode = "quiet"\n'
    )
    config = parse_config(text, str(tmp_path / "s.toml"))
    runs = {name: spec.runs_executable for name, spec in config.schedulers.items()}
    assert runs == {"p": False, "p@polling": True, "p@quiet": False}
    assert exec_argv(config.schedulers["p@polling"])[1:] == ["-p"]
    # a profile that runs natively everywhere never needs the program: refused, not ignored
    native = PROFILE.replace('userspace = "its user space polls', 'summary = "its user space polls')
    (tmp_path / "profiles" / "poller.toml").write_text(native)
    assert "never run: profile 'poller' runs natively in every mode" in error_of(
        text, tmp_path / "s.toml"
    )


def test_without_an_executable_a_userspace_profile_keeps_its_refusal(tmp_path: Path) -> None:
    """Point 4: nothing can run the polling mode; the refusal quotes the profile's sentence."""
    from schedswitchd.errors import ProfileError
    from schedswitchd.profile.apply import check_runnable
    from schedswitchd.profile.model import load_profile

    (tmp_path / "poller.toml").write_text(PROFILE)
    config = parse_config(
        f'[schedulers.p]\nobject = "p.o"\nprofile = "{tmp_path / "poller.toml"}"\n'
        '[hints.poll]\nscheduler = "p"\nmode = "polling"\n',
        str(tmp_path / "s.toml"),
    )
    assert not config.schedulers["p@polling"].runs_executable
    with pytest.raises(ProfileError, match="polls CPU utilisation every 250 ms"):
        check_runnable(load_profile(tmp_path / "poller.toml"), "polling")


# --- the child supervisor ----------------------------------------------------------------------

SERVES = """\
trap 'echo stopped > "$1.out"; exit 0' INT
echo x > "$1"
while :; do sleep 0.05; done
"""


def wait_for(path: Path) -> None:
    """Until the child wrote ``path`` (its signal handling is set up by then)."""
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_sigint_stops_a_child_that_serves(tmp_path: Path) -> None:
    exe = program(tmp_path, "serves", SERVES)
    child = ChildScheduler([str(exe), str(tmp_path / "m")], "serves")
    child.start()
    pids = [child.pid]
    assert child.alive()
    wait_for(tmp_path / "m")
    assert child.stop(10.0) == 0 and not child.killed
    assert (tmp_path / "m.out").read_text() == "stopped\n"  # its own handler ran
    pids.append(child.pid)
    assert pids[0] is not None and pids[1] is None and not child.alive()


def test_a_child_ignoring_sigint_is_killed_after_the_bound(tmp_path: Path) -> None:
    exe = program(
        tmp_path, "stubborn", "trap '' INT\necho x > \"$1\"\nwhile :; do sleep 0.05; done\n"
    )
    child = ChildScheduler([str(exe), str(tmp_path / "m")], "stubborn")
    child.start()
    wait_for(tmp_path / "m")
    start = time.monotonic()
    assert child.stop(0.5) == -signal.SIGKILL and child.killed
    assert time.monotonic() - start >= 0.5


def test_a_program_that_cannot_start_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(ExecutableError, match=r"cannot start .*gone: No such file"):
        ChildScheduler([str(tmp_path / "gone")], "gone").start()


# --- the backend's attach/detach ---------------------------------------------------------------


class MarkerKernel:
    """The wrapped backend's kernel view: ``enabled`` with ops ``ss_marker`` while the file
    ``marker`` exists (the child writes it once "attached", removes it when it ends)."""

    def __init__(self, marker: Path, state: str = "disabled") -> None:
        self.marker = marker
        self.state = state

    def kernel_state(self) -> KernelInfo:
        if self.marker.exists():
            return KernelInfo(state="enabled", ops="ss_marker")
        return KernelInfo(state=self.state)


def backend_for(kernel: MarkerKernel) -> SchedulerBackend:
    return with_executables(cast(SchedulerBackend, kernel))


def spec_of(tmp_path: Path, exe: Path, *args: str, stop_timeout_s: float = 5.0) -> Any:
    text = f'[schedulers.x]\nexecutable = "{exe}"\nargs = {list(args)!r}\n'
    text += f"stop_timeout_s = {stop_timeout_s}\n"
    return parse_config(text.replace("'", '"'), str(tmp_path / "s.toml")).schedulers["x"]


def test_attach_waits_for_the_kernel_and_detach_for_its_end(tmp_path: Path) -> None:
    marker = tmp_path / "m"
    exe = program(
        tmp_path,
        "attaches",
        'sleep 0.2\ntrap \'rm -f "$1"; exit 0\' INT\ntouch "$1"\nwhile :; do sleep 0.05; done\n',
    )
    backend = backend_for(MarkerKernel(marker))
    prepared = backend.prepare("x", spec_of(tmp_path, exe, str(marker)))
    assert isinstance(prepared, ExecPrepared) and prepared.pid is None
    start = time.monotonic_ns()
    enabled_ns = backend.attach(prepared, 30.0)
    assert enabled_ns is not None and enabled_ns - start >= 200_000_000  # not before the kernel
    assert prepared.ops_name == "ss_marker"  # the kernel's word, read at the confirmation
    info = runs_info(prepared)
    assert info is not None and info.way == "executable" and info.pid == prepared.pid
    assert info.argv == [str(exe), str(marker)]
    backend.detach(prepared, 30.0)
    assert not marker.exists() and prepared.pid is None
    assert {"attach.spawn", "attach.enable", "detach.stop", "detach.disabled"} <= set(
        prepared.timings_ns
    )


def test_a_program_that_exits_before_the_kernel_runs_it_fails_the_attach(tmp_path: Path) -> None:
    exe = program(tmp_path, "fails", "echo refusing >&2\nexit 1\n")
    backend = backend_for(MarkerKernel(tmp_path / "m"))
    prepared = backend.prepare("x", spec_of(tmp_path, exe))
    with pytest.raises(ExecutableError, match=r"fails ended \(exit status 1\)"):
        backend.attach(prepared, 30.0)


def test_a_program_cannot_attach_while_another_scheduler_runs(tmp_path: Path) -> None:
    exe = program(tmp_path, "never", "touch started\n")
    backend = backend_for(MarkerKernel(tmp_path / "m", state="enabling"))
    prepared = backend.prepare("x", spec_of(tmp_path, exe))
    with pytest.raises(SchedExtError, match="can attach only while it is disabled"):
        backend.attach(prepared, 30.0)
    assert cast(ExecPrepared, prepared).child is None  # never started


def test_a_kernel_that_never_enables_it_stops_the_child(tmp_path: Path) -> None:
    exe = program(tmp_path, "idle", "while :; do sleep 0.05; done\n")
    backend = backend_for(MarkerKernel(tmp_path / "m"))
    prepared = cast(ExecPrepared, backend.prepare("x", spec_of(tmp_path, exe)))
    with pytest.raises(SchedExtError, match="did not enable"):
        backend.attach(prepared, 0.3)
    assert prepared.child is not None and not prepared.child.alive()
    assert prepared.child.returncode is not None


def test_under_systemd_the_output_goes_to_a_journal_stream_named_for_the_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wiring only (no journald here): with ``JOURNAL_STREAM`` set, the child's stdout
    and stderr are the stream ``systemd.journal.stream`` opened for the scheduler's name."""
    from systemd import journal  # type: ignore[attr-defined]

    opened: list[str] = []

    def stream(identifier: str) -> Any:
        opened.append(identifier)
        return (tmp_path / "journal.txt").open("w")

    monkeypatch.setattr(journal, "stream", stream)
    monkeypatch.setenv("JOURNAL_STREAM", "8:1")
    exe = program(tmp_path, "talks", "echo out\necho err >&2\n")
    child = ChildScheduler([str(exe)], "rusty")
    child.start()
    deadline = time.monotonic() + 30
    while child.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.returncode == 0
    assert opened == ["rusty"]
    assert sorted((tmp_path / "journal.txt").read_text().split()) == ["err", "out"]
