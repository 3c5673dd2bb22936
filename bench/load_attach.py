"""Benchmark: load + attach + detach of a BPF TCP congestion control, ours vs libbpf.

The object is ``build/tests/bpf/tcp_ca.bpf.o`` (``make test-objects``; legacy
``.struct_ops``, which Debian 12's libbpf 1.1 also loads). One iteration is, on each side:
open the ELF object, load it (BTF, maps, programs), attach the struct_ops map (the
congestion control appears in ``/proc/sys/net/ipv4/tcp_available_congestion_control``),
detach and unload.

* ours: ``open_object`` + ``load_object`` + ``attach_struct_ops`` + ``close``, with the
  kernel BTF already parsed (``KernelBtfRegistry``), as the daemon runs it;
* libbpf through ctypes: ``bpf_object__open_file`` + ``bpf_object__load`` +
  ``bpf_map__attach_struct_ops`` + ``bpf_link__destroy`` + ``bpf_object__close`` (libbpf
  parses vmlinux BTF inside every load).

Runs are interleaved in one process; prints the median ms of each side, the ratio
ours/libbpf, and the share of our time spent inside ``bpf(2)`` (from
``schedswitchd.kernel.syscall.STATS``). Needs root.

Usage: ``python bench/load_attach.py [--runs N] [--object PATH] [--json]``.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from schedswitchd.bpf.object import open_object
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import load_object

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OBJECT = REPO / "build" / "tests" / "bpf" / "tcp_ca.bpf.o"
CA_NAME = "ssd_bench"
MAP_NAME = "ssd_bench"
CA_LIST = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


def _registered() -> bool:
    return CA_NAME in CA_LIST.read_text().split()


class Libbpf:
    """The few libbpf calls the benchmark needs, through ctypes."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(ctypes.util.find_library("bpf") or "libbpf.so.1", use_errno=True)
        lib.bpf_object__open_file.restype = ctypes.c_void_p
        lib.bpf_object__open_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        lib.bpf_object__load.restype = ctypes.c_int
        lib.bpf_object__load.argtypes = [ctypes.c_void_p]
        lib.bpf_object__find_map_by_name.restype = ctypes.c_void_p
        lib.bpf_object__find_map_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.bpf_map__attach_struct_ops.restype = ctypes.c_void_p
        lib.bpf_map__attach_struct_ops.argtypes = [ctypes.c_void_p]
        lib.bpf_link__destroy.restype = ctypes.c_int
        lib.bpf_link__destroy.argtypes = [ctypes.c_void_p]
        lib.bpf_object__close.argtypes = [ctypes.c_void_p]
        lib.libbpf_get_error.restype = ctypes.c_long
        lib.libbpf_get_error.argtypes = [ctypes.c_void_p]
        self.lib = lib

    def cycle(self, path: str) -> float:
        """One open/load/attach/detach/close; returns ms."""
        lib = self.lib
        t0 = time.perf_counter()
        obj = lib.bpf_object__open_file(path.encode(), None)
        if not obj or lib.libbpf_get_error(obj):
            raise OSError(ctypes.get_errno(), f"bpf_object__open_file({path}) failed")
        try:
            if lib.bpf_object__load(obj) != 0:
                raise OSError(ctypes.get_errno(), "bpf_object__load failed")
            m = lib.bpf_object__find_map_by_name(obj, MAP_NAME.encode())
            link = lib.bpf_map__attach_struct_ops(m)
            if not link or lib.libbpf_get_error(link):
                raise OSError(ctypes.get_errno(), "bpf_map__attach_struct_ops failed")
            attached = _registered()
            lib.bpf_link__destroy(link)
        finally:
            lib.bpf_object__close(obj)
        elapsed = (time.perf_counter() - t0) * 1e3
        if not attached:
            raise RuntimeError("libbpf: congestion control was not registered")
        return elapsed


def ours_cycle(path: str, registry: KernelBtfRegistry) -> tuple[float, int]:
    """One open/load/attach/detach/close with our loader; returns (ms, ns in bpf())."""
    syscall.STATS.reset()
    t0 = time.perf_counter()
    spec = open_object(path)
    with load_object(
        spec, registry.targets(spec.kmod_btfs), open_btf_object=registry.open_btf_object
    ) as obj:
        obj.attach_struct_ops()
        attached = _registered()
        obj.detach_struct_ops()
    elapsed = (time.perf_counter() - t0) * 1e3
    if not attached:
        raise RuntimeError("ours: congestion control was not registered")
    return elapsed, syscall.STATS.total_ns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--object", default=str(DEFAULT_OBJECT))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not Path(args.object).is_file():
        print(f"{args.object} is missing: run `make test-objects`", file=sys.stderr)
        return 2
    registry = KernelBtfRegistry()
    registry.targets(())  # parse vmlinux BTF once, before the clock, as the daemon does
    libbpf = Libbpf()
    ours_cycle(args.object, registry)  # warm-up: imports, first-use caches
    libbpf.cycle(args.object)
    ours_ms: list[float] = []
    ours_sys: list[float] = []
    theirs_ms: list[float] = []
    for _ in range(max(args.runs, 3)):
        ms, sys_ns = ours_cycle(args.object, registry)
        ours_ms.append(ms)
        ours_sys.append(sys_ns / 1e6 / ms)
        theirs_ms.append(libbpf.cycle(args.object))
    result: dict[str, Any] = {
        "runs": len(ours_ms),
        "ours_ms": statistics.median(ours_ms),
        "libbpf_ms": statistics.median(theirs_ms),
        "ratio": statistics.median(ours_ms) / statistics.median(theirs_ms),
        "ours_syscall_share": statistics.median(ours_sys),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"load+attach+detach of {Path(args.object).name}, {result['runs']} runs, medians")
        print(
            f"  ours   {result['ours_ms']:8.2f} ms  ({result['ours_syscall_share']:.0%} in bpf())"
        )
        print(f"  libbpf {result['libbpf_ms']:8.2f} ms")
        print(f"  ratio ours/libbpf {result['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
