"""Run the real daemon's serving path (:func:`schedswitchd.daemon.service.serve`) with the
fake backend injected, in a process of its own: ``python -m tests.daemon.serve_fake CONFIG
SOCKET``. Memory is tuned as ``schedswitchd`` tunes it before serving, so resident-memory
figures of this process are the daemon's own (minus the real loader).

``$FAKE_PRELOAD`` names a scheduler to pretend a previous daemon left pinned.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

from schedswitchd.daemon.memory_tuning import (
    disable_transparent_hugepages,
    limit_malloc_arenas,
    skip_pydantic_plugins,
)


def main(argv: list[str]) -> int:
    disable_transparent_hugepages()
    limit_malloc_arenas()
    skip_pydantic_plugins()
    from schedswitchd.daemon.config import load_config
    from schedswitchd.daemon.service import serve, setup_logging

    from .fakes import FakeBackend

    config_path, sock_path = argv
    config = load_config(config_path)
    setup_logging(config)
    backend = FakeBackend()
    preload = os.environ.get("FAKE_PRELOAD")
    if preload:
        backend.preload(preload)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(sock_path)
    os.chmod(sock_path, 0o666)
    sock.listen(512)
    asyncio.run(serve(config, backend, sock))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
