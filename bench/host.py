"""The host-only benchmarks in one run, one table.

Runs, each in its own subprocess with ``--json`` (so one's imports and caches do not favour
another), and prints one markdown table with ours next to libbpf measured in the same run:

* ``bench/btf_parse.py``: vmlinux BTF ready for a by-name lookup (``Btf.from_file`` vs
  libbpf 1.1 ``btf__parse``, fresh process per run) and the RSS it adds;
* ``bench/kmod_btf.py``: the declared module's BTF ready with 1/10/100/300 real module BTFs
  present (libbpf's way: parse every module; ours cold and warm);
* ``bench/object_open.py``: open (ELF, BTF, relocations; programs linked at first use) of
  the largest test object, ours cold and from the spec cache, vs libbpf
  ``bpf_object__open_file``;
* ``bench/load_attach.py``: load + attach + detach of the ``tcp_congestion_ops`` test
  object, ours with kernel BTF already parsed vs libbpf through ctypes, and the share of
  our time inside ``bpf(2)``.

Times are medians in ms; "ratio" is ours / libbpf. Exit status 0 when every benchmark met
its own target, 2 when one missed, 1 when one failed to run. Needs root (bpf()) and the
``make kernel`` cache (kmod_btf) and ``make test-objects`` (load_attach).

Usage: ``python bench/host.py [--runs N] [--out FILE.md]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def run(script: str, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    """Run ``bench/<script> --json ARGS``; (status, parsed JSON or None, stderr)."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--json", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        data = None
    return proc.returncode, data, proc.stderr


def table(
    btf: dict[str, Any] | None,
    kmod: dict[str, Any] | None,
    oo: dict[str, Any] | None,
    la: dict[str, Any] | None,
) -> list[str]:
    """Markdown rows: benchmark, case, ours ms, libbpf ms, ratio, note."""
    out = [
        "| benchmark | case | ours ms | libbpf 1.1 ms | ours/libbpf | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    if btf is not None:
        mib = 1 << 20
        out.append(
            f"| BTF parse | vmlinux, ready for lookup | {btf['ours_ms']:.1f} "
            f"| {btf['libbpf_ms']:.1f} | {btf['ratio']:.2f} | added RSS ours "
            f"{btf['ours_rss'] / mib:.1f} MiB, libbpf {btf['libbpf_rss'] / mib:.1f} MiB; "
            f"{btf['runs']} fresh processes |"
        )
    if kmod is not None:
        for n, cell in kmod["ms"].items():
            a, b, c = cell["a"], cell["b"], cell["c"]
            out.append(
                f"| module BTF of 1 declared ({kmod['declared']}) | {n} modules present "
                f"| cold {b:.3f} / warm {c:.4f} | {a:.3f} | {b / a:.3f} / {c / a:.5f} "
                f"| libbpf parses every module |"
            )
    if oo is not None:
        ms = oo["ms"]
        ref = ms["libbpf open"]
        core = (
            f"; CO-RE of all its relocations {ms['ours CO-RE']:.2f} ms"
            if "ours CO-RE" in ms
            else ""
        )
        out.append(
            f"| object open | {oo['object']} | cold {ms['ours cold']:.2f} / cached "
            f"{ms['ours cached']:.4f} | {ref:.2f} | {ms['ours cold'] / ref:.2f} / "
            f"{ms['ours cached'] / ref:.4f} | libbpf does CO-RE at load{core} |"
        )
    if la is not None:
        out.append(
            f"| load + attach + detach | tcp_congestion_ops object | {la['ours_ms']:.2f} "
            f"| {la['libbpf_ms']:.2f} | {la['ratio']:.2f} "
            f"| {la['ours_syscall_share'] * 100:.0f}% of ours inside bpf(); {la['runs']} runs |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=None, help="runs per benchmark (their default)")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args(argv)
    runs = ["--runs", str(args.runs)] if args.runs else []
    results: dict[str, tuple[int, dict[str, Any] | None, str]] = {}
    for script in ("btf_parse.py", "kmod_btf.py", "object_open.py", "load_attach.py"):
        t0 = time.monotonic()
        results[script] = run(script, *runs)
        status, data, err = results[script]
        print(f"{script}: status {status} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        if data is None:
            print(f"{script} failed:\n{err}", file=sys.stderr)
    lines = table(*(results[s][1] for s in results))
    for script, (status, data, err) in results.items():
        if data is None:
            last = (err.strip().splitlines() or ["no output"])[-1]
            lines.append(f"| {script} | did not run (status {status}) | | | | {last[:160]} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    statuses = [s for s, d, _ in results.values()]
    if any(d is None for _, d, _ in results.values()):
        return 1
    return 2 if any(s != 0 for s in statuses) else 0


if __name__ == "__main__":
    sys.exit(main())
