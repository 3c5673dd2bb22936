"""The loader on the host kernel with hand-built object specs: global data, kconfig,
kfuncs (strong, weak, missing), struct_ops tcp_congestion_ops attach/detach, failures
that leave nothing behind."""

from __future__ import annotations

import dataclasses
import os
import struct
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf import insn
from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import INT_CHAR, VAR_GLOBAL_ALLOCATED, Kind
from schedswitchd.bpf.spec import (
    ExternKind,
    ExternSpec,
    Fixup,
    FixupKind,
    KconfigType,
    MapKind,
    MapSpec,
    ObjectSpec,
    ProgramSpec,
    StructOpsMember,
    StructOpsSpec,
    VariableSpec,
)
from schedswitchd.errors import BpfSyscallError, LoadError
from schedswitchd.kernel import bpf_uapi
from schedswitchd.kernel.btf.features import BtfFeatures
from schedswitchd.kernel.btf.registry import KernelBtfRegistry, TargetBtfs
from schedswitchd.kernel.kconfig import kernel_version_code, read_kernel_config
from schedswitchd.kernel.loader import ProgramLoadError, load_object
from schedswitchd.kernel.syscall import (
    btf_info,
    link_info,
    map_get_fd_by_id,
    map_get_next_id,
    map_info,
    map_lookup_elem,
    prog_get_fd_by_id,
    prog_get_next_id,
    prog_info,
    prog_test_run,
)
from tests.kernel import asm

pytestmark = pytest.mark.root

CA_LIST = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


@pytest.fixture
def kernel(registry: KernelBtfRegistry) -> TargetBtfs:
    return registry.targets(())


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _prog(name: str, insns: bytes, fixups: tuple[Fixup, ...] = (), **kw: object) -> ProgramSpec:
    fields: dict[str, object] = {
        "name": name,
        "section": "syscall",
        "prog_type": bpf_uapi.ProgType.SYSCALL,
        "expected_attach_type": 0,
        "attach_to": "",
        "sleepable": True,
        "autoload": True,
        "insns": insns,
        "fixups": fixups,
    }
    fields.update(kw)
    return ProgramSpec(**fields)  # type: ignore[arg-type]


