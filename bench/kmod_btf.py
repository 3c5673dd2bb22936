"""Benchmark: resolving the one module BTF an object declares, as the module count grows.

For N = 1, 10, 100, 300 module BTFs present (real split BTF of Debian sid's kernel, from the
``tools.sidkernel`` cache; the declared module is always among them), measures the time to
have the declared module's BTF parsed and ready, three ways, in the same run:

(a) libbpf's way: whenever something is missing from vmlinux, libbpf reads and parses the
    BTF of *every* loaded module (``load_module_btfs()``). Emulated on a directory shaped
    like ``/sys/kernel/btf`` with libbpf's own parser, ``btf__parse_split(path, vmlinux)``
    from ``libbpf.so.1`` through ctypes, on each of the N files (the kernel-side id walk
    libbpf also does is not counted, which favours (a));
(b) ours, cold: a new :class:`~schedswitchd.kernel.btf.registry.KernelBtfRegistry` on that
    directory, ``targets([declared])``: reads and parses the one declared file;
(c) ours, warm: the same call on a registry that already holds it (a file-identity check
    and a cache hit).

vmlinux BTF is parsed once beforehand for every side (libbpf's handle and our process-wide
one) and not counted. Each cell is the median of all its samples: ``--runs`` rounds of 1 (a),
10 (b) or 20 (c) timed calls. Medians, because a 2-core machine shared with other work shows
rare multi-millisecond stalls that a mean would smear over a cell. Within a round ours run
first, in an N order that rotates from round to round, then libbpf, so neither drift nor
libbpf's cache pollution favours one N. GC is off while timing. Prints the table with ratios
against (a) and the flatness of (b) and (c) from the smallest to the largest N.

Targets: (b) and (c) flat within 5% from 1 to 300 modules; (c) at 300 at most
1/20 of (a). Exit status 0 when met, 2 when not.

Usage: ``python bench/kmod_btf.py [--runs N] [--declared nf_tables] [--counts 1,10,100,300]``.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schedswitchd.kernel.btf.registry import KernelBtfRegistry, shared_vmlinux
from tools.sidkernel import ensure_kernel

FLAT_TARGET = 0.05
# Samples per round: (b) and (c) take micro-, not milliseconds, so one sample is noisier.
REPEAT = {"a": 1, "b": 10, "c": 20}
WARM_TARGET = 1 / 20


class Libbpf:
    """The few libbpf (``libbpf.so.1``) BTF calls the emulation needs."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(ctypes.util.find_library("bpf") or "libbpf.so.1", use_errno=True)
        lib.btf__parse.restype = ctypes.c_void_p
        lib.btf__parse.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        lib.btf__parse_split.restype = ctypes.c_void_p
        lib.btf__parse_split.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        lib.btf__type_cnt.restype = ctypes.c_uint32
        lib.btf__type_cnt.argtypes = [ctypes.c_void_p]
        lib.btf__free.argtypes = [ctypes.c_void_p]
        self.lib = lib

    def parse(self, path: Path, base: int | None = None) -> int:
        fn = self.lib.btf__parse if base is None else self.lib.btf__parse_split
        btf: int | None = fn(str(path).encode(), base)
        if not btf:
            raise OSError(ctypes.get_errno(), f"libbpf could not parse {path}")
        return btf

    def type_cnt(self, btf: int) -> int:
        return int(self.lib.btf__type_cnt(btf))

    def free(self, btf: int) -> None:
        self.lib.btf__free(btf)


def make_root(src: Path, dest: Path, declared: str, others: list[str]) -> Path:
    """A directory shaped like /sys/kernel/btf: symlinks to vmlinux, declared and others."""
    dest.mkdir()
    for name in ("vmlinux", declared, *others):
        os.symlink(src / name, dest / name)
    return dest


