"""Benchmark: vmlinux BTF ready for a by-name lookup, ours vs libbpf, in the same run.

Measures, each in a fresh subprocess (so resident memory is meaningful), the wall time of
``Btf.from_file(PATH)`` + ``find("task_struct", STRUCT)`` against libbpf's ``btf__parse`` +
``btf__find_by_name_kind`` called through ctypes (``libbpf.so.1``), and the resident memory
(RSS, from ``/proc/self/statm``) each adds while the parsed BTF is alive. Library loading
(``import`` / ``dlopen``) happens before the clock starts and is reported separately.

A third series runs our reader on a regular-file copy of the same BTF: the kernel maps
``/sys/kernel/btf/vmlinux`` straight onto its own BTF pages, which RSS does not count, while a
copy's mapped page-cache pages do.

Prints the medians of ``--runs`` runs per side (>= 7, interleaved) and the ratios; targets:
time ratio <= 10, our added RSS <= 3x the file size.

Usage: ``python bench/btf_parse.py [--runs N] [--path /sys/kernel/btf/vmlinux]``.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_PATH = "/sys/kernel/btf/vmlinux"
LOOKUP = "task_struct"
BTF_KIND_STRUCT = 4
TIME_TARGET = 10.0
RSS_TARGET = 3.0


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child_ours(path: str) -> dict[str, Any]:
    """One measurement of our reader (run in a fresh process)."""
    t0 = time.perf_counter()
    from schedswitchd.bpf.btf.reader import Btf
    from schedswitchd.bpf.btf.types import Kind

    t_import = time.perf_counter() - t0
    rss0 = _rss_bytes()
    t1 = time.perf_counter()
    btf = Btf.from_file(path)
    tid = btf.find(LOOKUP, Kind.STRUCT)
    t2 = time.perf_counter()
    rss1 = _rss_bytes()
    assert tid is not None
    return {"ms": (t2 - t1) * 1e3, "rss": rss1 - rss0, "id": tid, "load_ms": t_import * 1e3}


def child_libbpf(path: str) -> dict[str, Any]:
    """One measurement of libbpf's btf__parse via ctypes (run in a fresh process)."""
    t0 = time.perf_counter()
    lib = ctypes.CDLL(ctypes.util.find_library("bpf") or "libbpf.so.1", use_errno=True)
    lib.btf__parse.restype = ctypes.c_void_p
    lib.btf__parse.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    lib.btf__find_by_name_kind.restype = ctypes.c_int32
    lib.btf__find_by_name_kind.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32]
    lib.btf__free.argtypes = [ctypes.c_void_p]
    t_load = time.perf_counter() - t0
    rss0 = _rss_bytes()
    t1 = time.perf_counter()
    btf = lib.btf__parse(path.encode(), None)
    if not btf:
        raise OSError(ctypes.get_errno(), f"btf__parse({path}) failed")
    tid = lib.btf__find_by_name_kind(btf, LOOKUP.encode(), BTF_KIND_STRUCT)
    t2 = time.perf_counter()
    rss1 = _rss_bytes()
    lib.btf__free(btf)
    return {"ms": (t2 - t1) * 1e3, "rss": rss1 - rss0, "id": tid, "load_ms": t_load * 1e3}


def _run_child(side: str, path: str) -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run(
        [sys.executable, __file__, "--child", side, "--path", path],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", default=DEFAULT_PATH)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--child", choices=["ours", "libbpf"], help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print one JSON object (bench/host.py)")
    args = ap.parse_args(argv)
    if args.child:
        fn = child_ours if args.child == "ours" else child_libbpf
        print(json.dumps(fn(args.path)))
        return 0
    runs = max(7, args.runs)
    size = os.stat(args.path).st_size or len(Path(args.path).read_bytes())
    results: dict[str, list[dict[str, Any]]] = {"ours": [], "libbpf": [], "copy": []}
    with tempfile.TemporaryDirectory() as tmp:
        # The kernel maps /sys/kernel/btf/vmlinux as its own pages (not counted in RSS); a
        # copy in a regular file shows what mapping page-cache pages costs instead.
        copy = str(Path(tmp) / "vmlinux.btf")
        shutil.copyfile(args.path, copy)
        for _ in range(runs):
            for side in ("libbpf", "ours"):
                results[side].append(_run_child(side, args.path))
            results["copy"].append(_run_child("ours", copy))
    ids = {r["id"] for side in results.values() for r in side}
    if len(ids) != 1:
        print(f"error: the two readers disagree on {LOOKUP}'s id: {sorted(ids)}", file=sys.stderr)
        return 1

    def med(side: str, key: str) -> float:
        return float(statistics.median(float(r[key]) for r in results[side]))

    ours_ms, lib_ms = med("ours", "ms"), med("libbpf", "ms")
    ours_rss, lib_rss = med("ours", "rss"), med("libbpf", "rss")
    ratio = ours_ms / lib_ms
    rss_x = ours_rss / size
    mib = 1 << 20
    status = 0 if ratio <= TIME_TARGET and rss_x <= RSS_TARGET else 2
    if args.json:
        out = {"runs": runs, "size": size, "ours_ms": ours_ms, "libbpf_ms": lib_ms,
               "ratio": ratio, "ours_rss": ours_rss, "libbpf_rss": lib_rss,
               "copy_ms": med("copy", "ms"), "rss_x": rss_x, "status": status}  # fmt: skip
        print(json.dumps(out))
        return status
    print(f"file: {args.path} ({size / mib:.2f} MiB); lookup {LOOKUP!r} -> id {ids.pop()}")
    print(f"runs: {runs} per side, fresh subprocess each; medians")
    print(
        f"libbpf btf__parse+find:        {lib_ms:8.2f} ms   added RSS {lib_rss / mib:6.2f} MiB"
        f"   (dlopen {med('libbpf', 'load_ms'):.1f} ms, not counted)"
    )
    print(
        f"ours from_file+find:           {ours_ms:8.2f} ms   added RSS {ours_rss / mib:6.2f} MiB"
        f"   (import {med('ours', 'load_ms'):.1f} ms, not counted)"
    )
    print(
        f"ours, regular-file copy:       {med('copy', 'ms'):8.2f} ms   added RSS "
        f"{med('copy', 'rss') / mib:6.2f} MiB"
    )
    print(
        f"time ratio ours/libbpf: {ratio:.2f} (target <= {TIME_TARGET:g}); "
        f"our added RSS / file size: {rss_x:.2f} (target <= {RSS_TARGET:g})"
    )
    return status


if __name__ == "__main__":
    raise SystemExit(main())
