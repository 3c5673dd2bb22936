"""Our BTF JSON equals ``bpftool btf dump file ... format raw -j``, type by type."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.json_dump import btf_to_json
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Kind
from tests.bpf.btf.bpftool_compare import assert_same_types, bpftool_json

VMLINUX = Path("/sys/kernel/btf/vmlinux")
DATA = Path(__file__).parent / "btf_data"


@pytest.mark.skipif(not VMLINUX.exists(), reason="host kernel has no /sys/kernel/btf/vmlinux")
@pytest.mark.slow  # the whole vmlinux BTF, ours and bpftool's
def test_host_vmlinux_equals_bpftool() -> None:
    ours = btf_to_json(Btf.from_file(VMLINUX))["types"]
    theirs = bpftool_json(VMLINUX)
    assert len(ours) > 10_000
    assert_same_types(ours, theirs)


def test_object_with_every_clang_kind_equals_bpftool(tmp_path: Path) -> None:
    obj = tmp_path / "kinds.bpf.o"
    subprocess.run(
        ["clang", "-g", "-O2", "-target", "bpf", "-c", str(DATA / "kinds.bpf.c"), "-o", str(obj)],
        check=True,
    )
    btf = Btf.from_file(obj)
    assert btf.name == "kinds"
    ours = btf_to_json(btf)["types"]
    kinds = {t["kind"] for t in ours}
    assert {"DECL_TAG", "TYPE_TAG", "DATASEC", "VAR", "FWD", "FLOAT", "RESTRICT"} <= kinds
    assert_same_types(ours, bpftool_json(obj))


def _builder_every_kind(b: BtfBuilder, base_int: int) -> None:
    i = b.add_int("int", 4, signed=True)
    b.add_int("_Bool", 1, encoding=4, bits=1)
    b.add_int("weird", 4, encoding=3)
    s = b.add_struct("s", 8, [("a", i, 0, 3), ("", base_int, 32, 0)])
    b.add_union("u", 4, [("x", i, 0, 0)])
    b.add_enum("e", 4, [("NEG", -1), ("POS", 7)], signed=True)
    b.add_enum("eu", 4, [("BIG", 0xFFFFFFFF), ("MID", 0x80000000)])
    b.add_enum64("e64", 8, [("N", -5), ("L", 1 << 40)], signed=True)
    b.add_enum64("e64u", 8, [("H", (1 << 64) - 1)])
    b.add_fwd("f")
    b.add_fwd("fu", is_union=True)
    b.add_type_tag("tt", b.add_ptr(s))
    proto = b.add_func_proto(i, [("a", i), ("", 0)])
    for linkage in range(4):
        b.add_func(f"fn{linkage}", proto, linkage)
    v = b.add_var("v", s, 2)
    b.add_var("odd", s, 7)
    b.add_datasec(".data", 8, [(v, 0, 8)])
    b.add_float("double", 8)
    b.add_decl_tag("t", s, 0)
    b.add_decl_tag("tt", s, -1)
    b.add_restrict(b.add_volatile(b.add_const(b.add_typedef("s_t", s))))
    b.add_array(s, i, 3)


def test_builder_output_and_split_equal_bpftool(tmp_path: Path) -> None:
    b = BtfBuilder()
    base_int = b.add_int("long", 8, signed=True)
    _builder_every_kind(b, base_int)
    base_path = tmp_path / "base.btf"
    base_path.write_bytes(b.build())
    base = Btf.from_file(base_path)
    assert_same_types(btf_to_json(base)["types"], bpftool_json(base_path))

    sb = BtfBuilder(base)
    _builder_every_kind(sb, base.find("long", Kind.INT) or 0)
    split_path = tmp_path / "split.btf"
    split_path.write_bytes(sb.build())
    split = Btf.from_file(split_path, base=base)
    ours = btf_to_json(split)["types"]
    assert ours[0]["id"] == base.end_id
    assert_same_types(ours, bpftool_json(split_path, base_path))


@pytest.mark.skipif(not VMLINUX.exists(), reason="host kernel has no /sys/kernel/btf/vmlinux")
def test_split_on_host_vmlinux_equals_bpftool(tmp_path: Path) -> None:
    vmlinux = Btf.from_file(VMLINUX)
    task = vmlinux.find("task_struct", Kind.STRUCT)
    assert task is not None
    b = BtfBuilder(vmlinux)
    ptr = b.add_ptr(task)
    s = b.add_struct("mod_ctx", 16, [("task", ptr, 0, 0), ("pid", 1, 64, 0)])
    b.add_func("mod_fn", b.add_func_proto(0, [("ctx", b.add_ptr(s))]), 1)
    path = tmp_path / "mod"
    path.write_bytes(b.build())
    split = Btf.from_file(path, base=vmlinux)
    assert split.name == "mod" and split.start_id == vmlinux.end_id
    assert_same_types(btf_to_json(split)["types"], bpftool_json(path, VMLINUX))


def test_cli_prints_bpftool_shaped_json(tmp_path: Path) -> None:
    b = BtfBuilder()
    _builder_every_kind(b, b.add_int("long", 8, signed=True))
    path = tmp_path / "x.btf"
    path.write_bytes(b.build())
    out = subprocess.run(
        [sys.executable, "-m", "schedswitchd.bpf.btf", str(path)],
        check=True,
        capture_output=True,
    ).stdout
    assert_same_types(json.loads(out)["types"], bpftool_json(path))
    bad = tmp_path / "bad.btf"
    bad.write_bytes(b"\0" * 30)
    proc = subprocess.run(
        [sys.executable, "-m", "schedswitchd.bpf.btf", str(bad)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "bad BTF magic" in proc.stderr
