"""``schedswitchd``, the command: the daemon (:func:`schedswitchd.daemon.service.main`)
composed with the D-Bus faces of ``desktop/`` (:func:`schedswitchd.desktop.faces.start_faces`),
which it starts when the configuration has a ``[dbus]`` table (docs/desktop.md).

The one module above both ``daemon/`` and ``desktop/`` (docs/architecture.md): the daemon's
floor offers the hook, this module fills it, so ``daemon/`` never imports ``desktop/``.
Arguments, exit statuses and everything else are the service's.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from schedswitchd.daemon import service

if TYPE_CHECKING:
    from schedswitchd.daemon.control import DaemonControl
    from schedswitchd.daemon.service import BackendFactory, StartedFaces


async def start_desktop_faces(control: DaemonControl) -> StartedFaces:
    """:class:`schedswitchd.daemon.service.FaceStarter` of the D-Bus faces: every face of
    :data:`schedswitchd.desktop.faces.FACES` the configuration asks for."""
    # Imported here: a daemon without [dbus] never calls this and loads no D-Bus library.
    from schedswitchd.desktop.faces import start_faces

    return await start_faces(control)


def main(
    argv: Sequence[str] | None = None, *, backend_factory: BackendFactory | None = None
) -> int:
    """Entry point of ``schedswitchd``: :func:`schedswitchd.daemon.service.main` with the
    D-Bus faces; returns the process exit status."""
    return service.main(argv, backend_factory=backend_factory, start_faces=start_desktop_faces)


if __name__ == "__main__":
    sys.exit(main())
