"""Attaching the programs that are not struct_ops members, as a libbpf skeleton's attach does.

libbpf's ``bpf_object__attach_skeleton`` walks every loaded program and calls the attach
function its section definition names (``section_defs`` in ``src/libbpf.c``); a program
whose section has none (``syscall``, ``xdp``, ``tc``, ``socket``, ``struct_ops``, ...) or
that names no target (``SEC("raw_tp")``, ``SEC("tp")``, ``SEC("kprobe")``) is left
unattached. scx's ``SCX_OPS_ATTACH`` runs that skeleton attach *before* it creates the
struct_ops link, so hooks such as ``SEC("fentry/bpf_scx_reg")`` see the registration.

What each section kind becomes here (UAPI ``include/uapi/linux/bpf.h``, kernel
``kernel/bpf/syscall.c`` ``link_create``):

========================================  ===================================================
``fentry``/``fexit``/``fmod_ret``         ``BPF_LINK_CREATE``, attach type = the program's
(``.s``), ``tp_btf``, ``lsm`` (``.s``)    expected attach type; the target was fixed at load
                                          (``attach_btf_id``, module BTF fd for ``mod:fn``)
``iter/NAME`` (``.s``)                    ``BPF_LINK_CREATE`` ``BPF_TRACE_ITER`` without
                                          parameters (task, task_file, bpf_map, ...); read it
                                          with ``BPF_ITER_CREATE``
``raw_tp/NAME``, ``raw_tracepoint/NAME``  ``BPF_RAW_TRACEPOINT_OPEN`` (a pinnable link)
``tp/CAT/NAME``, ``tracepoint/CAT/NAME``  ``perf_event_open(2)`` of ``PERF_TYPE_TRACEPOINT``
                                          with the event id from tracefs
                                          (``events/CAT/NAME/id``), then ``BPF_LINK_CREATE``
                                          ``BPF_PERF_EVENT`` (the link holds the event)
``kprobe/FN[+OFF]``, ``kretprobe/FN``     ``perf_event_open(2)`` of the ``kprobe`` PMU
                                          (``/sys/bus/event_source/devices/kprobe``:
                                          ``config1`` = the function name, ``config2`` =
                                          the offset, the ``retprobe`` format bit), then
                                          ``BPF_LINK_CREATE`` ``BPF_PERF_EVENT``
``uprobe``/``usdt``/``ksyscall``/...      refused with :class:`AttachError` (not supported)
anything else                             not auto-attached (``None``)
========================================  ===================================================

Every link is a ``bpf_link``: it can be pinned in bpffs and detaches when its last
reference (fd or pin) goes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import platform
import struct
import tempfile
from enum import Enum

from schedswitchd.bpf.spec import ProgramSpec
from schedswitchd.errors import BpfSyscallError, LoadError
from schedswitchd.kernel import bpf_uapi, syscall
from schedswitchd.kernel.fd import LinkFd, OwnedFd, ProgFd

__all__ = ["AttachError", "AttachMode", "attach_mode", "attach_program", "tracepoint_id"]


class AttachError(LoadError):
    """A program could not be attached: ``program`` names it; ``errno`` is the kernel's
    errno when a syscall refused (0 otherwise)."""

    def __init__(self, program: str, message: str, *, errno_value: int = 0) -> None:
        self.program = program
        self.errno = errno_value
        super().__init__(f"program {program}: {message}")


class AttachMode(Enum):
    """How :func:`attach_program` attaches a program (see the module table)."""

    NONE = "none"  #: not auto-attached
    LINK = "link"  #: BPF_LINK_CREATE with the expected attach type (tracing, LSM)
    ITER = "iter"  #: BPF_LINK_CREATE BPF_TRACE_ITER
    RAW_TP = "raw_tp"  #: BPF_RAW_TRACEPOINT_OPEN
    TRACEPOINT = "tracepoint"  #: perf_event_open + BPF_LINK_CREATE BPF_PERF_EVENT
    KPROBE = "kprobe"  #: perf kprobe PMU event + BPF_LINK_CREATE BPF_PERF_EVENT
    UNSUPPORTED = "unsupported"  #: auto-attached by libbpf, refused here


_LINK_ATTACH_TYPES = frozenset(
    {
        bpf_uapi.AttachType.TRACE_FENTRY,
        bpf_uapi.AttachType.TRACE_FEXIT,
        bpf_uapi.AttachType.MODIFY_RETURN,
        bpf_uapi.AttachType.TRACE_RAW_TP,
        bpf_uapi.AttachType.LSM_MAC,
    }
)


def _section_prefix(prog: ProgramSpec) -> str:
    sec = prog.section.removeprefix("?")
    for i, ch in enumerate(sec):
        if ch in "/+":
            return sec[:i]
    return sec


def attach_mode(prog: ProgramSpec) -> AttachMode:
    """How ``prog`` is auto-attached, from its program type, expected attach type and
    section (libbpf's ``section_defs`` attach functions)."""
    ptype, eat = prog.prog_type, prog.expected_attach_type
    if ptype in (bpf_uapi.ProgType.TRACING, bpf_uapi.ProgType.LSM):
        if eat == bpf_uapi.AttachType.TRACE_ITER:
            return AttachMode.ITER
        if eat in _LINK_ATTACH_TYPES:
            return AttachMode.LINK
        return AttachMode.NONE
    if ptype in (bpf_uapi.ProgType.RAW_TRACEPOINT, bpf_uapi.ProgType.RAW_TRACEPOINT_WRITABLE):
        return AttachMode.RAW_TP if prog.attach_to else AttachMode.NONE
    if ptype == bpf_uapi.ProgType.TRACEPOINT:
        return AttachMode.TRACEPOINT if prog.attach_to else AttachMode.NONE
    if ptype == bpf_uapi.ProgType.KPROBE:
        # libbpf auto-attaches kprobe/kretprobe/uprobe/usdt/ksyscall sections that name a
        # target; without one (SEC("kprobe")) it leaves them alone.
        if not prog.attach_to:
            return AttachMode.NONE
        if _section_prefix(prog) in ("kprobe", "kretprobe"):
            return AttachMode.KPROBE
        return AttachMode.UNSUPPORTED
    return AttachMode.NONE


def attach_program(prog: ProgramSpec, fd: ProgFd) -> LinkFd | None:
    """Attach loaded program ``prog`` (fd ``fd``) as a skeleton's attach would; ``None``
    when its section is not auto-attached. Raises :class:`AttachError` (the kernel
    refused, the tracepoint is unknown, tracefs is unavailable, or the kind is not
    supported: kprobes, uprobes)."""
    mode = attach_mode(prog)
    try:
        if mode is AttachMode.NONE:
            return None
        if mode is AttachMode.LINK:
            return syscall.link_create(fd, prog.expected_attach_type)
        if mode is AttachMode.ITER:
            return syscall.link_create(fd, bpf_uapi.AttachType.TRACE_ITER)
        if mode is AttachMode.RAW_TP:
            return syscall.raw_tracepoint_open(fd, prog.attach_to)
        if mode is AttachMode.TRACEPOINT:
            return _attach_tracepoint(prog, fd)
        if mode is AttachMode.KPROBE:
            return _attach_kprobe(prog, fd)
    except BpfSyscallError as exc:
        raise AttachError(
            prog.name, f"{prog.section}: attach refused: {exc}", errno_value=exc.errno
        ) from exc
    raise AttachError(
        prog.name,
        f"section {prog.section!r}: {_section_prefix(prog)} programs are auto-attached by "
        "libbpf but not by this loader (only kprobe/FN[+OFF] and kretprobe/FN are); turn "
        "the program's autoload off to load the object without it",
    )


# --- tracepoints through perf events ---------------------------------------------------------

PERF_TYPE_TRACEPOINT = 2
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_EVENT_IOC_ENABLE = 0x2400  # _IO('$', 0)
#: ``PERF_ATTR_SIZE_VER5``: the attr fields up to ``sample_max_stack``; all but type,
#: size and config stay zero (include/uapi/linux/perf_event.h).
_PERF_ATTR_SIZE = 112

# __NR_perf_event_open per architecture (arch/*/entry/syscalls, asm-generic/unistd.h).
_NR_PERF_EVENT_OPEN = {
    "x86_64": 298,
    "amd64": 298,
    "aarch64": 241,
    "arm64": 241,
    "riscv64": 241,
    "loongarch64": 241,
    "ppc64le": 319,
    "ppc64": 319,
    "s390x": 331,
}

_libc = ctypes.CDLL(None, use_errno=True)


def _perf_event_open(attr: bytes, pid: int, cpu: int, group_fd: int, flags: int) -> int:
    nr = _NR_PERF_EVENT_OPEN.get(platform.machine().lower())
    if nr is None:
        raise OSError(errno.ENOSYS, f"perf_event_open number unknown for {platform.machine()}")
    buf = ctypes.create_string_buffer(attr, len(attr))
    fn = _libc.syscall
    fn.restype = ctypes.c_long
    ret = int(
        fn(
            ctypes.c_long(nr),
            ctypes.c_void_p(ctypes.addressof(buf)),
            ctypes.c_int(pid),
            ctypes.c_int(cpu),
            ctypes.c_int(group_fd),
            ctypes.c_ulong(flags),
        )
    )
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def open_cpu_counter(type_: int, config: int, cpu: int) -> int:
    """``perf_event_open(2)`` of a counting event (``perf_event_attr`` with only ``type``,
    ``size`` and ``config`` set: enabled, no sampling) for every task on ``cpu`` (pid -1,
    no group, ``PERF_FLAG_FD_CLOEXEC``) -> its fd, owned by the caller. Raises
    :class:`OSError` with the kernel's errno (``ENOENT``: the event is not supported,
    ``ENODEV``: the CPU is offline)."""
    attr = struct.pack("<IIQ", type_, _PERF_ATTR_SIZE, config).ljust(_PERF_ATTR_SIZE, b"\0")
    return _perf_event_open(attr, -1, cpu, -1, PERF_FLAG_FD_CLOEXEC)


def _tracefs_mounts() -> list[str]:
    """Directories holding ``events/``: tracefs mounts, then ``tracing/`` under debugfs
    mounts (from ``/proc/self/mountinfo``), in mount order."""
    found: list[str] = []
    later: list[str] = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) < 5 or not right:
                    continue
                point = fields[4].replace("\\040", " ")
                fstype = right.split()[0]
                if fstype == "tracefs":
                    found.append(point)
                elif fstype == "debugfs":
                    later.append(os.path.join(point, "tracing"))
    except OSError:
        pass
    return found + later


