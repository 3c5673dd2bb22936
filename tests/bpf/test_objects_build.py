"""Every ``tests/bpf/*.bpf.c`` has a compiled object that is a BPF ELF file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.bpf.conftest import BPF_SRC_DIR

EM_BPF = 247


@pytest.mark.parametrize(
    "name", sorted(p.name.removesuffix(".bpf.c") for p in BPF_SRC_DIR.glob("*.bpf.c"))
)
def test_object_is_bpf_elf(name: str, bpf_object: Callable[[str], Path]) -> None:
    data = bpf_object(name).read_bytes()
    assert data[:4] == b"\x7fELF"
    assert int.from_bytes(data[18:20], "little") == EM_BPF
