"""Real ``bpf(2)`` commands on the host kernel (root): BTF, maps, programs, info, ids,
pins and links, including the failures and their typed errors."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from pathlib import Path

import pytest

from schedswitchd.bpf import insn as I
from schedswitchd.errors import BpfSyscallError
from schedswitchd.kernel import bpf_uapi as A
from schedswitchd.kernel import syscall as S
from schedswitchd.kernel.fd import BtfFd, LinkFd, MapFd, ProgFd
from tests.kernel import asm
from tests.kernel.rawbtf import RawBtf, int_and_pair

pytestmark = pytest.mark.root

U32_0 = struct.pack("<I", 0)
ETH_FRAME = bytes(64)


def _pair_map(kind: A.MapType = A.MapType.ARRAY, entries: int = 4) -> tuple[BtfFd, MapFd]:
    raw, i32, _u64, pair = int_and_pair()
    btf = S.btf_load(raw)
    m = S.map_create(
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
    with S.btf_load(raw) as btf:
        info = S.btf_info(btf, data=True)
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
        S.btf_load(b.build())
    err = exc.value
    assert err.command == "BPF_BTF_LOAD"
    assert err.errno_name == "EINVAL"
    assert err.verifier_log and "Invalid" in err.verifier_log
    assert "BTF" in str(err)


def test_btf_log_grows_from_a_tiny_buffer() -> None:
    b = RawBtf()
    b.struct("bad", 4, [("x", 99, 0)])
    with pytest.raises(BpfSyscallError) as exc:
        S.btf_load(b.build(), log_size_start=8)
    assert exc.value.errno_name == "EINVAL"
    assert exc.value.verifier_log is not None and "Invalid" in exc.value.verifier_log


def test_vmlinux_found_by_name_in_id_walk() -> None:
    found = None
    for btf_id in S.btf_ids():
        with S.btf_get_fd_by_id(btf_id) as fd:
            info = S.btf_info(fd)
            if info.name == "vmlinux":
                found = (fd.fd, info)
                assert info.kernel_btf
                raw = S.btf_info(fd, data=True).data
                break
    assert found is not None, "no BTF object named vmlinux"
    assert raw == Path("/sys/kernel/btf/vmlinux").read_bytes()


def test_get_fd_by_unknown_id_is_enoent() -> None:
    with pytest.raises(BpfSyscallError) as exc:
        S.btf_get_fd_by_id(0x7FFFFFF0)
    assert exc.value.errno_name == "ENOENT"
    assert "BPF_BTF_GET_FD_BY_ID" in str(exc.value)


# --- maps ----------------------------------------------------------------------------------


def test_array_map_with_btf_roundtrip_and_info() -> None:
    btf, m = _pair_map()
    with btf, m:
        value = struct.pack("<iiQ", -5, 0, 1 << 40)
        S.map_update_elem(m, struct.pack("<I", 2), value)
        assert S.map_lookup_elem(m, struct.pack("<I", 2), 16) == value
        assert S.map_lookup_elem(m, struct.pack("<I", 3), 16) == bytes(16)
        assert S.map_lookup_elem(m, struct.pack("<I", 9), 16) is None  # out of range
        info = S.map_info(m)
        assert (info.type, info.key_size, info.value_size, info.max_entries) == (
            A.MapType.ARRAY,
            4,
            16,
            4,
        )
        assert info.name == "pairs"
        assert info.btf_id == S.btf_info(btf).id
        assert (info.btf_key_type_id, info.btf_value_type_id) == (1, 3)


def test_hash_map_update_delete_and_iterate() -> None:
    btf, m = _pair_map(A.MapType.HASH, 8)
    with btf, m:
        keys = [struct.pack("<I", k) for k in (7, 11, 13)]
        for k in keys:
            S.map_update_elem(m, k, k * 4, flags=A.NOEXIST)
        with pytest.raises(BpfSyscallError) as exc:
            S.map_update_elem(m, keys[0], bytes(16), flags=A.NOEXIST)
        assert exc.value.errno_name == "EEXIST"
        assert sorted(S.map_keys(m, 4)) == sorted(keys)
        assert S.map_delete_elem(m, keys[1]) is True
        assert S.map_delete_elem(m, keys[1]) is False
        assert S.map_lookup_elem(m, keys[1], 16) is None
        assert sorted(S.map_keys(m, 4)) == sorted([keys[0], keys[2]])


def test_percpu_array_value_per_cpu() -> None:
    with S.map_create(A.MapType.PERCPU_ARRAY, 4, 4, 1, name="pcpu") as m:
        size = S.percpu_value_size(4)
        assert size == 8 * S.possible_cpus()
        vals = b"".join(struct.pack("<Q", cpu + 1) for cpu in range(S.possible_cpus()))
        S.map_update_elem(m, U32_0, vals)
        assert S.map_lookup_elem(m, U32_0, size) == vals


def test_frozen_map_rejects_user_writes_with_eperm() -> None:
    with S.map_create(A.MapType.ARRAY, 4, 8, 1, name="ro") as m:
        S.map_update_elem(m, U32_0, struct.pack("<Q", 42))
        S.map_freeze(m)
        with pytest.raises(BpfSyscallError) as exc:
            S.map_update_elem(m, U32_0, struct.pack("<Q", 43))
        err = exc.value
        assert (err.command, err.errno, err.errno_name) == (
            "BPF_MAP_UPDATE_ELEM",
            errno.EPERM,
            "EPERM",
        )
        assert "frozen" in str(err)
        assert S.map_lookup_elem(m, U32_0, 8) == struct.pack("<Q", 42)


def test_map_create_invalid_definition_explains() -> None:
    with pytest.raises(BpfSyscallError) as exc:
        S.map_create(A.MapType.HASH, 0, 8, 1, name="bad")
    assert exc.value.errno_name == "EINVAL"
    assert "map definition" in str(exc.value) and "'bad'" in str(exc.value)


def test_long_map_name_is_truncated() -> None:
    with S.map_create(A.MapType.ARRAY, 4, 4, 1, name="a_very_long_map_name_indeed") as m:
        assert S.map_info(m).name == "a_very_long_map"


# --- programs ------------------------------------------------------------------------------


def test_socket_filter_test_run_and_xlated_insns() -> None:
    insns = asm.ret(7)
    with S.prog_load(A.ProgType.SOCKET_FILTER, insns, name="ret7") as p:
        res = S.prog_test_run(p, data_in=ETH_FRAME, repeat=3)
        assert res.retval == 7
        info = S.prog_info(p)
        assert info.type == A.ProgType.SOCKET_FILTER
        assert info.name == "ret7"
        assert info.xlated_insns == insns
        assert info.gpl_compatible
        assert info.map_ids == ()


def test_program_with_map_counts_runs_and_reports_map_id() -> None:
    with S.map_create(A.MapType.ARRAY, 4, 8, 1, name="counter") as m:
        insns = asm.count_in_map(m.fd, 1)
        with S.prog_load(A.ProgType.SOCKET_FILTER, insns, name="count") as p:
            res = S.prog_test_run(p, data_in=ETH_FRAME, repeat=5)
            assert res.retval == 1
            assert S.map_lookup_elem(m, U32_0, 8) == struct.pack("<Q", 5)
            info = S.prog_info(p)
            assert info.map_ids == (S.map_info(m).id,)
            xl = info.xlated_insns
            assert len(xl) % 8 == 0 and len(xl) >= len(insns) - 16
            # the map reference survives translation as an ld_imm64
            assert any(I.decode(xl, i).is_ld_imm64 for i in range(I.count(xl)))


def test_syscall_program_test_run_with_context() -> None:
    with S.map_create(A.MapType.ARRAY, 4, 8, 1, name="sys_cnt") as m:
        insns = asm.count_in_map(m.fd, 3)
        with S.prog_load(A.ProgType.SYSCALL, insns, name="sys", prog_flags=A.F_SLEEPABLE) as p:
            res = S.prog_test_run(p, ctx_in=bytes(8))
            assert res.retval == 3
            assert S.map_lookup_elem(m, U32_0, 8) == struct.pack("<Q", 1)


def test_verifier_rejection_carries_log() -> None:
    with pytest.raises(BpfSyscallError) as exc:
        S.prog_load(A.ProgType.SOCKET_FILTER, asm.exit_(), name="noret")
    err = exc.value
    assert err.command == "BPF_PROG_LOAD"
    assert err.errno_name == "EACCES"
    assert err.verifier_log is not None and "R0 !read_ok" in err.verifier_log
    assert "R0 !read_ok" in str(err) and "'noret'" in str(err)


def test_verifier_log_grows_until_it_fits() -> None:
    # A long valid prefix makes the log exceed a tiny buffer several times over.
    body = asm.mov64_imm(1, 1) * 300 + asm.exit_()
    with pytest.raises(BpfSyscallError) as exc:
        S.prog_load(A.ProgType.SOCKET_FILTER, body, log_size_start=64)
    log = exc.value.verifier_log
    assert log is not None and "R0 !read_ok" in log
    assert exc.value.errno_name == "EACCES"


def test_prog_bind_map_adds_map_id() -> None:
    with (
        S.map_create(A.MapType.ARRAY, 4, 4, 1, name="bound") as m,
        S.prog_load(A.ProgType.SOCKET_FILTER, asm.ret(0)) as p,
    ):
        S.prog_bind_map(p, m)
        assert S.prog_info(p).map_ids == (S.map_info(m).id,)


def test_get_fd_by_id_for_prog_and_map() -> None:
    with (
        S.map_create(A.MapType.ARRAY, 4, 4, 1, name="byid") as m,
        S.prog_load(A.ProgType.SOCKET_FILTER, asm.ret(0), name="byid") as p,
    ):
        mid, pid = S.map_info(m).id, S.prog_info(p).id
        with S.map_get_fd_by_id(mid) as m2, S.prog_get_fd_by_id(pid) as p2:
            assert S.map_info(m2).id == mid
            assert S.prog_info(p2).id == pid
        assert S.map_get_next_id(mid - 1) is not None
        assert S.prog_get_next_id(pid - 1) is not None
    with pytest.raises(BpfSyscallError) as exc:
        S.prog_get_fd_by_id(pid)
    assert exc.value.errno_name == "ENOENT"


def test_bad_insns_length_is_value_error() -> None:
    with pytest.raises(ValueError):
        S.prog_load(A.ProgType.SOCKET_FILTER, b"\0" * 12)


# --- pins and links ------------------------------------------------------------------------


def test_pin_and_get_map_and_prog(bpffs: Path) -> None:
    with (
        S.map_create(A.MapType.ARRAY, 4, 4, 1, name="pinned") as m,
        S.prog_load(A.ProgType.SOCKET_FILTER, asm.ret(1)) as p,
    ):
        S.obj_pin(m, bpffs / "m")
        S.obj_pin(p, bpffs / "p")
        with pytest.raises(BpfSyscallError) as exc:
            S.obj_pin(m, bpffs / "m")
        assert exc.value.errno_name == "EEXIST"
        mid, pid = S.map_info(m).id, S.prog_info(p).id
    # the pins keep both alive after our fds are closed
    with S.obj_get(bpffs / "m", expect=MapFd) as m2:
        assert isinstance(m2, MapFd) and S.map_info(m2).id == mid
    with S.obj_get(bpffs / "p") as p2:
        assert isinstance(p2, ProgFd) and S.prog_info(p2).id == pid
    with pytest.raises(BpfSyscallError) as exc:
        S.obj_get(bpffs / "p", expect=MapFd)
    assert "not a map" in str(exc.value)
    os.unlink(bpffs / "m")
    os.unlink(bpffs / "p")
    with pytest.raises(BpfSyscallError) as exc:
        S.obj_get(bpffs / "m")
    assert exc.value.errno_name == "ENOENT"
    assert "nothing is pinned" in str(exc.value)


def test_cgroup_link_create_info_pin_detach(bpffs: Path, cgroup2_dir: Path) -> None:
    cg = os.open(cgroup2_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with S.prog_load(
            A.ProgType.CGROUP_SKB,
            asm.ret(1),
            name="allow",
            expected_attach_type=A.AttachType.CGROUP_INET_EGRESS,
        ) as p:
            pid = S.prog_info(p).id
            with S.link_create(p, A.AttachType.CGROUP_INET_EGRESS, target_fd=cg) as link:
                info = S.link_info(link)
                assert info.type == A.LinkType.CGROUP
                assert info.prog_id == pid
                assert info.attach_type == A.AttachType.CGROUP_INET_EGRESS
                assert info.cgroup_id == os.stat(cgroup2_dir).st_ino
                S.obj_pin(link, bpffs / "link")
                with S.obj_get(bpffs / "link", expect=LinkFd) as again:
                    assert S.link_info(again).id == info.id
                S.link_detach(link)
                assert S.link_info(link).prog_id == pid  # detached link still describes itself
                os.unlink(bpffs / "link")
    finally:
        os.close(cg)


def test_link_create_wrong_attach_type_explains(cgroup2_dir: Path) -> None:
    cg = os.open(cgroup2_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with S.prog_load(A.ProgType.SOCKET_FILTER, asm.ret(1)) as p:
            with pytest.raises(BpfSyscallError) as exc:
                S.link_create(p, A.AttachType.CGROUP_INET_EGRESS, target_fd=cg)
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
            S.btf_load(raw) as btf,
            S.map_create(
                A.MapType.ARRAY, 4, 16, 1, btf_fd=btf, btf_key_type_id=i32, btf_value_type_id=pair
            ) as m,
        ):
            with S.prog_load(A.ProgType.SOCKET_FILTER, asm.count_in_map(m.fd, 0)) as p:
                S.prog_test_run(p, data_in=ETH_FRAME)
                S.prog_info(p)
                S.obj_pin(p, bpffs / f"p{i}")
            with S.obj_get(bpffs / f"p{i}"):
                pass
            os.unlink(bpffs / f"p{i}")
        with pytest.raises(BpfSyscallError):
            S.prog_load(A.ProgType.SOCKET_FILTER, asm.exit_())
        with pytest.raises(BpfSyscallError):
            S.btf_load(raw[:-3])
        with pytest.raises(BpfSyscallError):
            S.map_create(A.MapType.HASH, 0, 0, 0)
        with pytest.raises(BpfSyscallError):
            S.obj_get(bpffs / "missing")
        # owners dropped without close: the safety net must reclaim them
        S.map_create(A.MapType.ARRAY, 4, 4, 1)
    assert _open_fds() == before


def test_stats_count_calls() -> None:
    S.STATS.reset()
    with S.map_create(A.MapType.ARRAY, 4, 4, 1) as m:
        S.map_lookup_elem(m, U32_0, 4)
    assert S.STATS.calls == 2
    assert S.STATS.total_ns > 0
    assert ctypes.sizeof(A.MapElemAttr) == 32
