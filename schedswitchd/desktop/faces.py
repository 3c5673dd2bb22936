"""Starting and stopping the configured D-Bus faces.

Each face is a module of this package in :data:`FACES` with ``async def start(control,
buses) -> Face | None`` (``None``: not configured). A face that fails to start (no system
bus, its name taken) is logged and left out; the daemon's socket serves on regardless.
"""

from __future__ import annotations

import importlib
import logging
from typing import Protocol

from schedswitchd.daemon.control import DaemonControl
from schedswitchd.desktop.bus import Buses

log = logging.getLogger("schedswitchd")

#: The face modules, started in this order.
FACES: tuple[str, ...] = (
    "schedswitchd.desktop.scx_loader",
    "schedswitchd.desktop.power_profiles",
)


class Face(Protocol):
    """A started face: :meth:`close` releases its names and stops its tasks."""

    async def close(self) -> None:
        """Release the face's bus names and exported objects and stop its tasks; an
        exception it raises is logged by :meth:`Faces.close`, which closes the others."""


class Faces:
    """The started faces and the bus connections they share."""

    def __init__(self, buses: Buses, faces: list[Face]) -> None:
        self.buses = buses
        self.faces = faces

    async def close(self) -> None:
        """Close every face (in reverse order), then the buses."""
        for face in reversed(self.faces):
            try:
                await face.close()
            except Exception:
                log.exception("closing the D-Bus face %s failed", type(face).__name__)
        self.faces.clear()
        self.buses.close()


async def start_faces(control: DaemonControl, modules: tuple[str, ...] = FACES) -> Faces:
    """Start each face of ``modules`` the configuration asks for."""
    buses = Buses()
    started: list[Face] = []
    for name in modules:
        module = importlib.import_module(name)
        try:
            face = await module.start(control, buses)
        except Exception as exc:
            log.error("the D-Bus face %s did not start: %s", name.rpartition(".")[2], exc)
            continue
        if face is not None:
            started.append(face)
    return Faces(buses, started)
