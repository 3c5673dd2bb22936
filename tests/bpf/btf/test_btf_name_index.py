"""The compact per-kind name index of :class:`Btf`: same answers as a scan over every type
(host vmlinux, flavoured names), and little memory kept after it is built."""

from __future__ import annotations

import tracemalloc
from collections import defaultdict
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Kind, essential_name

VMLINUX = Path("/sys/kernel/btf/vmlinux")
needs_vmlinux = pytest.mark.skipif(not VMLINUX.exists(), reason="no /sys/kernel/btf/vmlinux")


def _scan(btf: Btf) -> dict[tuple[str, Kind], list[int]]:
    by_name: dict[tuple[str, Kind], list[int]] = defaultdict(list)
    for tid in btf.own_ids():
        by_name[btf.type_name(tid), btf.kind(tid)].append(tid)
    return by_name


def test_flavoured_and_repeated_names() -> None:
    b = BtfBuilder()
    i32 = b.add_int("int", 4)
    ids = {
        nm: b.add_struct(nm, 4, [("a", i32, 0, 0)])
        for nm in ("foo", "foo___v2", "foo___v2___compat", "__x___", "bar___1")
    }
    foo_again = b.add_struct("foo", 8, [])
    union_foo = b.add_union("foo", 4, [])
    anon = [b.add_struct("", 4, []), b.add_struct("", 8, [])]
    btf = Btf.from_bytes(b.build())
    assert btf.find_ids("foo", Kind.STRUCT) == [ids["foo"], foo_again]
    assert btf.find("foo", Kind.STRUCT) == ids["foo"]
    assert btf.find_ids("foo", Kind.UNION) == [union_foo]
    assert btf.find_ids("", Kind.STRUCT) == anon
    assert btf.find_ids("fo", Kind.STRUCT) == [] and btf.find("nope", Kind.STRUCT) is None
    # foo___v2 -> foo; foo___v2___compat -> foo___v2 (last separator); __x___ unchanged.
    assert btf.find_by_essential_name("foo", Kind.STRUCT) == [
        ids["foo"],
        ids["foo___v2"],
        foo_again,
    ]
    assert btf.find_by_essential_name("foo___v2", Kind.STRUCT) == [ids["foo___v2___compat"]]
    assert btf.find_by_essential_name("__x___", Kind.STRUCT) == [ids["__x___"]]
    assert btf.find_by_essential_name("bar", Kind.STRUCT) == [ids["bar___1"]]
    assert btf.find_by_essential_name("bar___1", Kind.STRUCT) == []
    assert btf.find_by_essential_name("foo", Kind.UNION) == [union_foo]


@needs_vmlinux
@pytest.mark.slow  # every name of the vmlinux BTF
def test_vmlinux_lookups_match_a_full_scan() -> None:
    btf = Btf.from_file(VMLINUX)
    by_name = _scan(btf)
    by_ess: dict[tuple[str, Kind], list[int]] = defaultdict(list)
    for (nm, kind), tids in by_name.items():
        by_ess[essential_name(nm), kind].extend(tids)
    for (nm, kind), tids in by_name.items():
        assert btf.find_ids(nm, kind) == tids, (nm, kind)
        assert btf.find(nm, kind) == tids[0]
    for (ess, kind), tids in by_ess.items():
        assert btf.find_by_essential_name(ess, kind) == sorted(tids), (ess, kind)
    assert btf.find_ids("no_such_type_anywhere", Kind.STRUCT) == []


@needs_vmlinux
@pytest.mark.slow  # the vmlinux BTF decoded in full
def test_vmlinux_indexes_keep_little_memory() -> None:
    btf = Btf.from_file(VMLINUX)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for kind in Kind:
            if kind != Kind.UNKN:
                btf.find_by_essential_name("task_struct", kind)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Two arrays, 8 bytes per type (~150k types); a dict of decoded names kept ~14 MiB.
    assert kept < 16 * len(btf) + (1 << 20), kept
