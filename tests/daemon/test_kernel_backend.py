"""The real backend on the host kernel, which has BPF but no sched_ext: loading through the
registry with customisation, the spec cache, exit records read back from a real data map,
bpffs pins of a real struct_ops link, stale-pin cleanup, the sysfs view. The sched_ext
half (attach/detach/adopt of a running scheduler) runs in the VM (tests/vm/)."""

from __future__ import annotations

import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from schedswitchd.bpf.scheduler import ops_name_of, sched_ext_map
from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.kernel_backend import KernelBackend
from schedswitchd.daemon.kernel_handle import KernelPrepared
from schedswitchd.errors import (
    BpfSyscallError,
    CustomizationError,
    LoadError,
    ObjectError,
    SchedExtError,
)
from schedswitchd.kernel import bpf_uapi, syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.fd import LinkFd
from schedswitchd.kernel.fdinfo import memlock_bytes
from schedswitchd.kernel.sched_ext.exit_info import UeiView, uei_layout
from schedswitchd.kernel.sched_ext.scheduler_pins import PinDir
from schedswitchd.kernel.sched_ext.sysfs import SchedExtUnavailable
from schedswitchd.kernel.spec_cache import SpecCache
from schedswitchd.kernel.struct_ops.link import KERNEL_LINKS
from tests.bpf.conftest import BPF_BUILD_DIR
from tests.build_outputs import missing_build_output
from tests.daemon.kernel_objects import TCP, object_config
from tests.fs_events import FileEvents
from tests.kernel.fake_sched_ext import TCP_LIST, FakeSchedExt
from tests.kernel.unique_ops import ca_name

pytestmark = pytest.mark.root

#: The congestion controls this process registers (kernel-wide names: unique_ops.py).
UEI, HOOKS = ca_name("ssd_uei"), ca_name("ssd_hooks")


@pytest.fixture
def sched_ext(scx_root: Path) -> Iterator[FakeSchedExt]:
    """sched_ext's answers to the backend's struct_ops links, kept in ``scx_root``
    (tests/kernel/fake_sched_ext.py): the links stay real."""
    with FakeSchedExt(scx_root) as fake:
        yield fake


@pytest.fixture
def backend(
    registry: KernelBtfRegistry, bpffs: Path, scx_root: Path, request: pytest.FixtureRequest
) -> KernelBackend:
    """The backend on ``scx_root``, for ``tcp_congestion_ops``. Its struct_ops links go
    through the test's ``sched_ext`` when the test asks for that fixture (the sysfs then
    follows them as sched_ext's would); else straight to the kernel, and ``scx_root``
    reads only what the test writes."""
    links = request.getfixturevalue("sched_ext") if "sched_ext" in request.fixturenames else None
    return KernelBackend(
        pin_dir=bpffs / "pins",
        registry=registry,
        sched_ext_root=scx_root,
        ops_type=TCP,
        links=links or KERNEL_LINKS,
    )


def _set_state(scx_root: Path, state: str, ops: str | None) -> None:
    (scx_root / "state").write_text(state + "\n")
    if ops is None:
        shutil.rmtree(scx_root / "root", ignore_errors=True)
    else:
        (scx_root / "root").mkdir(exist_ok=True)
        (scx_root / "root" / "ops").write_text(ops + "\n")


def _registered(name: str, want: bool) -> bool:
    """Whether congestion control ``name`` is (``want``) or is not registered, waiting up
    to 2 s: dropping a pinned link's last reference is finished by a kernel work item."""
    deadline = time.monotonic() + 2
    while True:
        listed = name in TCP_LIST.read_text().split()
        if listed == want or time.monotonic() > deadline:
            return listed == want
        time.sleep(0.01)


def _attached(h: KernelPrepared) -> bool:
    return h.attached  # a call, so the type checker does not narrow across attach/detach


def test_prepare_loads_with_config_and_timings(
    backend: KernelBackend, bpf_object: Callable[[str], Path]
) -> None:
    cfg = object_config(
        bpf_object("uei"), rodata={"ssthresh_value": 5}, struct_ops={"flags": 0}, hotplug_seq=False
    )
    h = backend.prepare("uei", cfg)
    try:
        assert h.ops_name == UEI and h.ops_map == "ssd_uei"  # the name, the variable
        assert h.loaded is not None and set(h.loaded.programs) >= {"ssd_uei_ssthresh"}
        for phase in ("open", "customize", "kmod_btfs", "load", "load.maps"):
            assert h.timings_ns[phase] >= 0, phase
        assert h.timings_ns["load"] > 0
        # the tunable reached the kernel's .rodata map
        rodata = h.loaded.maps[".rodata"]
        value = syscall.map_lookup_elem(rodata.fd, b"\0\0\0\0", rodata.spec.value_size)
        off = rodata.spec.variable("ssthresh_value")
        assert value is not None and off is not None
        assert struct.unpack_from("<I", value, off.offset)[0] == 5
        counters = backend.counters()
        assert counters["prepares"] == 1 and counters["spec_cache_misses"] == 1
        assert counters["prepare.load_ns"] == h.timings_ns["load"]
        # the module lookup memo's counters are part of the status counters
        memo_keys = {"module_lookup_hits", "module_lookup_walks", "module_lookup_invalidations"}
        assert memo_keys <= set(counters) and counters["module_lookup_max_entries"] > 0
    finally:
        backend.discard(h)
    h2 = backend.prepare("uei", cfg)
    backend.discard(h2)
    assert backend.counters()["spec_cache_hits"] == 1
    assert h2.timings_ns["open"] == 0  # cached: not parsed again
    backend.discard(h2)  # idempotent


