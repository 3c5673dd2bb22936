"""The start-up's objects left out of later garbage collections (``freeze_startup_objects``),
checked against the running CPython in a process of its own (the freeze is process-wide)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from schedswitchd.daemon import collector

from .fakes import FakeBackend
from .harness import Running

_PROBE = r"""
import gc, json, sys, weakref
from schedswitchd.daemon.collector import freeze_startup_objects, frozen_objects

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a

dropped = weakref.ref(cycle())          # garbage before the freeze: collected by it
kept = cycle()
kept_ref = weakref.ref(kept)            # alive at the freeze, dropped after it
frozen = freeze_startup_objects()
after_freeze = dropped() is None
del kept
gc.collect()
later = weakref.ref(cycle())            # made after the freeze, dropped
gc.collect()
json.dump({
    "frozen": frozen,
    "garbage_before_collected": after_freeze,
    "frozen_cycle_left": kept_ref() is not None,
    "later_cycle_collected": later() is None,
    "kept": frozen_objects(),
}, sys.stdout)
"""


def test_the_freeze_collects_first_then_leaves_its_objects_to_reference_counting() -> None:
    """Garbage from before the call is collected by it; a cycle alive at the call and
    dropped after is left alone by later collections (what makes them short: they do not
    walk frozen objects), one made after the call is collected as always. Fails when
    CPython's ``gc.freeze`` no longer moves objects out of the collector's reach."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    got = json.loads(out)
    assert got["garbage_before_collected"], got
    assert got["frozen_cycle_left"], got
    assert got["later_cycle_collected"], got
    # the collector's own modules and everything they import: thousands of objects
    assert got["frozen"] == got["kept"] > 1000, got


def test_status_reports_the_frozen_count_without_walking_the_frozen_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gc.get_freeze_count()`` walks every frozen object (milliseconds in the serving
    daemon): ``status`` gives the count taken at the freeze instead."""

    def walking() -> int:
        raise AssertionError("status walked the frozen list")

    monkeypatch.setattr(gc, "get_freeze_count", walking)
    monkeypatch.setattr(collector, "_frozen", 1234)
    srv = Running(FakeBackend())
    try:
        c = srv.client()
        reply = c.request(op="status")
        assert reply["ok"], reply
        assert reply["status"]["counters"]["gc_frozen_objects"] == 1234
        c.close()
    finally:
        srv.stop()
