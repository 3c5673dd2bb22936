"""Starting the service as a process in the daemon's tests: its command line and
environment (tests/daemon/test_service.py, test_object_paths.py, test_socket_ownership.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: The checkout: the service's processes import ``schedswitchd`` and ``tests`` from it.
ROOT = Path(__file__).resolve().parents[2]


def env(**extra: str) -> dict[str, str]:
    """This process's environment without systemd's socket and notify variables, with the
    checkout on ``PYTHONPATH`` and ``extra`` added."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "LISTEN_"))}
    base.update(PYTHONPATH=str(ROOT), **extra)
    return base


def daemon_cmd(config: Path, *more: str) -> list[str]:
    """The ``schedswitchd`` entry point with the fake backend (tests/daemon/fake_service.py);
    run with :func:`env` (``PYTHONPATH`` is the checkout)."""
    return [sys.executable, "-m", "tests.daemon.fake_service", "--config", str(config), *more]
