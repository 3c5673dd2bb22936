"""``org.scx.Loader`` on a private system bus with the real polkitd, driven by clients no one
here wrote (``busctl``, ``gdbus``, ``dbus-send``), as scx_loader's users drive it (scxctl's
calls: ``CurrentScheduler``, ``SchedulerMode``, ``SupportedSchedulers``, the seven methods).

The daemon is a real :class:`~schedswitchd.daemon.server.Server` with the fake backend
(tests/daemon/harness.py), so that switches succeed, fail and get ejected on the host; its
face is started as the service starts it. The last test runs the real ``schedswitchd`` (real
backend) on the host kernel, which has no sched_ext: a switch fails with the kernel's reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from schedswitchd.daemon.config import parse_config
from schedswitchd.daemon.control import DaemonControl
from schedswitchd.desktop.faces import Faces, start_faces
from tests.build_outputs import missing_build_output
from tests.daemon.harness import Running
from tests.desktop.buses import (
    Polkitd,
    PrivateBus,
    as_nobody,
    need_root,
    program,
)

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "dbus" / "org.scx.Loader.conf"
ACTION_FILE = ROOT / "polkit" / "org.scx.Loader.policy"
NAME, PATH, IFACE = "org.scx.Loader", "/org/scx/Loader", "org.scx.Loader"
#: A polkit rule granting the action to one non-admin user (uid 1, Debian's ``daemon``).
GRANT = """polkit.addRule(function(action, subject) {
    if (action.id == "org.scx.loader.manage-schedulers" && subject.user == "daemon")
        return polkit.Result.YES;
});
"""
DAEMON_UID = 1

EXTRA = """
[schedulers.bpfland]
object = "bpfland.bpf.o"
profile = "bpfland"
[dbus]
[dbus.scx_names]
scx_bpfland = "bpfland"
scx_fifo = "fifo"
"""


class Loader:
    """The bus, polkitd, the daemon with its face, and ways to call it."""

    def __init__(self, bus: PrivateBus, polkit: Polkitd, srv: Running, faces: Faces) -> None:
        self.bus, self.polkit, self.srv, self.faces = bus, polkit, srv, faces

    def busctl(self, *args: str, nobody: bool = False, uid: int | None = None) -> Any:
        argv = [program("busctl"), f"--address={self.bus.address}", "--json=short", "--", *args]
        if nobody:
            argv = as_nobody(argv)
        elif uid is not None:
            argv = [program("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)

    def call(self, method: str, *sig_args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.busctl("call", NAME, PATH, IFACE, method, *sig_args, **kw)  # type: ignore[no-any-return]

    def prop(self, name: str, **kw: Any) -> Any:
        out = self.busctl("get-property", NAME, PATH, IFACE, name, **kw)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["data"]

    def active(self) -> str:
        return self.srv.read(lambda s: s.switcher.active)


@pytest.fixture
def loader() -> Iterator[Loader]:
    need_root()
    with (
        PrivateBus("system", [POLICY]) as bus,
        Polkitd(bus, [ACTION_FILE], {"50-test.rules": GRANT}) as polkit,
    ):
        os.environ["DBUS_SYSTEM_BUS_ADDRESS"] = bus.address
        srv = Running()
        try:
            path = srv.dir / "schedswitchd.toml"
            text = path.read_text() + EXTRA
            path.write_text(text)
            config = parse_config(text, str(path))
            srv.read(lambda s: s.apply_config(config))
            assert srv.server is not None
            control = DaemonControl(srv.server)
            faces = srv.run(start_faces(control))
            assert len(faces.faces) == 1
            bus.wait_for_name(NAME)
            yield Loader(bus, polkit, srv, faces)
            srv.run(faces.close())
        finally:
            srv.stop()
            os.environ.pop("DBUS_SYSTEM_BUS_ADDRESS", None)


class Monitor:
    """``busctl monitor`` of the name's signals, collected by a thread."""

    def __init__(self, bus: PrivateBus) -> None:
        self.proc = subprocess.Popen(
            [program("busctl"), f"--address={bus.address}", "monitor", NAME, "--json=short"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.signals: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        time.sleep(0.5)  # busctl monitor has subscribed once it printed nothing for a while

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if msg.get("type") == "signal" and msg.get("member") == "PropertiesChanged":
                with self.cond:
                    self.signals.append(msg["payload"]["data"][1])
                    self.cond.notify_all()

    def wait(self, pred: Any, timeout: float = 10) -> list[dict[str, Any]]:
        with self.cond:
            assert self.cond.wait_for(lambda: any(pred(s) for s in self.signals), timeout), (
                self.signals
            )
            return list(self.signals)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


def test_properties_from_the_kernel_and_the_configuration(loader: Loader) -> None:
    assert loader.prop("CurrentScheduler") == "unknown"
    assert loader.prop("SchedulerMode") == 0
    assert loader.prop("CurrentSchedulerArgs") == []
    assert loader.prop("SupportedSchedulers") == ["scx_bpfland", "scx_fifo"]
    assert loader.prop("DefaultScheduler") == "unknown"  # default = "kernel"
    assert loader.prop("DefaultMode") == 0
    # Anyone may read them (the shipped policy opens Properties.Get).
    assert loader.prop("CurrentScheduler", nobody=True) == "unknown"
    out = loader.busctl("introspect", NAME, PATH, IFACE)
    for member in ("StartScheduler", "SwitchSchedulerWithArgs", "RestoreDefault", "DefaultMode"):
        assert member in out.stdout
    # Every property is sent in PropertiesChanged, and Introspect says so: a client that
    # honours the annotation (GDBus's proxies do) follows the changes.
    xml = subprocess.run(
        [program("gdbus"), "introspect", "--xml", "--address", loader.bus.address,
         "--dest", NAME, "--object-path", PATH],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert xml.returncode == 0, xml.stderr
    iface = next(i for i in ElementTree.fromstring(xml.stdout) if i.get("name") == IFACE)
    props = iface.findall("property")
    assert len(props) == 6
    for prop in props:
        emits = [
            a.get("value")
            for a in prop.findall("annotation")
            if a.get("name") == "org.freedesktop.DBus.Property.EmitsChangedSignal"
        ]
        assert emits in ([], ["true"]), (prop.get("name"), emits)


def test_switch_in_a_mode_then_stop_restore_and_restart(loader: Loader) -> None:
    monitor = Monitor(loader.bus)
    try:
        out = loader.call("SwitchScheduler", "su", "scx_bpfland", "1")
        assert out.returncode == 0, out.stderr
        assert loader.active() == "bpfland@gaming"
        assert loader.prop("CurrentScheduler") == "scx_bpfland"
        assert loader.prop("SchedulerMode") == 1
        monitor.wait(lambda s: s.get("CurrentScheduler", {}).get("data") == "scx_bpfland")
        # The kernel's view, not the last call's: the backend says what runs.
        assert loader.srv.backend.kernel_state().ops == "bpfland@gaming_ops"

        out = loader.call("StartScheduler", "su", "scx_fifo", "0")
        assert out.returncode == 0, out.stderr
        assert loader.active() == "fifo" and loader.prop("SchedulerMode") == 0

        out = loader.call("RestartScheduler")
        assert out.returncode == 0, out.stderr
        assert loader.active() == "fifo"
        assert loader.srv.backend.calls.count("prepare fifo") >= 2  # loaded again

        out = loader.call("StopScheduler")
        assert out.returncode == 0, out.stderr
        assert loader.active() == "kernel" and loader.prop("CurrentScheduler") == "unknown"
        monitor.wait(lambda s: s.get("CurrentScheduler", {}).get("data") == "unknown")

        out = loader.call("RestartScheduler")
        assert out.returncode != 0 and "no scheduler is running" in out.stderr

        # RestoreDefault: the override ends, hints and the default (kernel) rule again.
        out = loader.call("RestoreDefault")
        assert out.returncode == 0, out.stderr
        assert loader.srv.read(lambda s: s.policy.override) is None
        # A restart of what a hint runs loads it again and leaves the hints ruling.
        hint = loader.srv.client()
        assert hint.request(op="hint", workload="battery")["active"] == "fifo"
        prepares = loader.srv.backend.calls.count("prepare fifo")
        out = loader.call("RestartScheduler")
        assert out.returncode == 0, out.stderr
        assert (
            loader.active() == "fifo" and loader.srv.backend.calls.count("prepare fifo") > prepares
        )
        assert loader.srv.read(lambda s: s.policy.override) is None
        hint.close()
    finally:
        monitor.close()


def test_with_args_only_a_modes_documented_flags(loader: Loader) -> None:
    # bpfland's lowlatency mode documents "-m performance -w" (config/profiles/bpfland.toml).
    out = loader.call(
        "SwitchSchedulerWithArgs", "sas", "scx_bpfland", "3", "-m", "performance", "-w"
    )
    assert out.returncode == 0, out.stderr
    assert loader.active() == "bpfland@lowlatency"
    assert loader.prop("SchedulerMode") == 3
    assert loader.prop("CurrentSchedulerArgs") == ["-m", "performance", "-w"]
    before = loader.active()
    out = loader.call("StartSchedulerWithArgs", "sas", "scx_bpfland", "2", "--slice-us", "1")
    assert out.returncode != 0
    assert "not the flags of any of its modes" in out.stderr
    assert "lowlatency: -m performance -w" in out.stderr
    assert loader.active() == before  # refused, never ignored: nothing changed


def test_errors_are_failed_with_the_reason(loader: Loader) -> None:
    out = loader.call("SwitchScheduler", "su", "scx_rusty", "0")
    assert out.returncode != 0 and "scx_rusty is not offered here" in out.stderr
    out = loader.call("SwitchScheduler", "su", "scx_fifo", "1")
    assert out.returncode != 0 and "scx_fifo has no gaming mode" in out.stderr
    out = loader.call("SwitchScheduler", "su", "scx_bpfland", "9")
    assert out.returncode != 0 and "mode 9 is not one of scx_loader's" in out.stderr
    # A verifier rejection: the reason comes back, what ran before runs on.
    assert loader.call("SwitchScheduler", "su", "scx_fifo", "0").returncode == 0
    loader.srv.backend.verifier_reject.add("bpfland@gaming")
    gdbus = subprocess.run(
        [program("gdbus"), "call", "--address", loader.bus.address, "--dest", NAME,
         "--object-path", PATH, "--method", f"{IFACE}.SwitchScheduler", "scx_bpfland", "1"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert gdbus.returncode != 0
    assert "org.freedesktop.DBus.Error.Failed" in gdbus.stderr
    assert "switch to bpfland@gaming failed" in gdbus.stderr and "enqueue" in gdbus.stderr
    assert loader.active() == "fifo" and loader.prop("CurrentScheduler") == "scx_fifo"


def test_polkit_refuses_an_unprivileged_caller_and_a_rule_grants_one(
    loader: Loader, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="schedswitchd"):
        out = loader.call("SwitchScheduler", "su", "scx_fifo", "0", nobody=True)
    # The daemon's log says who was refused what, as it says who was granted.
    assert (
        "org.scx.Loader.SwitchScheduler refused: uid 65534 (:1." in caplog.text
        and "not authorized for org.scx.loader.manage-schedulers (polkit)" in caplog.text
    ), caplog.text
    assert out.returncode != 0
    assert (
        "uid 65534" in out.stderr
        and "not authorized for org.scx.loader.manage-schedulers" in out.stderr
    )
    assert loader.active() == "kernel"
    # dbus-send as nobody: the same refusal, as a D-Bus error of type Failed.
    send = subprocess.run(
        as_nobody([program("dbus-send"), f"--bus={loader.bus.address}", "--print-reply",
                   f"--dest={NAME}", PATH, f"{IFACE}.StopScheduler"]),
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert send.returncode != 0 and "org.freedesktop.DBus.Error.Failed" in send.stderr
    # The test's polkit rule grants the action to uid 1 (not an admin of [auth]).
    out = loader.call("SwitchScheduler", "su", "scx_fifo", "0", uid=DAEMON_UID)
    assert out.returncode == 0, out.stderr
    assert loader.active() == "fifo"


def test_root_passes_without_polkit(loader: Loader) -> None:
    """With polkitd gone, root (an admin of ``[auth]``) is still served, and a non-admin
    is refused because polkit cannot be asked."""
    loader.polkit.close()
    out = loader.call("SwitchScheduler", "su", "scx_fifo", "0")
    assert out.returncode == 0, out.stderr
    assert loader.active() == "fifo"
    out = loader.call("StopScheduler", uid=DAEMON_UID)
    assert out.returncode != 0 and "polkit could not be asked" in out.stderr
    assert loader.active() == "fifo"


def test_an_ejection_changes_the_properties_and_signals_it(loader: Loader) -> None:
    monitor = Monitor(loader.bus)
    try:
        assert loader.call("SwitchScheduler", "su", "scx_bpfland", "4").returncode == 0
        monitor.wait(lambda s: s.get("SchedulerMode", {}).get("data") == 4)
        loader.srv.backend.eject(1026, "watchdog failed for bpfland@server")
        monitor.wait(lambda s: s.get("CurrentScheduler", {}).get("data") == "unknown")
        assert loader.prop("CurrentScheduler") == "unknown"
        assert loader.prop("SchedulerMode") == 0
    finally:
        monitor.close()


def test_the_real_daemon_on_a_kernel_without_sched_ext_fails_cleanly(tmp_path: Path) -> None:
    """``schedswitchd`` itself (the real backend, the service's start of its faces) on the
    host kernel: ``SwitchScheduler`` is ``Failed`` with the reason, the kernel's scheduler
    runs on, and the daemon serves on."""
    need_root()
    fifo = ROOT / "build" / "bpf" / "fifo.bpf.o"
    if not fifo.is_file():
        missing_build_output(fifo, "schedulers")
    config = tmp_path / "schedswitchd.toml"
    config.write_text(
        f'[schedulers.fifo]\nobject = "{fifo}"\n[dbus]\n[dbus.scx_names]\nscx_fifo = "fifo"\n'
        f'[daemon]\npin_dir = "{tmp_path}/pins"\n'
    )
    sock = tmp_path / "s.sock"
    with PrivateBus("system", [POLICY]) as bus:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "schedswitchd"), "--config", str(config),
             "--socket", str(sock)],
            env=bus.env(), stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            bus.wait_for_name(NAME, 60)
            base = [program("busctl"), f"--address={bus.address}", "--json=short", "--"]
            out = subprocess.run(
                [*base, "call", NAME, PATH, IFACE, "SwitchScheduler", "su", "scx_fifo", "0"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert out.returncode != 0
            assert "switch to fifo failed" in out.stderr, out.stderr
            assert "sched_ext" in out.stderr  # the kernel has none: said, not hidden
            got = subprocess.run(
                [*base, "get-property", NAME, PATH, IFACE, "CurrentScheduler"],
                capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
            assert json.loads(got.stdout)["data"] == "unknown"
            status = subprocess.run(
                [str(Path(sys.executable).parent / "schedswitchctl"), "status", "--json",
                 "--socket", str(sock)],
                capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
            assert json.loads(status.stdout)["status"]["active"] == "kernel"
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "serving org.scx.Loader on the system bus" in err


def test_the_activation_file_names_org_scx_loader_for_the_unit() -> None:
    """The shipped ``dbus/org.scx.Loader.service`` as ``dbus-daemon`` reads it: a system bus
    given the directory lists ``org.scx.Loader`` as activatable (``ListActivatableNames``),
    and the file hands activation to systemd's ``schedswitchd.service``."""
    need_root()
    service = ROOT / "dbus" / "org.scx.Loader.service"
    assert "SystemdService=schedswitchd.service" in service.read_text().splitlines()
    with PrivateBus("system", [POLICY], service_dirs=[service.parent]) as bus:
        out = subprocess.run(
            [program("busctl"), f"--address={bus.address}", "--json=short", "--", "call",
             "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
             "ListActivatableNames"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert NAME in json.loads(out.stdout)["data"][0]
    with PrivateBus("system", [POLICY]) as bus:  # the control: not without the file
        out = subprocess.run(
            [program("busctl"), f"--address={bus.address}", "--json=short", "--", "call",
             "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
             "ListActivatableNames"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert NAME not in json.loads(out.stdout)["data"][0]


def test_a_second_face_names_who_owns_the_name(
    loader: Loader, caplog: pytest.LogCaptureFixture
) -> None:
    """A second daemon's face (a connection of its own) finds ``org.scx.Loader`` taken: it
    is left out, and the log names the owner's unique name, pid and command."""
    assert loader.srv.server is not None
    control = DaemonControl(loader.srv.server)
    with caplog.at_level("ERROR", logger="schedswitchd"):
        second = loader.srv.run(start_faces(control))
    try:
        assert second.faces == []
        comm = Path("/proc/self/comm").read_text().strip()
        text = caplog.text
        assert "the D-Bus face scx_loader did not start: org.scx.Loader is owned by :1." in text
        assert f" (pid {os.getpid()}, {comm}); is scx_loader still running?" in text, text
    finally:
        loader.srv.run(second.close())
    assert loader.prop("CurrentScheduler") == "unknown"  # the first serves on


def test_a_scheduler_without_an_scx_name_reads_unknown(loader: Loader) -> None:
    """scxctl parses ``CurrentScheduler`` as one of scx_loader's names: a scheduler that has
    none in ``[dbus.scx_names]`` (the harness's ``gaming``, run by a hint) reads ``unknown``,
    as scx_loader answers when it runs nothing it knows, never its configured name."""
    hint = loader.srv.client()
    try:
        assert hint.request(op="hint", workload="gaming")["active"] == "gaming"
        assert loader.active() == "gaming"
        assert loader.srv.backend.kernel_state().state == "enabled"
        assert loader.prop("CurrentScheduler") == "unknown"
        assert loader.prop("SchedulerMode") == 0
        assert loader.prop("CurrentSchedulerArgs") == []
    finally:
        hint.close()
    # One it names still reads its scx name.
    assert loader.call("SwitchScheduler", "su", "scx_fifo", "0").returncode == 0
    assert loader.prop("CurrentScheduler") == "scx_fifo"


def test_with_args_runs_an_executable_scheduler_with_those_args(
    loader: Loader, tmp_path: Path
) -> None:
    """A scheduler run as its own executable takes any flags (as scx_loader passes them);
    one the daemon loads still refuses flags no mode documents."""
    exe = tmp_path / "scx_rusty"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    path = loader.srv.dir / "schedswitchd.toml"
    text = (
        path.read_text().replace("[dbus.scx_names]\n", '[dbus.scx_names]\nscx_rusty = "rusty"\n')
        + f'[schedulers.rusty]\nexecutable = "{exe}"\nargs = ["--configured"]\n'
    )
    config = parse_config(text, str(path))
    loader.srv.read(lambda s: s.apply_config(config))
    out = loader.call("SwitchSchedulerWithArgs", "sas", "scx_rusty", "3", "-k", "-c", "0")
    assert out.returncode == 0, out.stderr
    assert loader.active() == "rusty@args"
    spec = loader.srv.read(lambda s: s.config.schedulers["rusty@args"])
    assert spec.runs_executable and spec.args == ["-k", "-c", "0"]
    assert loader.prop("CurrentScheduler") == "scx_rusty"
    assert loader.prop("CurrentSchedulerArgs") == ["-k", "-c", "0"]
    assert loader.prop("SchedulerMode") == 0  # as scx_loader: flags reset the mode to auto
    # other flags: the variant replaced, and run
    out = loader.call("StartSchedulerWithArgs", "sas", "scx_rusty", "1", "--slice-us=5")
    assert out.returncode == 0, out.stderr
    assert loader.srv.read(lambda s: s.config.schedulers["rusty@args"].args) == ["--slice-us=5"]
    # an object scheduler keeps the refusal, with the reason
    out = loader.call("StartSchedulerWithArgs", "sas", "scx_bpfland", "1", "-k")
    assert out.returncode != 0 and "only those flags mean something" in out.stderr
