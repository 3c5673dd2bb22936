"""The kernel-floor phases of a scheduler profile, between load and link and right after.

A :class:`~schedswitchd.profile.apply.ProfilePlan` (pure, laid out from BTF) is carried
out on a :class:`~schedswitchd.kernel.loader.LoadedObject` in named phases, each timed into
``obj.timings_ns`` (ns):

- ``profile.after_load``: ``[after_load]`` variables written into the loaded ``.bss``/
  ``.data`` maps (:meth:`LoadedObject.write_variable`);
- ``profile.map_updates``: ``BPF_MAP_UPDATE_ELEM`` per planned element (per-CPU values
  repeated for every possible CPU, each slot rounded up to 8 bytes, as
  ``bpf_map_update_elem`` expects for ``BPF_MAP_TYPE_PERCPU_*``);
- ``profile.perf_events``: ``perf_event_open(2)`` per planned event (a counting event on
  one CPU for every task) and its fd written into the ``BPF_MAP_TYPE_PERF_EVENT_ARRAY``
  (the map holds its own reference to the event, so our fd is closed after); an event
  planned ``skip_on_error`` that cannot be opened is a note in ``obj.notes``, otherwise
  a :class:`~schedswitchd.errors.LoadError` naming the step and the errno;
- ``profile.run.before_attach`` / ``profile.run.after_attach``: ``BPF_PROG_RUN`` of
  ``SEC("syscall")`` programs with their context bytes. A syscall program runs in the
  calling thread (``bpf_prog_test_run_syscall()`` refuses ``BPF_F_TEST_RUN_ON_CPU``), so
  "on CPU n" means the thread is bound to CPU n with ``sched_setaffinity`` for the run and
  its mask restored after; a return value other than the expected one is a
  :class:`~schedswitchd.errors.LoadError` naming the program and iteration;
- ``profile.attach``: the struct_ops link created from the profile's attach CPU
  (:func:`on_cpu` around the caller's link creation).

Kernel references: ``include/uapi/linux/bpf.h`` (``BPF_PROG_RUN``, ``BPF_MAP_UPDATE_ELEM``
flags), ``kernel/bpf/syscall.c`` / ``net/bpf/test_run.c`` (``bpf_prog_test_run_syscall``),
``sched_setaffinity(2)`` (pid 0 = the calling thread).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from schedswitchd.errors import BpfSyscallError, LoadError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.prog_attach import open_cpu_counter
from schedswitchd.profile.apply import PlannedStat, ProfilePlan

if TYPE_CHECKING:
    from schedswitchd.kernel.loader import LoadedObject

__all__ = [
    "ENABLE_HELPER_COMM",
    "attach_from_cpu",
    "enable_helper_pids",
    "helper_on_cpu",
    "on_cpu",
    "read_stats",
    "run_after_attach",
    "run_after_load",
    "run_before_attach",
]


@contextlib.contextmanager
def on_cpu(cpu: int | None) -> Iterator[None]:
    """Bind the calling thread to ``cpu`` (``sched_setaffinity(0, {cpu})``; the kernel
    migrates it before the call returns) for the ``with`` body, then restore its previous
    mask. ``None``: no change. Raises :class:`LoadError` when the CPU cannot be used."""
    if cpu is None:
        yield
        return
    old = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError as exc:
        raise LoadError(f"cannot run on CPU {cpu}: sched_setaffinity: {exc.strerror}") from exc
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def _timed(obj: LoadedObject, key: str, start: int) -> None:
    obj.timings_ns[key] = obj.timings_ns.get(key, 0) + time.perf_counter_ns() - start


def _percpu(value: bytes) -> bytes:
    slot = (len(value) + 7) // 8 * 8
    return (value + bytes(slot - len(value))) * syscall.possible_cpus()


def run_after_load(obj: LoadedObject, plan: ProfilePlan) -> None:
    """Phase ``profile.after_load``: write the ``[after_load]`` variables. Raises
    ``LoadError``/``BpfSyscallError`` naming the variable."""
    start = time.perf_counter_ns()
    for name, raw in plan.after_load:
        try:
            obj.write_variable(name, raw)
        except (LoadError, BpfSyscallError) as exc:
            raise LoadError(f"profile {plan.profile}: after_load.{name}: {exc}") from exc
    _timed(obj, "profile.after_load", start)


def _map_updates(obj: LoadedObject, plan: ProfilePlan, when: str) -> None:
    start = time.perf_counter_ns()
    for u in plan.map_updates:
        if u.when != when:
            continue
        m = obj.maps.get(u.map)
        if m is None:
            raise LoadError(f"profile {plan.profile}: {u.label}: map {u.map} was not created")
        value = _percpu(u.value) if u.percpu else u.value
        try:
            syscall.map_update_elem(m.fd, u.key, value, flags=u.flags)
        except BpfSyscallError as exc:
            raise LoadError(f"profile {plan.profile}: {u.label}: {exc}") from exc
    _timed(obj, "profile.map_updates", start)


def _perf_events(obj: LoadedObject, plan: ProfilePlan) -> None:
    if not plan.perf_events:
        return
    start = time.perf_counter_ns()
    for e in plan.perf_events:
        m = obj.maps.get(e.map)
        if m is None:
            raise LoadError(f"profile {plan.profile}: {e.label}: map {e.map} was not created")
        try:
            fd = open_cpu_counter(e.type, e.config, e.cpu)
        except OSError as exc:
            why = (
                f"{e.label}: perf_event_open(type {e.type}, config {e.config:#x}, cpu "
                f"{e.cpu}): {exc.strerror}"
            )
            if e.skip_on_error:
                obj.notes.append(f"profile {plan.profile}: {why}; skipped")
                continue
            raise LoadError(f"profile {plan.profile}: {why}") from exc
        try:
            syscall.map_update_elem(m.fd, e.key, fd.to_bytes(4, "little"))
        except BpfSyscallError as exc:
            raise LoadError(f"profile {plan.profile}: {e.label}: {exc}") from exc
        finally:
            os.close(fd)
    _timed(obj, "profile.perf_events", start)


def _runs(obj: LoadedObject, plan: ProfilePlan, when: str) -> None:
    start = time.perf_counter_ns()
    for r in plan.runs:
        if r.when != when:
            continue
        prog = obj.programs.get(r.program)
        if prog is None:
            raise LoadError(f"profile {plan.profile}: {r.label}: program {r.program} not loaded")
        # After attach a run without a CPU of its own runs on the attach CPU: a scheduler's
        # userspace pins itself before attaching and keeps that pin for what follows
        # (scx_tickless starts its timer from there, and start_timer checks the CPU).
        cpu = r.cpu if r.cpu is not None or when != "after_attach" else plan.attach_cpu
        try:
            with on_cpu(cpu):
                # No ctx_out: the kernel copies a syscall program's context back into
                # ctx_in's buffer and refuses ctx_out (net/bpf/test_run.c).
                res = syscall.prog_test_run(prog.fd, ctx_in=r.ctx)
        except BpfSyscallError as exc:
            raise LoadError(f"profile {plan.profile}: {r.label}: {exc}") from exc
        retval = res.retval - (1 << 32) if res.retval >= 1 << 31 else res.retval
        if r.expect_retval is not None and retval != r.expect_retval:
            raise LoadError(
                f"profile {plan.profile}: {r.label}: {r.program} returned {retval}, "
                f"expected {r.expect_retval}"
            )
    _timed(obj, f"profile.run.{when}", start)


def run_before_attach(obj: LoadedObject, plan: ProfilePlan) -> None:
    """Phases ``profile.after_load``, ``profile.map_updates``, ``profile.perf_events`` and
    ``profile.run.before_attach``, in that order. Raises ``LoadError``."""
    run_after_load(obj, plan)
    _map_updates(obj, plan, "before_attach")
    _perf_events(obj, plan)
    _runs(obj, plan, "before_attach")


def run_after_attach(obj: LoadedObject, plan: ProfilePlan) -> None:
    """The ``after_attach`` map updates and runs (phase ``profile.run.after_attach``).
    Raises ``LoadError``."""
    _map_updates(obj, plan, "after_attach")
    _runs(obj, plan, "after_attach")


T = TypeVar("T")


#: ``comm`` of the kernel thread that enables a sched_ext scheduler (``kernel/sched/ext.c``
#: ``scx_enable()``: one ``kthread_run_worker(0, "scx_enable_helper")``, SCHED_FIFO, made
#: on the first enable after boot and kept). ``ops.init`` runs in it, not in the thread that
#: creates the link.
ENABLE_HELPER_COMM = "scx_enable_helper"


def enable_helper_pids(proc: str = "/proc") -> list[int]:
    """Pids of the kernel's ``scx_enable_helper`` threads: tasks of that ``comm`` whose
    parent is ``kthreadd`` (pid 2), read from ``proc`` (``/proc/PID/stat``). Empty before
    the first sched_ext enable since boot, or without sched_ext."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for entry in os.listdir(proc):
            if not entry.isdigit():
                continue
            try:
                with open(f"{proc}/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            # "pid (comm) state ppid ...": comm may hold spaces, so split at the last ")"
            comm = stat[stat.find("(") + 1 : stat.rfind(")")]
            rest = stat[stat.rfind(")") + 2 :].split()
            if comm == ENABLE_HELPER_COMM and len(rest) > 1 and rest[1] == "2":
                out.append(int(entry))
    return out