def _spec(ca_name: str = "ssd_x", *, extra_member_value: int = 0) -> ObjectSpec:
    """An object with .data (u64 counter), .rodata (u32 tunable = 41), .kconfig
    (CONFIG_HZ, LINUX_KERNEL_VERSION, weak CONFIG_SSD_NOPE), two kfunc externs (strong
    bpf_rcu_read_lock/unlock, weak missing), and a .struct_ops.link tcp_congestion_ops."""
    b = BtfBuilder()
    u32 = b.add_int("unsigned int", 4)
    i32 = b.add_int("int", 4, signed=True)
    u64 = b.add_int("unsigned long long", 8)
    char = b.add_int("char", 1, encoding=INT_CHAR)
    v_counter = b.add_var("counter", u64, VAR_GLOBAL_ALLOCATED)
    data_sec = b.add_datasec(".data", 8, [(v_counter, 0, 8)])
    v_tunable = b.add_var("tunable", b.add_const(u32), VAR_GLOBAL_ALLOCATED)
    rodata_sec = b.add_datasec(".rodata", 4, [(v_tunable, 0, 4)])
    v_hz = b.add_var("CONFIG_HZ", i32, VAR_GLOBAL_ALLOCATED)
    v_ver = b.add_var("LINUX_KERNEL_VERSION", u32, VAR_GLOBAL_ALLOCATED)
    v_nope = b.add_var("CONFIG_SSD_NOPE", u64, VAR_GLOBAL_ALLOCATED)
    kcfg_sec = b.add_datasec(".kconfig", 16, [(v_hz, 0, 4), (v_ver, 4, 4), (v_nope, 8, 8)])
    void_proto = b.add_func_proto(0, [])
    f_lock = b.add_func("bpf_rcu_read_lock", void_proto)
    f_unlock = b.add_func("bpf_rcu_read_unlock", void_proto)
    f_missing = b.add_func("ssd_no_such_kfunc", void_proto)
    # struct_ops local type, as in a BPF object's vmlinux.h (subset + an optional extra)
    sock = b.add_fwd("sock")
    fptr = b.add_ptr(b.add_func_proto(u32, [("sk", b.add_ptr(sock))]))
    ca_members = [
        ("ssthresh", fptr, 0, 0),
        ("cong_avoid", fptr, 64, 0),
        ("undo_cwnd", fptr, 128, 0),
        ("name", b.add_array(char, u32, 16), 192, 0),
        ("flags", u32, 320, 0),
        ("ssd_extra", u32, 352, 0),
    ]
    ca_type = b.add_struct("tcp_congestion_ops", 48, ca_members)
    btf = Btf.from_bytes(b.build(), name="test_obj")

    ca_data = bytearray(48)
    ca_data[24 : 24 + len(ca_name)] = ca_name.encode()
    struct.pack_into("<I", ca_data, 44, extra_member_value)
    so = StructOpsSpec(
        var_name="ssd_ca",
        section=".struct_ops.link",
        type_name="tcp_congestion_ops",
        type_id=ca_type,
        data=bytes(ca_data),
        link=True,
        members=(
            StructOpsMember("ssthresh", 0, 8, fptr, True, "ssd_ssthresh"),
            StructOpsMember("cong_avoid", 8, 8, fptr, True, "ssd_cong_avoid"),
            StructOpsMember("undo_cwnd", 16, 8, fptr, True, "ssd_undo_cwnd"),
            StructOpsMember("name", 24, 16, 0, False, None),
            StructOpsMember("flags", 40, 4, u32, False, None),
            StructOpsMember("ssd_extra", 44, 4, u32, False, None),
        ),
    )
    maps = (
        MapSpec(
            ".data",
            "test_obj.data",
            MapKind.DATA,
            bpf_uapi.MapType.ARRAY,
            4,
            8,
            1,
            flags=bpf_uapi.F_MMAPABLE,
            value_type_id=data_sec,
            data=bytes(8),
            variables=(VariableSpec("counter", ".data", 0, 8, u64, False),),
            section=".data",
        ),
        MapSpec(
            ".rodata",
            "test_obj.rodata",
            MapKind.RODATA,
            bpf_uapi.MapType.ARRAY,
            4,
            4,
            1,
            flags=bpf_uapi.F_RDONLY_PROG | bpf_uapi.F_MMAPABLE,
            value_type_id=rodata_sec,
            data=struct.pack("<I", 41),
            variables=(VariableSpec("tunable", ".rodata", 0, 4, u32, False),),
            section=".rodata",
        ),
        MapSpec(
            ".kconfig",
            "test_obj.kconfig",
            MapKind.KCONFIG,
            bpf_uapi.MapType.ARRAY,
            4,
            16,
            1,
            flags=bpf_uapi.F_RDONLY_PROG | bpf_uapi.F_MMAPABLE,
            value_type_id=kcfg_sec,
            data=bytes(16),
            section=".kconfig",
        ),
        MapSpec(
            "ssd_ca",
            "ssd_ca",
            MapKind.STRUCT_OPS,
            bpf_uapi.MapType.STRUCT_OPS,
            4,
            48,
            1,
            flags=bpf_uapi.F_LINK,
            value_type_id=ca_type,
            struct_ops=so,
            section=".struct_ops.link",
        ),
    )
    counter = (
        asm.ld_imm64(1, 0, 0, 0)  # &counter
        + asm.ldx_dw(2, 1, 0)
        + asm.add64_imm(2, 1)
        + asm.stx_dw(1, 2, 0)
        + asm.ld_imm64(3, 0, 0, 0)  # &tunable
        + asm.ldx_w(0, 3, 0)
        + asm.exit_()
    )
    kcfg = asm.ld_imm64(1, 0, 0, 0) + asm.ldx_w(0, 1, 0) + asm.exit_()
    kfuncs = (
        asm.kfunc_call()
        + asm.kfunc_call()
        + asm.mov64_imm(1, 0)
        + asm.jeq_imm(1, 0, 1)
        + asm.kfunc_call()  # weak and missing: poisoned, and dead
        + asm.ret(7)
    )
    programs = (
        _prog(
            "counter",
            counter,
            (
                Fixup(FixupKind.MAP_VALUE, 0, map_index=0),
                Fixup(FixupKind.MAP_VALUE, 5, map_index=1),
            ),
        ),
        _prog("kcfg", kcfg, (Fixup(FixupKind.MAP_VALUE, 0, map_index=2),)),
        _prog(
            "kfuncs",
            kfuncs,
            (
                Fixup(FixupKind.KFUNC_CALL, 0, extern="bpf_rcu_read_lock"),
                Fixup(FixupKind.KFUNC_CALL, 1, extern="bpf_rcu_read_unlock"),
                Fixup(FixupKind.KFUNC_CALL, 4, extern="ssd_no_such_kfunc"),
            ),
        ),
        *(
            _prog(
                f"ssd_{m}",
                asm.ret(v),
                section=f"struct_ops/ssd_{m}",
                prog_type=bpf_uapi.ProgType.STRUCT_OPS,
                attach_to=f"ssd_{m}",
                sleepable=False,
            )
            for m, v in (("ssthresh", 2), ("cong_avoid", 0), ("undo_cwnd", 10))
        ),
    )
    externs = (
        ExternSpec(
            "CONFIG_HZ",
            "CONFIG_HZ",
            ExternKind.KCONFIG,
            False,
            v_hz,
            i32,
            0,
            4,
            KconfigType.INT,
            True,
        ),
        ExternSpec(
            "LINUX_KERNEL_VERSION",
            "LINUX_KERNEL_VERSION",
            ExternKind.KCONFIG,
            False,
            v_ver,
            u32,
            4,
            4,
            KconfigType.INT,
        ),
        ExternSpec(
            "CONFIG_SSD_NOPE",
            "CONFIG_SSD_NOPE",
            ExternKind.KCONFIG,
            True,
            v_nope,
            u64,
            8,
            8,
            KconfigType.INT,
        ),
        ExternSpec(
            "bpf_rcu_read_lock", "bpf_rcu_read_lock", ExternKind.KFUNC, False, f_lock, void_proto
        ),
        ExternSpec(
            "bpf_rcu_read_unlock",
            "bpf_rcu_read_unlock",
            ExternKind.KFUNC,
            False,
            f_unlock,
            void_proto,
        ),
        ExternSpec(
            "ssd_no_such_kfunc", "ssd_no_such_kfunc", ExternKind.KFUNC, True, f_missing, void_proto
        ),
    )
    return ObjectSpec("test_obj", "GPL", 0, btf, programs, maps, externs)


