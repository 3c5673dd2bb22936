"""``python -m tests.daemon.fake_service ARGS``: the ``schedswitchd`` entry point
(:func:`schedswitchd.app.main`: the service's arguments, sockets, systemd glue and logging,
and the D-Bus faces a ``[dbus]`` table starts) with the fake backend injected from Python
instead of from the command line.

``$FAKE_PRELOAD`` names a scheduler to pretend a previous daemon left pinned.
"""

from __future__ import annotations

import sys

from schedswitchd import app

from .fakes import create_backend

if __name__ == "__main__":
    sys.exit(app.main(sys.argv[1:], backend_factory=create_backend))
