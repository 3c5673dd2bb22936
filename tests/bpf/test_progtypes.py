"""Section names -> program type, expected attach type, target and sleepable (libbpf's
``section_defs``), and which of them the loader auto-attaches and how
(:func:`schedswitchd.kernel.prog_attach.attach_mode`). Pure: no kernel."""

from __future__ import annotations

from dataclasses import replace

import pytest

from schedswitchd.bpf.progtypes import classify
from schedswitchd.bpf.spec import ProgramSpec
from schedswitchd.kernel import bpf_uapi
from schedswitchd.kernel.prog_attach import AttachMode, attach_mode

P, T = bpf_uapi.ProgType, bpf_uapi.AttachType

_BASE = ProgramSpec("p", "", 0, 0, "", False, True, b"")


def _prog(section: str) -> ProgramSpec:
    kind = classify(section.removeprefix("?"))
    return replace(
        _BASE,
        section=section,
        prog_type=kind.prog_type,
        expected_attach_type=kind.expected_attach_type,
        attach_to=kind.attach_to,
        sleepable=kind.sleepable,
        autoload=not section.startswith("?"),
    )


@pytest.mark.parametrize(
    ("section", "ptype", "atype", "target", "sleepable", "mode"),
    [
        ("fentry/bpf_scx_reg", P.TRACING, T.TRACE_FENTRY, "bpf_scx_reg", False, AttachMode.LINK),
        ("fentry.s/f", P.TRACING, T.TRACE_FENTRY, "f", True, AttachMode.LINK),
        ("fexit/mod:f", P.TRACING, T.TRACE_FEXIT, "mod:f", False, AttachMode.LINK),
        ("fmod_ret/f", P.TRACING, T.MODIFY_RETURN, "f", False, AttachMode.LINK),
        ("tp_btf/sched_switch", P.TRACING, T.TRACE_RAW_TP, "sched_switch", False, AttachMode.LINK),
        ("lsm/file_open", P.LSM, T.LSM_MAC, "file_open", False, AttachMode.LINK),
        ("iter/task", P.TRACING, T.TRACE_ITER, "task", False, AttachMode.ITER),
        ("iter.s/task", P.TRACING, T.TRACE_ITER, "task", True, AttachMode.ITER),
        ("raw_tp/sys_enter", P.RAW_TRACEPOINT, 0, "sys_enter", False, AttachMode.RAW_TP),
        ("raw_tracepoint/x", P.RAW_TRACEPOINT, 0, "x", False, AttachMode.RAW_TP),
        ("raw_tp.w/x", P.RAW_TRACEPOINT_WRITABLE, 0, "x", False, AttachMode.RAW_TP),
        ("raw_tp", P.RAW_TRACEPOINT, 0, "", False, AttachMode.NONE),
        (
            "tp/sched/sched_switch",
            P.TRACEPOINT,
            0,
            "sched/sched_switch",
            False,
            AttachMode.TRACEPOINT,
        ),
        ("tracepoint/syscalls/x", P.TRACEPOINT, 0, "syscalls/x", False, AttachMode.TRACEPOINT),
        ("kprobe/do_nanosleep", P.KPROBE, 0, "do_nanosleep", False, AttachMode.KPROBE),
        ("kretprobe/f", P.KPROBE, 0, "f", False, AttachMode.KPROBE),
        ("kprobe", P.KPROBE, 0, "", False, AttachMode.NONE),
        ("kprobe.multi/f*", P.KPROBE, T.TRACE_KPROBE_MULTI, "f*", False, AttachMode.UNSUPPORTED),
        ("kretprobe.multi/f", P.KPROBE, T.TRACE_KPROBE_MULTI, "f", False, AttachMode.UNSUPPORTED),
        ("ksyscall/getpid", P.KPROBE, 0, "getpid", False, AttachMode.UNSUPPORTED),
        ("uprobe//bin/sh:main", P.KPROBE, 0, "/bin/sh:main", False, AttachMode.UNSUPPORTED),
        ("usdt/x", P.KPROBE, 0, "x", False, AttachMode.UNSUPPORTED),
        ("syscall", P.SYSCALL, 0, "", True, AttachMode.NONE),
        ("struct_ops/enqueue", P.STRUCT_OPS, 0, "enqueue", False, AttachMode.NONE),
        ("xdp", P.XDP, T.XDP, "", False, AttachMode.NONE),
        ("?tp_btf/sched_switch", P.TRACING, T.TRACE_RAW_TP, "sched_switch", False, AttachMode.LINK),
    ],
)
def test_section_table(
    section: str, ptype: int, atype: int, target: str, sleepable: bool, mode: AttachMode
) -> None:
    p = _prog(section)
    assert (p.prog_type, p.expected_attach_type, p.attach_to, p.sleepable) == (
        ptype,
        atype,
        target,
        sleepable,
    )
    assert attach_mode(p) is mode
