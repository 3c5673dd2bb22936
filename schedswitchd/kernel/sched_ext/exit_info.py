"""A sched_ext scheduler's own record of why it ended: the ``uei`` variable.

The kernel hands ``ops.exit`` a ``struct scx_exit_info`` (``kind``, ``exit_code``,
``reason``, ``msg``; ``include/linux/sched/ext.h``). Schedulers copy it into a global
variable in ``.data`` (``UEI_DEFINE(uei)`` / ``UEI_RECORD`` in scx's
``tools/sched_ext/include/scx/user_exit_info.h``, and in this repository's
``bpf/scx_common.bpf.h``) so that user space can read it from the data map after the kernel
disabled the scheduler. The layout is taken from the object's BTF by member name, so both
scx's ``struct user_exit_info`` and ours (which adds a ``recorded`` flag) decode:

* ``kind`` (int; ``enum scx_exit_kind``: 0 none, 64+ unregistered, 1024+ error),
* ``exit_code`` (s64), ``reason`` and ``msg`` (``char[]``, NUL terminated),
* optional ``recorded`` (int, non-zero once ``ops.exit`` ran).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Array, Int, Member
from schedswitchd.bpf.spec import MapKind, ObjectSpec
from schedswitchd.errors import BtfError

#: The variable name schedulers use (``UEI_DEFINE(uei)``).
UEI_VARIABLE = "uei"


@dataclass(frozen=True, slots=True)
class _Field:
    offset: int
    size: int
    signed: bool = False


@dataclass(frozen=True, slots=True)
class ScxExit:
    """A decoded exit record: ``kind`` (``enum scx_exit_kind``), ``exit_code``, and the
    kernel's ``reason`` and ``message`` strings."""

    kind: int
    exit_code: int
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class UeiLayout:
    """Where the exit record lives: data map ``map_name`` (an ELF section name such as
    ``.data``), the variable's ``offset``/``size`` in the map value, and its fields."""

    map_name: str
    offset: int
    size: int
    kind: _Field
    exit_code: _Field | None
    reason: _Field | None
    message: _Field | None
    recorded: _Field | None

    def decode(self, value: bytes) -> ScxExit | None:
        """Decode the exit record from the data map's value (key 0). ``None`` when it was
        never written (``recorded`` is 0, or ``kind`` is 0). Raises ``ValueError`` when
        ``value`` is too short for the variable."""
        if len(value) < self.offset + self.size:
            raise ValueError(
                f"data map value of {len(value)} bytes is too short for {UEI_VARIABLE} "
                f"at {self.offset}+{self.size}"
            )
        var = value[self.offset : self.offset + self.size]
        if self.recorded is not None and _int(var, self.recorded) == 0:
            return None
        kind = _int(var, self.kind)
        if kind == 0:
            return None
        return ScxExit(
            kind=kind,
            exit_code=_int(var, self.exit_code) if self.exit_code else 0,
            reason=_text(var, self.reason),
            message=_text(var, self.message),
        )


