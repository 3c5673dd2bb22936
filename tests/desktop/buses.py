"""Private D-Bus buses and a private polkitd for the desktop faces' tests: real peers only.

:class:`PrivateBus` runs ``dbus-daemon`` with a configuration the test writes (a system
bus shaped like Debian's ``system.conf``: everything denied but what a policy file in
``system.d`` opens, so the shipped policy file is what lets the daemon own its name; or a
permissive session bus). :class:`Polkitd` runs the real ``polkitd`` on a private system
bus (it connects to ``$DBUS_SYSTEM_BUS_ADDRESS``), in a mount namespace of its own where
the test's action files and rules are bound over polkit's directories, so a test can
register the shipped ``.policy`` and grant an action to a uid without touching the host's
polkit configuration.

A missing binary skips the test with the package that has it (fails under
``SCHEDSWITCHD_FULL_SUITE=1``, like a missing build output).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import pytest

from tests.build_outputs import full_suite
from tools.dbus_conf import system_bus_conf

#: The Debian package of each program these tests run (the Makefile's APT_PACKAGES).
PACKAGES = {
    "dbus-daemon": "dbus-daemon",
    "busctl": "systemd",
    "gdbus": "libglib2.0-bin",
    "dbus-send": "dbus-bin",
    "polkitd": "polkitd",
    "unshare": "util-linux",
    "setpriv": "util-linux",
    "powerprofilesctl": "power-profiles-daemon",
    "gamemoded": "gamemode",
}
#: Where Debian installs polkit's daemon (not on ``$PATH``).
POLKITD = "/usr/lib/polkit-1/polkitd"
#: polkit's action and rule directories, as polkitd reads them.
POLKIT_ACTIONS = "/usr/share/polkit-1/actions"
POLKIT_RULES = ("/etc/polkit-1/rules.d", "/usr/share/polkit-1/rules.d")
#: The uid tests run unprivileged clients as (``setpriv --reuid``).
NOBODY = 65534

START_TIMEOUT_S = 10.0


def missing_program(name: str) -> NoReturn:
    """Skip (fail under the full suite) a test that needs program ``name``."""
    message = f"{name} is missing: install Debian's {PACKAGES.get(name, name)} (make deps)"
    if full_suite():
        pytest.fail(message)
    pytest.skip(message)


def program(name: str) -> str:
    """The path of program ``name`` (on ``$PATH``, or :data:`POLKITD`); skips without it."""
    found = POLKITD if name == "polkitd" and os.access(POLKITD, os.X_OK) else shutil.which(name)
    if found is None:
        missing_program(name)
    return found


def need_root() -> None:
    """Skip unless root: a system bus with polkit and unprivileged clients needs it."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a private system bus with polkitd, clients as uid 65534)")