def test_prepare_flags_by_name_on_a_kernel_without_them(
    backend: KernelBackend, bpf_object: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    """The host kernel's BTF has no ``enum scx_ops_flags``: a flag named in the config is
    dropped with a warning and the object loads with flags 0; a required one fails the
    prepare with a CustomizationError. (A found name reaching the kernel needs sched_ext:
    tests/vm/test_loader_vm.py.)"""
    obj = bpf_object("uei")
    with caplog.at_level("WARNING", logger="schedswitchd.backend"):
        h = backend.prepare(
            "uei", object_config(obj, struct_ops={"flags": ["SCX_OPS_ENQ_LAST"]}, hotplug_seq=False)
        )
    try:
        assert h.loaded is not None
        so = h.loaded.spec.map(h.ops_map).struct_ops
        assert so is not None
        mem = so.member("flags")
        assert mem is not None and so.data[mem.offset : mem.offset + mem.size] == bytes(mem.size)
    finally:
        backend.discard(h)
    assert any(
        "flag SCX_OPS_ENQ_LAST dropped" in r.getMessage()
        and "no enum scx_ops_flags" in r.getMessage()
        for r in caplog.records
    ), caplog.text
    before = backend.counters().get("prepare_failures", 0)
    required = {"flags": [{"name": "SCX_OPS_ENQ_LAST", "required": True}]}
    with pytest.raises(CustomizationError, match="required flag SCX_OPS_ENQ_LAST"):
        backend.prepare("uei", object_config(obj, struct_ops=required, hotplug_seq=False))
    assert backend.counters()["prepare_failures"] == before + 1


def test_prepare_sets_hotplug_seq_from_sysfs(
    backend: KernelBackend, bpf_object: Callable[[str], Path], scx_root: Path
) -> None:
    # tcp_congestion_ops has no hotplug_seq member: the attempt proves the sysfs value is
    # read and applied (the customisation names the member it could not set).
    with pytest.raises(CustomizationError, match="hotplug_seq"):
        backend.prepare("uei", object_config(bpf_object("uei")))
    assert backend.counters()["prepare_failures"] == 1


def test_prepare_errors_are_typed(
    backend: KernelBackend, bpf_object: Callable[[str], Path], tmp_path: Path
) -> None:
    with pytest.raises(CustomizationError, match=r"rodata\.nope"):
        backend.prepare(
            "uei", object_config(bpf_object("uei"), rodata={"nope": 1}, hotplug_seq=False)
        )
    with pytest.raises(LoadError, match="not a scheduler"):
        KernelBackend(pin_dir=tmp_path).prepare(
            "uei", object_config(bpf_object("uei"), hotplug_seq=False)
        )
    fifo = BPF_BUILD_DIR.parents[1] / "bpf" / "fifo.bpf.o"  # make schedulers (make test)
    if not fifo.is_file():
        missing_build_output(fifo, "schedulers")
    no_scx = KernelBackend(pin_dir=tmp_path, sched_ext_root=tmp_path / "absent")
    with pytest.raises(SchedExtUnavailable, match="this kernel has no sched_ext"):
        no_scx.prepare("fifo", object_config(fifo))
    with pytest.raises(LoadError, match="several"):
        backend.prepare("so", object_config(bpf_object("struct_ops"), hotplug_seq=False))


def test_spec_cache_keyed_by_identity(bpf_object: Callable[[str], Path], tmp_path: Path) -> None:
    obj = tmp_path / "x.bpf.o"
    shutil.copy(bpf_object("uei"), obj)
    cache = SpecCache(max_entries=4)
    a = cache.open(obj)
    assert not a.cached and a.open_ns > 0 and a.spec.name == "x"
    assert cache.open(obj).cached
    os.utime(obj, ns=(time.time_ns(), time.time_ns() + 10**9))  # mtime changes
    assert not cache.open(obj).cached
    replacement = tmp_path / "y"
    shutil.copy(bpf_object("struct_ops"), replacement)
    os.replace(replacement, obj)  # new inode and size at the same path
    c = cache.open(obj)
    assert not c.cached and {m.name for m in c.spec.struct_ops_maps} == {"ssd_plain", "ssd_link"}


def test_spec_cache_bound_and_unreadable_file(
    bpf_object: Callable[[str], Path], tmp_path: Path
) -> None:
    cache = SpecCache(max_entries=2)
    for name in ("uei", "struct_ops", "kconfig"):
        cache.open(bpf_object(name))
    stats = cache.stats()
    assert (stats.entries, stats.evictions, stats.misses) == (2, 1, 3)
    assert not cache.open(bpf_object("uei")).cached  # the oldest was evicted
    with pytest.raises(ObjectError, match="cannot read BPF object"):
        cache.open(tmp_path / "missing.bpf.o")


def test_exit_info_read_from_the_data_map(
    backend: KernelBackend, bpf_object: Callable[[str], Path]
) -> None:
    h = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    try:
        assert h.uei is not None and h.uei.map_name == ".data"
        assert backend.exit_info(h) is None  # never written
        reason, msg = b"BPF scheduler called scx_bpf_error()", b"injected error after 40"
        rec = struct.pack("<iiq128s1024s", 1, 1025, -22, reason, msg)
        assert h.loaded is not None
        h.loaded.write_variable("uei", rec)
        info = backend.exit_info(h)
        assert info is not None
        assert (info.kind, info.kind_name, info.exit_code) == (1025, "ERROR_BPF", -22)
        assert (info.reason, info.message) == (reason.decode(), msg.decode())
    finally:
        backend.discard(h)
    assert backend.exit_info(h) is None  # discarded: nothing to read, no error


def test_the_exit_record_read_in_place_follows_the_data_map(
    backend: KernelBackend, bpf_object: Callable[[str], Path]
) -> None:
    """UeiView (a read-only mapping of the data map) reads what a map lookup reads: empty
    while unwritten or ``recorded`` is 0, the decoded record once written; closing it
    twice is harmless and a closed view refuses to read. A tcp congestion control has no
    ``ops.exit``, so the backend makes no view for it (its confirmation reads sysfs)."""
    h = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    try:
        assert h.exit_view is None  # no ops.exit member in tcp_congestion_ops
        assert h.uei is not None and h.loaded is not None
        data = h.loaded.maps[h.uei.map_name]
        view = UeiView(h.uei, data.fd.fileno(), data.spec.value_size)
        try:
            assert view.empty() and view.record() is None
            reason, msg = b"BPF scheduler called scx_bpf_error()", b"injected error"
            # kind written but not yet recorded (recorded = 0): still empty, as decode says
            h.loaded.write_variable("uei", struct.pack("<iiq128s1024s", 0, 1025, -22, reason, msg))
            assert view.empty() and backend.exit_info(h) is None
            h.loaded.write_variable("uei", struct.pack("<iiq128s1024s", 1, 1025, -22, reason, msg))
            assert not view.empty()
            rec = view.record()
            assert rec is not None and (rec.kind, rec.exit_code, rec.reason) == (
                1025,
                -22,
                reason.decode(),
            )
            info = backend.exit_info(h)
            assert info is not None and (info.kind, info.message) == (rec.kind, rec.message)
        finally:
            view.close()
            view.close()
        with pytest.raises(ValueError):
            view.empty()
    finally:
        backend.discard(h)


def test_a_first_attach_is_confirmed_from_the_exit_record_in_place(
    backend: KernelBackend,
    bpf_object: Callable[[str], Path],
    sched_ext: FakeSchedExt,
    scx_root: Path,
) -> None:
    """With an exit record view (what prepare makes for a scheduler whose ``ops.exit``
    writes one; given here by hand, as tcp_congestion_ops has no ``exit``), a handle's
    first attach is confirmed by one read of ``state`` and the record read in place: no
    ``root/ops`` read and no ``bpf(2)`` call besides ``BPF_LINK_CREATE``. A record the
    enable already wrote (its ``ops.exit`` ran: the enable failed) fails the attach, and
    the link is undone; the view is unmapped with the handle."""
    ok = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    bad = backend.prepare("uei2", object_config(bpf_object("uei"), hotplug_seq=False))
    views = []
    try:
        for h in (ok, bad):
            assert h.uei is not None and h.loaded is not None
            data = h.loaded.maps[h.uei.map_name]
            h.exit_view = UeiView(h.uei, data.fd.fileno(), data.spec.value_size)
            views.append(h.exit_view)
        with FileEvents(scx_root) as sysfs:
            calls = syscall.STATS.calls
            backend.attach(ok, 2.0)
            assert syscall.STATS.calls - calls == 1
            assert sysfs.paths("read") == ["state"]
        backend.detach(ok, 2.0)
        assert _registered(UEI, False)
        assert bad.loaded is not None
        reason = b"ops.init() failed"
        bad.loaded.write_variable("uei", struct.pack("<iiq128s1024s", 1, 1024, -12, reason, b""))
        with pytest.raises(SchedExtError, match="disabled by the kernel right after attach"):
            backend.attach(bad, 2.0)
        assert bad.link() is None and not bad.attached
    finally:
        backend.discard(ok)
        backend.discard(bad)
    for view in views:
        with pytest.raises(ValueError):
            view.empty()  # unmapped by discard


def test_uei_layout_absent_and_names(bpf_object: Callable[[str], Path]) -> None:
    spec = SpecCache().open(bpf_object("struct_ops")).spec
    assert uei_layout(spec) is None
    uspec = SpecCache().open(bpf_object("uei")).spec
    assert ops_name_of(uspec, sched_ext_map(uspec, TCP)) == UEI


def test_attach_refused_with_ebusy_says_what_runs(
    backend: KernelBackend, bpf_object: Callable[[str], Path], sched_ext: FakeSchedExt
) -> None:
    # attach reads no sysfs before BPF_LINK_CREATE: sched_ext refuses a second scheduler
    # with EBUSY (scx_root_enable_workfn), which tcp_congestion_ops cannot produce here:
    # the fake sched_ext answers so, before anything registers.
    h = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    try:
        sched_ext.others_run("other_sched")
        with pytest.raises(
            SchedExtError, match=r"sched_ext is enabled \(ops 'other_sched'\), not disabled"
        ):
            backend.attach(h, 0.2)
        assert not _attached(h) and h.link() is None
        assert backend.pins.names() == [] and _registered(UEI, False)
        sched_ext.disable()
        sched_ext.busy_next = True  # EBUSY while disabled: a teardown in flight
        with pytest.raises(SchedExtError, match="refused with EBUSY"):
            backend.attach(h, 0.2)
        assert not _attached(h) and h.link() is None
        assert backend.counters()["attach_failures"] == 2 and sched_ext.creates == 0
        # nothing of the refusals stays in the way: once sched_ext lets it, it attaches
        backend.attach(h, 2.0)
        assert _attached(h) and _registered(UEI, True)
    finally:
        backend.discard(h)


def test_attach_when_someone_else_runs_is_undone(
    backend: KernelBackend, bpf_object: Callable[[str], Path], scx_root: Path
) -> None:
    h = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    try:
        _set_state(scx_root, "enabled", "other_sched")
        with pytest.raises(SchedExtError, match=f"the kernel runs 'other_sched', not '{UEI}'"):
            backend.attach(h, 0.2)
        assert not h.attached and h.link() is None
        assert backend.pins.names() == []
        assert _registered(UEI, False)
    finally:
        _set_state(scx_root, "disabled", None)
        backend.discard(h)


def test_attach_undone_when_the_kernel_does_not_run_it(
    backend: KernelBackend, bpf_object: Callable[[str], Path], scx_root: Path
) -> None:
    # The link is real (tcp_congestion_ops registers); sysfs still reads "disabled" after
    # BPF_LINK_CREATE returned, which on sched_ext means the kernel threw the scheduler out
    # at once: attach fails at its first look (one read of state, no wait for "enabled")
    # and leaves no link, no pin.
    h = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    try:
        for state in ("disabled", "disabling"):  # thrown out, or being thrown out
            (scx_root / "state").write_text(state + "\n")
            with (
                FileEvents(scx_root) as sysfs,
                FileEvents(backend.pins.root) as pins,
                pytest.raises(SchedExtError, match="disabled by the kernel right after attach"),
            ):
                backend.attach(h, 5.0)
            assert sysfs.paths("read") == ["state"]
            assert h.link() is None and not h.attached
            # never pinned (no directory made under the pin root): pins follow the attach
            assert backend.pins.names() == [] and pins.of("os.mkdir") == []
        (scx_root / "state").write_text("disabled\n")
        assert _registered(UEI, False)
        assert backend.counters()["attach_failures"] == 2
    finally:
        (scx_root / "state").write_text("disabled\n")
        backend.discard(h)


def test_attach_detach_pins_and_reattach(
    backend: KernelBackend,
    bpf_object: Callable[[str], Path],
    scx_root: Path,
    sched_ext: FakeSchedExt,
) -> None:
    # attach confirms "enabled" with the ops name and pins the real link and exit map,
    # detach detaches the link in the kernel (BPF_LINK_DETACH: unregistered at once) and
    # leaves its pins and fd to discard or the next attach, and a detached handle attaches
    # again (what a rollback does).
    h = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    try:
        for _ in range(2):
            before = time.monotonic_ns()
            enabled_ns = backend.attach(h, 2.0)
            assert backend.pins.names() == []  # pinned by pin(), after the switch replied
            backend.pin(h)
            assert before < enabled_ns < time.monotonic_ns()
            link = h.link()
            assert link is not None and h.attached
            assert sorted(os.listdir(backend.pins.path("uei"))) == ["exit_map", "link"]
            pinned = syscall.obj_get(backend.pins.path("uei") / "link")
            try:
                assert syscall.link_info(pinned).id == syscall.link_info(link).id
                assert syscall.link_info(pinned).type == bpf_uapi.LinkType.STRUCT_OPS
            finally:
                pinned.close()
            assert _registered(UEI, True)
            assert {"attach.link", "attach.confirm", "attach.pin"} <= set(h.timings_ns)
            assert {"attach.link_ns", "attach.confirm_ns", "attach.pin_ns"} <= set(
                backend.counters()
            )
            backend.detach(h, 2.0)
            assert not _attached(h) and h.release_pending
            assert _registered(UEI, False)  # synchronous, although still pinned
            assert backend.pins.names() == ["uei"]
            pinned = syscall.obj_get(backend.pins.path("uei") / "link")
            try:
                assert syscall.link_info(pinned).map_id == 0  # a detached struct_ops link
            finally:
                pinned.close()
            assert set(backend.counters()) & {"detach.link_detach_ns", "detach.unpin_ns"} == {
                "detach.link_detach_ns"
            }
            assert "detach.link_detach" in h.timings_ns
        backend.detach(h, 0.1)  # not attached: a no-op
    finally:
        backend.discard(h)
    assert backend.pins.names() == [] and h.link() is None  # discard released them


def test_new_form_of_a_running_scheduler_keeps_its_pin(
    backend: KernelBackend,
    bpf_object: Callable[[str], Path],
    scx_root: Path,
    sched_ext: FakeSchedExt,
) -> None:
    """A reload swaps a running scheduler for a new handle of the same name: discarding the
    old handle afterwards must not remove the new one's pin."""
    old = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    new = backend.prepare(
        "uei", object_config(bpf_object("uei"), rodata={"ssthresh_value": 5}, hotplug_seq=False)
    )
    try:
        backend.attach(old, 2.0)
        backend.pin(old)
        backend.detach(old, 2.0)
        backend.attach(new, 2.0)
        backend.pin(new)
        new_link = new.link()
        assert new_link is not None
        backend.discard(old)
        assert backend.pins.names() == ["uei"]
        pinned = syscall.obj_get(backend.pins.path("uei") / "link")
        try:
            assert syscall.link_info(pinned).id == syscall.link_info(new_link).id
        finally:
            pinned.close()
        assert _registered(UEI, True)
    finally:
        backend.discard(old)
        backend.discard(new)
    assert backend.pins.names() == []


def test_gap_work_is_two_syscalls_and_two_reads(
    backend: KernelBackend,
    bpf_object: Callable[[str], Path],
    sched_ext: FakeSchedExt,
    scx_root: Path,
) -> None:
    # Inside the no-scheduler gap: detach = BPF_LINK_DETACH and nothing else (no other
    # bpf(2) call, no sysfs read, nothing touched under the pin root); attach up to its
    # confirmation = BPF_LINK_CREATE plus one read of state and one of root/ops. The
    # struct_ops value was written by prepare: its BPF_MAP_UPDATE_ELEM (a trampoline per
    # program) is not in the gap. (bpf(2) calls counted by syscall.STATS; file reads and
    # removals seen through audit events, tests/fs_events.py.)
    old = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    new = backend.prepare("uei2", object_config(bpf_object("uei"), hotplug_seq=False))
    try:
        assert new.loaded is not None and "struct_ops_value" in new.timings_ns
        ops = new.loaded.maps[new.ops_map]
        # the kernel's value (struct bpf_struct_ops_<type>), not the object's struct
        size = syscall.map_info(ops.fd).value_size
        value = syscall.map_lookup_elem(ops.fd, b"\0\0\0\0", size)
        # struct bpf_struct_ops_common_value: refcnt, then state; READY (3) once written
        # (include/linux/bpf.h, enum bpf_struct_ops_state), nothing registered yet
        assert value is not None and struct.unpack_from("<I", value, 4)[0] == 3
        backend.attach(old, 2.0)
        backend.pin(old)
        with FileEvents(scx_root) as sysfs, FileEvents(backend.pins.root) as pins:
            calls = syscall.STATS.calls
            backend.detach(old, 2.0)
            assert syscall.STATS.calls - calls == 1 and sched_ext.detach_calls == 1
            assert sysfs.paths("read") == [] and pins.events == []
            # the old link is detached; only now may a scheduler of the same name register
            assert _registered(UEI, False)
            calls = syscall.STATS.calls
            enabled_ns = backend.attach(new, 2.0)
            assert syscall.STATS.calls - calls == 1 and sched_ext.creates == 2
            assert sysfs.paths("read") == ["state", "root/ops"] and pins.events == []
            # the gap ends when BPF_LINK_CREATE returned; the confirming reads come after it
            assert enabled_ns < sysfs.of("read")[0].time_ns
            backend.pin(new)  # after the confirmation (the reply): the new pins
            assert backend.pins.names() == ["uei", "uei2"]
            pins.clear()
            backend.discard(old)  # after the switch: the old pin goes, the new one stays
            assert pins.paths("os.rmdir") == ["uei"] and backend.pins.names() == ["uei2"]
    finally:
        backend.discard(old)
        backend.discard(new)
    assert backend.pins.names() == []


def test_detach_falls_back_to_close_without_link_detach(
    backend: KernelBackend,
    bpf_object: Callable[[str], Path],
    sched_ext: FakeSchedExt,
) -> None:
    # Kernels before 6.10 answer EOPNOTSUPP to BPF_LINK_DETACH on struct_ops links: unpin,
    # close (the last reference unregisters) and wait for "disabled"; asked once only.
    sched_ext.link_detach_supported = False
    h = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    try:
        for _ in range(2):
            backend.attach(h, 2.0)
            backend.detach(h, 2.0)
            assert not _attached(h) and not h.release_pending and h.link() is None
            assert backend.pins.names() == []
            assert _registered(UEI, False)
            assert {"detach.unpin", "detach.link_close", "detach.disable_wait"} <= set(h.timings_ns)
            assert "detach.link_detach" not in h.timings_ns
        assert sched_ext.detach_calls == 1
    finally:
        backend.discard(h)


def test_pins_survive_the_handle_and_adopt_cleans_stale(
    backend: KernelBackend, bpf_object: Callable[[str], Path], scx_root: Path
) -> None:
    h = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    assert h.loaded is not None
    link = h.create_link()
    data = h.exit_map_fd()
    assert data is not None
    backend.pins.pin("uei", link, data)
    (backend.pins.root / "junk").mkdir()
    link_id = syscall.link_info(link).id
    h.close()  # as if the daemon died: only the pins hold the link now
    assert _registered(UEI, True)
    pinned = PinDir(backend.pins.root).open("uei")
    assert pinned is not None and pinned.exit_map is not None
    assert syscall.link_info(pinned.link).id == link_id
    pinned.close()
    # sched_ext reads disabled: nothing to adopt, every pin is stale and removed, which
    # drops the last reference to the link.
    cfg = {"uei": object_config(bpf_object("uei"), hotplug_seq=False)}
    assert backend.adopt(cfg) is None
    assert backend.pins.names() == []
    assert backend.counters()["stale_pins_removed"] == 2
    assert _registered(UEI, False)


def test_adopt_reopens_a_running_pinned_scheduler(
    backend: KernelBackend,
    bpf_object: Callable[[str], Path],
    scx_root: Path,
    sched_ext: FakeSchedExt,
) -> None:
    cfg = object_config(bpf_object("uei"), hotplug_seq=False)

    def previous_daemon() -> None:
        # attach and pin, record an exit record, then die (fds closed, pins stay)
        h = backend.prepare("uei", cfg)
        assert h.loaded is not None
        backend.pins.pin("uei", h.create_link(), h.exit_map_fd())
        rec = struct.pack("<iiq128s1024s", 1, 1026, 0, b"stall", b"m")
        h.loaded.write_variable("uei", rec)
        h.close()
        assert (scx_root / "root" / "ops").read_text() == f"{UEI}\n"

    previous_daemon()
    # pinned under a name the configuration no longer has: stale, removed
    assert backend.adopt({"other": cfg}) is None
    assert backend.pins.names() == []
    assert _registered(UEI, False)  # its last reference was the pin
    previous_daemon()
    got = backend.adopt({"uei": cfg})
    assert isinstance(got, KernelPrepared)
    try:
        assert got.adopted and got.attached and got.ops_name == UEI
        assert _registered(UEI, True)
        info = backend.exit_info(got)
        assert info is not None and (info.kind_name, info.reason) == ("ERROR_STALL", "stall")
        assert backend.pins.names() == ["uei"]
        backend.detach(got, 1.0)  # detaches the adopted link in the kernel
        assert _registered(UEI, False)
        # an adopted handle attaches again (rollback) from the struct_ops map it holds,
        # replacing the detached link and its pin
        backend.attach(got, 2.0)
        backend.pin(got)
        assert backend.pins.names() == ["uei"]
        assert _registered(UEI, True)
    finally:
        backend.discard(got)
    assert backend.pins.names() == []
    assert _registered(UEI, False)


def test_adopt_takes_the_running_scheduler_whatever_its_file_says_now(
    backend: KernelBackend,
    bpf_object: Callable[[str], Path],
    sched_ext: FakeSchedExt,
    tmp_path: Path,
) -> None:
    """The object was rebuilt (another ops name) or removed after the previous daemon
    pinned it: the running scheduler is adopted under the kernel's name, its pin kept."""
    cfg = object_config(bpf_object("uei"), hotplug_seq=False)
    for now_on_disk in (bpf_object("tcp_ca"), tmp_path / "gone.bpf.o"):
        h = backend.prepare("uei", cfg)
        assert h.loaded is not None
        backend.pins.pin("uei", h.create_link(), h.exit_map_fd())
        h.close()  # the previous daemon died; the pin keeps UEI registered
        got = backend.adopt({"uei": object_config(now_on_disk, hotplug_seq=False)})
        assert isinstance(got, KernelPrepared), now_on_disk
        try:
            assert got.ops_name == UEI and got.attached
            assert backend.pins.names() == ["uei"] and _registered(UEI, True)
        finally:
            backend.discard(got)
        assert _registered(UEI, False)
    # a live pinned link that is not what runs (ejected, another scheduler enabled since)
    h = backend.prepare("uei", cfg)
    assert h.loaded is not None
    backend.pins.pin("uei", h.create_link(), h.exit_map_fd())
    h.close()
    sched_ext.others_run("someone_else")
    assert backend.adopt({"uei": cfg}) is None
    assert backend.pins.names() == [] and _registered(UEI, False)


def test_kernel_state_and_watch(backend: KernelBackend, scx_root: Path, tmp_path: Path) -> None:
    st = backend.kernel_state()
    assert (st.state, st.ops, st.enable_seq) == ("disabled", None, 3)
    assert KernelBackend(sched_ext_root=tmp_path / "absent").kernel_state().state == ("unavailable")
    hits = threading.Event()
    with FileEvents(scx_root) as reads:
        stop = backend.watch(hits.set)
        # the sysfs check has taken its first look (what it compares with) once it opened
        # enable_seq, the last of its three files (state, root/ops, enable_seq): change
        # state only then
        assert reads.wait_for("read", "enable_seq", 5.0)
    try:
        hits.clear()
        (scx_root / "state").write_text("enabled\n")
        assert hits.wait(1.0), "a sysfs change was not noticed within 1 s"
    finally:
        stop()


def test_the_watch_is_quiet_in_a_switch_window(backend: KernelBackend, scx_root: Path) -> None:
    """While the switcher holds its switch window (detach to the reply), the watch's sysfs
    check reads nothing and its uevent reader reads no datagram; a change made inside the
    window (an ejection, say) is noticed by the first check after it."""
    hits = threading.Event()

    def held_checks() -> int:
        return backend.counters().get("watch_checks_held", 0)

    def wait(pred: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + 5.0
        while not pred():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    with FileEvents(scx_root) as reads:
        stop = backend.watch(hits.set)
        assert reads.wait_for("read", "enable_seq", 5.0)  # its first look
    try:
        listener = backend.watcher.listener  # None where no uevent socket opens
        with FileEvents(scx_root) as reads, backend.switch_window():
            if listener is not None:
                assert wait(lambda: listener.held), "the uevent reader still reads"
            before = held_checks()
            assert wait(lambda: held_checks() > before), "no check was held back"
            # the check now sees the window at each tick: nothing it reads can race this
            hits.clear()
            reads.clear()
            (scx_root / "state").write_text("enabled\n")
            now = held_checks()
            assert wait(lambda: held_checks() >= now + 2)
            assert reads.paths("read") == [] and not hits.is_set()
        assert listener is None or wait(lambda: not listener.held)
        assert hits.wait(1.0), "the change made in the window was not noticed after it"
    finally:
        stop()


def test_standby_freshness_and_kernel_bytes(
    backend: KernelBackend, bpf_object: Callable[[str], Path], tmp_path: Path
) -> None:
    obj = tmp_path / "uei.bpf.o"
    shutil.copyfile(bpf_object("uei"), obj)
    cfg = object_config(obj, hotplug_seq=False)
    h = backend.prepare("uei", cfg)
    try:
        assert backend.fresh(h, cfg)
        # the kernel charges its maps and programs: more than the data section alone
        held = backend.kernel_bytes(h)
        assert held >= 4096 and h.loaded is not None
        fds = [m.fd.fileno() for m in h.loaded.maps.values()]
        fds += [p.fd.fileno() for p in h.loaded.programs.values()]
        assert held == sum(memlock_bytes(fd) for fd in fds)
        os.utime(obj, ns=(1, 1))  # "rebuilt": another mtime
        assert not backend.fresh(h, cfg)
    finally:
        backend.discard(h)
    assert not backend.fresh(h, cfg)  # a discarded handle is never fresh
    assert backend.kernel_bytes(h) == 0


def test_standby_is_stale_after_a_cpu_hotplug(
    backend: KernelBackend, bpf_object: Callable[[str], Path], scx_root: Path
) -> None:
    # tcp_congestion_ops has no hotplug_seq member: call the freshness check on a handle
    # prepared without it, with a spec that asks for it (the check reads sysfs each time).
    h = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    try:
        with_seq = object_config(bpf_object("uei"))
        assert h.inputs is not None  # as if prepared from with_seq when hotplug_seq read 7
        h.inputs.spec = h.inputs.spec._replace(config=with_seq, hotplug_seq=7)
        assert backend.fresh(h, with_seq)
        (scx_root / "hotplug_seq").write_text("8\n")  # a CPU went off or on line since
        assert not backend.fresh(h, with_seq)
    finally:
        backend.discard(h)


def _link_alive(link_id: int) -> bool:
    try:
        syscall.link_get_fd_by_id(link_id).close()
    except BpfSyscallError:
        return False
    return True


def _gone(link_id: int) -> bool:
    deadline = time.monotonic() + 2  # a link's last reference is dropped by a work item
    while _link_alive(link_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_program_links_attach_first_pin_and_survive_a_restart(
    backend: KernelBackend,
    bpf_object: Callable[[str], Path],
    scx_root: Path,
    sched_ext: FakeSchedExt,
) -> None:
    # ca_hooks: a tcp_congestion_ops next to a tp_btf/sys_enter program. attach attaches
    # the program before the struct_ops link and pins its link under progs/; a daemon that
    # dies leaves both pinned; the next one adopts both; discard removes both.
    cfg = object_config(bpf_object("ca_hooks"), hotplug_seq=False)
    h = backend.prepare("hooks", cfg)
    assert h.loaded is not None and h.program_links() == {}  # nothing runs before attach
    backend.attach(h, 2.0)
    backend.pin(h)
    progs = h.program_links()
    assert set(progs) == {"hk_sys_enter"}
    prog_link = syscall.link_info(progs["hk_sys_enter"]).id
    link = h.link()
    assert link is not None and prog_link < syscall.link_info(link).id  # attached first
    assert "attach.programs" in h.timings_ns
    d = backend.pins.path("hooks")
    assert sorted(os.listdir(d)) == ["link", "progs"]
    assert os.listdir(d / "progs") == ["hk_sys_enter"]
    with syscall.obj_get(d / "progs" / "hk_sys_enter", expect=LinkFd) as pinned:
        assert syscall.link_info(pinned).id == prog_link
    h.close()  # the daemon dies: only the pins hold the links
    assert _registered(HOOKS, True) and _link_alive(prog_link)
    got = backend.adopt({"hooks": cfg})
    assert isinstance(got, KernelPrepared)
    try:
        assert set(got.program_links()) == {"hk_sys_enter"}
        assert syscall.link_info(got.program_links()["hk_sys_enter"]).id == prog_link
        backend.detach(got, 1.0)
        assert _registered(HOOKS, False)
        backend.attach(got, 2.0)  # rollback: the hooks were kept, and are pinned again
        backend.pin(got)
        assert os.listdir(d / "progs") == ["hk_sys_enter"]
    finally:
        backend.discard(got)
    assert backend.pins.names() == []
    assert _registered(HOOKS, False)
    assert _gone(prog_link)


def test_program_links_closed_when_a_prepared_handle_is_discarded(
    backend: KernelBackend, bpf_object: Callable[[str], Path], scx_root: Path
) -> None:
    h = backend.prepare("hooks", object_config(bpf_object("ca_hooks"), hotplug_seq=False))
    assert h.loaded is not None
    h.loaded.attach_programs()
    prog_link = syscall.link_info(h.program_links()["hk_sys_enter"]).id
    backend.discard(h)
    assert _gone(prog_link)


def test_preopen_fills_the_spec_cache_and_survives_a_bad_file(
    backend: KernelBackend, bpf_object: Callable[[str], Path], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.bpf.o"
    bad.write_bytes(b"not an ELF")
    backend.preopen({"uei": object_config(bpf_object("uei")), "bad": object_config(bad)})
    assert backend.counters()["preopens"] == 1
    h = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    try:
        assert h.timings_ns["open"] == 0  # served from the cache: no parse in the switch
    finally:
        backend.discard(h)


PROFILE_TOML = """
[profile]
name = "prof"
ops_name = "{name}"

[variables]
nr_cpu_ids = {{ expr = "topo.nr_cpu_ids" }}

[resize]
".data.cpu_ctxs" = {{ expr = "topo.nr_cpu_ids" }}

[after_load]
armed = 2

[[run]]
program = "record_cpu"
for_each = "online_cpu"
cpu = {{ expr = "cpu.id" }}
args = {{ slot = {{ expr = "cpu.id" }}, value = 1 }}

[[run]]
program = "returns_seven"
when = "after_attach"
expect_retval = 7

[attach]
cpu = {{ expr = "topo.online_cpus[-1]" }}

[[stats]]
name = "runs"
variable = "nr_runs"

[modes.loud]
[modes.loud.after_load]
armed = 9
"""


def test_profiled_prepare_attach_and_stats(
    backend: KernelBackend,
    bpf_object: Callable[[str], Path],
    tmp_path: Path,
    sched_ext: FakeSchedExt,
) -> None:
    """A profile through the real backend: applied at prepare (resize, variables, after-load
    write, syscall runs on each CPU), link created from the attach CPU, after-attach run,
    the stats read from the loaded maps in ``counters()`` while attached."""
    import uuid

    from schedswitchd.daemon.config import parse_config
    from schedswitchd.profile.topology import read_topology

    name = f"ssdb{uuid.uuid4().hex[:8]}"  # tcp_congestion_ops names are kernel-wide
    obj = _renamed_profile_object(bpf_object("profile"), tmp_path, name)
    (tmp_path / "prof.toml").write_text(PROFILE_TOML.format(name=name))
    config = parse_config(
        f"[schedulers.p]\nobject = '{obj}'\nprofile = 'prof.toml'\n"
        "hotplug_seq = false\n[hints.h]\nscheduler = 'p'\nmode = 'loud'\n",
        str(tmp_path / "s.toml"),
    )
    topo = read_topology("/sys")
    # The hint's mode variant, under its own name (pinned as such).
    h = backend.prepare("p@loud", config.schedulers["p@loud"])
    try:
        assert h.plan is not None and h.loaded is not None
        assert struct.unpack("<I", h.loaded.read_variable("armed")) == (9,)  # the mode's
        assert struct.unpack("<I", h.loaded.read_variable("nr_cpu_ids")) == (topo.nr_cpu_ids,)
        ran_on = struct.unpack("<64I", h.loaded.read_variable("ran_on"))
        assert [ran_on[c] for c in topo.online_cpus if c < 64] == [
            c + 1 for c in topo.online_cpus if c < 64
        ]
        assert "profile" in h.timings_ns and "load.profile.run.before_attach" in h.timings_ns
        assert "profile.runs" not in backend.counters()  # not attached yet
        backend.attach(h, 2.0)
        backend.pin(h)
        assert _registered(name, True)
        assert {"attach.profile.after_attach"} <= set(h.timings_ns)
        assert "profile.attach" in h.loaded.timings_ns
        assert backend.counters()["profile.runs"] == topo.nr_cpus
        assert (backend.pins.root / "p@loud" / "link").exists()
        backend.detach(h, 2.0)
        assert "profile.runs" not in backend.counters()
    finally:
        backend.discard(h)
    assert _registered(name, False)


FRESH_PROFILE = """
[profile]
name = "fresh"
ops_name = "{name}"

[variables]
nr_cpu_ids = {{ expr = "topo.nr_cpu_ids" }}
"""


def _renamed_profile_object(obj: Path, tmp_path: Path, name: str) -> Path:
    """A copy of the profile test object (``bpf_object("profile")``, its ops named
    ``ca_name("ssd_prof")``) whose ``tcp_congestion_ops`` is named ``name`` (congestion
    control names are kernel-wide: each test registers its own). The name is a
    ``char[16]`` (``TCP_CA_NAME_MAX``) in the initial value of the ``ssd_prof`` variable,
    in section ``.struct_ops.link``: written there in place."""
    from elftools.elf.elffile import ELFFile

    old, size = ca_name("ssd_prof").encode(), 16
    assert len(name) < size
    raw = bytearray(obj.read_bytes())
    with obj.open("rb") as f:
        sec = ELFFile(f).get_section_by_name(".struct_ops.link")
        assert sec is not None
        start, data = sec["sh_offset"], sec.data()
    at = data.find(old + b"\0")
    assert at >= 0 and data.find(old + b"\0", at + 1) < 0, "one ops name in the section"
    assert data[at + len(old) : at + size] == bytes(size - len(old))  # the rest of the array
    raw[start + at : start + at + size] = name.encode().ljust(size, b"\0")
    out = tmp_path / "profile.bpf.o"
    out.write_bytes(raw)
    return out


def _profiled_on_fake_sysfs(
    registry: KernelBtfRegistry,
    bpffs: Path,
    scx_root: Path,
    obj: Path,
    tmp_path: Path,
    name: str,
) -> tuple[KernelBackend, SchedulerConfig, Path, Path]:
    """A backend reading its topology from a fake sysfs tree of 4 CPUs and
    ``hotplug_seq`` from ``scx_root``, and the configuration of ``obj`` (its ops named
    ``name``) with the profile ``FRESH_PROFILE`` (``hotplug_seq = false``): ``(backend,
    cfg, profile file, sysfs root)``."""
    from schedswitchd.daemon.config import parse_config
    from tests.profile.fakesys import fake_sysfs

    sysfs = Path(fake_sysfs(tmp_path / "sys", possible=range(4)))
    backend = KernelBackend(
        pin_dir=bpffs / "pins",
        registry=registry,
        sched_ext_root=scx_root,
        ops_type=TCP,
        sysfs_root=sysfs,
    )
    prof = tmp_path / "fresh.toml"
    prof.write_text(FRESH_PROFILE.format(name=name))
    config = parse_config(
        f"[schedulers.p]\nobject = '{obj}'\nprofile = 'fresh.toml'\nhotplug_seq = false\n",
        str(tmp_path / "s.toml"),
    )
    return backend, config.schedulers["p"], prof, sysfs


def test_profiled_standby_freshness_follows_profile_file_and_topology(
    registry: KernelBtfRegistry,
    bpffs: Path,
    scx_root: Path,
    bpf_object: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    """A prepared profiled scheduler is fresh only while its profile file and the topology
    its values came from are unchanged (a CPU going offline, a profile edited)."""
    import uuid

    name = f"ssdf{uuid.uuid4().hex[:8]}"
    obj = _renamed_profile_object(bpf_object("profile"), tmp_path, name)
    backend, cfg, prof, sysfs = _profiled_on_fake_sysfs(
        registry, bpffs, scx_root, obj, tmp_path, name
    )
    h = backend.prepare("p", cfg)
    try:
        assert h.loaded is not None
        assert struct.unpack("<I", h.loaded.read_variable("nr_cpu_ids")) == (4,)
        assert backend.fresh(h, cfg)
        # CPU 3 goes offline: the topology differs, so does what the profile computes.
        (Path(sysfs) / "devices/system/cpu/online").write_text("0-2\n")
        assert not backend.fresh(h, cfg)
        (Path(sysfs) / "devices/system/cpu/online").write_text("0-3\n")
        assert backend.fresh(h, cfg)
        # The profile file edited (its size and mtime change).
        prof.write_text(FRESH_PROFILE.format(name=name) + "\n# edited\n")
        assert not backend.fresh(h, cfg)
    finally:
        backend.discard(h)


def test_quick_freshness_of_a_profiled_standby_trusts_hotplug_seq_for_the_topology(
    registry: KernelBtfRegistry,
    bpffs: Path,
    scx_root: Path,
    bpf_object: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    """A standby hit's quick check reads ``hotplug_seq`` and the online CPUs, not the
    topology: while both read what they did when the topology was read, it counts as
    unchanged. Once either moved, the topology is read in full; a full check that finds the
    topology unchanged again makes the new value the one quick checks compare with. The
    profile file is compared either way."""
    import uuid

    name = f"ssdq{uuid.uuid4().hex[:8]}"
    obj = _renamed_profile_object(bpf_object("profile"), tmp_path, name)
    backend, cfg, prof, sysfs = _profiled_on_fake_sysfs(
        registry, bpffs, scx_root, obj, tmp_path, name
    )
    online, seq_file = sysfs / "devices/system/cpu/online", scx_root / "hotplug_seq"
    h = backend.prepare("p", cfg)
    try:
        assert backend.fresh(h, cfg, quick=True) and backend.fresh(h, cfg)
        # No topology read: with "possible" gone, a full read fails; the quick check reads
        # hotplug_seq and "online" alone.
        possible = sysfs / "devices/system/cpu/possible"
        possible.rename(tmp_path / "possible")
        assert backend.fresh(h, cfg, quick=True)
        assert not backend.fresh(h, cfg)
        (tmp_path / "possible").rename(possible)
        # A CPU left the online mask, hotplug_seq unchanged (a topology read in the middle
        # of an offline pairs the new value with the old CPUs): read in full, stale.
        online.write_text("0-2\n")
        assert not backend.fresh(h, cfg, quick=True)
        # hotplug_seq moved too: the topology is read, and it differs.
        seq_file.write_text("8\n")
        assert not backend.fresh(h, cfg, quick=True)
        # The CPU is back (seq 9): read in full, the same again, and 9 is remembered.
        online.write_text("0-3\n")
        seq_file.write_text("9\n")
        assert backend.fresh(h, cfg, quick=True)
        possible.rename(tmp_path / "possible")
        assert backend.fresh(h, cfg, quick=True)
        (tmp_path / "possible").rename(possible)
        prof.write_text(FRESH_PROFILE.format(name=name) + "\n# edited\n")
        assert not backend.fresh(h, cfg, quick=True)
    finally:
        backend.discard(h)


def test_profile_step_failures_leave_nothing(
    backend: KernelBackend,
    bpf_object: Callable[[str], Path],
    tmp_path: Path,
    sched_ext: FakeSchedExt,
) -> None:
    """A before-attach run returning what the profile does not expect fails the prepare
    (nothing stays loaded); an after-attach one fails the attach and unregisters again."""
    import uuid

    from schedswitchd.daemon.config import parse_config

    name = f"ssdg{uuid.uuid4().hex[:8]}"
    obj = _renamed_profile_object(bpf_object("profile"), tmp_path, name)
    base = f'[profile]\nname = "bad"\nops_name = "{name}"\n'
    for when, step in (("before_attach", "prepare"), ("after_attach", "attach")):
        (tmp_path / "bad.toml").write_text(
            base + f'[[run]]\nprogram = "returns_seven"\nwhen = "{when}"\n'
        )
        config = parse_config(
            f"[schedulers.p]\nobject = '{obj}'\nprofile = 'bad.toml'\nhotplug_seq = false\n",
            str(tmp_path / "s.toml"),
        )
        if step == "prepare":
            with pytest.raises(LoadError, match="returns_seven returned 7, expected 0"):
                backend.prepare("p", config.schedulers["p"])
            assert backend.counters()["prepare_failures"] == 1
            continue
        h = backend.prepare("p", config.schedulers["p"])
        try:
            with pytest.raises(LoadError, match="returns_seven returned 7, expected 0"):
                backend.attach(h, 2.0)
            assert not _attached(h) and _registered(name, False)
            assert "profile.x" not in backend.counters()
        finally:
            backend.discard(h)


def test_preopen_builds_the_vmlinux_indexes_the_first_prepare_reads(
    bpffs: Path, scx_root: Path, bpf_object: Callable[[str], Path], tmp_path: Path
) -> None:
    """The first prepare after the daemon's start parses and indexes no vmlinux BTF: the
    pre-open did (the hint would otherwise wait for it: ~5 s under the VM's emulation). A
    vmlinux copy of its own, so that no other test's loads have indexed it already."""
    btf_root = tmp_path / "btf"
    btf_root.mkdir()
    shutil.copyfile("/sys/kernel/btf/vmlinux", btf_root / "vmlinux")
    registry = KernelBtfRegistry(btf_root=btf_root)
    backend = KernelBackend(
        pin_dir=bpffs / "pins", registry=registry, sched_ext_root=scx_root, ops_type=TCP
    )
    cfg = object_config(bpf_object("uei"), hotplug_seq=False)
    backend.preopen({"uei": cfg})
    assert backend.counters()["vmlinux_warms"] == 1
    vmlinux = registry.vmlinux
    warmed = (dict(vmlinux._name_index), {k: id(v) for k, v in vmlinux._ess_index.items()})
    assert warmed[0], "the pre-open built no vmlinux name index"
    h = backend.prepare("uei", cfg)
    try:
        assert registry.vmlinux is vmlinux  # parsed once, by the pre-open
        # no index built or rebuilt by the load: each kind's is the pre-open's object
        assert {k: id(v) for k, v in vmlinux._name_index.items()} == {
            k: id(v) for k, v in warmed[0].items()
        }
        assert {k: id(v) for k, v in vmlinux._ess_index.items()} == warmed[1]
    finally:
        backend.discard(h)


def test_phase_timings_replace_the_previous_ones_of_their_kind(
    backend: KernelBackend, bpf_object: Callable[[str], Path], sched_ext: FakeSchedExt
) -> None:
    """A handle's attach.*/detach.* timings are those of its latest attach/detach: a second
    attach (a rollback's) replaces the first's, pin included, and a fallback detach (link
    closed) leaves no BPF_LINK_DETACH phase of the detach before."""
    h = backend.prepare("uei", object_config(bpf_object("uei"), hotplug_seq=False))
    try:
        prepared = {k for k in h.timings_ns if not k.startswith(("attach.", "detach."))}
        backend.attach(h, 2.0)
        backend.pin(h)
        assert {"attach.link", "attach.pin"} <= set(h.timings_ns)
        backend.detach(h, 2.0)
        assert "detach.link_detach" in h.timings_ns
        h.timings_ns["attach.stale"] = 1  # as a phase only an earlier attach had
        backend.attach(h, 2.0)
        assert "attach.stale" not in h.timings_ns and "attach.pin" not in h.timings_ns
        sched_ext.link_detach_supported = False
        backend.detach(h, 2.0)
        assert "detach.link_detach" not in h.timings_ns and "detach.link_close" in h.timings_ns
        assert prepared <= set(h.timings_ns)  # the prepare's own phases stay
    finally:
        sched_ext.link_detach_supported = True
        backend.discard(h)


def test_the_backends_parts_share_its_state(backend: KernelBackend) -> None:
    """The parts of the backend see one pin directory, one set of counters and one list of
    the kernel's scx_enable_helper pids: the attacher reads the list prepare refills."""
    assert backend.preparer.pins is backend.attacher.pins is backend.adoption.pins
    assert backend.preparer.stats is backend.attacher.stats is backend.watcher.stats
    helpers = backend.preparer.enable_helpers
    assert backend.attacher.enable_helpers is helpers
    backend.stats.count("attaches", 0)
    assert backend.counters()["attaches"] == 0