class UeiView:
    """The exit record read in place: a read-only shared mapping of its data map (which
    must be ``BPF_F_MMAPABLE``, as a data map with global variables is), so that whether
    ``ops.exit`` has written it is one memory read, no ``bpf(2)`` call. ``map_fd``: the
    data map (the mapping keeps the map alive until :meth:`close`); ``value_size``: its
    value's size, bytes. Raises ``OSError`` when the map cannot be mapped."""

    __slots__ = ("_kind", "_kind_zero", "_mm", "_rec_zero", "_recorded", "layout", "value_size")

    def __init__(self, layout: UeiLayout, map_fd: int, value_size: int) -> None:
        if value_size < layout.offset + layout.size:
            raise ValueError(
                f"data map value of {value_size} bytes is too short for {UEI_VARIABLE}"
            )
        self.layout = layout
        self.value_size = value_size
        self._mm: mmap.mmap | None = mmap.mmap(map_fd, value_size, mmap.MAP_SHARED, mmap.PROT_READ)
        kind = layout.kind
        self._kind = slice(layout.offset + kind.offset, layout.offset + kind.offset + kind.size)
        self._kind_zero = bytes(kind.size)
        rec = layout.recorded
        self._recorded = (
            slice(layout.offset + rec.offset, layout.offset + rec.offset + rec.size)
            if rec is not None
            else None
        )
        self._rec_zero = bytes(rec.size) if rec is not None else b""

    def empty(self) -> bool:
        """True while the record is unwritten (:meth:`UeiLayout.decode` would say ``None``:
        ``recorded`` is 0, or ``kind`` is). Raises ``ValueError`` once closed."""
        mm = self._mm
        if mm is None:
            raise ValueError("exit record view closed")
        if self._recorded is not None and mm[self._recorded] == self._rec_zero:
            return True
        return mm[self._kind] == self._kind_zero

    def record(self) -> ScxExit | None:
        """The record decoded from the mapping now (see :meth:`UeiLayout.decode`)."""
        if self._mm is None:
            raise ValueError("exit record view closed")
        return self.layout.decode(self._mm[: self.value_size])

    def close(self) -> None:
        """Unmap (idempotent)."""
        mm, self._mm = self._mm, None
        if mm is not None:
            mm.close()


def _int(buf: bytes, f: _Field) -> int:
    return int.from_bytes(buf[f.offset : f.offset + f.size], "little", signed=f.signed)


def _text(buf: bytes, f: _Field | None) -> str:
    if f is None:
        return ""
    raw = buf[f.offset : f.offset + f.size]
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")


def _field(btf: Btf, type_id: int, name: str, want: str) -> _Field | None:
    hit = btf.find_member(type_id, name)
    if hit is None:
        return None
    bit_off, member = hit
    if bit_off % 8 or member.bitfield_size:
        raise BtfError(f"{UEI_VARIABLE}.{name} is a bitfield")
    return _checked(btf, member, bit_off // 8, name, want)


def _checked(btf: Btf, member: Member, offset: int, name: str, want: str) -> _Field:
    t = btf.type(btf.skip_mods_and_typedefs(member.type))
    if want == "int":
        if not isinstance(t, Int) or t.size not in (1, 2, 4, 8):
            raise BtfError(f"{UEI_VARIABLE}.{name} is not an integer")
        return _Field(offset, t.size, t.signed)
    # "chars": an array of 1-byte integers
    if not isinstance(t, Array):
        raise BtfError(f"{UEI_VARIABLE}.{name} is not a char array")
    elem = btf.type(btf.skip_mods_and_typedefs(t.type))
    if not isinstance(elem, Int) or elem.size != 1:
        raise BtfError(f"{UEI_VARIABLE}.{name} is not a char array")
    return _Field(offset, t.nelems)


def uei_layout(spec: ObjectSpec, variable: str = UEI_VARIABLE) -> UeiLayout | None:
    """The exit record's layout in ``spec``, or ``None`` when the object has no such
    variable (or no BTF). Raises :class:`~schedswitchd.errors.BtfError` when the variable
    exists but its type lacks an integer ``kind`` or has mistyped fields."""
    if spec.btf is None:
        return None
    for m in spec.maps:
        if m.kind not in (MapKind.DATA, MapKind.BSS):
            continue
        var = m.variable(variable)
        if var is None or not var.type_id:
            continue
        btf = spec.btf
        kind = _field(btf, var.type_id, "kind", "int")
        if kind is None:
            raise BtfError(f"{spec.name}: {variable} has no 'kind' member")
        fields = (
            kind,
            _field(btf, var.type_id, "exit_code", "int"),
            _field(btf, var.type_id, "reason", "chars"),
            _field(btf, var.type_id, "msg", "chars"),
            _field(btf, var.type_id, "recorded", "int"),
        )
        for f in fields:
            if f is not None and f.offset + f.size > var.size:
                raise BtfError(f"{spec.name}: a member of {variable} lies outside it")
        return UeiLayout(m.name, var.offset, var.size, *fields)
    return None