def test_globals_kconfig_and_kfuncs_run(kernel: TargetBtfs) -> None:
    cfg = read_kernel_config()
    with load_object(_spec(), kernel) as obj:
        assert set(obj.programs) == {
            "counter",
            "kcfg",
            "kfuncs",
            "ssd_ssthresh",
            "ssd_cong_avoid",
            "ssd_undo_cwnd",
        }
        res = prog_test_run(obj.programs["counter"].fd)
        assert res.retval == 41
        prog_test_run(obj.programs["counter"].fd)
        assert obj.read_variable("counter") == struct.pack("<Q", 2)
        obj.write_variable("counter", struct.pack("<Q", 100))
        prog_test_run(obj.programs["counter"].fd)
        assert obj.read_variable("counter") == struct.pack("<Q", 101)
        assert obj.read_variable("tunable") == struct.pack("<I", 41)
        with pytest.raises(BpfSyscallError) as exc:
            obj.write_variable("tunable", struct.pack("<I", 1))
        assert exc.value.errno_name == "EPERM"  # .rodata is frozen
        with pytest.raises(LoadError, match="no global variable"):
            obj.read_variable("nope")
        # .kconfig: values from the running kernel's config, weak unknown = 0
        assert prog_test_run(obj.programs["kcfg"].fd).retval == cfg["CONFIG_HZ"]
        kmap = obj.maps[".kconfig"].fd
        value = map_lookup_elem(kmap, b"\0" * 4, 16)
        assert value is not None
        hz, ver, nope = struct.unpack("<iIQ", value)
        assert (hz, ver, nope) == (cfg["CONFIG_HZ"], kernel_version_code(), 0)
        # kfuncs: resolved in vmlinux, the weak missing one poisoned (and dead)
        assert obj.externs["bpf_rcu_read_lock"].resolved
        assert obj.externs["bpf_rcu_read_lock"].btf_name == "vmlinux"
        assert not obj.externs["ssd_no_such_kfunc"].resolved
        insns = obj.programs["kfuncs"].insns
        assert insn.decode(insns, 0).src == insn.PSEUDO_KFUNC_CALL
        assert (
            insn.decode(insns, 0).imm == kernel.vmlinux.find_ids("bpf_rcu_read_lock", Kind.FUNC)[0]
        )
        assert insn.decode(insns, 4).imm == 2002000000 + 5
        assert prog_test_run(obj.programs["kfuncs"].fd).retval == 7
        # .rodata is bound to every program
        rodata_id = obj.maps[".rodata"].id
        assert all(rodata_id in prog_info(p.fd).map_ids for p in obj.programs.values())
        assert {"btf", "maps", "externs"} <= set(obj.timings_ns)
        assert all(f"prog:{n}" in obj.timings_ns for n in obj.programs)


