"""What the daemon's start costs before it answers (issue 15.4: fast cold paths).

Under the VM's emulation a process start takes seconds, so the daemon's start path must not
start processes of its own. Each check runs in a fresh interpreter: an import happens once
per process.
"""

from __future__ import annotations

import subprocess
import sys

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
