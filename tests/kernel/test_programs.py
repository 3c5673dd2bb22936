"""Programs beyond struct_ops on the host kernel: ``SEC("syscall")`` programs run with
``BPF_PROG_RUN`` and a context laid out from BTF, optional (``?``) sections, and the
auto-attached kinds (tp_btf, raw_tp, tracepoint, iter; fentry/fexit where the kernel
allows them), attached before the struct_ops link and closed on unload.

Objects: ``tests/bpf/{syscall_run,optional,attach,ca_hooks}.bpf.c``."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf.customize import set_struct_ops_member, set_variable
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.errors import CustomizationError, LoadError
from schedswitchd.kernel import bpf_uapi
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import (
    LoadedObject,
    ProgramLoadError,
    ProgramRunError,
    load_object,
)
from schedswitchd.kernel.prog_attach import AttachError, AttachMode, attach_mode
from schedswitchd.kernel.syscall import (
    link_get_fd_by_id,
    link_get_next_id,
    link_info,
    prog_get_next_id,
    prog_info,
)
from tests.build_outputs import built_object

pytestmark = pytest.mark.root

_libc = ctypes.CDLL(None, use_errno=True)
NR_GETPID, NR_GETPPID, NR_GETPGID = 39, 110, 121  # x86_64


def _obj(name: str) -> ObjectSpec:
    return open_object(built_object(name))


def _load(spec: ObjectSpec, registry: KernelBtfRegistry, **kw: object) -> LoadedObject:
    return load_object(
        spec,
        registry.targets(spec.kmod_btfs),
        open_btf_object=registry.open_btf_object,
        **kw,  # type: ignore[arg-type]
    )


def _u64(obj: LoadedObject, name: str) -> int:
    return int(struct.unpack("<Q", obj.read_variable(name))[0])


def _s64(obj: LoadedObject, name: str) -> int:
    return int(struct.unpack("<q", obj.read_variable(name))[0])


def _bpf_fds() -> dict[int, str]:
    """This process's fds that refer to BPF objects: number -> anon inode name."""
    out = {}
    for entry in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue
        if target.startswith("anon_inode:bpf") or target == "anon_inode:btf":
            out[int(entry)] = target
    return out


def _links_of(prog_ids: set[int]) -> list[int]:
    """Ids of the kernel's links whose program is one of ``prog_ids``."""
    found = []
    start = 0
    while (nxt := link_get_next_id(start)) is not None:
        start = nxt
        try:
            with link_get_fd_by_id(nxt) as fd:
                info = link_info(fd)
        except Exception:  # gone meanwhile (another test's link)
            continue
        if info.prog_id in prog_ids:
            found.append(nxt)
    return found


