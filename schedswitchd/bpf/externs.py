"""Extern symbols: ``__kconfig`` variables and ``__ksym`` variables/kfuncs.

An extern is an undefined GLOBAL or WEAK ``STT_NOTYPE`` symbol; the object's BTF lists it
in the ``.kconfig`` or ``.ksyms`` DATASEC, which says what it is (libbpf's
``bpf_object__collect_externs``). ``.kconfig`` externs are laid out in the ``.kconfig``
map: sorted by alignment (descending), then size (ascending), then name, each at the next
offset aligned to its alignment; the map value is as long as the last one's end.
"""

from __future__ import annotations

from dataclasses import replace

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import (
    INT_BOOL,
    Array,
    BtfType,
    Datasec,
    Enum,
    Func,
    Int,
    Kind,
    Var,
    essential_name,
)
from schedswitchd.bpf.elf import SHN_UNDEF, STB_WEAK, ElfObject
from schedswitchd.bpf.spec import MAX_ARRAY_VALUE_SIZE, ExternKind, ExternSpec, KconfigType
from schedswitchd.errors import BtfError, ObjectError

KSYMS_SEC = ".ksyms"
KCONFIG_SEC = ".kconfig"
#: The largest ``.kconfig`` char array, in bytes: a value comes from one line of the
#: kernel's config, which libbpf reads into a ``PATH_MAX`` (4096-byte) buffer, so a longer
#: array holds nothing but zeros after it; refused at open rather than made a map of that
#: size (a 7 KB object could otherwise ask for a gigabyte).
MAX_KCONFIG_ARRAY = 4096


def _kconfig_type(btf: Btf, type_id: int, name: str) -> tuple[KconfigType, bool]:
    """(storage class, signed) of a ``.kconfig`` extern's type (libbpf's find_kcfg_type).

    An array is one level deep: its element must be a char, so an array of arrays (or one
    whose BTF names itself as its element type) is refused without walking further."""
    t = btf.type(btf.skip_mods_and_typedefs(type_id))
    if isinstance(t, Array):
        elem = btf.type(btf.skip_mods_and_typedefs(t.type))
        found = None if isinstance(elem, Array) else _scalar_kconfig_type(elem, name)
        if found is not None and found[0] is KconfigType.CHAR and t.nelems > 0:
            return KconfigType.CHAR_ARRAY, False
        raise ObjectError(f"kconfig extern {name!r} has an unsupported type (type id {type_id})")
    found = _scalar_kconfig_type(t, name)
    if found is None:
        raise ObjectError(f"kconfig extern {name!r} has an unsupported type (type id {type_id})")
    return found


def _scalar_kconfig_type(t: BtfType, name: str) -> tuple[KconfigType, bool] | None:
    """(storage class, signed) of a non-array ``.kconfig`` type, ``None`` if unsupported."""
    if isinstance(t, Int):
        if t.offset or t.bits != 8 * t.size:
            raise ObjectError(f"kconfig extern {name!r} is a bitfield-like integer")
        if t.size == 1:
            # libbpf: every 1-byte integer that is not bool is a char
            if t.encoding & INT_BOOL:
                return KconfigType.BOOL, False
            return KconfigType.CHAR, t.signed
        if t.size in (2, 4, 8):
            return KconfigType.INT, t.signed
    elif isinstance(t, Enum) and (t.kind, t.size, t.name) == (Kind.ENUM, 4, "libbpf_tristate"):
        return KconfigType.TRISTATE, False
    return None


def collect_externs(elf: ElfObject, btf: Btf | None) -> tuple[tuple[ExternSpec, ...], int]:
    """All externs of the object and the ``.kconfig`` map value size in bytes.

    Order: ``.kconfig`` externs in map layout order, then ``.ksyms`` externs by name.
    ``btf`` is the object's BTF *before* :mod:`.btf.fixup` (extern VAR types intact).
    Raises :class:`ObjectError` for an extern with no BTF entry or an unsupported type, a
    ``.kconfig`` extern over :data:`MAX_KCONFIG_ARRAY` bytes, and a ``.kconfig`` map larger
    than :data:`~schedswitchd.bpf.spec.MAX_ARRAY_VALUE_SIZE`.
    """
    syms = [s for s in elf.symbols if s.shndx == SHN_UNDEF and s.is_extern]
    if not syms:
        return (), 0
    if btf is None:
        raise ObjectError(f"extern {syms[0].name!r} needs BTF, but the object has no .BTF")
    entries: dict[str, tuple[str, int]] = {}
    try:
        for tid in btf.own_ids_of_kind(Kind.DATASEC):
            sec_name = btf.type_name(tid)
            if sec_name not in (KSYMS_SEC, KCONFIG_SEC):
                continue
            ds = btf.type(tid)
            assert isinstance(ds, Datasec)
            for vsi in ds.vars:
                entries[btf.type_name(vsi.type)] = (sec_name, vsi.type)
        kconfig: list[tuple[int, int, ExternSpec]] = []
        ksyms: list[ExternSpec] = []
        for sym in syms:
            hit = entries.get(sym.name)
            if hit is None:
                raise ObjectError(
                    f"extern {sym.name!r} is not in the .ksyms or .kconfig DATASEC of the BTF"
                )
            sec_name, btf_id = hit
            weak = sym.bind == STB_WEAK
            ess = essential_name(sym.name)
            t = btf.type(btf_id)
            if sec_name == KCONFIG_SEC:
                if not isinstance(t, Var):
                    raise ObjectError(f"kconfig extern {sym.name!r} is not a variable")
                ktype, signed = _kconfig_type(btf, t.type, sym.name)
                size = btf.size_of(t.type)
                if size > MAX_KCONFIG_ARRAY:
                    raise ObjectError(
                        f"kconfig extern {sym.name!r} is {size} bytes: a kernel config value "
                        f"is at most {MAX_KCONFIG_ARRAY} (one line of the config)"
                    )
                align = max(1, btf.align_of(t.type))
                ext = ExternSpec(
                    name=sym.name,
                    essential_name=ess,
                    kind=ExternKind.KCONFIG,
                    weak=weak,
                    btf_id=btf_id,
                    type_id=t.type,
                    size=size,
                    kconfig_type=ktype,
                    signed=signed,
                )
                kconfig.append((align, size, ext))
            elif isinstance(t, Func):
                ksyms.append(ExternSpec(sym.name, ess, ExternKind.KFUNC, weak, btf_id, t.type))
            elif isinstance(t, Var):
                target = btf.skip_mods_and_typedefs(t.type)
                ksyms.append(ExternSpec(sym.name, ess, ExternKind.KSYM_VAR, weak, btf_id, target))
            else:
                raise ObjectError(f"ksym extern {sym.name!r} is neither a variable nor a function")
    except BtfError as exc:
        raise ObjectError(f"extern BTF is malformed: {exc}") from exc
    kconfig.sort(key=lambda e: (-e[0], e[1], e[2].name))
    off = 0
    laid: list[ExternSpec] = []
    for align, size, ext in kconfig:
        off = (off + align - 1) // align * align
        laid.append(replace(ext, offset=off))
        off += size
        if off > MAX_ARRAY_VALUE_SIZE:
            # The sizes come from the object's BTF (an array of 2**32-1 chars is valid BTF);
            # the kernel would refuse such a map value anyway (E2BIG).
            raise ObjectError(
                f"kconfig extern {ext.name!r} ends at byte {off} of the .kconfig map: over "
                f"the kernel's array map value limit of {MAX_ARRAY_VALUE_SIZE} bytes"
            )
    ksyms.sort(key=lambda e: e.name)
    return tuple(laid) + tuple(ksyms), off
