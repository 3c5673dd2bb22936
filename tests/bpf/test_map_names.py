"""Kernel-visible map names: ``sanitize_name`` keeps what the kernel's ``bpf_obj_name_cpy``
accepts (ASCII letters, digits, ``_`` and ``.``), makes every other character ``_`` and
cuts the result to 15 bytes (``BPF_OBJ_NAME_LEN`` with its NUL)."""

from __future__ import annotations

import pytest

from schedswitchd.bpf.maps import sanitize_name


@pytest.mark.parametrize(
    ("name", "kernel"),
    [
        ("task_ctx", "task_ctx"),
        ("bss.data_1", "bss.data_1"),
        ("a-b c/d", "a_b_c_d"),
        ("ümlaut_€", "_mlaut__"),  # one "_" per character, not per byte
        ("very_long_map_name_x", "very_long_map_n"),
        ("", ""),
    ],
)
def test_sanitize_name(name: str, kernel: str) -> None:
    assert sanitize_name(name) == kernel
