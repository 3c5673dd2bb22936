"""Sum a ``make fuzz-props`` run (the property tests at scale): inputs per fuzz family,
how they ended, time, defects by class.

Reads ``DIR/stats.jsonl`` (one ``{"test": FAMILY, "outcomes": {OUTCOME: N}}`` object a
line, appended by ``tests.fuzzing.flush``) and ``DIR/junit.xml`` (pytest's, for the time
and failures of each test) and prints a Markdown table. An outcome ``defect:CLASS`` is an
input that raised something other than the allowed error (``ObjectError``/``BtfError``
for ELF and BTF, ``RequestError`` or a reply for the protocol); a failed test counts too
(hypothesis stops a test at its first defect and shrinks it).

Usage: ``python -m tools.fuzz_report build/fuzz [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

# Which pytest file feeds which family prefix (for the time column).
_FILES = {
    "elf": "tests/bpf/test_object_fuzz.py",
    "btf": "tests/bpf/btf/test_btf_fuzz.py",
    "protocol": "tests/daemon/test_protocol.py tests/daemon/test_server.py",
}


def _read_stats(path: Path) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = defaultdict(Counter)
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        out[rec["test"]].update(rec["outcomes"])
    return out


def _read_junit(path: Path) -> tuple[dict[str, float], dict[str, list[str]], float]:
    """(seconds per family, failure messages per family, total seconds)."""
    secs: dict[str, float] = defaultdict(float)
    fails: dict[str, list[str]] = defaultdict(list)
    total = 0.0
    if not path.exists():
        return secs, fails, total
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        t = float(case.get("time", "0"))
        total += t
        cls = case.get("classname", "")
        family = next(
            (f for f, files in _FILES.items() if any(_module(p) == cls for p in files.split())),
            "other",
        )
        secs[family] += t
        for bad in (*case.findall("failure"), *case.findall("error")):
            fails[family].append((bad.get("message") or "failure").splitlines()[0][:160])
    return secs, fails, total


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def report(directory: Path) -> tuple[str, bool]:
    """The Markdown report of the run in ``directory`` and whether it found a defect."""
    stats = _read_stats(directory / "stats.jsonl")
    secs, fails, total = _read_junit(directory / "junit.xml")
    families: dict[str, Counter[str]] = defaultdict(Counter)
    per_test: list[tuple[str, int, str]] = []
    for test, outcomes in sorted(stats.items()):
        family = test.split(":", 1)[0]
        families[family].update(outcomes)
        shown = ", ".join(f"{k} {v}" for k, v in outcomes.most_common())
        per_test.append((test, sum(outcomes.values()), shown))
    lines = [
        "| family | inputs | time (s) | defects by class |",
        "|---|---:|---:|---|",
    ]
    all_inputs = 0
    all_defects: Counter[str] = Counter()
    for family in sorted(families):
        c = families[family]
        n = sum(c.values())
        all_inputs += n
        defects = Counter({k.split(":", 1)[1]: v for k, v in c.items() if k.startswith("defect:")})
        all_defects.update(defects)
        text = ", ".join(f"{k} {v}" for k, v in defects.most_common()) or "none"
        if fails.get(family):
            text += f" ({len(fails[family])} failed test(s))"
        lines.append(f"| {family} | {n} | {secs.get(family, 0.0):.0f} | {text} |")
    lines.append(
        f"| all | {all_inputs} | {total:.0f} | "
        + (", ".join(f"{k} {v}" for k, v in all_defects.most_common()) or "none")
        + " |"
    )
    lines += ["", "| fuzz test | inputs | outcomes |", "|---|---:|---|"]
    lines += [f"| {t} | {n} | {shown} |" for t, n, shown in per_test]
    for family, msgs in sorted(fails.items()):
        for m in msgs:
            lines.append(f"\nfailed ({family}): {m}")
    return "\n".join(lines) + "\n", bool(all_defects or any(fails.values()))


def main(argv: list[str] | None = None) -> int:
    """Print (or write with ``--out``) the report; exit 1 when a defect was found."""
    ap = argparse.ArgumentParser(prog="fuzz_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    text, bad = report(args.directory)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
