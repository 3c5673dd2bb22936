"""What the daemon's start costs before it answers (a cold path, kept fast).

Under the VM's emulation a process start takes seconds, so the daemon's start path must not
start processes of its own. Each check runs in a fresh interpreter: an import happens once
per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .harness import make_config

ROOT = Path(__file__).resolve().parents[2]

#: The modules a serving daemon imports (schedswitchd.daemon.service's _main and serve()).
DAEMON_MODULES = (
    "schedswitchd.daemon.service",
    "schedswitchd.daemon.config",
    "schedswitchd.daemon.check_config",
    "schedswitchd.daemon.kernel_backend",
    "schedswitchd.daemon.reconcile",
    "schedswitchd.daemon.server",
)

#: Audit events (sys.addaudithook, the standard library's audit events table) of a new process.
SPAWNS = ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.system", "os.spawn")


def test_importing_the_daemon_starts_no_process() -> None:
    """ctypes.util.find_library, for one, runs ``ldconfig -p`` when imported code calls it."""
    probe = (
        "import sys\n"
        "seen = []\n"
        f"sys.addaudithook(lambda e, a: seen.append((e, repr(a)[:200])) if e in {SPAWNS!r} "
        "else None)\n"
        f"for m in {DAEMON_MODULES!r}:\n"
        "    __import__(m)\n"
        "print(seen)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_a_daemon_without_dbus_imports_no_dbus_library(tmp_path: Path) -> None:
    """Importing the service, and a daemon serving a configuration without ``[dbus]``,
    load neither sdbus nor the desktop faces (``python -X importtime`` lists every import
    of the process on stderr); one with ``[dbus]`` loads both."""
    config = make_config(tmp_path)
    source = Path(config.source or "")
    imported: dict[str, set[str]] = {}
    for name, text in (("plain", source.read_text()), ("dbus", source.read_text() + "[dbus]\n")):
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        sock = tmp_path / f"{name}.sock"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-X",
                "importtime",
                "-m",
                "tests.daemon.fake_service",
                "--config",
                str(path),
                "--socket",
                str(sock),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent",
            },
        )
        lines: list[str] = []
        try:
            assert proc.stderr is not None
            # The line the daemon logs once serving, after its faces started.
            while not any("ready (pid" in line for line in lines[-1:]):
                line = proc.stderr.readline()
                assert line, "".join(lines[-20:])
                lines.append(line)
        finally:
            proc.terminate()
            _, rest = proc.communicate(timeout=30)
        err = "".join(lines) + rest
        modules = {line.rpartition("|")[2].strip() for line in err.splitlines() if "|" in line}
        imported[name] = {
            m for m in modules if m.split(".")[0] == "sdbus" or m.startswith("schedswitchd.desktop")
        }
    assert imported["plain"] == set()
    assert {"sdbus", "schedswitchd.desktop.faces"} <= imported["dbus"], imported
