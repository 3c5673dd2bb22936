"""A fake SchedulerBackend for host tests: a tiny model of sched_ext's one-scheduler rule.

It enforces what the real kernel enforces (attach only while ``disabled``; ``root/ops``
names the attached scheduler; ``enable_seq`` grows) so that switcher and server logic is
tested against the same rules, and counts live handles so tests can find leaks.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import cast

from schedswitchd.daemon.backend import Prepared
from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.protocol import ExitInfo, KernelInfo
from schedswitchd.errors import BpfSyscallError, LoadError, SchedExtError
from schedswitchd.kernel.sched_ext.scheduler_pins import PinError


@dataclass(eq=False)
class FakePrepared:
    name: str
    ops_name: str
    attached: bool = False
    discarded: bool = False
    exit: ExitInfo | None = None
    spec: SchedulerConfig | None = None
    timings_ns: dict[str, int] = field(default_factory=lambda: {"btf": 2, "core": 3})


@dataclass
class FakeBackend:
    fail_prepare: set[str] = field(default_factory=set)
    verifier_reject: set[str] = field(default_factory=set)
    fail_attach: set[str] = field(default_factory=set)
    #: What ``counters()`` reports as an attached profiled scheduler's ``[[stats]]``.
    profile_stats: dict[str, int] = field(default_factory=lambda: {"dispatched": 7})
    fail_detach: bool = False
    #: Scheduler names whose pin fails (after attach, as a read-only bpffs would).
    fail_pin: set[str] = field(default_factory=set)
    #: When set, ``pin`` waits for it (at most 10 s): the switch is held after its
    #: ``on_enabled`` moment.
    pin_event: threading.Event | None = None
    #: When set, called with the call's name (``attach gaming``, ``pin gaming``) as
    #: ``attach`` and ``pin`` begin, on the worker thread: what a test sees at that moment.
    on_call: Callable[[str], None] | None = None
    #: Called (worker thread) with each ``pre-open ...`` call, e.g. to hold it.
    on_preopen: Callable[[str], None] | None = None
    #: When given, ``prepare`` sets ``preparing`` and then blocks until the test sets
    #: ``gate``: a switch held on the worker thread while the test talks to the daemon.
    gate: threading.Event | None = None
    preparing: threading.Event = field(default_factory=threading.Event)
    #: Like the real backend: record attach./detach. phase timings on the handle and spend
    #: this long in attach after the kernel enabled the scheduler (pinning), returning the
    #: moment it was enabled.
    attach_tail_s: float | None = None
    pinned: FakePrepared | None = None
    state: str = "disabled"
    ops: str | None = None
    enable_seq: int = 0
    live: set[int] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)
    attached_handle: FakePrepared | None = None
    watchers: list[Callable[[], None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Scheduler names whose prepared handles no longer match the "kernel" (a rebuilt
    #: object, a module change): ``fresh`` says False for them.
    stale: set[str] = field(default_factory=set)
    #: Kernel bytes each handle holds, by scheduler name (default 4096).
    handle_bytes: dict[str, int] = field(default_factory=dict)
    #: Scheduler names whose handles keep no exit record (``exit_recorded`` says False for
    #: them; a real scheduler without a ``uei`` variable), though ``exit_info`` knows.
    no_exit_record: set[str] = field(default_factory=set)
    #: Switch windows open now (``switch_window`` entered, not yet left).
    windows_open: int = 0
    #: ``fresh`` calls, in order: (scheduler name, ``quick``).
    fresh_checks: list[tuple[str, bool]] = field(default_factory=list)

    def prepare(self, name: str, spec: SchedulerConfig) -> FakePrepared:
        self.calls.append(f"prepare {name}")
        if self.gate is not None:
            self.preparing.set()
            assert self.gate.wait(30), "the test never opened the gate"
        if name in self.fail_prepare:
            raise LoadError(f"{name}: kfunc scx_bpf_nope not found in kernel BTF")
        if name in self.verifier_reject:
            raise BpfSyscallError(
                "BPF_PROG_LOAD", 13, f"{name}/enqueue", verifier_log="R1 invalid mem access"
            )
        handle = FakePrepared(name, f"{name}_ops", spec=spec)
        self.live.add(id(handle))
        return handle

    def attach(self, prepared: Prepared, timeout_s: float) -> int | None:
        prepared = cast(FakePrepared, prepared)
        self.calls.append(f"attach {prepared.name}")
        if self.on_call is not None:
            self.on_call(f"attach {prepared.name}")
        assert not prepared.discarded, "attach of a discarded handle"
        with self.lock:
            if self.state != "disabled":
                raise SchedExtError(f"sched_ext is {self.state}, cannot attach")
            if prepared.name in self.fail_attach:
                # the kernel calls ops.init, which fails: the scheduler exits at once
                prepared.exit = ExitInfo(
                    kind=1024, reason="init failed", message="ops.init() returned -ENOMEM"
                )
                raise SchedExtError(f"{prepared.name}: sched_ext disabled during enable")
            self.state, self.ops = "enabled", prepared.ops_name
            self.enable_seq += 1
            prepared.attached = True
            self.attached_handle = prepared
        if self.attach_tail_s is None:
            return None
        enabled_ns = time.monotonic_ns()
        time.sleep(self.attach_tail_s)
        prepared.timings_ns.update({"attach.link": 11, "attach.confirm": 13})
        return enabled_ns

    def pin(self, prepared: Prepared) -> None:
        prepared = cast(FakePrepared, prepared)
        self.calls.append(f"pin {prepared.name}")
        if self.on_call is not None:
            self.on_call(f"pin {prepared.name}")
        assert prepared.attached, "pin of a handle that is not attached"
        if self.pin_event is not None:  # a test holds the switch here, after the reply
            self.pin_event.wait(10)
        if prepared.name in self.fail_pin:
            raise PinError(f"cannot pin {prepared.name}: Read-only file system")

    def detach(self, prepared: Prepared, timeout_s: float) -> None:
        prepared = cast(FakePrepared, prepared)
        self.calls.append(f"detach {prepared.name}")
        if self.fail_detach:
            raise SchedExtError("timed out waiting for sched_ext to read disabled")
        with self.lock:
            if prepared.attached and self.attached_handle is prepared:
                self.state, self.ops = "disabled", None
                self.attached_handle = None
                # the kernel calls ops.exit on unregister too (SCX_EXIT_UNREG)
                prepared.exit = ExitInfo(kind=64, reason="unregistered from user space")
            prepared.attached = False
        if self.attach_tail_s is not None:
            prepared.timings_ns["detach.link_detach"] = 17

    def discard(self, prepared: Prepared) -> None:
        prepared = cast(FakePrepared, prepared)
        self.calls.append(f"discard {prepared.name}")
        if prepared.attached:
            self.detach(prepared, 1.0)
        prepared.discarded = True
        self.live.discard(id(prepared))

    def kernel_state(self) -> KernelInfo:
        with self.lock:
            return KernelInfo(state=self.state, ops=self.ops, enable_seq=self.enable_seq)

    def exit_info(self, prepared: Prepared) -> ExitInfo | None:
        return cast(FakePrepared, prepared).exit

    def exit_recorded(self, prepared: Prepared) -> bool:
        return prepared.name not in self.no_exit_record

    def adopt(self, schedulers: Mapping[str, SchedulerConfig]) -> FakePrepared | None:
        pinned, self.pinned = self.pinned, None
        if pinned is None or pinned.name not in schedulers or self.ops != pinned.ops_name:
            return None
        pinned.attached = True
        self.attached_handle = pinned
        self.live.add(id(pinned))
        return pinned

    def counters(self) -> Mapping[str, int]:
        out = {"prepares": sum(c.startswith("prepare") for c in self.calls)}
        h = self.attached_handle
        if h is not None and h.spec is not None and h.spec.profile_path is not None:
            # As the kernel backend reports a profiled scheduler's [[stats]].
            out.update({f"profile.{k}": v for k, v in self.profile_stats.items()})
        return out

    def watch(self, notify: Callable[[], None]) -> Callable[[], None]:
        self.watchers.append(notify)
        return lambda: self.watchers.remove(notify)

    def switch_window(self) -> AbstractContextManager[bool]:
        return self._window()

    @contextlib.contextmanager
    def _window(self) -> Iterator[bool]:
        self.windows_open += 1
        try:
            yield False
        finally:
            self.windows_open -= 1

    def fresh(self, prepared: Prepared, spec: SchedulerConfig, *, quick: bool = False) -> bool:
        prepared = cast(FakePrepared, prepared)
        self.fresh_checks.append((prepared.name, quick))
        return not prepared.discarded and not prepared.attached and prepared.name not in self.stale

    def kernel_bytes(self, prepared: Prepared) -> int:
        return self.handle_bytes.get(prepared.name, 4096)

    def preopen(self, schedulers: Mapping[str, SchedulerConfig]) -> None:
        call = "pre-open " + " ".join(sorted(schedulers))
        self.calls.append(call)
        if self.on_preopen is not None:
            self.on_preopen(call)

    # --- test controls ----------------------------------------------------------------------

    def eject(
        self,
        kind: int = 1026,
        reason: str = "watchdog failed to check in",
        exit_code: int = 0,
        message: str = "runnable task stall",
    ) -> None:
        """Simulate the kernel disabling the running scheduler (e.g. a stall; with
        ``exit_code`` carrying ``SCX_ECODE_ACT_RESTART``, a CPU hotplug)."""
        with self.lock:
            handle = self.attached_handle
            assert handle is not None, "nothing to eject"
            handle.exit = ExitInfo(kind=kind, exit_code=exit_code, reason=reason, message=message)
            handle.attached = False
            self.attached_handle = None
            self.state, self.ops = "disabled", None
        for notify in list(self.watchers):
            notify()

    def preload(self, name: str) -> None:
        """Pretend a previous daemon left ``name`` pinned and enabled."""
        handle = FakePrepared(name, f"{name}_ops", attached=True)
        self.pinned = handle
        self.state, self.ops = "enabled", handle.ops_name
        self.enable_seq += 1


def create_backend(config: object) -> FakeBackend:
    """The backend factory of ``python -m tests.daemon.fake_service`` (tests only).

    ``$FAKE_PRELOAD`` names a scheduler to pretend a previous daemon left pinned.
    """
    import os

    backend = FakeBackend()
    preload = os.environ.get("FAKE_PRELOAD")
    if preload:
        backend.preload(preload)
    return backend