def test_struct_ops_link_attach_detach(kernel: TargetBtfs) -> None:
    name = f"ssd_{uuid.uuid4().hex[:8]}"
    with load_object(_spec(name), kernel) as obj:
        assert name not in CA_LIST.read_text().split()
        links = obj.attach_struct_ops()
        assert set(links) == {"ssd_ca"}
        assert name in CA_LIST.read_text().split()
        info = link_info(links["ssd_ca"])
        assert info.type == bpf_uapi.LinkType.STRUCT_OPS and info.map_id == obj.maps["ssd_ca"].id
        assert "attach" in obj.timings_ns
        obj.detach_struct_ops()
        assert name not in CA_LIST.read_text().split()
        obj.attach_struct_ops()
        assert name in CA_LIST.read_text().split()
    assert name not in CA_LIST.read_text().split()  # closing the object detaches


def test_legacy_struct_ops_attach_detach(kernel: TargetBtfs) -> None:
    name = f"ssd_{uuid.uuid4().hex[:8]}"
    spec = _spec(name)
    ca = spec.map("ssd_ca")
    legacy = dataclasses.replace(ca, flags=0, section=".struct_ops")
    spec = dataclasses.replace(spec, maps=tuple(legacy if m is ca else m for m in spec.maps))
    with load_object(spec, kernel) as obj:
        assert obj.attach_struct_ops() == {}
        assert name in CA_LIST.read_text().split()
        obj.detach_struct_ops()
        assert name not in CA_LIST.read_text().split()
        with pytest.raises(LoadError, match="cannot be registered again"):
            obj.attach_struct_ops()


def _fail_leaves_nothing(spec: ObjectSpec, kernel: TargetBtfs, exc: type[Exception]) -> Exception:
    """Load must fail with ``exc`` leaving no fd in this process and no program or map of
    the spec's names in the kernel (other processes' objects are ignored)."""
    before = _open_fds()
    progs_before = _named_ids(prog_get_next_id, _prog_name, {p.name for p in spec.programs})
    maps_before = _named_ids(map_get_next_id, _map_name, {m.kernel_name for m in spec.maps})
    with pytest.raises(exc) as info:
        load_object(spec, kernel)
    assert _open_fds() == before
    # Programs free their maps after an RCU (tasks-trace, for sleepable ones) grace period,
    # so the kernel drops the maps shortly after our last close: poll briefly.
    deadline = time.monotonic() + 10
    while True:
        progs = _named_ids(prog_get_next_id, _prog_name, {p.name for p in spec.programs})
        maps = _named_ids(map_get_next_id, _map_name, {m.kernel_name for m in spec.maps})
        progs, maps = _not_held_elsewhere(progs - progs_before, maps - maps_before)
        if not (progs or maps) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not progs
    assert not maps
    return info.value


def _not_held_elsewhere(progs: set[int], maps: set[int]) -> tuple[set[int], set[int]]:
    """Drop the ids another process holds: a same-named object of a test suite running
    beside this one (its fd in /proc/PID/fdinfo, ``prog_id:``/``map_id:``, or a map of a
    program it holds). Ours are held by no other process, so a leak still shows."""
    if not (progs or maps):
        return progs, maps
    held_progs: set[int] = set()
    held_maps: set[int] = set()
    me = os.getpid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            infos = list((proc / "fdinfo").iterdir())
        except OSError:
            continue
        for info in infos:
            try:
                text = info.read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(":")
                if key == "prog_id":
                    held_progs.add(int(value))
                elif key == "map_id":
                    held_maps.add(int(value))
    for prog_id in held_progs & progs:
        try:
            with prog_get_fd_by_id(prog_id) as fd:
                held_maps.update(prog_info(fd, xlated=False).map_ids)
        except BpfSyscallError:
            continue
    return progs - held_progs, maps - held_maps


