"""CO-RE against real split module BTF: Debian sid's kernel (``tools.sidkernel`` cache,
``make kernel``), whose vmlinux has sched_ext and whose modules carry their own BTF.

Module BTFs are searched only for local types with no candidate in vmlinux; the result
names the module; the same struct in two modules gives two agreeing candidates.
Expectations come from ``bpftool btf dump file MOD -B vmlinux -j``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from schedswitchd.bpf import insn as bpf
from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.core.access import BtfView
from schedswitchd.bpf.core.relo import CoreRelo, CoreReloKind
from schedswitchd.bpf.core.relocate import relocate
from tests.bpf.core.core_btf import SpyBtf
from tests.bpf.core.core_expect import JsonBtf, bpftool_types
from tests.build_outputs import sid_kernel
from tools.sidkernel import SidKernel

MOV64_K = bpf.CLASS_ALU64 | bpf.OP_MOV | bpf.SRC_K
EXIT = bpf.Insn(bpf.CLASS_JMP | bpf.OP_EXIT, 0, 0, 0, 0)


def prog(*imms: int) -> bytes:
    return b"".join(bpf.Insn(MOV64_K, 0, 0, 0, i).encode() for i in imms) + EXIT.encode()


#: The sid kernel's whole vmlinux BTF and module BTFs read by our reader.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kernel() -> SidKernel:
    return sid_kernel()


@pytest.fixture(scope="module")
def vmlinux(kernel: SidKernel) -> Btf:
    return Btf.from_file(kernel.btf_root / "vmlinux", name="vmlinux")


def module(kernel: SidKernel, vmlinux: Btf, name: str) -> SpyBtf:
    return SpyBtf(Btf.from_file(kernel.btf_root / name, base=vmlinux, name=name))


@functools.cache
def _base_json(path: Path) -> dict[int, dict[str, Any]]:
    return bpftool_types(path)


def module_json(kernel: SidKernel, name: str) -> JsonBtf:
    """Types of vmlinux plus the module's own (split ids continue after vmlinux's)."""
    base = kernel.btf_root / "vmlinux"
    return JsonBtf(_base_json(base) | bpftool_types(kernel.btf_root / name, base=base))


class Local:
    def __init__(self) -> None:
        b = BtfBuilder()
        i32 = b.add_int("int", 4, signed=True)
        u64 = b.add_int("long long unsigned int", 8)
        vp = b.add_ptr(0)
        self.ops = b.add_struct("sched_ext_ops___l", 16, [("hotplug_seq", u64, 0, 0)])
        self.task = b.add_struct("task_struct", 4, [("pid", i32, 0, 0)])
        self.vlan_net = b.add_struct("vlan_net___l", 8, [("name_type", i32, 0, 0)])
        self.garp = b.add_struct("garp_applicant", 8, [("dev", vp, 0, 0)])
        self.btf = Btf.from_bytes(b.build(), name="obj")


LOCAL = Local()


def test_vmlinux_types_never_touch_modules(kernel: SidKernel, vmlinux: Btf) -> None:
    js = JsonBtf(_base_json(kernel.btf_root / "vmlinux"))
    vlan = module(kernel, vmlinux, "8021q")
    relos = [
        CoreRelo(0, LOCAL.ops, "0:0", CoreReloKind.FIELD_BYTE_OFFSET),
        CoreRelo(1, LOCAL.task, "0:0", CoreReloKind.FIELD_BYTE_OFFSET),
    ]
    res = relocate(LOCAL.btf, prog(0, 0), relos, [vmlinux, vlan])
    ops = js.member(js.find("sched_ext_ops", "STRUCT"), "hotplug_seq")
    pid = js.member(js.find("task_struct", "STRUCT"), "pid")
    assert ops is not None and pid is not None
    assert [r.target_value for r in res.results] == [ops.bit_offset // 8, pid.bit_offset // 8]
    assert res.consulted == ("vmlinux",)
    assert vlan.essential_lookups == []


def test_module_only_type_found_in_its_module(kernel: SidKernel, vmlinux: Btf) -> None:
    js = module_json(kernel, "8021q")
    vlan_net = js.find("vlan_net", "STRUCT")
    field = js.member(vlan_net, "name_type")
    assert field is not None
    targets: list[BtfView] = [
        vmlinux,
        module(kernel, vmlinux, "3c59x"),
        module(kernel, vmlinux, "8021q"),
    ]
    relos = [
        CoreRelo(0, LOCAL.vlan_net, "0:0", CoreReloKind.FIELD_BYTE_OFFSET),
        CoreRelo(1, LOCAL.vlan_net, "0", CoreReloKind.TYPE_ID_TARGET),
    ]
    res = relocate(LOCAL.btf, prog(0, 0), relos, targets)
    assert [r.target_value for r in res.results] == [field.bit_offset // 8, vlan_net["id"]]
    assert {r.target_btf for r in res.results} == {"8021q"}
    assert vlan_net["id"] >= vmlinux.end_id
    assert res.consulted == ("vmlinux", "3c59x", "8021q")
    # Without the declared module the field is simply not there: poisoned, type id 0.
    res = relocate(LOCAL.btf, prog(0, 0), relos, [vmlinux])
    assert res.results[0].poisoned and res.results[1].target_value == 0


def test_same_struct_in_two_modules_agrees(kernel: SidKernel, vmlinux: Btf) -> None:
    # garp.ko defines garp_applicant and 8021q.ko, which uses it, carries a copy.
    garp = module(kernel, vmlinux, "garp")
    vlan = module(kernel, vmlinux, "8021q")
    garp_js = module_json(kernel, "garp")
    dev = garp_js.member(garp_js.find("garp_applicant", "STRUCT"), "dev")
    assert dev is not None
    relos = [CoreRelo(0, LOCAL.garp, "0:0", CoreReloKind.FIELD_BYTE_OFFSET)]
    res = relocate(LOCAL.btf, prog(0), relos, [vmlinux, garp, vlan])
    r = res.results[0]
    assert (r.target_value, r.candidates, r.target_btf) == (dev.bit_offset // 8, 2, "garp")
