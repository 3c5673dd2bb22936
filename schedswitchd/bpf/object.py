"""``open_object``: a compiled BPF ELF object -> :class:`~schedswitchd.bpf.spec.ObjectSpec`.

Pure (no syscalls, no kernel facts). The order follows libbpf's ``bpf_object_open``: read
the ELF, collect externs, fix up the object BTF, read ``.BTF.ext``, find programs, build
maps (``.maps``, data sections, ``.kconfig``, struct_ops), classify relocations, and read
``license``, ``version`` and ``.kmod_btfs``. The sections and their order follow libbpf's
``bpf_object__open`` (``src/libbpf.c``). Each entry program is linked with its subprograms
when its code is first read (:class:`~schedswitchd.bpf.spec.ProgramSpec`), as libbpf links
at load (``bpf_object__relocate``) rather than at open; the daemon links every program
right after opening (:meth:`~schedswitchd.bpf.spec.ObjectSpec.link_programs`, in
:class:`~schedswitchd.kernel.spec_cache.SpecCache`).
"""

from __future__ import annotations

import gc
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import BinaryIO

from schedswitchd.bpf.btf.ext import BtfExt, parse_btf_ext
from schedswitchd.bpf.btf.fixup import fixup_object_btf
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Array, Datasec, Kind, Var
from schedswitchd.bpf.elf import ElfObject, read_elf
from schedswitchd.bpf.embedded import is_program, select_object
from schedswitchd.bpf.externs import collect_externs
from schedswitchd.bpf.kmod_btfs import SECTION, parse_fixed, parse_pointers
from schedswitchd.bpf.maps import (
    data_maps,
    data_section_kind,
    datasec_variables,
    declared_maps,
    kconfig_map,
)
from schedswitchd.bpf.object_file import OBJECT_FILE, open_object_file
from schedswitchd.bpf.progtypes import classify
from schedswitchd.bpf.spec import (
    PROG_TYPE_STRUCT_OPS,
    ExternKind,
    LinkedCode,
    MapKind,
    MapSpec,
    ObjectSpec,
    ProgramSpec,
    VariableSpec,
)
from schedswitchd.bpf.struct_ops import struct_ops_maps
from schedswitchd.bpf.subprogs import (
    Function,
    Linker,
    classify_relocs,
    collect_functions,
)
from schedswitchd.errors import BtfError, ObjectError, unreadable

ARENA_SEC = ".addr_space.1"

__all__ = ["open_object", "open_object_noted"]


def _object_name(path: str) -> str:
    base = os.path.basename(path)
    return base.split(".", 1)[0] or base


def open_object(
    source: str | os.PathLike[str] | bytes | BinaryIO, *, name: str | None = None
) -> ObjectSpec:
    """Open a BPF object from a path, its bytes, or a file opened for binary reading.

    A path may also name an executable that embeds the object (an installed scheduler
    built with a libbpf-rs skeleton): see :mod:`schedswitchd.bpf.embedded`, and
    :func:`open_object_noted` for the note saying which embedded object was used.
    ``name`` defaults to the file name up to its first dot (``"maps"`` for
    ``maps.bpf.o``; ``"obj"`` for bytes or a file). From a path or file only the headers,
    tables and the sections the spec keeps are read: not the DWARF, not the zeros of arena
    globals (``.addr_space.1``, megabytes in scx schedulers). Raises :class:`ObjectError`
    for any malformed or unsupported part of the ELF file (naming the section, symbol or
    offset) and :class:`~schedswitchd.errors.BtfError` for malformed ``.BTF``; never
    anything else for bad input. An unreadable path raises ``ObjectError`` naming it.
    Programs are linked when first used: malformed code (a call into the middle of a
    function, a cut-off ``ld_imm64``, misaligned ``.BTF.ext`` records) raises
    ``ObjectError`` from that use, or from :meth:`ObjectSpec.link_programs
    <schedswitchd.bpf.spec.ObjectSpec.link_programs>`, named as open's errors are.
    """
    return open_object_noted(source, name=name)[0]


