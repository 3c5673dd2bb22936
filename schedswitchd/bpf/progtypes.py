"""Program section names -> program type, expected attach type, attach target, sleepable.

The conventions are libbpf's ``section_defs`` table (``src/libbpf.c``); values are UAPI
``enum bpf_prog_type`` / ``enum bpf_attach_type`` (``include/uapi/linux/bpf.h``). A leading
``?`` (autoload off) is stripped by the caller. Unknown sections give program type 0
(``BPF_PROG_TYPE_UNSPEC``), which the kernel refuses at load time, as with libbpf.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedswitchd.bpf import spec

PROG_TYPE_SOCKET_FILTER = 1
PROG_TYPE_SCHED_CLS = 3
PROG_TYPE_XDP = 6
PROG_TYPE_PERF_EVENT = 7
ATTACH_XDP = 37
PROG_TYPE_RAW_TRACEPOINT_WRITABLE = 24
ATTACH_TRACE_KPROBE_MULTI = 42
ATTACH_TRACE_UPROBE_MULTI = 48
ATTACH_TRACE_KPROBE_SESSION = 56


@dataclass(frozen=True, slots=True)
class ProgKind:
    """What a section name says about its programs."""

    prog_type: int
    expected_attach_type: int
    attach_to: str
    sleepable: bool


# (prefix, takes a "/target" suffix, prog type, attach type, sleepable); first match wins,
# so longer prefixes come first.
_TABLE: tuple[tuple[str, bool, int, int, bool], ...] = (
    ("struct_ops.s", True, spec.PROG_TYPE_STRUCT_OPS, spec.ATTACH_NONE, True),
    ("struct_ops", True, spec.PROG_TYPE_STRUCT_OPS, spec.ATTACH_NONE, False),
    ("fentry.s", True, spec.PROG_TYPE_TRACING, spec.ATTACH_TRACE_FENTRY, True),
    ("fentry", True, spec.PROG_TYPE_TRACING, spec.ATTACH_TRACE_FENTRY, False),
    ("fexit.s", True, spec.PROG_TYPE_TRACING, spec.ATTACH_TRACE_FEXIT, True),
    ("fexit", True, spec.PROG_TYPE_TRACING, spec.ATTACH_TRACE_FEXIT, False),
    ("fmod_ret.s", True, spec.PROG_TYPE_TRACING, spec.ATTACH_MODIFY_RETURN, True),
    ("fmod_ret", True, spec.PROG_TYPE_TRACING, spec.ATTACH_MODIFY_RETURN, False),
    ("tp_btf", True, spec.PROG_TYPE_TRACING, spec.ATTACH_TRACE_RAW_TP, False),
    ("iter.s", True, spec.PROG_TYPE_TRACING, spec.ATTACH_TRACE_ITER, True),
    ("iter", True, spec.PROG_TYPE_TRACING, spec.ATTACH_TRACE_ITER, False),
    ("lsm.s", True, spec.PROG_TYPE_LSM, spec.ATTACH_LSM_MAC, True),
    ("lsm", True, spec.PROG_TYPE_LSM, spec.ATTACH_LSM_MAC, False),
    ("freplace", True, spec.PROG_TYPE_EXT, spec.ATTACH_NONE, False),
    # kprobe/uprobe flavours: loaded as libbpf does; only plain kprobe/kretprobe attach
    # (schedswitchd.kernel.prog_attach), the others are refused by name at attach time.
    ("kprobe.multi", True, spec.PROG_TYPE_KPROBE, ATTACH_TRACE_KPROBE_MULTI, False),
    ("kretprobe.multi", True, spec.PROG_TYPE_KPROBE, ATTACH_TRACE_KPROBE_MULTI, False),
    ("kprobe.session", True, spec.PROG_TYPE_KPROBE, ATTACH_TRACE_KPROBE_SESSION, False),
    ("uprobe.multi.s", True, spec.PROG_TYPE_KPROBE, ATTACH_TRACE_UPROBE_MULTI, True),
    ("uprobe.multi", True, spec.PROG_TYPE_KPROBE, ATTACH_TRACE_UPROBE_MULTI, False),
    ("uretprobe.multi.s", True, spec.PROG_TYPE_KPROBE, ATTACH_TRACE_UPROBE_MULTI, True),
    ("uretprobe.multi", True, spec.PROG_TYPE_KPROBE, ATTACH_TRACE_UPROBE_MULTI, False),
    ("ksyscall", True, spec.PROG_TYPE_KPROBE, spec.ATTACH_NONE, False),
    ("kretsyscall", True, spec.PROG_TYPE_KPROBE, spec.ATTACH_NONE, False),
    ("usdt", True, spec.PROG_TYPE_KPROBE, spec.ATTACH_NONE, False),
    ("kprobe", True, spec.PROG_TYPE_KPROBE, spec.ATTACH_NONE, False),
    ("kretprobe", True, spec.PROG_TYPE_KPROBE, spec.ATTACH_NONE, False),
    ("uprobe.s", True, spec.PROG_TYPE_KPROBE, spec.ATTACH_NONE, True),
    ("uprobe", True, spec.PROG_TYPE_KPROBE, spec.ATTACH_NONE, False),
    ("uretprobe", True, spec.PROG_TYPE_KPROBE, spec.ATTACH_NONE, False),
    ("tracepoint", True, spec.PROG_TYPE_TRACEPOINT, spec.ATTACH_NONE, False),
    ("tp", True, spec.PROG_TYPE_TRACEPOINT, spec.ATTACH_NONE, False),
    ("raw_tracepoint.w", True, PROG_TYPE_RAW_TRACEPOINT_WRITABLE, spec.ATTACH_NONE, False),
    ("raw_tracepoint", True, spec.PROG_TYPE_RAW_TRACEPOINT, spec.ATTACH_NONE, False),
    ("raw_tp.w", True, PROG_TYPE_RAW_TRACEPOINT_WRITABLE, spec.ATTACH_NONE, False),
    ("raw_tp", True, spec.PROG_TYPE_RAW_TRACEPOINT, spec.ATTACH_NONE, False),
    ("syscall", False, spec.PROG_TYPE_SYSCALL, spec.ATTACH_NONE, True),
    ("perf_event", False, PROG_TYPE_PERF_EVENT, spec.ATTACH_NONE, False),
    ("xdp", False, PROG_TYPE_XDP, ATTACH_XDP, False),
    ("tc", False, PROG_TYPE_SCHED_CLS, spec.ATTACH_NONE, False),
    ("classifier", False, PROG_TYPE_SCHED_CLS, spec.ATTACH_NONE, False),
    ("socket", False, PROG_TYPE_SOCKET_FILTER, spec.ATTACH_NONE, False),
)


def classify(section: str) -> ProgKind:
    """Classify a program section name (without its leading ``?``).

    ``struct_ops/NAME`` -> (STRUCT_OPS, attach_to "NAME"); ``tp_btf/sched_switch`` ->
    (TRACING, TRACE_RAW_TP, "sched_switch"); ``syscall`` -> (SYSCALL, sleepable). Also
    accepts libbpf's ``struct_ops+`` style (``+`` instead of ``/``) and bare prefixes.
    """
    for prefix, with_target, ptype, atype, sleepable in _TABLE:
        if section == prefix:
            return ProgKind(ptype, atype, "", sleepable)
        if with_target and len(section) > len(prefix) and section.startswith(prefix):
            sep = section[len(prefix)]
            if sep in "/+":
                return ProgKind(ptype, atype, section[len(prefix) + 1 :], sleepable)
        if not with_target and section.startswith(prefix + "/"):
            return ProgKind(ptype, atype, section[len(prefix) + 1 :], sleepable)
    return ProgKind(0, spec.ATTACH_NONE, "", False)