def _wait_for(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


# --- SEC("syscall") and BPF_PROG_RUN -------------------------------------------------------


def test_syscall_program_runs_with_a_context_dict(registry: KernelBtfRegistry) -> None:
    with _load(_obj("syscall_run"), registry) as obj:
        prog = obj.programs["compute"]
        assert prog.spec.sleepable
        assert prog_info(prog.fd).type == bpf_uapi.ProgType.SYSCALL
        run = obj.run_program_result("compute", {"a": 6, "b": 7, "bias": -2, "tag": "hello"})
        assert run.retval == 13  # a + b
        # the program wrote out = a * b + bias into the context and the globals
        layout = struct.Struct("<IIhB8sxxxxxQ")
        assert layout.size == 32
        assert layout.unpack(run.ctx) == (6, 7, -2, 0, b"hello\0\0\0", 40)
        assert _s64(obj, "last_result") == 40
        assert obj.read_variable("last_tag") == b"hello\0\0\0"
        # op 1 (a - b + bias), an enum-free int member, and the bytes form of the context
        ctx = obj.context("compute", {"a": 5, "b": 9, "bias": 1, "op": 1})
        assert ctx == layout.pack(5, 9, 1, 1, b"", 0)
        assert obj.run_program("compute", ctx) == 14
        assert _s64(obj, "last_result") == -3
        assert struct.unpack("<I", obj.read_variable("runs")) == (2,)


def test_syscall_program_errors(registry: KernelBtfRegistry) -> None:
    with _load(_obj("syscall_run"), registry) as obj:
        with pytest.raises(ProgramRunError) as info:
            obj.run_program("compute", b"\0" * 4)  # the program reads 32 bytes
        assert info.value.errno_name == "EINVAL"
        assert "struct run_args is 32" in str(info.value)
        with pytest.raises(CustomizationError, match="no member 'c'"):
            obj.run_program("compute", {"c": 1})
        with pytest.raises(CustomizationError, match="out of range"):
            obj.context("compute", {"a": -1})
        with pytest.raises(CustomizationError, match="not a struct pointer"):
            obj.context("which_cpu", {"a": 1})
        assert obj.context("which_cpu") == b""
        with pytest.raises(LoadError, match="no program 'nope'"):
            obj.run_program("nope")


def test_syscall_program_runs_on_the_given_cpu(registry: KernelBtfRegistry) -> None:
    before = os.sched_getaffinity(0)
    with _load(_obj("syscall_run"), registry) as obj:
        for cpu in sorted(before):
            assert obj.run_program("which_cpu", cpu=cpu) == cpu
        assert os.sched_getaffinity(0) == before  # restored after each run
        with pytest.raises(ProgramRunError, match="cannot run on CPU"):
            obj.run_program("which_cpu", cpu=4096)
    assert os.sched_getaffinity(0) == before


# --- optional ('?') sections -----------------------------------------------------------------


def test_optional_sections_skip_what_the_kernel_refuses(registry: KernelBtfRegistry) -> None:
    spec = _obj("optional")
    assert not spec.program("opt_rejected").autoload
    with _load(spec, registry) as obj:
        assert set(obj.programs) == {"opt_accepted", "plain"}
        assert obj.run_program("opt_accepted") == 7
        assert set(obj.skipped) == {"opt_rejected", "opt_no_target"}
        assert "map_value_or_null" in obj.skipped["opt_rejected"]  # the verifier's reason
        assert "ssd_no_such_kernel_function not found" in obj.skipped["opt_no_target"]
        assert len(obj.notes) == 2
        assert all(n.startswith("optional program ") and "skipped" in n for n in obj.notes)
        with pytest.raises(LoadError, match=r"was not loaded: .*map_value_or_null"):
            obj.run_program("opt_rejected")


def test_autoload_overrides(registry: KernelBtfRegistry) -> None:
    spec = _obj("optional")
    # asked for explicitly, a '?' program must load like any other
    with pytest.raises(ProgramLoadError) as info:
        _load(spec, registry, autoload={"opt_rejected": True})
    assert info.value.program == "opt_rejected"
    assert "map_value_or_null" in (info.value.verifier_log or "")
    off = {"opt_rejected": False, "opt_no_target": False, "plain": False}
    with _load(spec, registry, autoload=off) as obj:
        assert set(obj.programs) == {"opt_accepted"}
        assert obj.skipped == {} and obj.notes == []
        with pytest.raises(LoadError, match="not loaded"):
            obj.run_program("plain")
    with pytest.raises(LoadError, match="unknown program"):
        _load(spec, registry, autoload={"nope": True})
    # libbpf's default: '?' programs stay out unless named
    with _load(spec, registry, optional_programs="off", autoload={"opt_accepted": True}) as obj:
        assert set(obj.programs) == {"opt_accepted", "plain"}
        assert obj.skipped == {}


# --- auto-attach -------------------------------------------------------------------------------


def test_attach_modes_follow_the_section_table() -> None:
    spec = _obj("attach")
    modes = {p.name: attach_mode(p) for p in spec.programs}
    assert modes == {
        "on_getpgid_entry": AttachMode.LINK,
        "on_getpgid_exit": AttachMode.LINK,
        "on_sys_enter_btf": AttachMode.LINK,
        "on_sys_enter_raw": AttachMode.RAW_TP,
        "on_getpid": AttachMode.TRACEPOINT,
        "dump_task": AttachMode.ITER,
    }
    assert attach_mode(_obj("syscall_run").program("compute")) is AttachMode.NONE


def _attach_spec() -> ObjectSpec:
    return set_variable(_obj("attach"), "target_tgid", os.getpid())


_NO_FENTRY = {"on_getpgid_entry": False, "on_getpgid_exit": False}


def test_tracing_programs_attach_and_count(registry: KernelBtfRegistry) -> None:
    with _load(_attach_spec(), registry, autoload=_NO_FENTRY) as obj:
        _libc.syscall(NR_GETPPID)
        assert _u64(obj, "tp_btf_hits") == 0  # loaded, not attached yet
        links = obj.attach_programs()
        assert set(links) == {"on_sys_enter_btf", "on_sys_enter_raw", "on_getpid", "dump_task"}
        kinds = {n: link_info(fd).type for n, fd in links.items()}
        assert kinds == {
            # tp_btf: a raw_tp link in the kernel
            "on_sys_enter_btf": bpf_uapi.LinkType.RAW_TRACEPOINT,
            "on_sys_enter_raw": bpf_uapi.LinkType.RAW_TRACEPOINT,
            "on_getpid": bpf_uapi.LinkType.PERF_EVENT,
            "dump_task": bpf_uapi.LinkType.ITER,
        }
        assert obj.attach_programs() == {}  # already attached
        for _ in range(3):
            _libc.syscall(NR_GETPPID)
        _libc.syscall(NR_GETPID)
        _libc.syscall(NR_GETPID)
        assert _u64(obj, "tp_btf_hits") == 3
        assert _u64(obj, "raw_tp_hits") == 3
        assert _u64(obj, "tracepoint_hits") == 2
        text = obj.read_iter("dump_task").decode()
        assert text == f"tgid={os.getpid()} comm={_comm()}\n"
        obj.detach_programs()
        _libc.syscall(NR_GETPPID)
        assert _u64(obj, "tp_btf_hits") == 3


def _comm() -> str:
    return Path("/proc/self/comm").read_text().strip()[:15]


def test_fentry_fexit_count_a_syscall(registry: KernelBtfRegistry) -> None:
    spec = _attach_spec()
    only = {p.name: p.name in ("on_getpgid_entry", "on_getpgid_exit") for p in spec.programs}
    try:
        obj = _load(spec, registry, autoload=only)
    except ProgramLoadError as exc:
        if exc.errno_name == "EPERM":
            pytest.skip(f"this kernel refuses fentry programs even to root: {exc}")
        raise
    with obj:
        pgid = os.getpgid(0)  # before attaching: it is a getpgid(2) too
        obj.attach_programs()
        assert _libc.syscall(NR_GETPGID, 0) == pgid
        assert _libc.syscall(NR_GETPGID, 1 << 22) == -1  # no such pid
        assert _u64(obj, "fentry_hits") == 2
        assert _u64(obj, "fexit_hits") == 2
        assert _s64(obj, "fexit_last_ret") == -errno.ESRCH  # the kernel function's return


def test_links_are_closed_on_unload(registry: KernelBtfRegistry) -> None:
    before = _bpf_fds()
    obj = _load(_attach_spec(), registry, autoload=_NO_FENTRY)
    obj.attach_programs()
    prog_ids = {p.id for p in obj.programs.values()}
    assert len(_links_of(prog_ids)) == 4
    assert sum(t.endswith("link") for t in _bpf_fds().values()) >= 4
    obj.close()
    assert obj.program_links == {}
    assert _bpf_fds() == before
    # the kernel frees links and programs after an RCU grace period / from a workqueue
    _wait_for(lambda: _links_of(prog_ids) == [], "links still in the kernel after close")
    _wait_for(lambda: not (prog_ids & _prog_ids()), "programs still in the kernel after close")


def _prog_ids() -> set[int]:
    out, start = set(), 0
    while (nxt := prog_get_next_id(start)) is not None:
        out.add(nxt)
        start = nxt
    return out


def test_struct_ops_attach_attaches_the_other_programs_first(
    registry: KernelBtfRegistry,
) -> None:
    name = f"ssd_hk{os.getpid() % 100000}"
    spec = set_struct_ops_member(_obj("ca_hooks"), "ssd_hooks", "name", name)
    ca_list = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
    with _load(spec, registry) as obj:
        made = obj.attach_struct_ops()
        assert set(made) == {"ssd_hooks"}
        assert name in ca_list.read_text().split()
        assert set(obj.program_links) == {"hk_sys_enter"}
        prog_link = link_info(obj.program_links["hk_sys_enter"]).id
        ops_link = link_info(obj.links["ssd_hooks"]).id
        assert prog_link < ops_link  # link ids grow: the program's link came first
        _wait_for(lambda: _u64(obj, "enters") > 0, "tp_btf/sys_enter never ran")
        obj.detach_struct_ops()
        assert "hk_sys_enter" in obj.program_links  # unregistering leaves the hooks
    assert name not in ca_list.read_text().split()
    assert obj.program_links == {} and obj.links == {}


# --- kprobes -----------------------------------------------------------------------------------

KPROBE_PMU = Path("/sys/bus/event_source/devices/kprobe/type")


def _kprobe_spec() -> ObjectSpec:
    return set_variable(_obj("kprobes"), "target_tgid", os.getpid())


def test_kprobe_sections_parse() -> None:
    modes = {p.name: attach_mode(p) for p in _obj("kprobes").programs}
    assert modes == {
        "on_getpgid_kprobe": AttachMode.KPROBE,
        "on_getpgid_kretprobe": AttachMode.KPROBE,
    }


def test_kprobe_refused_clearly_without_the_kprobe_pmu(
    registry: KernelBtfRegistry, bpffs: Path
) -> None:
    if KPROBE_PMU.exists():
        pytest.skip("this kernel has the kprobe PMU (the VM test covers attaching)")
    with _load(_kprobe_spec(), registry) as obj:
        before = _bpf_fds()
        with pytest.raises(AttachError, match="no kprobe PMU") as info:
            obj.attach_programs()
        assert info.value.program == "on_getpgid_kprobe"
        assert obj.program_links == {} and _bpf_fds() == before  # nothing left open
    # optional: maps.bpf.c's '?kprobe/do_nanosleep' is skipped with a note instead
    with _load(_obj("maps"), registry, pin_root=bpffs) as obj:
        obj.attach_programs()
        assert "probe_sleep" not in obj.program_links
        assert "no kprobe PMU" in obj.skipped["probe_sleep"]
        assert any("probe_sleep" in n for n in obj.notes)


def test_kprobes_count_a_syscall(registry: KernelBtfRegistry) -> None:
    if not KPROBE_PMU.exists():
        pytest.skip("this kernel has no kprobe PMU (CONFIG_KPROBE_EVENTS); the VM test runs it")
    with _load(_kprobe_spec(), registry) as obj:
        pgid = os.getpgid(0)
        obj.attach_programs()
        assert _libc.syscall(NR_GETPGID, 0) == pgid
        assert _libc.syscall(NR_GETPGID, 1 << 22) == -1
        assert _u64(obj, "kprobe_hits") == 2
        assert _u64(obj, "kretprobe_hits") == 2
        assert _s64(obj, "kretprobe_last_ret") == -errno.ESRCH
