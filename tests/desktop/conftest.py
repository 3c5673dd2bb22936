"""Fixtures of the desktop faces' tests: private buses and polkitd (:mod:`tests.desktop.buses`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.desktop.buses import PrivateBus, system_bus_with_polkit


@pytest.fixture
def session_bus() -> Iterator[PrivateBus]:
    """A private session bus (anyone may own any name)."""
    with PrivateBus("session") as bus:
        yield bus


@pytest.fixture
def system_bus() -> Iterator[PrivateBus]:
    """A private system bus shaped like Debian's, with polkitd on it (root only)."""
    with system_bus_with_polkit() as bus:
        yield bus
