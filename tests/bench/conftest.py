"""Fixtures of the tests of bench/'s scripts (their reports and checks on synthetic
readings; the measurements themselves run in the VM)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="session")
def bench_script() -> Callable[[str], ModuleType]:
    """``bench_script("daemon_rss")`` -> ``bench/daemon_rss.py`` run as module ``daemon_rss``
    (put in ``sys.modules`` first: its dataclasses look their module up there). bench/ is
    not a package; each call runs the script's top level anew."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    return load
