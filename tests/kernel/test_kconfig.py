"""Kernel config parsing and ``__kconfig`` extern values (libbpf's rules)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import INT_BOOL, INT_CHAR
from schedswitchd.errors import LoadError
from schedswitchd.kernel import kconfig

SAMPLE = r"""
#
# Automatically generated file; DO NOT EDIT.
#
CONFIG_BPF=y
CONFIG_FOO_MOD=m
# CONFIG_SCHED_CLASS_EXT is not set
CONFIG_HZ=250
CONFIG_MASK=0x1f
CONFIG_NEG=-3
CONFIG_PERMS=0700
CONFIG_LOCALVERSION="-fc \"q\" \\ end"
CONFIG_EMPTY=""
not a config line
"""


def test_parse_values() -> None:
    v = kconfig.parse_config(SAMPLE)
    assert v["CONFIG_BPF"] is kconfig.Tristate.YES
    assert v["CONFIG_FOO_MOD"] is kconfig.Tristate.MODULE
    assert v["CONFIG_SCHED_CLASS_EXT"] is kconfig.Tristate.NO
    assert v["CONFIG_HZ"] == 250
    assert v["CONFIG_MASK"] == 0x1F
    assert v["CONFIG_NEG"] == -3
    assert v["CONFIG_PERMS"] == 700
    assert v["CONFIG_LOCALVERSION"] == '-fc "q" \\ end'
    assert v["CONFIG_EMPTY"] == ""
    assert len(v) == 9


def test_parse_errors_name_the_line() -> None:
    with pytest.raises(LoadError, match=r"cfg:2"):
        kconfig.parse_config("CONFIG_A=y\nCONFIG_B=what\n", source="cfg")
    with pytest.raises(LoadError, match="unterminated"):
        kconfig.parse_config('CONFIG_S="open\n')


def test_search_order_and_gzip(tmp_path: Path) -> None:
    plain = tmp_path / "config-x"
    gz = tmp_path / "config.gz"
    gz.write_bytes(gzip.compress(b"CONFIG_FROM_GZ=y\n"))
    cfg = kconfig.read_kernel_config([plain, gz])
    assert cfg.source == str(gz) and cfg["CONFIG_FROM_GZ"] is kconfig.Tristate.YES
    plain.write_text("CONFIG_FROM_PLAIN=1\n")
    cfg = kconfig.read_kernel_config([plain, gz])
    assert dict(cfg) == {"CONFIG_FROM_PLAIN": 1}
    with pytest.raises(LoadError, match="no kernel config found"):
        kconfig.read_kernel_config([tmp_path / "nope"])


def test_default_paths_follow_uname() -> None:
    rel = os.uname().release
    assert [str(p) for p in kconfig.config_paths()] == [
        f"/boot/config-{rel}",
        "/proc/config.gz",
        f"/usr/lib/modules/{rel}/config",
    ]


@pytest.mark.skipif(
    not any(p.exists() for p in kconfig.config_paths()), reason="no kernel config on this host"
)
def test_host_config_has_bpf() -> None:
    cfg = kconfig.read_kernel_config()
    assert cfg["CONFIG_BPF"] is kconfig.Tristate.YES
    assert cfg["CONFIG_DEBUG_INFO_BTF"] is kconfig.Tristate.YES
    assert isinstance(cfg.get("CONFIG_HZ"), int)
    assert len(cfg) > 1000


def test_kernel_version_code() -> None:
    assert kconfig.kernel_version_code("6.18.44-fc-v669") == (6 << 16) | (18 << 8) | 44
    assert kconfig.kernel_version_code("4.19.300") == (4 << 16) | (19 << 8) | 255
    assert kconfig.kernel_version_code("6.1-rc1") == (6 << 16) | (1 << 8)
    assert kconfig.kernel_version_code("weird") == 0


def _types() -> tuple[Btf, dict[str, int]]:
    b = BtfBuilder()
    ids = {
        "bool": b.add_int("_Bool", 1, encoding=INT_BOOL),
        "char": b.add_int("char", 1, encoding=INT_CHAR),
        "u8": b.add_int("unsigned char", 1),
        "s16": b.add_int("short", 2, signed=True),
        "int": b.add_int("int", 4, signed=True),
        "u64": b.add_int("unsigned long long", 8),
    }
    ids["tri"] = b.add_enum(
        "libbpf_tristate", 4, [("TRI_NO", 0), ("TRI_YES", 1), ("TRI_MODULE", 2)]
    )
    ids["other_enum"] = b.add_enum("colour", 4, [("RED", 0)])
    ids["str"] = b.add_array(ids["char"], ids["int"], 8)
    ids["const_int"] = b.add_const(b.add_typedef("s32", ids["int"]))
    ids["ptr"] = b.add_ptr(ids["int"])
    return Btf.from_bytes(b.build()), ids


@pytest.mark.parametrize(
    ("type_key", "value", "expected"),
    [
        ("bool", kconfig.Tristate.YES, b"\x01"),
        ("bool", kconfig.Tristate.NO, b"\x00"),
        ("tri", kconfig.Tristate.MODULE, b"\x02\0\0\0"),
        ("tri", kconfig.Tristate.YES, b"\x01\0\0\0"),
        ("char", kconfig.Tristate.MODULE, b"m"),
        ("int", 250, (250).to_bytes(4, "little")),
        ("const_int", -3, (-3).to_bytes(4, "little", signed=True)),
        ("s16", -32768, (-32768).to_bytes(2, "little", signed=True)),
        ("u64", 0xFFFF_FFFF_FFFF_FFFF, b"\xff" * 8),
        ("u8", 255, b"\xff"),
        ("str", "-fc", b"-fc\0\0\0\0\0"),
        ("str", "0123456789", b"0123456\0"),
    ],
)
def test_encode_values(type_key: str, value: kconfig.KconfigValue, expected: bytes) -> None:
    btf, ids = _types()
    slot = kconfig.classify(btf, ids[type_key], "CONFIG_X")
    assert kconfig.encode_value(slot, "CONFIG_X", value) == expected


@pytest.mark.parametrize(
    ("type_key", "value", "message"),
    [
        ("bool", kconfig.Tristate.MODULE, "needs a tristate"),
        ("int", kconfig.Tristate.YES, "does not fit"),
        ("int", "str", "needs a char array"),
        ("str", 5, "needs an integer"),
        ("u8", 256, "overflows"),
        ("u8", -1, "overflows"),
        ("s16", 40000, "overflows"),
    ],
)
def test_encode_mismatches(type_key: str, value: kconfig.KconfigValue, message: str) -> None:
    btf, ids = _types()
    slot = kconfig.classify(btf, ids[type_key], "CONFIG_X")
    with pytest.raises(LoadError, match=message):
        kconfig.encode_value(slot, "CONFIG_X", value)


def test_unsupported_extern_types() -> None:
    btf, ids = _types()
    for key in ("other_enum", "ptr"):
        with pytest.raises(LoadError, match="CONFIG_BAD"):
            kconfig.classify(btf, ids[key], "CONFIG_BAD")


def test_extern_bytes_weak_strong_and_version() -> None:
    btf, ids = _types()
    cfg = {"CONFIG_HZ": 1000}
    assert kconfig.extern_bytes(btf, ids["int"], "CONFIG_HZ", cfg, weak=False) == (1000).to_bytes(
        4, "little"
    )
    assert kconfig.extern_bytes(btf, ids["u64"], "CONFIG_MISSING", cfg, weak=True) == bytes(8)
    with pytest.raises(LoadError, match="CONFIG_MISSING"):
        kconfig.extern_bytes(btf, ids["u64"], "CONFIG_MISSING", cfg, weak=False)
    ver = kconfig.extern_bytes(
        btf, ids["int"], "LINUX_KERNEL_VERSION", cfg, weak=False, release="6.18.2"
    )
    assert int.from_bytes(ver, "little") == 0x061202


def test_virtual_linux_externs() -> None:
    btf, ids = _types()
    assert kconfig.extern_bytes(btf, ids["bool"], "LINUX_HAS_BPF_COOKIE", {}, weak=False) == b"\x01"
    wrapper = kconfig.extern_bytes(btf, ids["bool"], "LINUX_HAS_SYSCALL_WRAPPER", {}, weak=False)
    assert wrapper == bytes([kconfig.has_syscall_wrapper()])
    assert kconfig.extern_bytes(btf, ids["int"], "LINUX_HAS_BPF_COOKIE", {}, weak=False) == (
        (1).to_bytes(4, "little")
    )
    with pytest.raises(LoadError, match="LINUX_NOT_A_THING"):
        kconfig.extern_bytes(btf, ids["int"], "LINUX_NOT_A_THING", {}, weak=False)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 syscall wrapper names")
def test_host_has_syscall_wrapper() -> None:
    assert kconfig.has_syscall_wrapper()  # x86-64 kernels since 4.17 wrap every syscall
