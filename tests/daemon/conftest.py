"""Fixtures of the daemon's tests (the suite's ``start_server`` and ``srv``: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.daemon.harness import FakeTimer, Running


@pytest.fixture
def timed(start_server: Callable[..., Running]) -> Running:
    """A server whose timeouts and TTLs run on a :class:`FakeTimer` (read timeout 0.3 s,
    idle timeout 0.4 s): tests move time instead of sleeping through it."""
    return start_server(timer=FakeTimer(), read_timeout=0.3, idle_timeout=0.4)