def _prog_name(obj_id: int) -> str:
    with prog_get_fd_by_id(obj_id) as fd:
        return prog_info(fd, xlated=False).name


def _map_name(obj_id: int) -> str:
    with map_get_fd_by_id(obj_id) as fd:
        return map_info(fd).name


def _named_ids(
    next_id: Callable[[int], int | None], name_of: Callable[[int], str], names: set[str]
) -> set[int]:
    out: set[int] = set()
    cur = 0
    while (nxt := next_id(cur)) is not None:
        cur = nxt
        try:
            if name_of(nxt) in {n[:15] for n in names}:
                out.add(nxt)
        except BpfSyscallError:  # freed meanwhile
            continue
    return out


def test_verifier_rejection_cleans_up(kernel: TargetBtfs) -> None:
    spec = _spec()
    bad = _prog("bad", asm.exit_())
    spec = dataclasses.replace(spec, programs=(*spec.programs, bad))
    err = _fail_leaves_nothing(spec, kernel, ProgramLoadError)
    assert isinstance(err, ProgramLoadError)
    assert err.program == "bad"
    assert err.verifier_log and "R0 !read_ok" in err.verifier_log


def test_missing_strong_kfunc_cleans_up(kernel: TargetBtfs) -> None:
    spec = _spec()
    ext = spec.extern("ssd_no_such_kfunc")
    strong = dataclasses.replace(ext, weak=False)
    spec = dataclasses.replace(spec, externs=tuple(strong if e is ext else e for e in spec.externs))
    err = _fail_leaves_nothing(spec, kernel, LoadError)
    assert "ssd_no_such_kfunc" in str(err)


def test_struct_ops_member_kernel_lacks_with_value_cleans_up(kernel: TargetBtfs) -> None:
    err = _fail_leaves_nothing(_spec(extra_member_value=3), kernel, LoadError)
    assert "ssd_extra" in str(err)


def test_no_fd_leak_across_load_cycles(kernel: TargetBtfs) -> None:
    before = _open_fds()
    for _ in range(10):
        with load_object(_spec(), kernel) as obj:
            prog_test_run(obj.programs["counter"].fd)
    assert _open_fds() == before


def test_pin_by_name_creates_then_reuses(kernel: TargetBtfs, bpffs: Path) -> None:
    spec = _spec()
    data = spec.map(".data")
    pinned = dataclasses.replace(data, name="ssd_pinned", pinning=1)
    spec = dataclasses.replace(spec, maps=tuple(pinned if m is data else m for m in spec.maps))
    with load_object(spec, kernel, pin_root=bpffs) as first:
        first_id = first.maps["ssd_pinned"].id
        first.write_variable("counter", struct.pack("<Q", 9))
    assert (bpffs / "ssd_pinned").exists()
    with load_object(spec, kernel, pin_root=bpffs) as second:
        assert second.maps["ssd_pinned"].id == first_id
        assert second.read_variable("counter") == struct.pack("<Q", 9)  # contents kept
    other = dataclasses.replace(pinned, max_entries=2)
    bad = dataclasses.replace(spec, maps=tuple(other if m is pinned else m for m in spec.maps))
    with pytest.raises(LoadError, match="does not match"):
        load_object(bad, kernel, pin_root=bpffs)
    os.unlink(bpffs / "ssd_pinned")


def test_btf_sanitised_for_a_kernel_without_newer_kinds(kernel: TargetBtfs) -> None:
    # As if the kernel knew neither DATASEC/VAR nor FUNC: data maps get STRUCT value types.
    old = BtfFeatures(False, False, False, False, False, False, False, False)
    with load_object(_spec(), kernel, btf_features=old) as obj:
        assert prog_test_run(obj.programs["counter"].fd).retval == 41
        assert obj.read_variable("counter") == struct.pack("<Q", 1)
        assert obj.btf_fd is not None
        loaded = Btf.from_bytes(btf_info(obj.btf_fd, data=True).data or b"")
        datasec = obj.spec.map(".data").value_type_id
        assert loaded.kind(datasec) == Kind.STRUCT  # what the kernel got is sanitised
        # a keyless array map needs a DATASEC value type, so (as libbpf does) the map was
        # created again without BTF types
        assert map_info(obj.maps[".data"].fd).btf_value_type_id == 0


