"""Our object spec against libbpf's view of the same objects (libbpf 1.1 through ctypes,
``bpf_object__open_file`` only: no kernel involved).

Compared: every map libbpf knows (name, type, key/value size, max_entries, flags) and every
program (name, section, type, expected attach type except struct_ops member indices,
autoload, instruction count of the entry function). Known, intended differences: libbpf
1.1 predates ``.struct_ops.link`` (it skips the section) and makes a map of the string
section that only ``.kmod_btfs`` points into (we do not).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import PROG_TYPE_STRUCT_OPS

Obj = Callable[[str], Path]
_KEEP: list[object] = []


@dataclass(frozen=True)
class _LMap:
    name: str
    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int


@dataclass(frozen=True)
class _LProg:
    name: str
    section: str
    type: int
    attach: int
    autoload: bool
    insns: int


def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("bpf")
    if name is None:
        pytest.skip("libbpf.so is not installed")
    lib = ctypes.CDLL(name, use_errno=True)
    vp, cp, u32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32
    for fn, res, args in [
        ("bpf_object__open_file", vp, [cp, vp]),
        ("bpf_object__close", None, [vp]),
        ("bpf_object__next_map", vp, [vp, vp]),
        ("bpf_object__next_program", vp, [vp, vp]),
        ("bpf_map__name", cp, [vp]),
        ("bpf_map__type", ctypes.c_int, [vp]),
        ("bpf_map__key_size", u32, [vp]),
        ("bpf_map__value_size", u32, [vp]),
        ("bpf_map__max_entries", u32, [vp]),
        ("bpf_map__map_flags", u32, [vp]),
        ("bpf_program__name", cp, [vp]),
        ("bpf_program__section_name", cp, [vp]),
        ("bpf_program__type", ctypes.c_int, [vp]),
        ("bpf_program__expected_attach_type", ctypes.c_int, [vp]),
        ("bpf_program__autoload", ctypes.c_bool, [vp]),
        ("bpf_program__insn_cnt", ctypes.c_size_t, [vp]),
    ]:
        f = getattr(lib, fn)
        f.restype, f.argtypes = res, args
    printer = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    quiet = printer(lambda _l, _f, _a: 0)
    _KEEP.append(quiet)
    lib.libbpf_set_print.argtypes = [printer]
    lib.libbpf_set_print.restype = vp
    lib.libbpf_set_print(quiet)
    return lib


def _walk(lib: ctypes.CDLL, obj: int, fn: str) -> Iterator[int]:
    it = getattr(lib, fn)(obj, None)
    while it:
        yield it
        it = getattr(lib, fn)(obj, it)


def _libbpf_view(path: Path) -> tuple[dict[str, _LMap], dict[str, _LProg]]:
    lib = _lib()
    obj = lib.bpf_object__open_file(str(path).encode(), None)
    if not obj:
        pytest.fail(f"libbpf cannot open {path}")
    try:
        maps = {}
        for m in _walk(lib, obj, "bpf_object__next_map"):
            lm = _LMap(
                lib.bpf_map__name(m).decode(),
                lib.bpf_map__type(m),
                lib.bpf_map__key_size(m),
                lib.bpf_map__value_size(m),
                lib.bpf_map__max_entries(m),
                lib.bpf_map__map_flags(m),
            )
            maps[lm.name] = lm
        progs = {}
        for p in _walk(lib, obj, "bpf_object__next_program"):
            lp = _LProg(
                lib.bpf_program__name(p).decode(),
                lib.bpf_program__section_name(p).decode(),
                lib.bpf_program__type(p),
                lib.bpf_program__expected_attach_type(p),
                bool(lib.bpf_program__autoload(p)),
                int(lib.bpf_program__insn_cnt(p)),
            )
            progs[lp.name] = lp
        return maps, progs
    finally:
        lib.bpf_object__close(obj)


@pytest.mark.parametrize(
    "name", ["maps", "globals", "subprogs", "ksyms", "kconfig", "struct_ops", "kmod_fixed"]
)
def test_maps_and_programs_match_libbpf(bpf_object: Obj, name: str) -> None:
    path = bpf_object(name)
    spec = open_object(path)
    lmaps, lprogs = _libbpf_view(path)
    ours = {}
    for m in spec.maps:
        if m.struct_ops is not None and m.struct_ops.link:
            continue  # libbpf 1.1 skips .struct_ops.link
        key = m.kernel_name if m.section_index >= 0 and m.struct_ops is None else m.name
        if m.kind.value == "kconfig":
            key = m.kernel_name
        ours[key] = _LMap(key, m.type, m.key_size, m.value_size, m.max_entries, m.flags)
    assert ours == lmaps
    for p in spec.programs:
        lp = lprogs.pop(p.name)
        # libbpf reports the section without its autoload-off "?"; we keep the ELF name
        assert (lp.section, lp.autoload) == (p.section.removeprefix("?"), p.autoload)
        if lp.type:  # libbpf 1.1 leaves sections it does not know (struct_ops.s/) untyped
            assert lp.type == p.prog_type
            # a struct_ops program's attach type is the kernel member index, which libbpf
            # resolves against vmlinux at open and our loader at load time
            if p.prog_type != PROG_TYPE_STRUCT_OPS:
                assert lp.attach == p.expected_attach_type
        entry = p.insn_count if not p.subprograms else (p.func_info[1].insn_idx)
        assert lp.insns == entry
    assert lprogs == {}


def test_kmod_string_section_differs_from_libbpf_by_design(bpf_object: Obj) -> None:
    lmaps, _ = _libbpf_view(bpf_object("kmod_ptrs"))
    assert list(lmaps) == [".rodata.str1.1"]  # libbpf: a read-only map of the names
    assert open_object(bpf_object("kmod_ptrs")).maps == ()