_SESSION_CONF = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <auth>EXTERNAL</auth>
  <listen>{listen}</listen>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
{includes}
</busconfig>
"""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


class PrivateBus:
    """A ``dbus-daemon`` of its own. ``kind``: ``system`` or ``session``; ``policies``:
    extra bus configuration files (``<include>``d, e.g. the shipped system policy file).
    ``address`` is its ``unix:path=...`` address; :meth:`env` the environment that points
    a client (``busctl``, ``gdbus``, sd-bus) at it. A context manager: leaving it stops the
    bus and removes its directory."""

    def __init__(
        self, kind: str, policies: Sequence[Path | str] = (), service_dirs: Sequence[Path] = ()
    ) -> None:
        """``service_dirs``: where the system bus finds activation files (``.service``)."""
        self.kind = kind
        self.policies = [str(p) for p in policies]
        self.service_dirs = list(service_dirs)
        # Not pytest's tmp_path: its parents are 0700 root, and a client running as
        # uid 65534 must reach the socket.
        self.dir = Path(tempfile.mkdtemp(prefix=f"schedswitchd-{kind}-bus-"))
        self.dir.chmod(0o755)
        self.socket = self.dir / "bus_socket"
        self.address = f"unix:path={self.socket}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrivateBus:
        daemon = program("dbus-daemon")
        listen = f"unix:path={self.socket}"
        conf = self.dir / f"{self.kind}.conf"
        if self.kind == "system":
            conf.write_text(system_bus_conf(listen, self.policies, service_dirs=self.service_dirs))
        else:
            includes = "\n".join(f"  <include>{p}</include>" for p in self.policies)
            conf.write_text(_SESSION_CONF.format(listen=listen, includes=includes))
        self.proc = subprocess.Popen(
            [daemon, f"--config-file={conf}", "--nofork", "--nopidfile", "--print-address"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if not line:
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            self.close()
            raise RuntimeError(f"dbus-daemon did not start: {err.strip()}")
        self.address = line
        return self

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with this bus as the system or
        session bus (``DBUS_SYSTEM_BUS_ADDRESS`` / ``DBUS_SESSION_BUS_ADDRESS``)."""
        env = dict(os.environ if base is None else base)
        key = "DBUS_SYSTEM_BUS_ADDRESS" if self.kind == "system" else "DBUS_SESSION_BUS_ADDRESS"
        env[key] = self.address
        return env

    def close(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.close()

    def has_name(self, name: str) -> bool:
        """Whether ``name`` has an owner on this bus (asked with ``busctl``)."""
        out = subprocess.run(
            [program("busctl"), f"--address={self.address}", "--list", "--no-pager", "--no-legend"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        return any(line.split()[:1] == [name] for line in out.stdout.splitlines())

    def wait_for_name(self, name: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until ``name`` has an owner; ``AssertionError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.has_name(name):
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not appear on the {self.kind} bus")
            time.sleep(0.05)


class Polkitd:
    """The real ``polkitd`` on ``bus`` (a system :class:`PrivateBus`), with ``actions``
    (``.policy`` files, beside the host's own) and ``rules`` (file name -> JavaScript,
    instead of the host's rules) bound over polkit's directories in a mount namespace of
    its own. Needs root. A context manager: leaving it stops polkitd."""

    NAME = "org.freedesktop.PolicyKit1"

    def __init__(
        self,
        bus: PrivateBus,
        actions: Sequence[Path | str] = (),
        rules: Mapping[str, str] | None = None,
    ) -> None:
        self.bus = bus
        self.actions = [Path(a) for a in actions]
        self.rules = dict(rules or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = bus.dir / "polkit"

    def __enter__(self) -> Polkitd:
        need_root()
        polkitd = program("polkitd")
        unshare = program("unshare")
        actions = self.dir / "actions"
        rules = self.dir / "rules.d"
        actions.mkdir(parents=True)
        rules.mkdir()
        for src in Path(POLKIT_ACTIONS).glob("*.policy"):
            shutil.copy(src, actions / src.name)
        for src in self.actions:
            shutil.copy(src, actions / src.name)
        for name, text in self.rules.items():
            (rules / name).write_text(text)
        for d in (self.dir, actions, rules):
            d.chmod(0o755)
        binds = [f"mount --bind {actions} {POLKIT_ACTIONS}"]
        binds += [f"mount --bind {rules} {d}" for d in POLKIT_RULES if os.path.isdir(d)]
        script = " && ".join([*binds, f"exec {polkitd} --no-debug"])
        self.proc = subprocess.Popen(
            [unshare, "--mount", "--propagation", "private", "sh", "-c", script],
            env=self.bus.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            self.bus.wait_for_name(self.NAME)
        except AssertionError:
            err = b""
            if self.proc.poll() is not None and self.proc.stderr is not None:
                err = self.proc.stderr.read()
            self.close()
            raise AssertionError(f"polkitd did not start: {err.decode().strip()}") from None
        return self

    def close(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            self.proc = None

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def system_bus_with_polkit(
    policies: Sequence[Path | str] = (),
    actions: Sequence[Path | str] = (),
    rules: Mapping[str, str] | None = None,
) -> Iterator[PrivateBus]:
    """A private system bus (with ``policies`` included) and polkitd on it (with
    ``actions`` and ``rules``, see :class:`Polkitd`)."""
    with PrivateBus("system", policies) as bus, Polkitd(bus, actions, rules):
        yield bus


def as_nobody(argv: Sequence[str]) -> list[str]:
    """``argv`` run as uid/gid 65534 with no supplementary groups (``setpriv``)."""
    return [
        program("setpriv"),
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        *argv,
    ]