def _with_indexed_read(spec: ObjectSpec) -> ObjectSpec:
    """Add a program reading ``*(u64 *)((char *)&counter + tunable)``: the verifier knows
    the frozen .rodata value, so the access is accepted or rejected by ``tunable``."""
    body = (
        asm.ld_imm64(1, 0, 0, 0)  # &counter
        + asm.ld_imm64(3, 0, 0, 0)  # &tunable
        + asm.ldx_w(2, 3, 0)
        + insn.Insn(insn.CLASS_ALU64 | asm.ALU_ADD | insn.SRC_X, 1, 2, 0, 0).encode()
        + asm.ldx_dw(0, 1, 0)
        + asm.exit_()
    )
    prog = _prog(
        "indexed",
        body,
        (
            Fixup(FixupKind.MAP_VALUE, 0, map_index=0),
            Fixup(FixupKind.MAP_VALUE, 2, map_index=1),
        ),
    )
    return dataclasses.replace(spec, programs=(*spec.programs, prog))


def test_bad_rodata_value_is_a_verifier_error(kernel: TargetBtfs) -> None:
    from schedswitchd.bpf.customize import set_variable

    good = set_variable(_with_indexed_read(_spec()), "tunable", 0)
    with load_object(good, kernel) as obj:
        assert "indexed" in obj.programs
    bad = set_variable(_with_indexed_read(_spec()), "tunable", 4096)
    err = _fail_leaves_nothing(bad, kernel, ProgramLoadError)
    assert isinstance(err, ProgramLoadError) and err.program == "indexed"
    assert err.verifier_log and "invalid access to map value" in err.verifier_log


def test_ksym_address_of_kfuncs(kernel: TargetBtfs) -> None:
    """``if (kfunc)``: a resolved kfunc's address is an ld_imm64 of its BTF id
    (BPF_PSEUDO_BTF_ID); an unresolved weak one becomes the constant 0."""
    body = (
        asm.ld_imm64(1, 0, 0, 0)  # &bpf_rcu_read_lock
        + asm.ld_imm64(2, 0, 0, 0)  # &ssd_no_such_kfunc
        + asm.mov64_reg(0, 2)
        + asm.exit_()
    )
    prog = _prog(
        "ksym_addr",
        body,
        (
            Fixup(FixupKind.KSYM, 0, extern="bpf_rcu_read_lock"),
            Fixup(FixupKind.KSYM, 2, extern="ssd_no_such_kfunc"),
        ),
    )
    spec = _spec()
    spec = dataclasses.replace(spec, programs=(*spec.programs, prog))
    with load_object(spec, kernel) as obj:
        insns = obj.programs["ksym_addr"].insns
        first, missing = insn.decode(insns, 0), insn.decode(insns, 2)
        assert first.src == insn.PSEUDO_BTF_ID
        assert first.imm == kernel.vmlinux.find_ids("bpf_rcu_read_lock", Kind.FUNC)[0]
        assert insn.decode(insns, 1).imm == 0  # vmlinux: no module BTF fd
        assert (missing.src, missing.imm, insn.decode(insns, 3).imm) == (0, 0, 0)
        assert prog_test_run(obj.programs["ksym_addr"].fd).retval == 0


def test_prog_array_values_initialiser(kernel: TargetBtfs) -> None:
    spec = _spec()
    jmp = MapSpec(
        "jmp_table",
        "jmp_table",
        MapKind.DECLARED,
        bpf_uapi.MapType.PROG_ARRAY,
        4,
        4,
        2,
        init_slots=((1, "counter"),),
    )
    spec = dataclasses.replace(spec, maps=(*spec.maps, jmp))
    with load_object(spec, kernel) as obj:
        m = obj.maps["jmp_table"].fd
        assert map_lookup_elem(m, struct.pack("<I", 1), 4) == struct.pack(
            "<I", obj.programs["counter"].id
        )
        assert map_lookup_elem(m, struct.pack("<I", 0), 4) is None
    bad = dataclasses.replace(jmp, init_slots=((0, "no_such_prog"),))
    spec_bad = dataclasses.replace(spec, maps=(*spec.maps[:-1], bad))
    err = _fail_leaves_nothing(spec_bad, kernel, LoadError)
    assert "no_such_prog" in str(err)
