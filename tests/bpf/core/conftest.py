"""Fixtures of the CO-RE tests: the host's vmlinux BTF and bpftool's JSON dump of it.

``test_core_modules.py`` has a ``vmlinux`` of its own (the sid kernel's, base of its
module BTFs), which overrides this one there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedswitchd.bpf.btf.reader import Btf
from tests.bpf.core.core_expect import JsonBtf, bpftool_types

#: The running kernel's BTF (tests that use it skip without it).
VMLINUX = Path("/sys/kernel/btf/vmlinux")


@pytest.fixture(scope="module")
def vmlinux() -> Btf:
    """The host's vmlinux BTF, parsed once per test module."""
    return Btf.from_file(VMLINUX, name="vmlinux")


@pytest.fixture(scope="module")
def js() -> JsonBtf:
    """``bpftool btf dump -j`` of the host's vmlinux: the expected answers."""
    return JsonBtf(bpftool_types(VMLINUX))
