"""The loader on real clang-built objects (``build/tests/bpf/*.bpf.o``, from
``make test-objects``) on the host kernel, and the same result as libbpf: programs loaded by
Debian's libbpf (``libbpf.so.1`` through ctypes, tests/libbpf_ref.py) and by us have
identical xlated instructions except for map ids."""

from __future__ import annotations

import dataclasses
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.kernel import bpf_uapi, syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.kconfig import Tristate, kernel_version_code, read_kernel_config
from schedswitchd.kernel.loader import LoadedObject, load_object
from tests.build_outputs import built_object
from tests.kernel.unique_ops import ca_name, unique_object
from tests.libbpf_ref import LibbpfError, libbpf_xlated
from tests.xlated import differences

pytestmark = pytest.mark.root

T = TypeVar("T")

CA_LIST = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


def _path(name: str) -> Path:
    """The build's object ``name``, its congestion controls named for this process (they
    are kernel-wide: tests/kernel/unique_ops.py)."""
    return unique_object(built_object(name))


def _obj(name: str) -> ObjectSpec:
    return open_object(_path(name))


def _load(spec: ObjectSpec, registry: KernelBtfRegistry, **kw: object) -> LoadedObject:
    return load_object(
        spec,
        registry.targets(spec.kmod_btfs),
        open_btf_object=registry.open_btf_object,
        **kw,  # type: ignore[arg-type]
    )


def test_kconfig_object_reads_the_running_config(registry: KernelBtfRegistry) -> None:
    cfg = read_kernel_config()
    with _load(_obj("kconfig"), registry) as obj:
        assert syscall.prog_test_run(obj.programs["read_kconfig"].fd).retval == 0
        out = struct.unpack("<Q", obj.read_variable("out"))[0]
    host = cfg.get("CONFIG_DEFAULT_HOSTNAME")
    expected = (
        kernel_version_code()
        + (cfg.get("CONFIG_BPF_SYSCALL") is Tristate.YES)
        + {Tristate.YES: 1, Tristate.MODULE: 2}.get(cfg.get("CONFIG_BPF_JIT"), 0)  # type: ignore[arg-type]
        + int(cfg["CONFIG_HZ"])  # type: ignore[arg-type]
        + (ord(host[0]) if isinstance(host, str) and host else 0)
    )
    assert out == expected


def test_subprograms_callbacks_and_tracing_attach(registry: KernelBtfRegistry) -> None:
    with _load(_obj("subprogs"), registry) as obj:
        obj.write_variable("total", struct.pack("<Q", 5))
        assert syscall.prog_test_run(obj.programs["prog_c"].fd).retval == 6  # add_one(total)
        info = syscall.prog_info(obj.programs["prog_a"].fd)
        assert info.nr_func_info >= 4  # entry + subprograms + callbacks carry BTF func info
        with syscall.link_create(
            obj.programs["prog_a"].fd, bpf_uapi.AttachType.TRACE_RAW_TP
        ) as link:
            assert syscall.link_info(link).type == bpf_uapi.LinkType.RAW_TRACEPOINT  # tp_btf
            deadline = time.monotonic() + 5
            while struct.unpack("<Q", obj.read_variable("total"))[0] == 5:
                assert time.monotonic() < deadline, "sched_switch program never ran"
                time.sleep(0.01)
        # prog_a adds twice(sum of idx+1 for idx < 8) = 74 per context switch
        assert (struct.unpack("<Q", obj.read_variable("total"))[0] - 5) % 74 == 0


def test_struct_ops_object_attaches_both_forms(registry: KernelBtfRegistry) -> None:
    spec = _obj("struct_ops")
    plain, link = ca_name("ssd_plain"), ca_name("ssd_link")  # the registered names
    with _load(spec, registry) as obj:
        names = CA_LIST.read_text().split()
        assert plain not in names and link not in names
        links = obj.attach_struct_ops()
        assert set(links) == {"ssd_link"}  # the map
        names = CA_LIST.read_text().split()
        assert plain in names and link in names
        # ssd_release comes from a '?' section but is used by ssd_link, so it was loaded
        assert "ssd_release" in obj.programs
        obj.detach_struct_ops("ssd_link")
        assert link not in CA_LIST.read_text().split()
    assert plain not in CA_LIST.read_text().split()


# --- same result as libbpf -------------------------------------------------------------------