@contextlib.contextmanager
def helper_on_cpu(
    cpu: int | None, pids: list[int] | None = None, *, proc: str = "/proc"
) -> Iterator[list[int]]:
    """Bind the kernel's ``scx_enable_helper`` thread(s) to ``cpu`` for the ``with`` body
    and restore their masks after; yields the pids bound. Since 6.18 the kernel runs
    ``ops.init`` there, so a scheduler whose ``ops.init`` must run on one CPU
    (scx_central's ``central_init``: "init from non-central CPU") gets it only this way;
    the attaching thread's own pin no longer decides it. ``pids``: the helpers found
    earlier (:func:`enable_helper_pids`; the kernel keeps its helper once made), so that
    the ``/proc`` walk stays out of the no-scheduler gap; ``None`` or empty: ``proc``
    walked now.
    A helper that cannot be bound (``EINVAL``/``EPERM``) is left as it is; none yet (first
    enable since boot): nothing."""
    bound: list[tuple[int, set[int]]] = []
    if cpu is not None:
        for pid in pids or enable_helper_pids(proc):
            try:
                old = os.sched_getaffinity(pid)
                os.sched_setaffinity(pid, {cpu})
            except OSError:
                continue
            bound.append((pid, old))
    try:
        yield [pid for pid, _ in bound]
    finally:
        for pid, old in bound:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(pid, old)


