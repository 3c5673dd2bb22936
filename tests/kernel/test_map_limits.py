"""The map size limits ``open_object`` checks (:func:`schedswitchd.bpf.maps.
check_kernel_limits`) are the running kernel's: a map just over each is refused by
``BPF_MAP_CREATE`` with ``E2BIG``, one at the limit is created."""

from __future__ import annotations

import errno

import pytest

from schedswitchd.bpf.maps import MAX_HASH_ENTRIES, PCPU_MIN_UNIT_SIZE
from schedswitchd.errors import BpfSyscallError
from schedswitchd.kernel.bpf_uapi import MapType
from schedswitchd.kernel.syscall import map_create

pytestmark = pytest.mark.root

F_NO_PREALLOC = 1  # BPF_F_NO_PREALLOC: nothing is allocated per entry up front


@pytest.mark.parametrize("map_type", [MapType.PERCPU_HASH, MapType.PERCPU_ARRAY])
def test_per_cpu_value_limit(map_type: MapType) -> None:
    key = 4
    flags = F_NO_PREALLOC if map_type == MapType.PERCPU_HASH else 0
    map_create(map_type, key, PCPU_MIN_UNIT_SIZE, 1, name="ssd_pcpu_ok", flags=flags).close()
    with pytest.raises(BpfSyscallError) as err:
        map_create(map_type, key, PCPU_MIN_UNIT_SIZE + 1, 1, name="ssd_pcpu_big", flags=flags)
    assert err.value.errno == errno.E2BIG


def test_hash_entry_limit() -> None:
    with pytest.raises(BpfSyscallError) as err:
        map_create(MapType.HASH, 4, 4, MAX_HASH_ENTRIES + 1, name="ssd_hash_big", flags=1)
    assert err.value.errno == errno.E2BIG
