"""Comparing our BTF dump with bpftool's ``btf dump -j`` (tests/bpf/btf/test_btf_bpftool.py,
test_btf_split_modules.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any


def bpftool_json(path: Path, base: Path | None = None) -> list[dict[str, Any]]:
    """bpftool's raw JSON dump of ``path`` (split on ``base``)."""
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    cmd = [bpftool, "btf", "dump", "file", str(path)]
    if base is not None:
        cmd += ["-B", str(base)]
    cmd += ["format", "raw", "-j"]
    out = subprocess.run(cmd, check=True, capture_output=True).stdout
    types: list[dict[str, Any]] = json.loads(out)["types"]
    return types


def assert_same_types(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
    """Equal type lists; on failure name the first differing types."""
    diffs = [(a, b) for a, b in zip(ours, theirs, strict=False) if a != b]
    shown = "\n".join(f"ours:    {a}\nbpftool: {b}" for a, b in diffs[:3])
    assert not diffs, f"{len(diffs)} types differ; first ones:\n{shown}"
    assert len(ours) == len(theirs)
