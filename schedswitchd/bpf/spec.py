"""The object spec: a compiled BPF ELF object described completely, without a kernel.

:func:`schedswitchd.bpf.object.open_object` builds an :class:`ObjectSpec`; the kernel
loader turns it into maps, programs and links in one pass. Every record here is immutable:
a frozen dataclass (:class:`ProgramSpec` links its code when first asked for it), or a
named tuple for the per-instruction records (:class:`Fixup`,
:class:`FuncInfo`, :class:`LineInfo`; a large scheduler's programs carry tens of
thousands), or :class:`ExtInfo`, which keeps a program's func_info and line_info
undecoded until its load; customisation (:mod:`schedswitchd.bpf.customize`) returns
edited copies.

Numbering conventions (from ``include/uapi/linux/bpf.h``): ``prog_type`` is a
``BPF_PROG_TYPE_*`` value, ``expected_attach_type`` a ``BPF_*`` attach type, map ``type``
a ``BPF_MAP_TYPE_*`` value. Instruction indices count 8-byte slots of the *linked*
program (:mod:`schedswitchd.bpf.insn`); sizes and offsets are in bytes.
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

from schedswitchd.bpf.core.relo import CoreRelo

if TYPE_CHECKING:
    from schedswitchd.bpf.btf.reader import Btf

# --- UAPI numbers used by the spec (include/uapi/linux/bpf.h) ------------------------------

MAP_TYPE_ARRAY = 2
MAP_TYPE_PROG_ARRAY = 3
MAP_TYPE_ARRAY_OF_MAPS = 12
MAP_TYPE_HASH_OF_MAPS = 13
MAP_TYPE_STRUCT_OPS = 26
MAP_TYPE_ARENA = 33

F_NO_PREALLOC = 1 << 0
F_NUMA_NODE = 1 << 2
F_RDONLY_PROG = 1 << 7
F_MMAPABLE = 1 << 10
F_LINK = 1 << 13

#: The largest value an ARRAY map may have, in bytes: ``array_map_alloc_check`` in the
#: kernel's ``kernel/bpf/arraymap.c`` refuses ``value_size > INT_MAX`` with ``E2BIG`` (it
#: was ``KMALLOC_MAX_SIZE`` before Linux 5.12). Data sections, ``.kconfig`` and resized
#: arrays beyond it are refused at open, before anything is allocated for them.
MAX_ARRAY_VALUE_SIZE = (1 << 31) - 1

PIN_NONE = 0
PIN_BY_NAME = 1

PROG_TYPE_KPROBE = 2
PROG_TYPE_TRACEPOINT = 5
PROG_TYPE_RAW_TRACEPOINT = 17
PROG_TYPE_TRACING = 26
PROG_TYPE_STRUCT_OPS = 27
PROG_TYPE_EXT = 28
PROG_TYPE_LSM = 29
PROG_TYPE_SYSCALL = 31

ATTACH_NONE = 0
ATTACH_TRACE_RAW_TP = 23
ATTACH_TRACE_FENTRY = 24
ATTACH_TRACE_FEXIT = 25
ATTACH_MODIFY_RETURN = 26
ATTACH_LSM_MAC = 27
ATTACH_TRACE_ITER = 28
ATTACH_STRUCT_OPS = 44


class MapKind(Enum):
    """Where a map comes from in the ELF file."""

    DECLARED = "declared"  #: a BTF-defined map in ``.maps``
    DATA = "data"  #: ``.data`` / ``.data.*``
    RODATA = "rodata"  #: ``.rodata`` / ``.rodata.*`` (frozen after load)
    BSS = "bss"  #: ``.bss`` / ``.bss.*`` (zero initialised)
    KCONFIG = "kconfig"  #: ``.kconfig`` externs, filled by the loader, frozen
    STRUCT_OPS = "struct_ops"  #: one variable of ``.struct_ops`` / ``.struct_ops.link``
    ARENA = "arena"  #: a ``BPF_MAP_TYPE_ARENA`` declared in ``.maps``


@dataclass(frozen=True, slots=True)
class VariableSpec:
    """A global variable inside a data section map.

    ``offset``/``size`` in bytes inside the map value; ``type_id`` is the variable's type in
    the object BTF (0 when the object has no BTF for it); ``static`` is true for ``static``
    or ``__hidden`` (STV_HIDDEN) variables, which user space should not touch.
    """

    name: str
    section: str
    offset: int
    size: int
    type_id: int
    static: bool


@dataclass(frozen=True, slots=True)
class StructOpsMember:
    """One member of a struct_ops variable's local struct type.

    ``offset``/``size`` in bytes in the local struct; ``program`` is the name of the
    program a function-pointer member is bound to (``None`` for scalars and unset
    pointers); ``is_func_ptr`` says whether the member is a function pointer.
    """

    name: str
    offset: int
    size: int
    type_id: int
    is_func_ptr: bool
    program: str | None


@dataclass(frozen=True, slots=True)
class StructOpsSpec:
    """A variable in a ``.struct_ops`` / ``.struct_ops.link`` section.

    ``type_name`` is the local struct's name (e.g. ``"tcp_congestion_ops"`` or
    ``"sched_ext_ops"``), ``type_id`` its id in the object BTF, ``data`` the variable's
    initial bytes in the *local* layout (function pointers are zero), ``link`` true for the
    ``.struct_ops.link`` form (map flag ``BPF_F_LINK``).
    """

    var_name: str
    section: str
    type_name: str
    type_id: int
    data: bytes
    link: bool
    members: tuple[StructOpsMember, ...]

    def member(self, name: str) -> StructOpsMember | None:
        """The member called ``name``, or ``None``."""
        for m in self.members:
            if m.name == name:
                return m
        return None


@dataclass(frozen=True, slots=True)
class MapSpec:
    """A map the loader must create, in creation order (``ObjectSpec.maps`` index = map index).

    ``name`` is the ELF name (variable name, or section name like ``".rodata"`` for data
    maps); ``kernel_name`` the name passed to ``BPF_MAP_CREATE`` (at most 15 bytes, libbpf's
    naming). ``key_type_id``/``value_type_id`` are object BTF ids (0 = none; for data maps
    ``value_type_id`` is the DATASEC). ``pinning`` is ``PIN_NONE``/``PIN_BY_NAME``.
    ``inner`` describes a map-in-map's inner map; ``init_slots`` the ``.values`` initialiser
    as ``(index, map or program name)`` pairs. ``data`` is the initial value of internal maps,
    or its first bytes: the rest up to ``value_size`` is zeros; ``None`` means all zeros
    (declared maps, ``.bss``, ``.kconfig`` before the loader fills it): a ``NOBITS`` section
    is never materialised, since the file does not hold it, and setting a variable in it
    grows ``data`` to that variable's end only.
    ``variables`` lists a data map's variables, ``struct_ops`` a struct_ops map's variable.
    ``section_index`` is the ELF section backing the map (data maps) or ``-1``;
    ``autocreate`` is false for maps of a ``?``-prefixed struct_ops section (created only
    when asked for).

    The arena map (``kind`` ARENA) carries the arena globals of ``.addr_space.1``:
    ``data_size`` is that section's size in bytes, ``data`` only its initialised prefix (up
    to the last non-zero byte; the rest is zeros, often megabytes, never copied) and
    ``variables`` its variables, at byte offsets from the arena's start.
    """

    name: str
    kernel_name: str
    kind: MapKind
    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int = 0
    map_extra: int = 0
    numa_node: int = 0
    key_type_id: int = 0
    value_type_id: int = 0
    pinning: int = PIN_NONE
    inner: MapSpec | None = None
    init_slots: tuple[tuple[int, str], ...] = ()
    data: bytes | None = None
    variables: tuple[VariableSpec, ...] = ()
    struct_ops: StructOpsSpec | None = None
    section: str = ".maps"
    section_index: int = -1
    autocreate: bool = True
    data_size: int = 0

    def variable(self, name: str) -> VariableSpec | None:
        """The variable called ``name`` in this data map, or ``None``."""
        for v in self.variables:
            if v.name == name:
                return v
        return None


class ExternKind(Enum):
    """What an extern symbol stands for."""

    KCONFIG = "kconfig"  #: ``__kconfig`` variable, value from the kernel config
    KSYM_VAR = "ksym_var"  #: ``__ksym`` variable (typed when ``type_id`` != 0)
    KFUNC = "kfunc"  #: ``__ksym`` function: a kfunc called from BPF


class KconfigType(Enum):
    """The storage class of a ``.kconfig`` extern (libbpf's ``kcfg_type``)."""

    BOOL = "bool"
    CHAR = "char"
    TRISTATE = "tristate"  #: ``enum libbpf_tristate`` (n=0, y=1, m=2)
    INT = "int"
    CHAR_ARRAY = "char_array"


@dataclass(frozen=True, slots=True)
class ExternSpec:
    """An undefined GLOBAL/WEAK symbol resolved by the loader.

    ``essential_name`` is ``name`` without its last ``___flavour``; ``btf_id`` the local
    VAR or FUNC id; ``type_id`` the VAR's type (0 for an untyped ``void`` ksym) or the
    FUNC's FUNC_PROTO id. Kconfig externs also carry ``offset``/``size`` inside the
    ``.kconfig`` map value, ``kconfig_type`` and, for ints, ``signed``.
    """

    name: str
    essential_name: str
    kind: ExternKind
    weak: bool
    btf_id: int
    type_id: int
    offset: int = 0
    size: int = 0
    kconfig_type: KconfigType | None = None
    signed: bool = False


class FixupKind(Enum):
    """What the kernel side must patch into a linked instruction."""

    #: ld_imm64 of a map: ``src_reg = BPF_PSEUDO_MAP_FD``, ``imm`` = fd of ``map_index``.
    MAP_FD = "map_fd"
    #: ld_imm64 of a map value address: ``src_reg = BPF_PSEUDO_MAP_VALUE``, ``imm`` = fd of
    #: ``map_index``; the second slot's ``imm`` already holds ``offset``. Used for global
    #: data, ``.kconfig`` externs (``extern`` set) and arena data.
    MAP_VALUE = "map_value"
    #: call of a kfunc ``extern``: ``src_reg = BPF_PSEUDO_KFUNC_CALL``, ``imm`` = BTF id,
    #: ``off`` = fd_array index; an unresolved weak kfunc is poisoned instead.
    KFUNC_CALL = "kfunc_call"
    #: ld_imm64 of a ksym ``extern``: typed -> ``src_reg = BPF_PSEUDO_BTF_ID``, imm = BTF id,
    #: second imm = module BTF fd (0 for vmlinux); kfunc address taken -> same with the FUNC
    #: id; unresolved weak -> both imm 0 and ``src_reg`` 0.
    KSYM = "ksym"


class Fixup(NamedTuple):
    """One kernel-side patch of a linked program instruction (see :class:`FixupKind`)."""

    kind: FixupKind
    insn_idx: int
    map_index: int = -1
    offset: int = 0
    extern: str = ""


class FuncInfo(NamedTuple):
    """``struct bpf_func_info`` with ``insn_idx`` in slots of the linked program."""

    insn_idx: int
    type_id: int


class LineInfo(NamedTuple):
    """``struct bpf_line_info``: ``file_name_off``/``line_off`` index the object BTF's
    strings; ``line_col`` is ``line << 10 | column``."""

    insn_idx: int
    file_name_off: int
    line_off: int
    line_col: int


class ExtPiece(NamedTuple):
    """The func_info or line_info records of one function copy in a linked program,
    undecoded: records ``lo`` to ``hi`` (exclusive) of ``words`` (a section's records as
    32-bit words, ``width`` per record, the first being ``insn_off`` in bytes from the
    section start; :class:`~schedswitchd.bpf.btf.ext.ExtRecords`). The record's
    instruction index in the linked program is ``insn_off // 8 + shift``."""

    words: array[int]
    width: int
    lo: int
    hi: int
    shift: int


#: ``_SLOTS(byte offset)`` is ``byte offset // 8``: the instruction slot of a byte offset.
_SLOTS = (8).__rfloordiv__


def _pack(pieces: Iterable[ExtPiece]) -> array[int]:
    """The records of ``pieces`` in order, each ``insn_off`` made the linked instruction
    index: a slice and two C-level maps per piece, no Python step per record."""
    out = array("I")
    for words, width, lo, hi, shift in pieces:
        part = words[lo * width : hi * width]
        part[0::width] = array("I", map(shift.__add__, map(_SLOTS, part[0::width])))
        out.extend(part)
    return out


class ExtInfo:
    """A linked program's func_info and line_info, kept as the ``.BTF.ext`` records of the
    functions placed in it (one :class:`ExtPiece` per function copy and kind) and decoded
    only when asked for -- at load (:meth:`func_info_bytes`, :meth:`line_info_bytes`), as
    libbpf builds them in ``bpf_object__relocate`` rather than at open: lavd's programs
    carry ~18k line_info records, which a cold open need not build. Immutable; compares
    (and hashes) by its decoded records."""

    __slots__ = ("_func", "_line")

    def __init__(self, func: tuple[ExtPiece, ...] = (), line: tuple[ExtPiece, ...] = ()) -> None:
        self._func = func
        self._line = line

    def func_info_bytes(self) -> bytes:
        """The program's ``struct bpf_func_info`` records (8 bytes each: ``insn_off`` in
        instruction slots of the linked program, ``type_id``; include/uapi/linux/bpf.h), in
        the host's byte order, as ``BPF_PROG_LOAD`` reads them."""
        return _pack(self._func).tobytes()

    def line_info_bytes(self) -> bytes:
        """The program's ``struct bpf_line_info`` records (16 bytes each: ``insn_off`` in
        slots, ``file_name_off``, ``line_off``, ``line_col``), host byte order."""
        return _pack(self._line).tobytes()

    def func_info(self) -> tuple[FuncInfo, ...]:
        """The func_info records, decoded (built anew at each call)."""
        w = _pack(self._func)
        return tuple(map(FuncInfo._make, zip(w[0::2], w[1::2], strict=True)))

    def line_info(self) -> tuple[LineInfo, ...]:
        """The line_info records, decoded (built anew at each call)."""
        w = _pack(self._line)
        return tuple(map(LineInfo._make, zip(w[0::4], w[1::4], w[2::4], w[3::4], strict=True)))

    def _key(self) -> tuple[bytes, bytes]:
        return self.func_info_bytes(), self.line_info_bytes()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExtInfo):
            return NotImplemented
        return self is other or self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        nf = sum(p.hi - p.lo for p in self._func)
        nl = sum(p.hi - p.lo for p in self._line)
        return f"ExtInfo({nf} func_info, {nl} line_info)"


