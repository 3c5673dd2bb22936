"""Shared knobs of the fuzz tests (hypothesis property tests over mutated inputs).

``make test`` runs each fuzz test with its bounded example count (``make unit`` a tenth of
it, see :data:`SCALE`); ``make fuzz-props`` sets
``SCHEDSWITCHD_FUZZ_SCALE`` (a float multiplier, default 1) for a longer run and
``SCHEDSWITCHD_FUZZ_STATS`` to a file that collects, per test, how many inputs ran and
how each one ended (``tools/fuzz_report.py`` sums them; docs/fuzzing.md has the figures).
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from tests.build_outputs import full_suite

#: ``SCHEDSWITCHD_FUZZ_SCALE`` when set; else 1 under the full suite (``make test``, ``make
#: pytest``) and 0.1 in the fast tier (``make unit``, a plain ``pytest``), which stays well
#: under a minute that way: the same properties, a tenth of the inputs (at least 20).
_SCALE_ENV = os.environ.get("SCHEDSWITCHD_FUZZ_SCALE", "")
SCALE = float(_SCALE_ENV) if _SCALE_ENV else (1.0 if full_suite() else 0.1)
_MIN_FAST = 20
_STATS_PATH = os.environ.get("SCHEDSWITCHD_FUZZ_STATS", "")
_counts: dict[str, Counter[str]] = {}


def examples(n: int) -> int:
    """``n`` hypothesis examples, scaled by :data:`SCALE` (at least 20 in the fast tier)."""
    if not _SCALE_ENV and not full_suite():
        return min(n, max(_MIN_FAST, round(n * SCALE)))
    return max(1, round(n * SCALE))


def record(test: str, outcome: str) -> None:
    """Count one input of ``test`` that ended as ``outcome`` (``"ok"`` or an exception
    class name). Flushed by :func:`flush` when ``SCHEDSWITCHD_FUZZ_STATS`` is set."""
    if _STATS_PATH:
        _counts.setdefault(test, Counter())[outcome] += 1


def exception_name(exc: BaseException) -> str:
    """``MemoryError``, ``struct.error``: the class name, with its module unless builtin."""
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def flush() -> None:
    """Append the counts gathered so far to the stats file (one JSON object a line; a
    lock keeps concurrent writers apart) and reset them."""
    if not _STATS_PATH or not _counts:
        return
    with open(_STATS_PATH, "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        for test, counter in sorted(_counts.items()):
            f.write(json.dumps({"test": test, "outcomes": dict(counter)}) + "\n")
    _counts.clear()


@contextmanager
def address_space_headroom(extra: int = 1 << 30) -> Iterator[None]:
    """Limit this process's address space (``RLIMIT_AS``, soft) to its current size plus
    ``extra`` bytes while the block runs: an input that makes the parser allocate what
    the file does not hold (a 4 GiB ``.bss``) then fails with ``MemoryError`` instead of
    passing on a machine with enough memory."""
    with open("/proc/self/statm", encoding="ascii") as f:
        vsz = int(f.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = vsz + extra
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
