"""struct_ops kernel types and value building, checked by registering a real BPF TCP
congestion control on the host kernel with the syscall layer alone."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import INT_CHAR, Kind
from schedswitchd.errors import LoadError
from schedswitchd.kernel import bpf_uapi
from schedswitchd.kernel.fd import ProgFd
from schedswitchd.kernel.struct_ops import value
from schedswitchd.kernel.syscall import (
    btf_load,
    link_create,
    link_info,
    map_create,
    map_delete_elem,
    map_info,
    map_update_elem,
    prog_load,
)
from tests.kernel import asm

pytestmark = pytest.mark.root

CA_LIST = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
VMLINUX = Path("/sys/kernel/btf/vmlinux")


@pytest.fixture(scope="module")
def vmlinux() -> Btf:
    if not VMLINUX.exists():
        pytest.skip("no vmlinux BTF")
    return Btf.from_file(VMLINUX)


@pytest.fixture(scope="module")
def tcp_ca(vmlinux: Btf) -> value.StructOpsKernelType:
    kt = value.find_struct_ops_kernel_type(vmlinux, "tcp_congestion_ops")
    if kt is None:
        pytest.skip("kernel has no BPF tcp_congestion_ops struct_ops")
    return kt


def _local_ca(extra_member: bool = False) -> tuple[Btf, int]:
    """A local ``struct tcp_congestion_ops___local`` as a BPF object declares it: three
    function pointers, ``name``, ``flags`` and (optionally) a member no kernel has."""
    b = BtfBuilder()
    u32 = b.add_int("unsigned int", 4)
    char = b.add_int("char", 1, encoding=INT_CHAR)
    sock = b.add_fwd("sock")
    proto = b.add_func_proto(u32, [("sk", b.add_ptr(sock))])
    fptr = b.add_ptr(proto)
    members = [
        ("ssthresh", fptr, 0, 0),
        ("cong_avoid", fptr, 64, 0),
        ("undo_cwnd", fptr, 128, 0),
        ("name", b.add_array(char, u32, 16), 192, 0),
        ("flags", u32, 320, 0),
        ("owner", b.add_ptr(u32), 384, 0),
    ]
    size = 56
    if extra_member:
        members.append(("not_in_kernel", u32, 448, 0))
        size = 64
    tid = b.add_struct("tcp_congestion_ops___local", size, members)
    return Btf.from_bytes(b.build()), tid


def _local_data(name: str, size: int, extra: int = 0) -> bytes:
    data = bytearray(size)
    data[24 : 24 + len(name)] = name.encode()
    struct.pack_into("<I", data, 40, 0)  # flags
    if size > 56:
        struct.pack_into("<I", data, 56, extra)
    return bytes(data)


def test_kernel_types_found(tcp_ca: value.StructOpsKernelType, vmlinux: Btf) -> None:
    assert tcp_ca.type.name == "tcp_congestion_ops"
    assert tcp_ca.value_type.name == "bpf_struct_ops_tcp_congestion_ops"
    assert tcp_ca.data_member.name == "data"
    assert tcp_ca.data_offset + tcp_ca.type.size <= tcp_ca.value_size
    assert value.find_struct_ops_kernel_type(vmlinux, "no_such_ops") is None
    # flavoured local names resolve by essential name
    flavoured = value.find_struct_ops_kernel_type(vmlinux, "tcp_congestion_ops___v2")
    assert flavoured is not None and flavoured.type_id == tcp_ca.type_id


def test_plan_maps_members_by_name(tcp_ca: value.StructOpsKernelType) -> None:
    local, tid = _local_ca(extra_member=True)
    data = _local_data("x", 64)
    plan = value.plan_struct_ops(local, tid, data, tcp_ca, programs={"ssthresh", "undo_cwnd"})
    kidx = {m.name: i for i, m in enumerate(tcp_ca.type.members)}
    assert plan.member("ssthresh").kern_index == kidx["ssthresh"]
    assert plan.member("undo_cwnd").kern_index == kidx["undo_cwnd"]
    assert plan.member("undo_cwnd").value_offset == tcp_ca.data_offset + 64  # kernel layout
    assert plan.member("name").size == 16 and not plan.member("name").is_func_ptr
    with pytest.raises(KeyError):
        plan.member("cong_avoid")  # no program assigned
    with pytest.raises(KeyError):
        plan.member("owner")  # plain pointer: left NULL
    assert plan.skipped == ("not_in_kernel",)


def test_plan_rejects_nonzero_member_the_kernel_lacks(
    tcp_ca: value.StructOpsKernelType,
) -> None:
    local, tid = _local_ca(extra_member=True)
    with pytest.raises(LoadError, match="not_in_kernel"):
        value.plan_struct_ops(local, tid, _local_data("x", 64, extra=5), tcp_ca)


def test_plan_rejects_size_and_kind_mismatch(tcp_ca: value.StructOpsKernelType) -> None:
    b = BtfBuilder()
    u64 = b.add_int("unsigned long long", 8)
    u32 = b.add_int("unsigned int", 4)
    tid = b.add_struct("tcp_congestion_ops", 16, [("flags", u64, 0, 0)])
    with pytest.raises(LoadError, match="flags is 8 bytes locally but 4"):
        value.plan_struct_ops(Btf.from_bytes(b.build()), tid, bytes(16), tcp_ca)
    tid2 = b.add_struct("tcp_congestion_ops", 8, [("ssthresh", u32, 0, 0)])
    with pytest.raises(LoadError, match="ssthresh is a INT locally but a PTR"):
        value.plan_struct_ops(Btf.from_bytes(b.build()), tid2, bytes(8), tcp_ca)


def _ca_programs(kt: value.StructOpsKernelType, plan: value.StructOpsPlan) -> dict[str, ProgFd]:
    bodies = {"ssthresh": asm.ret(2), "cong_avoid": asm.ret(0), "undo_cwnd": asm.ret(10)}
    progs: dict[str, ProgFd] = {}
    try:
        for name, body in bodies.items():
            progs[name] = prog_load(
                bpf_uapi.ProgType.STRUCT_OPS,
                body,
                name=name,
                attach_btf_id=kt.type_id,
                expected_attach_type=plan.member(name).kern_index,
            )
    except BaseException:
        for p in progs.values():
            p.close()
        raise
    return progs


@pytest.fixture
def ca_name() -> Iterator[str]:
    name = f"ssd_{uuid.uuid4().hex[:8]}"
    yield name
    assert name not in CA_LIST.read_text().split(), "congestion control left registered"


def _registered(name: str) -> bool:
    return name in CA_LIST.read_text().split()


@pytest.mark.parametrize("use_link", [True, False], ids=["struct_ops.link", "struct_ops"])
def test_tcp_congestion_control_registers_and_unregisters(
    tcp_ca: value.StructOpsKernelType, ca_name: str, use_link: bool
) -> None:
    local, tid = _local_ca(extra_member=True)
    data = _local_data(ca_name, 64)
    funcs = {"ssthresh", "cong_avoid", "undo_cwnd"}
    plan = value.plan_struct_ops(local, tid, data, tcp_ca, programs=funcs)
    progs = _ca_programs(tcp_ca, plan)
    try:
        raw_value = value.build_value(plan, data, {k: p.fd for k, p in progs.items()})
        assert len(raw_value) == tcp_ca.value_size
        with (
            btf_load(local.raw) as btf,
            map_create(
                bpf_uapi.MapType.STRUCT_OPS,
                4,
                tcp_ca.value_size,
                1,
                name="ssd_ca",
                flags=bpf_uapi.F_LINK if use_link else 0,
                btf_fd=btf,  # the kernel insists on the object's BTF even for a kernel value type
                btf_vmlinux_value_type_id=tcp_ca.value_type_id,
            ) as m,
        ):
            map_update_elem(m, b"\0\0\0\0", raw_value)
            if use_link:
                assert not _registered(ca_name)  # a link map registers only on LINK_CREATE
                with link_create(m, bpf_uapi.AttachType.STRUCT_OPS) as link:
                    assert _registered(ca_name)
                    info = link_info(link)
                    assert info.type == bpf_uapi.LinkType.STRUCT_OPS
                    assert info.map_id == map_info(m).id
                assert not _registered(ca_name)
            else:
                assert _registered(ca_name)
                assert map_delete_elem(m, b"\0\0\0\0")
                assert not _registered(ca_name)
    finally:
        for p in progs.values():
            p.close()


def test_missing_program_fd_is_reported(tcp_ca: value.StructOpsKernelType) -> None:
    local, tid = _local_ca()
    plan = value.plan_struct_ops(local, tid, _local_data("x", 56), tcp_ca, programs={"ssthresh"})
    with pytest.raises(LoadError, match="ssthresh"):
        value.build_value(plan, _local_data("x", 56), {})
    assert tcp_ca.type.kind == Kind.STRUCT