#: A program without func_info or line_info.
NO_EXT_INFO = ExtInfo()


class LinkedCode(NamedTuple):
    """What linking an entry program with its subprograms gives (:class:`ProgramSpec`'s
    linked fields): ``insns`` (bytes), ``fixups``, ``ext_info``, ``core_relos`` indexed into
    ``insns``, ``subprograms`` (the appended ``.text`` functions' names, in order)."""

    insns: bytes
    fixups: tuple[Fixup, ...]
    ext_info: ExtInfo
    core_relos: tuple[CoreRelo, ...]
    subprograms: tuple[str, ...]


#: :class:`ProgramSpec`'s fields that linking computes (:class:`LinkedCode`'s).
_LINKED_FIELDS = frozenset(LinkedCode._fields)


@dataclass(frozen=True, slots=True)
class ProgramSpec:
    """An entry program, linked with the ``.text`` subprograms it calls.

    ``insns`` are the linked instruction bytes (entry first, then used subprograms);
    ``fixups`` the kernel-side patches; ``ext_info`` the func_info/line_info re-based to
    the linked instructions, built when asked for (:attr:`func_info`, :attr:`line_info`;
    the loader takes the packed records, 8 and 16 bytes each, for ``BPF_PROG_LOAD``);
    ``core_relos`` CO-RE relocations indexed into ``insns``. ``attach_to`` is the section
    suffix naming the attach target (``"sched_switch"`` for ``tp_btf/sched_switch``, the
    struct_ops member name for ``struct_ops/NAME``, ``""`` when none); ``autoload`` is false
    for ``?``-prefixed sections; ``subprograms`` names the appended ``.text`` functions in
    order.

    A program :func:`~schedswitchd.bpf.object.open_object` made is linked (its
    :class:`LinkedCode` fields computed) when one of them is first read -- directly, or
    through comparison, hashing, ``repr`` or ``dataclasses.replace`` -- or by :meth:`link`
    / :meth:`ObjectSpec.link_programs`, once: libbpf, too, links subprograms at load
    (``bpf_object__relocate``), not at open. Linking raises
    :class:`~schedswitchd.errors.ObjectError` for malformed code (a call into the middle of
    a function, a cut-off ``ld_imm64``, misaligned ``.BTF.ext`` records), at each read until
    the program is linked.
    """

    name: str
    section: str
    prog_type: int
    expected_attach_type: int
    attach_to: str
    sleepable: bool
    autoload: bool
    insns: bytes
    fixups: tuple[Fixup, ...] = ()
    ext_info: ExtInfo = NO_EXT_INFO
    core_relos: tuple[CoreRelo, ...] = ()
    subprograms: tuple[str, ...] = ()
    btf_func_id: int = 0
    #: computes the linked fields of a :meth:`deferred` program; ``None`` once they are set
    _link: Callable[[], LinkedCode] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @classmethod
    def deferred(
        cls,
        name: str,
        section: str,
        prog_type: int,
        expected_attach_type: int,
        attach_to: str,
        sleepable: bool,
        autoload: bool,
        btf_func_id: int,
        link: Callable[[], LinkedCode],
    ) -> ProgramSpec:
        """A program whose :class:`LinkedCode` fields ``link()`` computes when first
        needed (it may raise ``ObjectError``, then again at the next read). What
        :func:`~schedswitchd.bpf.object.open_object` builds."""
        self = cls.__new__(cls)
        init = object.__setattr__
        init(self, "name", name)
        init(self, "section", section)
        init(self, "prog_type", prog_type)
        init(self, "expected_attach_type", expected_attach_type)
        init(self, "attach_to", attach_to)
        init(self, "sleepable", sleepable)
        init(self, "autoload", autoload)
        init(self, "btf_func_id", btf_func_id)
        init(self, "_link", link)
        return self  # the linked fields' slots stay empty until linked

    def link(self) -> LinkedCode:
        """The linked fields, linking the program now if it is not yet. Raises
        :class:`~schedswitchd.errors.ObjectError` for malformed code (see the class)."""
        link = self._link
        if link is not None:
            code = link()
            init = object.__setattr__
            # Two threads may link at once: their results are equal, either may stay.
            for name, value in zip(LinkedCode._fields, code, strict=True):
                init(self, name, value)
            init(self, "_link", None)  # drops the linker's references
            return code
        return LinkedCode(self.insns, self.fixups, self.ext_info, self.core_relos, self.subprograms)

    @property
    def is_linked(self) -> bool:
        """Whether the linked fields are set (linking has run, or was not needed)."""
        return self._link is None

    if not TYPE_CHECKING:  # (for mypy every field is always there, as it is to readers)

        def __getattr__(self, name: str) -> object:
            # Called only for an empty slot: a linked field of a program not linked yet.
            if name in _LINKED_FIELDS and object.__getattribute__(self, "_link") is not None:
                return getattr(self.link(), name)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def func_info(self) -> tuple[FuncInfo, ...]:
        """The func_info records, decoded from :attr:`ext_info` (built at each access)."""
        return self.ext_info.func_info()

    @property
    def line_info(self) -> tuple[LineInfo, ...]:
        """The line_info records, decoded from :attr:`ext_info` (built at each access)."""
        return self.ext_info.line_info()

    @property
    def insn_count(self) -> int:
        """Number of 8-byte instruction slots in :attr:`insns`."""
        return len(self.insns) // 8


