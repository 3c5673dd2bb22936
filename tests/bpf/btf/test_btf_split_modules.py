"""Split BTF of real kernel modules (Debian sid's kernel cache) equals bpftool's ``-B`` dump.

Uses the machine-wide kernel cache of ``tools.sidkernel`` (``make kernel`` fills it): its
``btf_root`` holds the kernel's vmlinux BTF and each module's ``.BTF`` section as a file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedswitchd.bpf.btf.json_dump import btf_to_json
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Kind
from tests.bpf.btf.bpftool_compare import assert_same_types, bpftool_json
from tests.build_outputs import sid_kernel
from tools.sidkernel import SidKernel

# Modules that carry the rarer kinds in their own split BTF (ENUM64 signed/unsigned, FLOAT,
# VAR + DATASEC, DECL_TAG, RESTRICT, VOLATILE, FWD union); the rest is an even spread.
RARE_KINDS = [
    "3c59x",
    "3w_9xxx",
    "3w_xxxx",
    "adm8211",
    "amd_freq_sensitivity",
    "cros_ec",
    "fou",
    "libblake2b",
    "ocrdma",
    "xor",
]
SPREAD = 16


@pytest.fixture(scope="module")
def kernel() -> SidKernel:
    return sid_kernel()


@pytest.fixture(scope="module")
def vmlinux(kernel: SidKernel) -> Btf:
    return Btf.from_file(kernel.btf_root / "vmlinux")


def _modules(kernel: SidKernel) -> list[str]:
    names = kernel.module_btf_names()
    step = max(1, len(names) // SPREAD)
    picked = [n for n in RARE_KINDS if n in names] + names[step // 2 :: step][:SPREAD]
    return sorted(set(picked))


@pytest.mark.slow  # 20 module BTFs, ours and bpftool's
def test_at_least_20_modules_equal_bpftool(kernel: SidKernel, vmlinux: Btf) -> None:
    base_path = kernel.btf_root / "vmlinux"
    assert_same_types(btf_to_json(vmlinux)["types"], bpftool_json(base_path))
    modules = _modules(kernel)
    assert len(modules) >= 20
    seen_kinds: set[str] = set()
    for name in modules:
        path = kernel.btf_root / name
        btf = Btf.from_file(path, base=vmlinux)
        assert btf.name == name and btf.start_id == vmlinux.end_id
        ours = btf_to_json(btf)["types"]
        seen_kinds.update(t["kind"] for t in ours)
        try:
            assert_same_types(ours, bpftool_json(path, base_path))
        except AssertionError as e:
            raise AssertionError(f"module {name}: {e}") from None
    assert {"ENUM64", "FLOAT", "VAR", "DATASEC", "DECL_TAG", "RESTRICT"} <= seen_kinds


def test_module_ko_xz_reads_the_same_btf(kernel: SidKernel, vmlinux: Btf) -> None:
    kos = kernel.module_paths()
    for name in ("fou", "xor", "libblake2b"):
        assert kos[name].name.endswith(".ko.xz")
        from_ko = Btf.from_file(kos[name], base=vmlinux)
        from_root = Btf.from_file(kernel.btf_root / name, base=vmlinux)
        assert from_ko.name == name
        assert bytes(from_ko.raw) == bytes(from_root.raw)


def test_module_lookups_reach_into_vmlinux(kernel: SidKernel, vmlinux: Btf) -> None:
    fou = Btf.from_file(kernel.btf_root / "fou", base=vmlinux)
    sk_buff = fou.find("sk_buff", Kind.STRUCT)
    assert sk_buff is not None and sk_buff < fou.start_id  # only in vmlinux
    assert fou.find_ids("sk_buff", Kind.STRUCT) == []
    own_structs = [i for i in fou.own_ids() if fou.kind(i) == Kind.STRUCT]
    assert own_structs
    for tid in own_structs:
        t = fou.type(tid)
        assert fou.size_of(tid) == getattr(t, "size", None)
        assert tid in fou.find_ids(t.name, Kind.STRUCT) or not t.name


def test_module_files_are_where_sidkernel_says(kernel: SidKernel) -> None:
    root: Path = kernel.btf_root
    assert (root / "vmlinux").is_file()
    assert len(kernel.module_btf_names()) >= 20


def test_vmlinux_elf_gives_the_same_btf(kernel: SidKernel, vmlinux: Btf) -> None:
    from_elf = Btf.from_file(kernel.vmlinux)
    assert from_elf.name == "vmlinux"
    assert bytes(from_elf.raw) == bytes(vmlinux.raw)
