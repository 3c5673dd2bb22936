"""The serving daemon's start-up objects, kept out of the cyclic garbage collector's walks.

A full collection walks every object the collector tracks, and most of the serving
daemon's are its imports' (modules, classes, functions): one holds the event loop -- and a
hint that comes meanwhile -- for all of that walk. :func:`freeze_startup_objects` moves
what the serving daemon's imports made out of the collector's reach (``gc.freeze``), so
later collections walk only what came after (docs/performance.md, "Memory").

Closed connections need no collection: they leave no reference cycle, so reference
counting frees them as they end (``tests/daemon/test_connection_garbage.py``).
"""

from __future__ import annotations

import gc

#: How many objects :func:`freeze_startup_objects` froze (0 until it ran).
_frozen = 0


def freeze_startup_objects() -> int:
    """Collect the start-up's garbage, then have every object left ignored by later
    collections (``gc.freeze()``, CPython's ``gc`` module: they move to its permanent
    generation); returns how many were frozen (``gc.get_freeze_count()``). For the serving
    daemon once its imports are done and before it builds its state: modules, classes and
    functions live as long as the process. A cycle of frozen objects that becomes garbage
    later is never collected (reference counting still frees everything else), so this is
    not for a process that goes on to drop what it had made before the call (a test
    run)."""
    global _frozen
    gc.collect()
    gc.freeze()
    _frozen = gc.get_freeze_count()
    return _frozen


def frozen_objects() -> int:
    """How many objects :func:`freeze_startup_objects` froze, 0 if it did not run: the
    count taken then, since ``gc.get_freeze_count()`` walks the whole frozen list (CPython
    3.11's ``gc_list_size``), too slow for every ``status`` (docs/performance.md,
    "``schedswitchctl status``")."""
    return _frozen