@dataclass(frozen=True, slots=True)
class ObjectSpec:
    """A whole BPF object.

    ``name`` is the file name up to its first dot (libbpf's object name); ``btf`` the
    object's own BTF after libbpf-style fix-ups (DATASEC sizes and offsets, extern VARs),
    ready for ``BPF_BTF_LOAD`` through ``btf.raw`` (``None`` if the object has no ``.BTF``).
    ``maps`` are in creation order; fixups refer to them by index. ``kmod_btfs`` are the
    module names declared in ``.kmod_btfs`` (``None`` when the section is absent, which
    means "search every module" -- unlike an empty tuple, "no modules"). ``assigned``
    names the global variables that customisation gave a value
    (:func:`~schedswitchd.bpf.customize.set_variable`): the loader's defaults (the
    enum-variable fill of :mod:`schedswitchd.bpf.enum_vars`) never overwrite those.
    """

    name: str
    license: str
    kern_version: int
    btf: Btf | None
    programs: tuple[ProgramSpec, ...]
    maps: tuple[MapSpec, ...]
    externs: tuple[ExternSpec, ...] = ()
    kmod_btfs: tuple[str, ...] | None = None
    assigned: frozenset[str] = frozenset()

    def link_programs(self) -> ObjectSpec:
        """Link every program now, in program order (see :class:`ProgramSpec`), and return
        this spec: what the daemon does at open, so that a malformed object is refused
        there, as :func:`~schedswitchd.bpf.object.open_object` did when it linked eagerly.
        Raises :class:`~schedswitchd.errors.ObjectError` for the first program that does
        not link."""
        # The cyclic collector is held off for the whole loop, as open_object holds it off
        # for the open (each program's linking does too): the programs' fixups and record
        # pieces are tens of thousands of small tuples and no cycles, and collections
        # between programs walked what the programs before had built (docs/performance.md,
        # cold open).
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            for p in self.programs:
                p.link()
        finally:
            if paused:
                gc.enable()
        return self

    def program(self, name: str) -> ProgramSpec:
        """The program called ``name``; ``KeyError`` if absent."""
        for p in self.programs:
            if p.name == name:
                return p
        raise KeyError(name)

    def map(self, name: str) -> MapSpec:
        """The map called ``name`` (ELF name); ``KeyError`` if absent."""
        for m in self.maps:
            if m.name == name:
                return m
        raise KeyError(name)

    def map_index(self, name: str) -> int:
        """Index of the map called ``name`` in :attr:`maps`; ``KeyError`` if absent."""
        for i, m in enumerate(self.maps):
            if m.name == name:
                return i
        raise KeyError(name)

    def extern(self, name: str) -> ExternSpec:
        """The extern called ``name``; ``KeyError`` if absent."""
        for e in self.externs:
            if e.name == name:
                return e
        raise KeyError(name)

    @property
    def struct_ops_maps(self) -> tuple[MapSpec, ...]:
        """The STRUCT_OPS maps, in map order."""
        return tuple(m for m in self.maps if m.kind is MapKind.STRUCT_OPS)
