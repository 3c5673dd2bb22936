"""Object BTF fix-ups the kernel's ``BPF_BTF_LOAD`` needs (libbpf's ``btf_fixup_datasec``
and the extern handling of ``bpf_object__collect_externs``).

clang leaves some of the object's BTF for the loader to finish:

* DATASEC ``size`` is 0 and global VAR offsets may be 0: sizes come from the ELF section,
  those offsets from the symbol table; the kernel also wants entries sorted by offset.
  Static and extern VARs keep the offsets clang or the linker gave them, and a DATASEC
  whose size the linker (``bpftool gen object``) already set keeps all its offsets, as in
  libbpf's ``btf_fixup_datasec``.
* variables with ``STV_HIDDEN``/``STV_INTERNAL`` visibility become ``BTF_VAR_STATIC``.
* extern VARs (linkage ``BTF_VAR_GLOBAL_EXTERN``) are refused by the kernel: ``.kconfig``
  ones become allocated variables at their offset in the ``.kconfig`` map; ``.ksyms`` ones
  become 4-byte ``int`` variables at increasing offsets.
* a DATASEC may only list VARs, so kfunc FUNCs in ``.ksyms`` are replaced by one added
  dummy VAR; FUNC_PROTO parameters without a name (``void f(int)``) get that VAR's name,
  since the kernel refuses unnamed parameters of a FUNC; the kernel also refuses
  ``BTF_FUNC_EXTERN`` linkage, so those FUNCs become global.
* global subprograms with hidden visibility get static FUNC linkage.
* a zero-size DATASEC (an empty ``.kmod_btfs``) gets size 1: the kernel refuses size 0.

Source of the record layout: kernel doc ``Documentation/bpf/btf.rst``. The result is new raw
BTF bytes; type ids are unchanged and new types (an ``int`` if none exists, the dummy VAR)
are appended after the object's last type.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import (
    FUNC_GLOBAL,
    FUNC_STATIC,
    VAR_GLOBAL_ALLOCATED,
    VAR_GLOBAL_EXTERN,
    VAR_STATIC,
    Datasec,
    Func,
    Int,
    Kind,
    Var,
)
from schedswitchd.bpf.elf import (
    STB_GLOBAL,
    STB_WEAK,
    STT_FUNC,
    STT_SECTION,
    STV_HIDDEN,
    STV_INTERNAL,
    ElfObject,
)
from schedswitchd.errors import BtfError, ObjectError

KSYMS_SEC = ".ksyms"
KCONFIG_SEC = ".kconfig"
DUMMY_KSYM_NAME = "dummy_ksym"

_U32 = struct.Struct("<I")
_PARAM = struct.Struct("<II")  # struct btf_param: name_off, type
_HDR = struct.Struct("<HBBIIIII")


def fixup_object_btf(
    btf: Btf,
    elf: ElfObject,
    kconfig_offsets: Mapping[str, tuple[int, int]],
    kconfig_size: int,
) -> bytes:
    """Return fixed-up raw BTF for ``btf`` (the object's ``.BTF``).

    ``kconfig_offsets`` maps a ``.kconfig`` extern's name to ``(offset, size)`` in the
    ``.kconfig`` map value of ``kconfig_size`` bytes. Raises :class:`ObjectError` when a
    DATASEC names an ELF section whose variables cannot be placed, ``BtfError`` for
    malformed BTF.
    """
    raw = bytearray(btf.raw)
    _, _, _, hdr_len, type_off, type_len, str_off, str_len = _HDR.unpack_from(raw)
    types = bytearray(raw[hdr_len + type_off : hdr_len + type_off + type_len])
    orig_strings = bytes(raw[hdr_len + str_off : hdr_len + str_off + str_len])
    strings = bytearray(orig_strings)
    tbase = hdr_len + type_off
    new_types: list[bytes] = []
    next_id = btf.end_id

    def put(type_id: int, field: int, value: int) -> None:
        _U32.pack_into(types, btf.type_offset(type_id) - tbase + field, value)

    sections = {s.name: s for s in elf.sections if s.name}
    symbols: dict[tuple[int, str], tuple[int, int]] = {}
    for sym in elf.symbols:
        # only GLOBAL/WEAK symbols name a global VAR (libbpf's find_elf_var_sym); local ones
        # are statics, whose names may repeat
        if sym.name and sym.type != STT_SECTION and sym.bind in (STB_GLOBAL, STB_WEAK):
            symbols[(sym.shndx, sym.name)] = (sym.value, sym.visibility)

    int_id: int | None = None
    dummy_id: int | None = None
    dummy_name_off = 0

    def need_int() -> int:
        nonlocal int_id, next_id
        if int_id is None:
            for tid in btf.own_ids_of_kind(Kind.INT):
                t = btf.type(tid)
                if isinstance(t, Int) and t.size == 4 and t.bits == 32 and t.offset == 0:
                    int_id = tid
                    break
        if int_id is None:
            name_off = len(strings)
            strings.extend(b"int\0")
            # INT: name, info (kind INT), size 4, encoding SIGNED | offset 0 | bits 32
            new_types.append(struct.pack("<IIII", name_off, int(Kind.INT) << 24, 4, (1 << 24) | 32))
            int_id = next_id
            next_id += 1
        return int_id

    def need_dummy() -> tuple[int, int]:
        nonlocal dummy_id, dummy_name_off, next_id
        if dummy_id is None:
            itype = need_int()
            dummy_name_off = len(strings)
            strings.extend(DUMMY_KSYM_NAME.encode() + b"\0")
            new_types.append(
                struct.pack(
                    "<IIII", dummy_name_off, int(Kind.VAR) << 24, itype, VAR_GLOBAL_ALLOCATED
                )
            )
            dummy_id = next_id
            next_id += 1
        return dummy_id, dummy_name_off

    for tid in btf.own_ids_of_kind(Kind.DATASEC):
        ds = btf.type(tid)
        assert isinstance(ds, Datasec)
        entries: list[tuple[int, int, int]] = []
        if ds.name == KSYMS_SEC:
            for i, vsi in enumerate(ds.vars):
                kind = btf.kind(vsi.type)
                if kind == Kind.FUNC:
                    did, dname = need_dummy()
                    _name_params(btf, vsi.type, dname, types, tbase, orig_strings)
                    _set_linkage(btf, vsi.type, FUNC_GLOBAL, types, tbase)
                    entries.append((did, 4 * i, 4))
                elif kind == Kind.VAR:
                    put(vsi.type, 8, need_int())
                    put(vsi.type, 12, VAR_GLOBAL_ALLOCATED)
                    entries.append((vsi.type, 4 * i, 4))
                else:
                    raise ObjectError(f".ksyms DATASEC lists type {vsi.type} of kind {kind.name}")
            size = 4 * len(ds.vars)
        elif ds.name == KCONFIG_SEC:
            for vsi in ds.vars:
                if btf.kind(vsi.type) != Kind.VAR:
                    raise ObjectError(f".kconfig DATASEC lists type {vsi.type}, not a VAR")
                name = btf.type_name(vsi.type)
                if name not in kconfig_offsets:
                    raise ObjectError(f".kconfig variable {name!r} has no extern symbol")
                off, sz = kconfig_offsets[name]
                put(vsi.type, 12, VAR_GLOBAL_ALLOCATED)
                entries.append((vsi.type, off, sz))
            size = kconfig_size
        else:
            sec = sections.get(ds.name)
            if sec is None:
                continue  # libbpf leaves DATASECs of absent sections alone too
            # clang leaves the DATASEC size 0 and global VARs at offset 0; `bpftool gen
            # object` (libbpf's linker) fills both in, so a non-zero size means the offsets
            # are final. Static and extern VARs keep their offsets either way: their names
            # need not be unique (a static `hits` in two linked files, bpf_printk's `____fmt`
            # in shared headers), so a symbol lookup by name would put them all at one offset.
            fixup_offsets = ds.size == 0
            for vsi in ds.vars:
                off = vsi.offset
                var = btf.type(vsi.type)
                if isinstance(var, Var) and var.linkage not in (VAR_STATIC, VAR_GLOBAL_EXTERN):
                    hit = symbols.get((sec.index, var.name))
                    if hit is not None:
                        sym_off, vis = hit
                        if fixup_offsets:
                            off = sym_off
                        if vis in (STV_HIDDEN, STV_INTERNAL):
                            put(vsi.type, 12, VAR_STATIC)
                if off + vsi.size > sec.size:
                    raise ObjectError(
                        f"variable {btf.type_name(vsi.type)!r} at offset {off} (+{vsi.size}) "
                        f"does not fit section {ds.name!r} of {sec.size} bytes"
                    )
                entries.append((vsi.type, off, vsi.size))
            size = sec.size
        entries.sort(key=lambda e: e[1])
        base = btf.type_offset(tid) - tbase
        # The kernel refuses zero-size DATASECs and entries; an empty section (``.kmod_btfs``
        # with no names, a zero-length array) gets no map, so size 1 only passes the checker.
        entries = [(t, off, sz or 1) for t, off, sz in entries]
        size = max([size, 1, *(off + sz for _, off, sz in entries)])
        _U32.pack_into(types, base + 8, size)
        for i, (t, off, sz) in enumerate(entries):
            struct.pack_into("<III", types, base + 12 + 12 * i, t, off, sz)

    # Hidden global subprograms are static for the verifier (libbpf's mark_btf_static):
    # they are verified with their caller, not on their own.
    text = sections.get(".text")
    if text is not None:
        hidden = {
            sym.name
            for sym in elf.symbols
            if sym.type == STT_FUNC
            and sym.shndx == text.index
            and sym.bind == STB_GLOBAL
            and sym.visibility in (STV_HIDDEN, STV_INTERNAL)
        }
        for name in sorted(hidden):
            for fid in btf.find_ids(name, Kind.FUNC):
                fn = btf.type(fid)
                if isinstance(fn, Func) and fn.linkage == FUNC_GLOBAL:
                    _set_linkage(btf, fid, FUNC_STATIC, types, tbase)

    out_types = bytes(types) + b"".join(new_types)
    header = _HDR.pack(0xEB9F, 1, 0, 24, 0, len(out_types), len(out_types), len(strings))
    return header + out_types + bytes(strings)


def _set_linkage(btf: Btf, func_id: int, linkage: int, types: bytearray, tbase: int) -> None:
    off = btf.type_offset(func_id) - tbase + 4
    (info,) = _U32.unpack_from(types, off)
    _U32.pack_into(types, off, (info & ~0xFFFF) | linkage)


def _name_params(
    btf: Btf, func_id: int, name_off: int, types: bytearray, tbase: int, strings: bytes
) -> None:
    """Give the unnamed parameters of FUNC ``func_id``'s FUNC_PROTO the name at
    ``name_off`` in ``types`` (all but a trailing ``void``: varargs). The prototype is
    read from ``btf``'s records as they are (kfuncs may share one), not decoded: a
    scheduler declares tens of kfuncs, whose prototypes nothing else reads at open;
    ``strings`` is ``btf``'s own string section."""
    func = btf.type(func_id)
    if not isinstance(func, Func):
        raise BtfError(f"type {func_id} is not a FUNC", where=f"type id {func_id}")
    if btf.kind(func.type) is not Kind.FUNC_PROTO:
        raise BtfError(f"FUNC {func.name!r} has no FUNC_PROTO", where=f"type id {func_id}")
    at = btf.type_offset(func.type)
    raw = btf.raw
    (info,) = _U32.unpack_from(raw, at + 4)
    vlen = info & 0xFFFF
    base = at - tbase
    for i, (p_name, p_type) in enumerate(_PARAM.iter_unpack(raw[at + 12 : at + 12 + 8 * vlen])):
        if p_name >= len(strings):
            btf.string(p_name)  # raises BtfError: past the object's string section
        # unnamed: offset 0, or an offset of the empty string
        if strings[p_name] == 0 and not (p_type == 0 and i == vlen - 1):
            _U32.pack_into(types, base + 12 + 8 * i, name_off)
