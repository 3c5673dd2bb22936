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
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Kind
from schedswitchd.bpf.spec import (
    Fixup,
    FixupKind,
    MapKind,
    MapSpec,
    ObjectSpec,
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
from tests.kernel.loader_specs import object_spec, program_spec, with_indexed_read

pytestmark = pytest.mark.root

CA_LIST = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


@pytest.fixture
def kernel(registry: KernelBtfRegistry) -> TargetBtfs:
    return registry.targets(())


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_globals_kconfig_and_kfuncs_run(kernel: TargetBtfs) -> None:
    cfg = read_kernel_config()
    with load_object(object_spec(), kernel) as obj:
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
    with load_object(object_spec(name), kernel) as obj:
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
    spec = object_spec(name)
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
    spec = object_spec()
    bad = program_spec("bad", asm.exit_())
    spec = dataclasses.replace(spec, programs=(*spec.programs, bad))
    err = _fail_leaves_nothing(spec, kernel, ProgramLoadError)
    assert isinstance(err, ProgramLoadError)
    assert err.program == "bad"
    assert err.verifier_log and "R0 !read_ok" in err.verifier_log


def test_missing_strong_kfunc_cleans_up(kernel: TargetBtfs) -> None:
    spec = object_spec()
    ext = spec.extern("ssd_no_such_kfunc")
    strong = dataclasses.replace(ext, weak=False)
    spec = dataclasses.replace(spec, externs=tuple(strong if e is ext else e for e in spec.externs))
    err = _fail_leaves_nothing(spec, kernel, LoadError)
    assert "ssd_no_such_kfunc" in str(err)


def test_struct_ops_member_kernel_lacks_with_value_cleans_up(kernel: TargetBtfs) -> None:
    err = _fail_leaves_nothing(object_spec(extra_member_value=3), kernel, LoadError)
    assert "ssd_extra" in str(err)


def test_no_fd_leak_across_load_cycles(kernel: TargetBtfs) -> None:
    before = _open_fds()
    for _ in range(10):
        with load_object(object_spec(), kernel) as obj:
            prog_test_run(obj.programs["counter"].fd)
    assert _open_fds() == before


def test_pin_by_name_creates_then_reuses(kernel: TargetBtfs, bpffs: Path) -> None:
    spec = object_spec()
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
    with load_object(object_spec(), kernel, btf_features=old) as obj:
        assert prog_test_run(obj.programs["counter"].fd).retval == 41
        assert obj.read_variable("counter") == struct.pack("<Q", 1)
        assert obj.btf_fd is not None
        loaded = Btf.from_bytes(btf_info(obj.btf_fd, data=True).data or b"")
        datasec = obj.spec.map(".data").value_type_id
        assert loaded.kind(datasec) == Kind.STRUCT  # what the kernel got is sanitised
        # a keyless array map needs a DATASEC value type, so (as libbpf does) the map was
        # created again without BTF types
        assert map_info(obj.maps[".data"].fd).btf_value_type_id == 0


def test_bad_rodata_value_is_a_verifier_error(kernel: TargetBtfs) -> None:
    from schedswitchd.bpf.customize import set_variable

    good = set_variable(with_indexed_read(object_spec()), "tunable", 0)
    with load_object(good, kernel) as obj:
        assert "indexed" in obj.programs
    bad = set_variable(with_indexed_read(object_spec()), "tunable", 4096)
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
    prog = program_spec(
        "ksym_addr",
        body,
        (
            Fixup(FixupKind.KSYM, 0, extern="bpf_rcu_read_lock"),
            Fixup(FixupKind.KSYM, 2, extern="ssd_no_such_kfunc"),
        ),
    )
    spec = object_spec()
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
    spec = object_spec()
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