def open_object_noted(
    source: str | os.PathLike[str] | bytes | BinaryIO, *, name: str | None = None
) -> tuple[ObjectSpec, str | None]:
    """:func:`open_object`, plus a note naming the embedded object used when ``source``
    (a path or file) is an executable (``None`` for a plain BPF object). Raises as
    :func:`open_object`, and ``ObjectError`` for an executable that embeds no BPF object."""
    with _collector_paused():
        return _open_source(source, name)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Hold off Python's cyclic garbage collector while an object is opened: an open builds
    tens of thousands of small tuples (lavd: ~18k line_info records, ~4k fixups) and no
    cycles, and the collections they triggered -- each walking the young objects built so
    far -- were a third of lavd's open. The objects are examined once, by the first
    collection after the open. Left alone when the collector is off already (another thread
    opening, or the application's choice)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _open_source(
    source: str | os.PathLike[str] | bytes | BinaryIO, name: str | None
) -> tuple[ObjectSpec, str | None]:
    if isinstance(source, bytes):
        return _open(_read(source), name or "obj", None), None
    if not isinstance(source, str | os.PathLike):
        return _open_file(source, name or "obj", "object", None)
    path = os.fspath(source)
    file = open_object_file(path)  # raises ObjectError naming the path
    try:
        with file as f:
            return _open_file(f, name or _object_name(path), path, path)
    except OSError as exc:
        why = unreadable(exc, OBJECT_FILE)
        raise ObjectError(f"cannot read BPF object {path!r}: {why}") from exc
    except (ObjectError, BtfError) as exc:  # name the file: callers open many
        if str(exc).startswith(path):
            raise
        raise type(exc)(f"{path}: {exc}") from exc


def _open_file(
    f: BinaryIO, obj_name: str, what: str, where: str | None
) -> tuple[ObjectSpec, str | None]:
    """An executable embedding the object is read whole and the object cut out of it;
    a plain object is read from the file (only what the spec keeps). ``where`` (the path,
    or ``None``) prefixes the errors of deferred linking."""
    start = f.tell()
    head = f.read(64)
    f.seek(start)
    if is_program(head):
        data, note = select_object(f.read(), what)
        return _open(_read(data), obj_name, where), note
    return _open(_read(f), obj_name, where), None


def _read(source: bytes | BinaryIO) -> ElfObject:
    try:
        return read_elf(source)
    except OSError as exc:  # a read error in the middle of the file
        raise ObjectError(f"cannot read the object: {exc}") from exc


