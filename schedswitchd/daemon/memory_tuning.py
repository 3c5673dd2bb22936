"""Keep the long-running daemon's resident memory down: glibc ``malloc_trim`` after a switch,
one malloc arena for all its threads, no transparent huge pages for its small heaps, and
no scan for pydantic plugins.

A switch parses and relocates a BPF object: many short-lived allocations (BTF records,
CO-RE candidates, instruction buffers, verifier log) that CPython and C extensions take from
the C heap. glibc keeps freed heap memory mapped for reuse, and only gives back the free
space at the very top of the heap on its own, so the long-running daemon's resident size
ratchets up by the fragmented remainder (what each tuning gave back: docs/performance.md,
"Memory").
``malloc_trim(0)`` (``malloc_trim(3)``) releases every free page of every arena with
``MADV_DONTNEED``; the memory is still there for the next allocation, only not resident.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
import types
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim  # glibc only (musl has no such call)
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def trim_heap() -> bool:
    """``malloc_trim(0)``: True if memory was released, False if there was none to release
    or the C library has no ``malloc_trim``. Never raises (it runs unattended after a
    switch); ctypes drops the GIL for the call (its cost: docs/performance.md, memory).
    """
    fn = _malloc_trim()
    if fn is None:
        return False
    try:
        return bool(fn(0))
    except Exception:  # pragma: no cover - a foreign-call failure must not stop the daemon
        log.debug("malloc_trim failed", exc_info=True)
        return False


#: ``PR_SET_THP_DISABLE`` from ``include/uapi/linux/prctl.h``.
PR_SET_THP_DISABLE = 41


def disable_transparent_hugepages() -> bool:
    """``prctl(PR_SET_THP_DISABLE, 1)`` for this process (``prctl(2)``): page faults and
    khugepaged no longer back its anonymous memory with 2 MiB pages. With the kernel's THP
    mode ``always`` (Debian's kernels), the daemon's heap and allocator arenas got huge pages
    that stayed mostly empty (docs/performance.md, "Memory"), for TLB savings an idle
    daemon does not need (what systemd's ``MemoryTHP=disable`` does for a unit). True if set;
    False (never raises) if the kernel or C library refused.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    prctl.restype = ctypes.c_int
    ok = bool(prctl(PR_SET_THP_DISABLE, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                    ctypes.c_ulong(0)) == 0)  # fmt: skip
    if not ok:
        log.debug("PR_SET_THP_DISABLE refused: %s", os.strerror(ctypes.get_errno()))
    return ok


#: ``M_ARENA_MAX`` of glibc's ``mallopt(3)`` (``malloc.h``).
M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int = 1) -> bool:
    """``mallopt(M_ARENA_MAX, arenas)``: threads share the C heap instead of each getting an
    arena of its own (glibc's default allows 8 per core). The daemon's threads (asyncio loop,
    switcher, uevent reader, executor) allocate under the GIL, so they hardly contend, while
    every extra arena kept its own free pages resident (docs/performance.md, "Memory"). Call
    before threads start. True if set; False (never raises) without glibc's ``mallopt``.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas) == 1)


#: pydantic's plugin loader (``pydantic/plugin/_loader.py``), a private module: the first
#: model pydantic builds imports it, and it imports ``importlib.metadata`` (with ``email``,
#: ``zipfile``, ``csv`` and ``importlib.resources``) to look its entry point group up.
PYDANTIC_PLUGIN_LOADER = "pydantic.plugin._loader"


def skip_pydantic_plugins() -> bool:
    """Put a plugin loader that finds no plugins in :data:`PYDANTIC_PLUGIN_LOADER`'s place,
    before pydantic builds a model: the serving daemon then never imports
    ``importlib.metadata`` nor scans the installed distributions' metadata, resident memory
    it kept for its lifetime (docs/performance.md, "Memory"). The daemon's models are its
    own config and protocol; no pydantic plugin (pydantic's "Plugins" page: observers of
    validation found by the ``pydantic`` entry point group) has a part in them, so the
    daemon runs as with ``PYDANTIC_DISABLE_PLUGINS=__all__``. True if put in place; False
    (never raises) if pydantic's own loader was imported already (a process that built a
    model before). Process-wide: for the serving daemon only.
    """
    if PYDANTIC_PLUGIN_LOADER in sys.modules:
        return False
    loader = types.ModuleType(PYDANTIC_PLUGIN_LOADER, "pydantic plugins: none in the daemon")

    def get_plugins() -> tuple[()]:
        return ()

    loader.get_plugins = get_plugins  # type: ignore[attr-defined]
    sys.modules[PYDANTIC_PLUGIN_LOADER] = loader
    return True
