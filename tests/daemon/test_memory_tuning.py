"""The daemon's resident-memory measures against the real kernel and C library: malloc_trim
returns freed heap pages and runs after a switch, THP opt-out, no libsystemd unless needed."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from schedswitchd.daemon import memory_tuning, reconcile

from .harness import Running


def _rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(memory_tuning._malloc_trim() is None, reason="C library without malloc_trim")
def test_trim_returns_freed_heap_pages_to_the_kernel() -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block, count = 64 << 10, 512  # below the mmap threshold: from the heap, 32 MiB in all
    blocks = [libc.malloc(block) for _ in range(count)]
    assert all(blocks)
    for p in blocks:
        ctypes.memset(p, 1, block)  # make every page resident
    for p in blocks[:-1]:  # the last block pins the heap top: free() cannot shrink it
        libc.free(p)
    before = _rss_anon_kib()
    assert memory_tuning.trim_heap() is True
    released = before - _rss_anon_kib()
    libc.free(blocks[-1])
    assert released > (count * block >> 10) // 2, f"only {released} KiB released"


def test_server_trims_after_a_switch_not_after_an_idle_pass() -> None:
    calls: list[str] = []
    trimmed = threading.Event()

    def counting_trim() -> bool:
        calls.append(threading.current_thread().name)
        trimmed.set()
        return True

    # the daemon's reconciler trims with malloc_trim unless told otherwise, as here
    defaults = reconcile.Reconciler.__init__.__kwdefaults__
    assert defaults is not None and defaults["trim"] is memory_tuning.trim_heap
    running = Running(trim=counting_trim)
    try:
        running.client().request(op="status")
        running.passes(3)  # idle reconcile passes: nothing to give back
        assert calls == []
        reply = running.client().request(op="hint", workload="gaming")
        assert reply["switch"]["result"] == "ok"
        assert trimmed.wait(10)  # queued on the switcher's worker after the pass
        assert calls[0].startswith("switcher")
    finally:
        running.stop()


def _in_child(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_disable_transparent_hugepages_is_seen_by_the_kernel() -> None:
    # /proc/PID/status shows the process's THP_enabled flag (kernel 5.0+), cleared by
    # PR_SET_THP_DISABLE; a child process so that pytest keeps its own setting.
    out = _in_child(
        "from pathlib import Path\n"
        "from schedswitchd.daemon.memory_tuning import disable_transparent_hugepages\n"
        "st = lambda: [l for l in Path('/proc/self/status').read_text().splitlines()"
        " if l.startswith('THP_enabled:')]\n"
        "before = st()\n"
        "print(disable_transparent_hugepages(), before, st())\n"
    )
    if "[]" in out:
        pytest.skip("kernel without THP_enabled in /proc/PID/status")
    assert out == "True ['THP_enabled:\\t1'] ['THP_enabled:\\t0']"


MAIN_ONE_SHOT_IN_CHILD = """
import contextlib, io
from pathlib import Path
from schedswitchd.daemon import service
for argv in (["--print-schema"], ["--check-config", "--config", "/nonexistent.toml"], ["--help"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with contextlib.suppress(SystemExit):
            service.main(argv)
print([l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("THP_")])
"""


def test_one_shot_modes_leave_the_process_untuned() -> None:
    # --help, --print-schema and --check-config return to the caller (a test, a shell): the
    # process-wide THP opt-out and arena limit are only for the serving daemon.
    out = _in_child(MAIN_ONE_SHOT_IN_CHILD)
    if out == "[]":
        pytest.skip("kernel without THP_enabled in /proc/PID/status")
    assert out == "['THP_enabled:\\t1']"


def test_no_socket_activation_leaves_libsystemd_unloaded() -> None:
    out = _in_child(
        "import os, sys\n"
        "os.environ.pop('LISTEN_FDS', None)\n"
        "from schedswitchd.daemon import service\n"
        "print(service.activated_socket(), 'systemd.daemon' in sys.modules)\n"
    )
    assert out == "None False"


ARENAS_IN_CHILD = """
import ctypes, os, tempfile, threading
from schedswitchd.daemon.memory_tuning import limit_malloc_arenas
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
limited = {limit} and limit_malloc_arenas()
def work():
    for p in [libc.malloc(256) for _ in range(1000)]:
        libc.free(p)
threads = [threading.Thread(target=work) for _ in range(3)]
for t in threads: t.start()
for t in threads: t.join()
path = tempfile.mktemp()
f = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, f)
libc.fclose(f)
print(limited, open(path).read().count("<heap nr="))
os.unlink(path)
"""


@pytest.mark.skipif(memory_tuning._malloc_trim() is None, reason="not glibc")
def test_one_malloc_arena_for_all_threads() -> None:
    # malloc_info(3) lists one <heap> per arena: threads get their own without the limit.
    assert _in_child(ARENAS_IN_CHILD.format(limit=True)) == "True 1"
    assert _in_child(ARENAS_IN_CHILD.format(limit=False)) != "False 1"