def attach_from_cpu(
    obj: LoadedObject,
    plan: ProfilePlan,
    create_link: Callable[[], T],
    helpers: list[int] | None = None,
) -> T:
    """Phase ``profile.attach``: call ``create_link()`` (which creates the struct_ops
    link) with the calling thread -- and the kernel's ``scx_enable_helper`` thread, where
    ``ops.init`` runs (:func:`helper_on_cpu`) -- bound to the plan's attach CPU, restoring
    their masks after. Returns what ``create_link`` returns; its errors propagate. The
    helper pids bound go to ``obj.notes``; ``helpers``: as :func:`helper_on_cpu`'s
    ``pids``."""
    start = time.perf_counter_ns()
    try:
        with on_cpu(plan.attach_cpu), helper_on_cpu(plan.attach_cpu, helpers) as bound:
            if bound:
                obj.notes.append(
                    f"profile {plan.profile}: {ENABLE_HELPER_COMM} (pid "
                    f"{', '.join(map(str, bound))}) bound to CPU {plan.attach_cpu} for attach"
                )
            return create_link()
    finally:
        _timed(obj, "profile.attach", start)


def _decode(raw: bytes, s: PlannedStat) -> int:
    return int.from_bytes(raw[s.offset : s.offset + s.size], "little", signed=s.signed)


def read_stats(obj: LoadedObject, plan: ProfilePlan) -> dict[str, int]:
    """The profile's ``[[stats]]`` counters read from the loaded maps (per-CPU map values
    summed over the possible CPUs). A counter that cannot be read is left out."""
    out: dict[str, int] = {}
    for s in plan.stats:
        try:
            if s.variable is not None:
                out[s.name] = _decode(obj.read_variable(s.variable), s)
                continue
            assert s.map is not None
            m = obj.maps.get(s.map)
            if m is None:
                continue
            if s.percpu:
                slot = (m.spec.value_size + 7) // 8 * 8
                raw = syscall.map_lookup_elem(m.fd, s.key, slot * syscall.possible_cpus())
                if raw is not None:
                    out[s.name] = sum(
                        _decode(raw[i : i + slot], s) for i in range(0, len(raw), slot)
                    )
            else:
                raw = syscall.map_lookup_elem(m.fd, s.key, m.spec.value_size)
                if raw is not None:
                    out[s.name] = _decode(raw, s)
        except (LoadError, BpfSyscallError):
            continue
    return out
