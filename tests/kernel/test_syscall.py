"""Real ``bpf(2)`` commands on the host kernel (root): BTF, maps, programs, info, ids,
pins and links, including the failures and their typed errors."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from pathlib import Path

import pytest

from schedswitchd.bpf import insn
from schedswitchd.errors import BpfSyscallError
from schedswitchd.kernel import bpf_uapi, syscall
from schedswitchd.kernel.fd import BtfFd, LinkFd, MapFd, ProgFd
from tests.kernel import asm
from tests.kernel.rawbtf import RawBtf, int_and_pair

pytestmark = pytest.mark.root

U32_0 = struct.pack("<I", 0)
ETH_FRAME = bytes(64)


def _pair_map(
    kind: bpf_uapi.MapType = bpf_uapi.MapType.ARRAY, entries: int = 4
) -> tuple[BtfFd, MapFd]:
    raw, i32, _u64, pair = int_and_pair()
    btf = syscall.btf_load(raw)
    m = syscall.map_create(
        kind,
        4,
        16,
        entries,
        name="pairs",
        btf_fd=btf,
        btf_key_type_id=i32,
        btf_value_type_id=pair,
    )
    return btf, m


# --- BTF -----------------------------------------------------------------------------------


def test_btf_load_and_info() -> None:
    raw, *_ = int_and_pair()
    with syscall.btf_load(raw) as btf:
        info = syscall.btf_info(btf, data=True)
        assert info.id > 0
        assert info.name == ""
        assert not info.kernel_btf
        assert info.btf_size == len(raw)
        assert info.data == raw


def test_btf_load_rejection_carries_log() -> None:
    b = RawBtf()
    i32 = b.int_("int", 4, signed=True)
    b.struct("bad", 4, [("x", i32 + 7, 0)])  # member refers to a type id that does not exist
    with pytest.raises(BpfSyscallError) as exc:
        syscall.btf_load(b.build())
    err = exc.value
    assert err.command == "BPF_BTF_LOAD"
    assert err.errno_name == "EINVAL"
    assert err.verifier_log and "Invalid" in err.verifier_log
    assert "BTF" in str(err)


def test_btf_log_grows_from_a_tiny_buffer() -> None:
    b = RawBtf()
    b.struct("bad", 4, [("x", 99, 0)])
    with pytest.raises(BpfSyscallError) as exc:
        syscall.btf_load(b.build(), log_size_start=8)
    assert exc.value.errno_name == "EINVAL"
    assert exc.value.verifier_log is not None and "Invalid" in exc.value.verifier_log


def test_vmlinux_found_by_name_in_id_walk() -> None:
    found = None
    for btf_id in syscall.btf_ids():
        with syscall.btf_get_fd_by_id(btf_id) as fd:
            info = syscall.btf_info(fd)
            if info.name == "vmlinux":
                found = (fd.fd, info)
                assert info.kernel_btf
                raw = syscall.btf_info(fd, data=True).data
                break
    assert found is not None, "no BTF object named vmlinux"
    assert raw == Path("/sys/kernel/btf/vmlinux").read_bytes()


def test_get_fd_by_unknown_id_is_enoent() -> None:
    with pytest.raises(BpfSyscallError) as exc:
        syscall.btf_get_fd_by_id(0x7FFFFFF0)
    assert exc.value.errno_name == "ENOENT"
    assert "BPF_BTF_GET_FD_BY_ID" in str(exc.value)


# --- maps ----------------------------------------------------------------------------------


def test_array_map_with_btf_roundtrip_and_info() -> None:
    btf, m = _pair_map()
    with btf, m:
        value = struct.pack("<iiQ", -5, 0, 1 << 40)
        syscall.map_update_elem(m, struct.pack("<I", 2), value)
        assert syscall.map_lookup_elem(m, struct.pack("<I", 2), 16) == value
        assert syscall.map_lookup_elem(m, struct.pack("<I", 3), 16) == bytes(16)
        assert syscall.map_lookup_elem(m, struct.pack("<I", 9), 16) is None  # out of range
        info = syscall.map_info(m)
        assert (info.type, info.key_size, info.value_size, info.max_entries) == (
            bpf_uapi.MapType.ARRAY,
            4,
            16,
            4,
        )
        assert info.name == "pairs"
        assert info.btf_id == syscall.btf_info(btf).id
        assert (info.btf_key_type_id, info.btf_value_type_id) == (1, 3)


def test_hash_map_update_delete_and_iterate() -> None:
    btf, m = _pair_map(bpf_uapi.MapType.HASH, 8)
    with btf, m:
        keys = [struct.pack("<I", k) for k in (7, 11, 13)]
        for k in keys:
            syscall.map_update_elem(m, k, k * 4, flags=bpf_uapi.NOEXIST)
        with pytest.raises(BpfSyscallError) as exc:
            syscall.map_update_elem(m, keys[0], bytes(16), flags=bpf_uapi.NOEXIST)
        assert exc.value.errno_name == "EEXIST"
        assert sorted(syscall.map_keys(m, 4)) == sorted(keys)
        assert syscall.map_delete_elem(m, keys[1]) is True
        assert syscall.map_delete_elem(m, keys[1]) is False
        assert syscall.map_lookup_elem(m, keys[1], 16) is None
        assert sorted(syscall.map_keys(m, 4)) == sorted([keys[0], keys[2]])


def test_percpu_array_value_per_cpu() -> None:
    with syscall.map_create(bpf_uapi.MapType.PERCPU_ARRAY, 4, 4, 1, name="pcpu") as m:
        size = syscall.percpu_value_size(4)
        assert size == 8 * syscall.possible_cpus()
        vals = b"".join(struct.pack("<Q", cpu + 1) for cpu in range(syscall.possible_cpus()))
        syscall.map_update_elem(m, U32_0, vals)
        assert syscall.map_lookup_elem(m, U32_0, size) == vals


def test_frozen_map_rejects_user_writes_with_eperm() -> None:
    with syscall.map_create(bpf_uapi.MapType.ARRAY, 4, 8, 1, name="ro") as m:
        syscall.map_update_elem(m, U32_0, struct.pack("<Q", 42))
        syscall.map_freeze(m)
        with pytest.raises(BpfSyscallError) as exc:
            syscall.map_update_elem(m, U32_0, struct.pack("<Q", 43))
        err = exc.value
        assert (err.command, err.errno, err.errno_name) == (
            "BPF_MAP_UPDATE_ELEM",
            errno.EPERM,
            "EPERM",
        )
        assert "frozen" in str(err)
        assert syscall.map_lookup_elem(m, U32_0, 8) == struct.pack("<Q", 42)


def test_map_create_invalid_definition_explains() -> None:
    with pytest.raises(BpfSyscallError) as exc:
        syscall.map_create(bpf_uapi.MapType.HASH, 0, 8, 1, name="bad")
    assert exc.value.errno_name == "EINVAL"
    assert "map definition" in str(exc.value) and "'bad'" in str(exc.value)


def test_long_map_name_is_truncated() -> None:
    with syscall.map_create(
        bpf_uapi.MapType.ARRAY, 4, 4, 1, name="a_very_long_map_name_indeed"
    ) as m:
        assert syscall.map_info(m).name == "a_very_long_map"


# --- programs ------------------------------------------------------------------------------


def test_socket_filter_test_run_and_xlated_insns() -> None:
    insns = asm.ret(7)
    with syscall.prog_load(bpf_uapi.ProgType.SOCKET_FILTER, insns, name="ret7") as p:
        res = syscall.prog_test_run(p, data_in=ETH_FRAME, repeat=3)
        assert res.retval == 7
        info = syscall.prog_info(p)
        assert info.type == bpf_uapi.ProgType.SOCKET_FILTER
        assert info.name == "ret7"
        assert info.xlated_insns == insns
        assert info.gpl_compatible
        assert info.map_ids == ()


def test_program_with_map_counts_runs_and_reports_map_id() -> None:
    with syscall.map_create(bpf_uapi.MapType.ARRAY, 4, 8, 1, name="counter") as m:
        insns = asm.count_in_map(m.fd, 1)
        with syscall.prog_load(bpf_uapi.ProgType.SOCKET_FILTER, insns, name="count") as p:
            res = syscall.prog_test_run(p, data_in=ETH_FRAME, repeat=5)
            assert res.retval == 1
            assert syscall.map_lookup_elem(m, U32_0, 8) == struct.pack("<Q", 5)
            info = syscall.prog_info(p)
            assert info.map_ids == (syscall.map_info(m).id,)
            xl = info.xlated_insns
            assert len(xl) % 8 == 0 and len(xl) >= len(insns) - 16
            # the map reference survives translation as an ld_imm64
            assert any(insn.decode(xl, i).is_ld_imm64 for i in range(insn.count(xl)))


def test_syscall_program_test_run_with_context() -> None:
    with syscall.map_create(bpf_uapi.MapType.ARRAY, 4, 8, 1, name="sys_cnt") as m:
        insns = asm.count_in_map(m.fd, 3)
        with syscall.prog_load(
            bpf_uapi.ProgType.SYSCALL, insns, name="sys", prog_flags=bpf_uapi.F_SLEEPABLE
        ) as p:
            res = syscall.prog_test_run(p, ctx_in=bytes(8))
            assert res.retval == 3
            assert syscall.map_lookup_elem(m, U32_0, 8) == struct.pack("<Q", 1)


def test_verifier_rejection_carries_log() -> None:
    with pytest.raises(BpfSyscallError) as exc:
        syscall.prog_load(bpf_uapi.ProgType.SOCKET_FILTER, asm.exit_(), name="noret")
    err = exc.value
    assert err.command == "BPF_PROG_LOAD"
    assert err.errno_name == "EACCES"
    assert err.verifier_log is not None and "R0 !read_ok" in err.verifier_log
    assert "R0 !read_ok" in str(err) and "'noret'" in str(err)


def test_verifier_log_grows_until_it_fits() -> None:
    # A long valid prefix makes the log exceed a tiny buffer several times over.
    body = asm.mov64_imm(1, 1) * 300 + asm.exit_()
    with pytest.raises(BpfSyscallError) as exc:
        syscall.prog_load(bpf_uapi.ProgType.SOCKET_FILTER, body, log_size_start=64)
    log = exc.value.verifier_log
    assert log is not None and "R0 !read_ok" in log
    assert exc.value.errno_name == "EACCES"


def test_prog_bind_map_adds_map_id() -> None:
    with (
        syscall.map_create(bpf_uapi.MapType.ARRAY, 4, 4, 1, name="bound") as m,
        syscall.prog_load(bpf_uapi.ProgType.SOCKET_FILTER, asm.ret(0)) as p,
    ):
        syscall.prog_bind_map(p, m)
        assert syscall.prog_info(p).map_ids == (syscall.map_info(m).id,)


def test_get_fd_by_id_for_prog_and_map() -> None:
    with (
        syscall.map_create(bpf_uapi.MapType.ARRAY, 4, 4, 1, name="byid") as m,
        syscall.prog_load(bpf_uapi.ProgType.SOCKET_FILTER, asm.ret(0), name="byid") as p,
    ):
        mid, pid = syscall.map_info(m).id, syscall.prog_info(p).id
        with syscall.map_get_fd_by_id(mid) as m2, syscall.prog_get_fd_by_id(pid) as p2:
            assert syscall.map_info(m2).id == mid
            assert syscall.prog_info(p2).id == pid
        assert syscall.map_get_next_id(mid - 1) is not None
        assert syscall.prog_get_next_id(pid - 1) is not None
    with pytest.raises(BpfSyscallError) as exc:
        syscall.prog_get_fd_by_id(pid)
    assert exc.value.errno_name == "ENOENT"


def test_bad_insns_length_is_value_error() -> None:
    with pytest.raises(ValueError):
        syscall.prog_load(bpf_uapi.ProgType.SOCKET_FILTER, b"\0" * 12)


# --- pins and links ------------------------------------------------------------------------


def test_pin_and_get_map_and_prog(bpffs: Path) -> None:
    with (
        syscall.map_create(bpf_uapi.MapType.ARRAY, 4, 4, 1, name="pinned") as m,
        syscall.prog_load(bpf_uapi.ProgType.SOCKET_FILTER, asm.ret(1)) as p,
    ):
        syscall.obj_pin(m, bpffs / "m")
        syscall.obj_pin(p, bpffs / "p")
        with pytest.raises(BpfSyscallError) as exc:
            syscall.obj_pin(m, bpffs / "m")
        assert exc.value.errno_name == "EEXIST"
        mid, pid = syscall.map_info(m).id, syscall.prog_info(p).id
    # the pins keep both alive after our fds are closed
    with syscall.obj_get(bpffs / "m", expect=MapFd) as m2:
        assert isinstance(m2, MapFd) and syscall.map_info(m2).id == mid
    with syscall.obj_get(bpffs / "p") as p2:
        assert isinstance(p2, ProgFd) and syscall.prog_info(p2).id == pid
    with pytest.raises(BpfSyscallError) as exc:
        syscall.obj_get(bpffs / "p", expect=MapFd)
    assert "not a map" in str(exc.value)
    os.unlink(bpffs / "m")
    os.unlink(bpffs / "p")
    with pytest.raises(BpfSyscallError) as exc:
        syscall.obj_get(bpffs / "m")
    assert exc.value.errno_name == "ENOENT"
    assert "nothing is pinned" in str(exc.value)


def test_cgroup_link_create_info_pin_detach(bpffs: Path, cgroup2_dir: Path) -> None:
    cg = os.open(cgroup2_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with syscall.prog_load(
            bpf_uapi.ProgType.CGROUP_SKB,
            asm.ret(1),
            name="allow",
            expected_attach_type=bpf_uapi.AttachType.CGROUP_INET_EGRESS,
        ) as p:
            pid = syscall.prog_info(p).id
            with syscall.link_create(
                p, bpf_uapi.AttachType.CGROUP_INET_EGRESS, target_fd=cg
            ) as link:
                info = syscall.link_info(link)
                assert info.type == bpf_uapi.LinkType.CGROUP
                assert info.prog_id == pid
                assert info.attach_type == bpf_uapi.AttachType.CGROUP_INET_EGRESS
                assert info.cgroup_id == os.stat(cgroup2_dir).st_ino
                syscall.obj_pin(link, bpffs / "link")
                with syscall.obj_get(bpffs / "link", expect=LinkFd) as again:
                    assert syscall.link_info(again).id == info.id
                syscall.link_detach(link)
                assert (
                    syscall.link_info(link).prog_id == pid
                )  # detached link still describes itself
                os.unlink(bpffs / "link")
    finally:
        os.close(cg)


def test_link_create_wrong_attach_type_explains(cgroup2_dir: Path) -> None:
    cg = os.open(cgroup2_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with syscall.prog_load(bpf_uapi.ProgType.SOCKET_FILTER, asm.ret(1)) as p:
            with pytest.raises(BpfSyscallError) as exc:
                syscall.link_create(p, bpf_uapi.AttachType.CGROUP_INET_EGRESS, target_fd=cg)
            assert exc.value.command == "BPF_LINK_CREATE"
            assert exc.value.errno_name == "EINVAL"
    finally:
        os.close(cg)


# --- leaks ---------------------------------------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_no_fd_leak_across_cycles_and_failures(bpffs: Path) -> None:
    raw, i32, _u64, pair = int_and_pair()
    before = _open_fds()
    for i in range(40):
        with (
            syscall.btf_load(raw) as btf,
            syscall.map_create(
                bpf_uapi.MapType.ARRAY,
                4,
                16,
                1,
                btf_fd=btf,
                btf_key_type_id=i32,
                btf_value_type_id=pair,
            ) as m,
        ):
            with syscall.prog_load(bpf_uapi.ProgType.SOCKET_FILTER, asm.count_in_map(m.fd, 0)) as p:
                syscall.prog_test_run(p, data_in=ETH_FRAME)
                syscall.prog_info(p)
                syscall.obj_pin(p, bpffs / f"p{i}")
            with syscall.obj_get(bpffs / f"p{i}"):
                pass
            os.unlink(bpffs / f"p{i}")
        with pytest.raises(BpfSyscallError):
            syscall.prog_load(bpf_uapi.ProgType.SOCKET_FILTER, asm.exit_())
        with pytest.raises(BpfSyscallError):
            syscall.btf_load(raw[:-3])
        with pytest.raises(BpfSyscallError):
            syscall.map_create(bpf_uapi.MapType.HASH, 0, 0, 0)
        with pytest.raises(BpfSyscallError):
            syscall.obj_get(bpffs / "missing")
        # owners dropped without close: the safety net must reclaim them
        syscall.map_create(bpf_uapi.MapType.ARRAY, 4, 4, 1)
    assert _open_fds() == before


def test_stats_count_calls() -> None:
    syscall.STATS.reset()
    with syscall.map_create(bpf_uapi.MapType.ARRAY, 4, 4, 1) as m:
        syscall.map_lookup_elem(m, U32_0, 4)
    assert syscall.STATS.calls == 2
    assert syscall.STATS.total_ns > 0
    assert ctypes.sizeof(bpf_uapi.MapElemAttr) == 32