@pytest.fixture
def libbpf_pins(bpffs: Path) -> Iterator[Path]:
    d = bpffs / "libbpf"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize(
    "name",
    [
        "kconfig",
        "subprogs",
        "core_kinds",
        "kmod_empty",
        "kmod_fixed",
        "kmod_ptrs",
        "struct_ops",
        "tcp_ca",
        "globals",
        "maps",
        "ksyms",
    ],
)
def test_xlated_same_as_libbpf(
    name: str, registry: KernelBtfRegistry, libbpf_pins: Path, bpffs: Path
) -> None:
    spec = _obj(name)
    try:
        theirs = libbpf_xlated(_path(name), libbpf_pins)
    except LibbpfError as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip() and "failed to load" not in ln]
        last = lines[-1:] or ["?"]
        pytest.skip(f"libbpf 1.1 cannot load {name}: {last[0]}")
    assert theirs, "libbpf loaded no programs"
    ours_pins = bpffs / "ours"
    ours_pins.mkdir()
    with _load(spec, registry, pin_root=ours_pins) as obj:
        ours = {n: syscall.prog_info(p.fd).xlated_insns for n, p in obj.programs.items()}
    assert set(theirs) <= set(ours)
    # libbpf leaves '?' programs out unless asked (1.1 even when a struct_ops map uses one,
    # ssd_release); we try them (optional programs): the only programs libbpf lacks.
    for extra in set(ours) - set(theirs):
        assert not spec.program(extra).autoload, extra
    for prog, xl in theirs.items():
        assert not differences(ours[prog], xl), f"{name}:{prog} differs from libbpf's"


def test_core_relocations_run_for_real(registry: KernelBtfRegistry) -> None:
    from schedswitchd.bpf.btf.types import Enum, Kind

    vmlinux = registry.targets(()).vmlinux
    with _load(_obj("core_kinds"), registry) as obj:
        assert "core" in obj.timings_ns
        with syscall.link_create(obj.programs["core_kinds"].fd, bpf_uapi.AttachType.TRACE_RAW_TP):
            deadline = time.monotonic() + 5
            while not any(obj.read_variable("out")[8:16]):
                assert time.monotonic() < deadline, "sched_switch program never ran"
                time.sleep(0.01)
        out = struct.unpack("<16Q", obj.read_variable("out"))
    task = vmlinux.find("task_struct", Kind.STRUCT)
    assert task is not None
    pid_type = vmlinux.type(vmlinux.find("pid_type", Kind.ENUM) or 0)
    assert isinstance(pid_type, Enum)
    sid = next(v.value for v in pid_type.values if v.name == "PIDTYPE_SID")
    assert out[1:4] == (1, 0, 16)  # pid exists, no_such_field does not, sizeof(comm)
    assert out[7:12] == (task, 1, 0, vmlinux.size_of(task), 1)
    assert out[12:14] == (0, sid)


class _CountingKernel:
    """vmlinux plus one (empty) module BTF; counts how often the modules are reached."""

    def __init__(self, vmlinux: Btf) -> None:
        from schedswitchd.bpf.btf.builder import BtfBuilder

        b = BtfBuilder()
        b.add_int("int", 4, signed=True)
        self.vmlinux = vmlinux
        self.module = Btf.from_bytes(b.build(), name="ssd_fake_mod")
        self.module_reads = 0

    def __iter__(self) -> Iterator[Btf]:
        yield self.vmlinux
        self.module_reads += 1
        yield self.module

    def first(self, probe: Callable[[Btf], T | None]) -> tuple[Btf, T] | None:
        for btf in self:
            got = probe(btf)
            if got is not None:
                return btf, got
        return None


def test_core_reads_modules_only_for_types_vmlinux_lacks(registry: KernelBtfRegistry) -> None:
    from schedswitchd.bpf.core.candidates import find_candidates
    from schedswitchd.bpf.core.relo import CoreReloKind
    from schedswitchd.bpf.core.relocate import relocate

    vmlinux = registry.targets(()).vmlinux
    spec = _obj("core_kinds")
    prog = spec.program("core_kinds")
    assert spec.btf is not None
    res = relocate(spec.btf, prog.insns, prog.core_relos, [vmlinux])
    # Relocations of types vmlinux has, including fields it lacks (task_struct___kinds'
    # no_such_field): libbpf reads no module BTF for those; only a type with no candidate in
    # vmlinux (no_such_struct___kinds) sends it to the modules.
    in_vmlinux = tuple(
        r.relo
        for r in res.results
        if r.kind == CoreReloKind.TYPE_ID_LOCAL
        or r.target_btf == "vmlinux"
        or r.found
        or find_candidates(spec.btf, r.relo.type_id, [vmlinux]).cands
    )
    assert any(not r.found for r in res.results if r.relo in in_vmlinux)
    assert 0 < len(in_vmlinux) < len(prog.core_relos)
    only_vmlinux_types = dataclasses.replace(
        spec, programs=(dataclasses.replace(prog, core_relos=in_vmlinux),)
    )
    lazy = _CountingKernel(vmlinux)
    with load_object(only_vmlinux_types, lazy):
        pass
    assert lazy.module_reads == 0
    eager = _CountingKernel(vmlinux)
    with load_object(spec, eager) as obj:
        assert "core_kinds" in obj.programs
    assert eager.module_reads >= 1