def _open(elf: ElfObject, obj_name: str, where: str | None) -> ObjectSpec:
    btf_sec = elf.section_by_name(".BTF")
    orig_btf = Btf.from_bytes(btf_sec.data, name=obj_name) if btf_sec is not None else None
    externs, kconfig_size = collect_externs(elf, orig_btf)
    btf: Btf | None = None
    if orig_btf is not None:
        kcfg = {e.name: (e.offset, e.size) for e in externs if e.kind is ExternKind.KCONFIG}
        fixed = fixup_object_btf(orig_btf, elf, kcfg, kconfig_size)
        btf = Btf.patched(fixed, orig_btf, name=obj_name)
    ext: BtfExt | None = None
    ext_sec = elf.section_by_name(".BTF.ext")
    if ext_sec is not None and btf is not None:
        ext = parse_btf_ext(ext_sec.data, btf.string)

    functions = collect_functions(elf)
    text = elf.section_by_name(".text")
    text_index = text.index if text is not None else -1
    text_funcs = {f.first: f for f in functions.get(text_index, [])}
    entries: list[Function] = [
        f for idx in sorted(functions) if idx != text_index for f in functions[idx]
    ]
    by_start = {(f.section.index, f.offset): f.name for f in entries}

    # --- maps, in libbpf's creation order -------------------------------------------------
    try:
        declared = declared_maps(elf, btf)
    except BtfError as exc:
        raise ObjectError(f"malformed BTF in .maps: {exc}") from exc
    maps: list[MapSpec] = [m for m, _ in declared]
    maps_sec = elf.section_by_name(".maps")
    maps_offsets = {off: i for i, (_, off) in enumerate(declared)}
    arena_idx = next((i for i, m in enumerate(maps) if m.kind is MapKind.ARENA), None)
    arena_sec = elf.section_by_name(ARENA_SEC)
    arena: tuple[int, int] | None = None
    if arena_sec is not None:
        if arena_idx is None:
            raise ObjectError(f"{ARENA_SEC} holds arena globals but no arena map is declared")
        arena = (arena_sec.index, arena_idx)
        from dataclasses import replace

        # read_elf kept only the initialised prefix of the section: the rest is zeros
        maps[arena_idx] = replace(
            maps[arena_idx],
            data=arena_sec.data,
            data_size=arena_sec.size,
            variables=datasec_variables(btf, ARENA_SEC)[1],
            section=ARENA_SEC,
            section_index=arena_sec.index,
        )

    skip = _kmod_only_sections(elf, btf)
    data_map_index: dict[int, int] = {}
    for m in data_maps(elf, btf, obj_name):
        if m.section_index in skip:
            continue
        data_map_index[m.section_index] = len(maps)
        maps.append(m)
    kconfig_idx = -1
    kcfg_ext = [e for e in externs if e.kind is ExternKind.KCONFIG]
    if kcfg_ext:
        kconfig_idx = len(maps)
        kvars = tuple(
            VariableSpec(e.name, ".kconfig", e.offset, e.size, e.type_id, False) for e in kcfg_ext
        )
        maps.append(kconfig_map(btf, obj_name, kconfig_size, kvars))
    try:
        maps.extend(struct_ops_maps(elf, btf, lambda s, o: by_start.get((s, o))))
    except BtfError as exc:
        raise ObjectError(f"malformed BTF in struct_ops: {exc}") from exc

    # --- programs ---------------------------------------------------------------------------
    relos = classify_relocs(
        elf,
        text_index,
        maps_offsets,
        maps_sec.index if maps_sec is not None else -1,
        data_map_index,
        arena,
        kconfig_idx,
        {e.name: e for e in externs},
    )
    programs = []
    linker = Linker(text_funcs, relos, ext)
    for f in entries:
        sec_name = f.section.name
        kind = classify(sec_name.removeprefix("?"))
        programs.append(
            ProgramSpec.deferred(
                f.name,
                sec_name,
                kind.prog_type,
                kind.expected_attach_type,
                kind.attach_to,
                kind.sleepable,
                not sec_name.startswith("?"),
                (btf.find(f.name, Kind.FUNC) or 0) if btf is not None else 0,
                partial(_link, linker, f, where),
            )
        )
    kinds = {p.name: p.prog_type for p in programs}
    for m in maps:
        if m.struct_ops is None:
            continue
        for member in m.struct_ops.members:
            if member.program is not None and kinds.get(member.program) != PROG_TYPE_STRUCT_OPS:
                raise ObjectError(
                    f"struct_ops {m.name}.{member.name} is bound to {member.program!r}, which "
                    "is not a struct_ops program"
                )

    return ObjectSpec(
        name=obj_name,
        license=_license(elf),
        kern_version=_version(elf),
        btf=btf,
        programs=tuple(programs),
        maps=tuple(maps),
        externs=externs,
        kmod_btfs=_kmod_btfs(elf, btf),
    )


def _link(linker: Linker, entry: Function, where: str | None) -> LinkedCode:
    """Link ``entry`` (a program's deferred linking, see :class:`ProgramSpec`); its errors
    name the file as :func:`open_object`'s do (``where``: the path, or ``None``)."""
    try:
        with _collector_paused():  # as at open: thousands of small tuples, no cycles
            return linker.link(entry)
    except ObjectError as exc:
        if where is None or str(exc).startswith(where):
            raise
        raise ObjectError(f"{where}: {exc}") from exc


