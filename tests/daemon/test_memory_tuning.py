"""The daemon's resident-memory measures against the real kernel and C library: malloc_trim
returns freed heap pages and runs after a switch, THP opt-out, no libsystemd unless needed, no
pydantic plugin scan in the serving daemon."""

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


SERVING_MAIN_IN_CHILD = """
import contextlib, io, sys
from schedswitchd import app
with contextlib.redirect_stderr(io.StringIO()):
    # Serving until the bind, which a socket path with a NUL byte refuses (a ConfigError):
    # the config has been loaded and validated by then, every model of it built.
    code = app.main(["--config", sys.argv[1], "--socket", "bad\\0path"])
loader = sys.modules["pydantic.plugin._loader"]
print(code, "schedswitchd.daemon.config" in sys.modules, loader.__doc__,
      "importlib.metadata" in sys.modules)
"""


def test_serving_daemon_builds_its_models_without_the_pydantic_plugin_scan(
    tmp_path: Path,
) -> None:
    # The ``schedswitchd`` command's main (the unit's ExecStart). Fails when the serving path
    # stops putting its loader in place, when pydantic looks its plugins up elsewhere (the
    # stub then goes unused and importlib.metadata comes back), or when something else on
    # the serving path imports importlib.metadata.
    config = tmp_path / "config.toml"
    config.write_text('default = "fifo"\n[schedulers.fifo]\nobject = "fifo.bpf.o"\n')
    proc = subprocess.run(
        [sys.executable, "-c", SERVING_MAIN_IN_CHILD, str(config)],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1 True pydantic plugins: none in the daemon False"


def test_skip_pydantic_plugins_leaves_a_loaded_loader_alone() -> None:
    # A process that built a model before (this test process: the daemon's config is
    # imported above) keeps pydantic's own loader and its plugins.
    import schedswitchd.daemon.config  # noqa: F401

    assert memory_tuning.PYDANTIC_PLUGIN_LOADER in sys.modules
    before = sys.modules[memory_tuning.PYDANTIC_PLUGIN_LOADER]
    assert memory_tuning.skip_pydantic_plugins() is False
    assert sys.modules[memory_tuning.PYDANTIC_PLUGIN_LOADER] is before
