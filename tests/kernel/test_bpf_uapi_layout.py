"""The ctypes layouts match the C layout of include/uapi/linux/bpf.h.

Expected offsets were printed by gcc (offsetof) from the 6.18-era header; they are ABI and
never change, so a wrong ctypes field type or order fails here without a kernel."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from schedswitchd.kernel import bpf_uapi as A


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
        (A.MapCreateAttr, ("btf_vmlinux_value_type_id",), 60),
        (A.MapCreateAttr, ("map_extra",), 64),
        (A.MapCreateAttr, ("value_type_btf_obj_fd",), 72),
        (A.MapCreateAttr, ("map_token_fd",), 76),
        (A.MapElemAttr, ("flags",), 24),
        (A.ProgLoadAttr, ("prog_name",), 48),
        (A.ProgLoadAttr, ("line_info_cnt",), 104),
        (A.ProgLoadAttr, ("attach_btf_obj_fd",), 112),
        (A.ProgLoadAttr, ("fd_array",), 120),
        (A.ProgLoadAttr, ("core_relo_rec_size",), 136),
        (A.ProgLoadAttr, ("log_true_size",), 140),
        (A.ProgLoadAttr, ("prog_token_fd",), 144),
        (A.ProgLoadAttr, ("fd_array_cnt",), 148),
        (A.ObjAttr, ("path_fd",), 16),
        (A.TestRunAttr, ("ctx_out",), 56),
        (A.TestRunAttr, ("batch_size",), 72),
        (A.GetIdAttr, ("open_flags",), 8),
        (A.InfoAttr, ("info",), 8),
        (A.BtfLoadAttr, ("btf_flags",), 32),
        (A.BtfLoadAttr, ("btf_token_fd",), 36),
        (A.LinkCreateAttr, ("tail", "tracing", "cookie"), 24),
        (A.LinkCreateAttr, ("tail", "iter", "iter_info_len"), 24),
        (A.ProgBindMapAttr, ("flags",), 8),
        (A.RawTracepointOpenAttr, ("prog_fd",), 8),
        (A.RawTracepointOpenAttr, ("cookie",), 16),
        (A.IterCreateAttr, ("flags",), 4),
        (A.BpfProgInfo, ("name",), 64),
        (A.BpfProgInfo, ("netns_dev",), 88),
        (A.BpfProgInfo, ("run_cnt",), 200),
        (A.BpfProgInfo, ("verified_insns",), 216),
        (A.BpfProgInfo, ("attach_btf_id",), 224),
        (A.BpfMapInfo, ("btf_vmlinux_id",), 76),
        (A.BpfMapInfo, ("map_extra",), 80),
        (A.BpfLinkInfo, ("tail", "struct_ops", "map_id"), 16),
        (A.BpfLinkInfo, ("tail", "tracing", "cookie"), 32),
        (A.BpfLinkInfo, ("tail", "cgroup", "attach_type"), 24),
    ],
)
def test_offsets_match_uapi(
    cls: type[ctypes.Structure], path: tuple[str, ...], offset: int
) -> None:
    assert _off(cls, *path) == offset


def test_info_sizes_match_uapi() -> None:
    assert ctypes.sizeof(A.BpfProgInfo) == 232
    assert ctypes.sizeof(A.BpfBtfInfo) == 32
    assert ctypes.sizeof(A.BpfLinkInfo) == 64
    assert ctypes.sizeof(A.BpfFuncInfo) == 8
    assert ctypes.sizeof(A.BpfLineInfo) == 16
