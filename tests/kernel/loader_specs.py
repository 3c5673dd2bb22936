"""Object specs built in memory for the loader's tests (tests/kernel/test_loader.py,
test_object_cli.py): no compiler, every section and relocation chosen by the test."""

from __future__ import annotations

import dataclasses
import struct

from schedswitchd.bpf import insn
from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import INT_CHAR, VAR_GLOBAL_ALLOCATED
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
from schedswitchd.kernel import bpf_uapi
from tests.kernel import asm


def program_spec(
    name: str, insns: bytes, fixups: tuple[Fixup, ...] = (), **kw: object
) -> ProgramSpec:
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


def object_spec(ca_name: str = "ssd_x", *, extra_member_value: int = 0) -> ObjectSpec:
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
        program_spec(
            "counter",
            counter,
            (
                Fixup(FixupKind.MAP_VALUE, 0, map_index=0),
                Fixup(FixupKind.MAP_VALUE, 5, map_index=1),
            ),
        ),
        program_spec("kcfg", kcfg, (Fixup(FixupKind.MAP_VALUE, 0, map_index=2),)),
        program_spec(
            "kfuncs",
            kfuncs,
            (
                Fixup(FixupKind.KFUNC_CALL, 0, extern="bpf_rcu_read_lock"),
                Fixup(FixupKind.KFUNC_CALL, 1, extern="bpf_rcu_read_unlock"),
                Fixup(FixupKind.KFUNC_CALL, 4, extern="ssd_no_such_kfunc"),
            ),
        ),
        *(
            program_spec(
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


def with_indexed_read(spec: ObjectSpec) -> ObjectSpec:
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
    prog = program_spec(
        "indexed",
        body,
        (
            Fixup(FixupKind.MAP_VALUE, 0, map_index=0),
            Fixup(FixupKind.MAP_VALUE, 2, map_index=1),
        ),
    )
    return dataclasses.replace(spec, programs=(*spec.programs, prog))
