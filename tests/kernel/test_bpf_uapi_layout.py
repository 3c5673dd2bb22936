"""The ctypes layouts match the C layout of include/uapi/linux/bpf.h.

Expected offsets were printed by gcc (offsetof) from the 6.18-era header; they are ABI and
never change, so a wrong ctypes field type or order fails here without a kernel."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from schedswitchd.kernel import bpf_uapi


def _off(cls: type[ctypes.Structure], *path: str) -> int:
    total = 0
    cur: Any = cls
    for name in path:
        total += getattr(cur, name).offset
        cur = {field[0]: field[1] for field in cur._fields_}[name]
    return total


@pytest.mark.parametrize(
    ("cls", "path", "offset"),
    [
        (bpf_uapi.MapCreateAttr, ("btf_vmlinux_value_type_id",), 60),
        (bpf_uapi.MapCreateAttr, ("map_extra",), 64),
        (bpf_uapi.MapCreateAttr, ("value_type_btf_obj_fd",), 72),
        (bpf_uapi.MapCreateAttr, ("map_token_fd",), 76),
        (bpf_uapi.MapElemAttr, ("flags",), 24),
        (bpf_uapi.ProgLoadAttr, ("prog_name",), 48),
        (bpf_uapi.ProgLoadAttr, ("line_info_cnt",), 104),
        (bpf_uapi.ProgLoadAttr, ("attach_btf_obj_fd",), 112),
        (bpf_uapi.ProgLoadAttr, ("fd_array",), 120),
        (bpf_uapi.ProgLoadAttr, ("core_relo_rec_size",), 136),
        (bpf_uapi.ProgLoadAttr, ("log_true_size",), 140),
        (bpf_uapi.ProgLoadAttr, ("prog_token_fd",), 144),
        (bpf_uapi.ProgLoadAttr, ("fd_array_cnt",), 148),
        (bpf_uapi.ObjAttr, ("path_fd",), 16),
        (bpf_uapi.TestRunAttr, ("ctx_out",), 56),
        (bpf_uapi.TestRunAttr, ("batch_size",), 72),
        (bpf_uapi.GetIdAttr, ("open_flags",), 8),
        (bpf_uapi.InfoAttr, ("info",), 8),
        (bpf_uapi.BtfLoadAttr, ("btf_flags",), 32),
        (bpf_uapi.BtfLoadAttr, ("btf_token_fd",), 36),
        (bpf_uapi.LinkCreateAttr, ("tail", "tracing", "cookie"), 24),
        (bpf_uapi.LinkCreateAttr, ("tail", "iter", "iter_info_len"), 24),
        (bpf_uapi.ProgBindMapAttr, ("flags",), 8),
        (bpf_uapi.RawTracepointOpenAttr, ("prog_fd",), 8),
        (bpf_uapi.RawTracepointOpenAttr, ("cookie",), 16),
        (bpf_uapi.IterCreateAttr, ("flags",), 4),
        (bpf_uapi.BpfProgInfo, ("name",), 64),
        (bpf_uapi.BpfProgInfo, ("netns_dev",), 88),
        (bpf_uapi.BpfProgInfo, ("run_cnt",), 200),
        (bpf_uapi.BpfProgInfo, ("verified_insns",), 216),
        (bpf_uapi.BpfProgInfo, ("attach_btf_id",), 224),
        (bpf_uapi.BpfMapInfo, ("btf_vmlinux_id",), 76),
        (bpf_uapi.BpfMapInfo, ("map_extra",), 80),
        (bpf_uapi.BpfLinkInfo, ("tail", "struct_ops", "map_id"), 16),
        (bpf_uapi.BpfLinkInfo, ("tail", "tracing", "cookie"), 32),
        (bpf_uapi.BpfLinkInfo, ("tail", "cgroup", "attach_type"), 24),
    ],
)
def test_offsets_match_uapi(
    cls: type[ctypes.Structure], path: tuple[str, ...], offset: int
) -> None:
    assert _off(cls, *path) == offset


def test_info_sizes_match_uapi() -> None:
    assert ctypes.sizeof(bpf_uapi.BpfProgInfo) == 232
    assert ctypes.sizeof(bpf_uapi.BpfBtfInfo) == 32
    assert ctypes.sizeof(bpf_uapi.BpfLinkInfo) == 64
    assert ctypes.sizeof(bpf_uapi.BpfFuncInfo) == 8
    assert ctypes.sizeof(bpf_uapi.BpfLineInfo) == 16