def _license(elf: ElfObject) -> str:
    sec = elf.section_by_name("license")
    if sec is None:
        return ""
    return sec.data.split(b"\0", 1)[0].decode("utf-8", "replace")


def _version(elf: ElfObject) -> int:
    sec = elf.section_by_name("version")
    if sec is None:
        return 0
    if len(sec.data) != 4:
        raise ObjectError(f"'version' section is {len(sec.data)} bytes, not 4")
    return int(struct.unpack("<I", sec.data)[0])


def _kmod_only_sections(elf: ElfObject, btf: Btf | None) -> set[int]:
    """String sections (``.rodata.str1.1``) referenced only by ``.kmod_btfs`` pointers: they
    carry module names for the loader, not data for programs, so no map is made for them."""
    kmod = elf.section_by_name(SECTION)
    if kmod is None or kmod.index not in elf.relocs:
        return set()
    targets = {elf.symbol(r.sym).shndx for r in elf.relocs[kmod.index]}
    used = set()
    for sec_idx, relocs in elf.relocs.items():
        if sec_idx == kmod.index or elf.section(sec_idx).name.startswith(".debug"):
            continue
        for r in relocs:
            if 0 <= r.sym < len(elf.symbols):
                used.add(elf.symbols[r.sym].shndx)
    out = set()
    for idx in targets - used:
        if not 0 < idx < len(elf.sections):
            continue
        name = elf.sections[idx].name
        has_btf = btf is not None and btf.find(name, Kind.DATASEC) is not None
        if data_section_kind(name) is not None and not has_btf:
            out.add(idx)
    return out


def _kmod_btfs(elf: ElfObject, btf: Btf | None) -> tuple[str, ...] | None:
    sec = elf.section_by_name(SECTION)
    if sec is None:
        return None
    relocs = elf.relocs.get(sec.index, ())
    if relocs:
        targets: dict[int, tuple[int, int]] = {}
        for r in relocs:
            sym = elf.symbol(r.sym)
            if r.offset % 8 or r.offset + 8 > len(sec.data):
                raise ObjectError(
                    f"{SECTION}: relocation at offset {r.offset} is not a pointer slot"
                )
            targets[r.offset] = (sym.shndx, sym.value)

        def read_string(sec_idx: int, off: int) -> bytes:
            if not 0 < sec_idx < len(elf.sections):
                raise ObjectError(f"{SECTION}: pointer into section {sec_idx}, out of range")
            data = elf.sections[sec_idx].data
            if not 0 <= off < len(data):
                raise ObjectError(
                    f"{SECTION}: pointer to offset {off} of {elf.sections[sec_idx].name!r} "
                    "is out of range"
                )
            return data[off:]

        return parse_pointers(sec.data, targets, read_string)
    return parse_fixed(sec.data, _kmod_entry_size(btf))


def _kmod_entry_size(btf: Btf | None) -> int | None:
    """``N`` of ``char name[][N]`` from the ``.kmod_btfs`` DATASEC, when the BTF says so."""
    if btf is None:
        return None
    try:
        ds_id = btf.find(SECTION, Kind.DATASEC)
        if ds_id is None:
            return None
        ds = btf.type(ds_id)
        assert isinstance(ds, Datasec)
        if len(ds.vars) != 1:
            return None
        var = btf.type(ds.vars[0].type)
        if not isinstance(var, Var):
            return None
        outer = btf.type(btf.skip_mods_and_typedefs(var.type))
        if not isinstance(outer, Array):
            return None
        inner = btf.type(btf.skip_mods_and_typedefs(outer.type))
        if isinstance(inner, Array) and btf.size_of(inner.type) == 1:
            return inner.nelems
    except BtfError:
        return None
    return None