def spread(names: list[str], k: int) -> list[str]:
    """``k`` names evenly spread over ``names`` (deterministic)."""
    if k <= 0:
        return []
    step = len(names) / k
    return [names[int(i * step)] for i in range(k)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--declared", default="nf_tables")
    ap.add_argument("--counts", default="1,10,100,300")
    ap.add_argument("--json", action="store_true", help="print one JSON object (bench/host.py)")
    args = ap.parse_args(argv)
    runs = max(5, args.runs)
    counts = sorted({int(c) for c in args.counts.split(",")})
    kernel = ensure_kernel()
    src = kernel.btf_root
    pool = [n for n in kernel.module_btf_names() if n != args.declared]
    if args.declared not in kernel.module_btf_names() or max(counts) - 1 > len(pool):
        print(f"error: need {args.declared!r} and {max(counts)} modules in {src}", file=sys.stderr)
        return 1
    lib = Libbpf()
    lib_vmlinux = lib.parse(src / "vmlinux")
    vmlinux = shared_vmlinux(src / "vmlinux")  # ours, once per process

    with tempfile.TemporaryDirectory(prefix="kmod-btf-bench-") as tmp:
        roots = {
            n: make_root(src, Path(tmp) / f"n{n}", args.declared, spread(pool, n - 1))
            for n in counts
        }
        files = {n: sorted(p for p in r.iterdir() if p.name != "vmlinux") for n, r in roots.items()}
        warm = {n: KernelBtfRegistry(btf_root=r) for n, r in roots.items()}
        for reg in warm.values():
            assert reg.targets([args.declared]).report.modules_read == 1
            assert reg.vmlinux is vmlinux

        def side_a(n: int) -> None:
            handles = [lib.parse(p, lib_vmlinux) for p in files[n]]
            for h in handles:
                lib.free(h)

        def side_b(n: int) -> None:
            t = KernelBtfRegistry(btf_root=roots[n]).targets([args.declared])
            assert t.report.modules_read == 1

        def side_c(n: int) -> None:
            t = warm[n].targets([args.declared])
            assert t.report.cache_hits == 1 and t.report.modules_read == 0

        sides: dict[str, Callable[[int], None]] = {"a": side_a, "b": side_b, "c": side_c}
        samples: dict[tuple[str, int], list[int]] = {(s, n): [] for s in sides for n in counts}
        gc.collect()
        gc.disable()  # a collection inside one sample would be charged to whichever side
        try:
            for r in range(runs):
                # Ours first, in a rotating N order, then libbpf: parsing hundreds of modules
                # evicts CPU caches, which must not be charged to the N that happens to
                # follow it.
                order = counts[r % len(counts) :] + counts[: r % len(counts)]
                for s in ("b", "c", "a"):
                    for n in order:
                        for _ in range(REPEAT[s]):
                            t0 = time.perf_counter_ns()
                            sides[s](n)
                            samples[(s, n)].append(time.perf_counter_ns() - t0)
                gc.collect()
        finally:
            gc.enable()
    lib.free(lib_vmlinux)

    def med(s: str, n: int) -> float:
        return float(statistics.median(samples[(s, n)])) / 1e6

    lo, hi = counts[0], counts[-1]
    if args.json:
        rows = {n: {s: med(s, n) for s in "abc"} for n in counts}
        ok = (abs(med("b", hi) / med("b", lo) - 1) <= FLAT_TARGET
              and abs(med("c", hi) / med("c", lo) - 1) <= FLAT_TARGET
              and med("c", hi) / med("a", hi) <= WARM_TARGET)  # fmt: skip
        print(json.dumps({"runs": runs, "declared": args.declared, "ms": rows,
                          "status": 0 if ok else 2}))  # fmt: skip
        return 0 if ok else 2
    print(f"kernel {kernel.version}: declared module {args.declared!r}; {runs} runs, medians (ms)")
    print("(a) libbpf: btf__parse_split of every module BTF present")
    print("(b) ours, cold: new registry, targets([declared])   (c) ours, warm: cached")
    print()
    print("| modules | (a) libbpf ms | (b) cold ms | (c) warm ms | (b)/(a) | (c)/(a) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in counts:
        a, b, c = med("a", n), med("b", n), med("c", n)
        print(f"| {n} | {a:.3f} | {b:.3f} | {c:.4f} | {b / a:.3f} | {c / a:.4f} |")
    flat_b = med("b", hi) / med("b", lo) - 1
    flat_c = med("c", hi) / med("c", lo) - 1
    warm_ratio = med("c", hi) / med("a", hi)
    print()
    print(
        f"flatness {lo}->{hi} modules: (b) {flat_b:+.1%}, (c) {flat_c:+.1%} "
        f"(target within ±{FLAT_TARGET:.0%}); (c)/(a) at {hi}: 1/{1 / warm_ratio:.0f} "
        f"(target <= 1/{1 / WARM_TARGET:.0f})"
    )
    ok = abs(flat_b) <= FLAT_TARGET and abs(flat_c) <= FLAT_TARGET and warm_ratio <= WARM_TARGET
    return 0 if ok else 2


if __name__ == "__main__":
    raise SystemExit(main())
