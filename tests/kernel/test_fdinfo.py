"""memlock from fdinfo, against maps and a program the host kernel creates."""

from __future__ import annotations

import os

import pytest

from schedswitchd.kernel import syscall
from schedswitchd.kernel.bpf_uapi import MapType
from schedswitchd.kernel.fdinfo import fdinfo, memlock_bytes

pytestmark = pytest.mark.root


def test_array_map_memlock_grows_with_its_size() -> None:
    small = syscall.map_create(MapType.ARRAY, 4, 8, 16, name="ssd_fi_small")
    big = syscall.map_create(MapType.ARRAY, 4, 4096, 1024, name="ssd_fi_big")
    try:
        assert fdinfo(big.fd)["map_type"] == str(MapType.ARRAY)
        # the kernel charges at least the values it holds
        assert memlock_bytes(big.fd) >= 4096 * 1024
        assert 0 < memlock_bytes(small.fd) < memlock_bytes(big.fd)
    finally:
        small.close()
        big.close()


def test_closed_or_non_bpf_fd_is_zero() -> None:
    r, w = os.pipe()
    try:
        assert memlock_bytes(r) == 0
    finally:
        os.close(r)
        os.close(w)
    assert memlock_bytes(r) == 0