def _read_id(root: str, category: str, name: str) -> int | None:
    try:
        with open(os.path.join(root, "events", category, name, "id"), encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


_MNT_DETACH = 2


def _id_from_private_tracefs(category: str, name: str) -> int | None:
    """Mount tracefs on a temporary directory just to read one id (root only), for a
    system where nothing mounted it (tracefs needs no mount to deliver events)."""
    d = tempfile.mkdtemp(prefix="schedswitchd-tracefs-")
    try:
        mount = _libc.mount
        if mount(b"tracefs", os.fsencode(d), b"tracefs", ctypes.c_ulong(0), None) != 0:
            return None
        try:
            return _read_id(d, category, name)
        finally:
            _libc.umount2(os.fsencode(d), _MNT_DETACH)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(d)


def tracepoint_id(category: str, name: str) -> int:
    """The perf event id of tracepoint ``category/name`` (``events/<cat>/<name>/id`` in
    tracefs, looked up at every tracefs or debugfs mount; when none is mounted, in a
    private tracefs mount made for the look-up). Raises :class:`LoadError` when it is not
    found."""
    roots = _tracefs_mounts()
    for root in roots:
        got = _read_id(root, category, name)
        if got is not None:
            return got
    if not roots:
        got = _id_from_private_tracefs(category, name)
        if got is not None:
            return got
        where = "no tracefs is mounted and mounting one failed"
    else:
        where = f"searched {', '.join(roots)}"
    raise LoadError(f"tracepoint {category}/{name} not found ({where})")


def _attach_tracepoint(prog: ProgramSpec, fd: ProgFd) -> LinkFd:
    category, sep, name = prog.attach_to.partition("/")
    if not sep or not category or not name:
        raise AttachError(
            prog.name,
            f"section {prog.section!r}: a tracepoint section is tp/<category>/<name>",
        )
    try:
        tp_id = tracepoint_id(category, name)
    except LoadError as exc:
        raise AttachError(prog.name, str(exc)) from exc
    attr = struct.pack("<IIQ", PERF_TYPE_TRACEPOINT, _PERF_ATTR_SIZE, tp_id).ljust(
        _PERF_ATTR_SIZE, b"\0"
    )
    return _link_perf_event(prog, fd, attr, f"tracepoint {prog.attach_to}")


def _link_perf_event(
    prog: ProgramSpec, fd: ProgFd, attr: bytes, what: str, *, enoent_hint: str = ""
) -> LinkFd:
    """Open the perf event ``attr`` (a ``perf_event_attr`` of ``_PERF_ATTR_SIZE`` bytes), link
    ``prog`` to it (``BPF_LINK_CREATE``, ``BPF_PERF_EVENT``) and enable it. ``what`` names
    the event in errors; ``enoent_hint`` is added when perf_event_open says ENOENT. Raises
    :class:`AttachError` (with the errno) when opening, linking or enabling fails."""
    try:
        # pid -1, cpu 0 as libbpf: the program runs for every CPU and task.
        pfd = OwnedFd(_perf_event_open(attr, -1, 0, -1, PERF_FLAG_FD_CLOEXEC))
    except OSError as exc:
        hint = enoent_hint if exc.errno == errno.ENOENT else ""
        raise AttachError(
            prog.name,
            f"perf_event_open of {what} failed: {exc.strerror}{hint}",
            errno_value=exc.errno or 0,
        ) from exc
    with pfd:
        # The link takes its own reference to the perf event file, so ours can go.
        link = syscall.link_create(fd, bpf_uapi.AttachType.PERF_EVENT, target_fd=pfd)
        try:
            fcntl.ioctl(pfd.fd, PERF_EVENT_IOC_ENABLE, 0)
        except OSError as exc:
            link.close()
            raise AttachError(
                prog.name,
                f"cannot enable the {what}: {exc.strerror}",
                errno_value=exc.errno or 0,
            ) from exc
    return link


# --- kprobes through the perf kprobe PMU ------------------------------------------------------

_KPROBE_PMU = "/sys/bus/event_source/devices/kprobe"


def _kprobe_pmu() -> tuple[int, int]:
    """(PMU type, ``retprobe`` bit in ``config``) of the kernel's ``kprobe`` PMU
    (``CONFIG_KPROBE_EVENTS``; ``type`` and ``format/retprobe``, e.g. ``config:0``).
    Raises :class:`LoadError` when the kernel has none."""
    try:
        with open(os.path.join(_KPROBE_PMU, "type"), encoding="ascii") as f:
            pmu_type = int(f.read().strip())
    except (OSError, ValueError) as exc:
        raise LoadError(
            f"this kernel has no kprobe PMU ({_KPROBE_PMU}/type: "
            f"{getattr(exc, 'strerror', None) or exc}; CONFIG_KPROBE_EVENTS)"
        ) from exc
    bit = 0
    try:
        with open(os.path.join(_KPROBE_PMU, "format", "retprobe"), encoding="ascii") as f:
            text = f.read().strip()  # "config:0"
        if text.startswith("config:"):
            bit = int(text.split(":", 1)[1].split("-", 1)[0])
    except (OSError, ValueError):
        pass  # every kernel with the PMU so far says config:0
    return pmu_type, bit


def _kprobe_target(prog: ProgramSpec) -> tuple[str, int, bool]:
    """(function, offset, is_return) from ``kprobe/FN[+OFF]`` / ``kretprobe/FN``."""
    retprobe = _section_prefix(prog) == "kretprobe"
    func, plus, off_text = prog.attach_to.partition("+")
    offset = 0
    if plus:
        try:
            offset = int(off_text, 0)
        except ValueError:
            offset = -1
        if offset < 0 or retprobe:
            raise AttachError(
                prog.name,
                f"section {prog.section!r}: expected kprobe/FUNCTION[+OFFSET] or "
                "kretprobe/FUNCTION",
            )
    if not func:
        raise AttachError(prog.name, f"section {prog.section!r} names no function")
    return func, offset, retprobe


def _attach_kprobe(prog: ProgramSpec, fd: ProgFd) -> LinkFd:
    func, offset, retprobe = _kprobe_target(prog)
    try:
        pmu_type, bit = _kprobe_pmu()
    except LoadError as exc:
        raise AttachError(prog.name, str(exc)) from exc
    name = ctypes.create_string_buffer(func.encode())
    # perf_event_attr: type, size, config (retprobe bit), ..., config1 (at 56: a pointer to
    # the function name), config2 (at 64: the offset) -- include/uapi/linux/perf_event.h.
    attr = bytearray(_PERF_ATTR_SIZE)
    struct.pack_into("<IIQ", attr, 0, pmu_type, _PERF_ATTR_SIZE, (1 << bit) if retprobe else 0)
    struct.pack_into("<QQ", attr, 56, ctypes.addressof(name), offset)
    what = f"{'kretprobe' if retprobe else 'kprobe'} on {func}" + (f"+{offset}" if offset else "")
    # ``name`` (a local, so alive until we return) is read by perf_event_open via config1.
    return _link_perf_event(
        prog, fd, bytes(attr), what, enoent_hint=" (no such function, or it cannot be probed)"
    )
