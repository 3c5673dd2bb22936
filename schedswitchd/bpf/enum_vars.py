"""Enum variables: ``.rodata`` globals that stand for a kernel enumerator's load-time value.

sched_ext objects do not bake the kernel's enum constants in: scx's
``include/scx/enums.autogen.bpf.h`` declares ``const volatile u64 __SCX_DSQ_LOCAL __weak;``
and ``#define SCX_DSQ_LOCAL __SCX_DSQ_LOCAL`` (likewise ``__SCX_SLICE_DFL``,
``__SCX_ENQ_*``, ``__SCX_TASK_*`` ...), and the scheduler's own user space fills each one
before load from the running kernel's BTF (``SCX_ENUM_INIT`` in ``include/scx/enums.h``,
``scx_utils::enums`` in Rust, both through ``__COMPAT_read_enum``). Left at 0,
``SCX_DSQ_LOCAL`` is DSQ 0 and ``SCX_SLICE_DFL`` a zero slice, and the kernel ejects the
scheduler.

This module does the same generally, without a table of names: every non-static variable
of a ``.rodata*`` section whose name starts with one of the given prefixes (default
``__SCX_``) is filled with the value of the kernel BTF enumerator named like the variable
without its two leading underscores, looked up among *all* enumerators of the given BTF
(scx looks in a named enum type; in vmlinux those names are unique). Pure: the kernel BTF
is an argument; the loader (:func:`schedswitchd.kernel.loader.load_object`) calls it with
vmlinux by default. Variables the user assigned (``ObjectSpec.assigned``) are left alone.

scx also recovers 64-bit values from kernels whose BTF encodes 64-bit enums as truncated
8-byte ``BTF_KIND_ENUM`` (pahole < 1.24) from a table built into the scheduler; without such
a table a truncated value cannot be trusted, so an 8-byte ENUM (not ENUM64) is reported as
skipped rather than written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import INT_BOOL, Enum, Int, Kind
from schedswitchd.bpf.spec import MapKind, MapSpec, ObjectSpec, VariableSpec
from schedswitchd.errors import BtfError, CustomizationError

__all__ = [
    "DEFAULT_ENUM_PREFIXES",
    "EnumFill",
    "EnumFillReport",
    "enum_variables",
    "fill_enum_variables",
]

#: scx's enum variables (``include/scx/enums.autogen.bpf.h``).
DEFAULT_ENUM_PREFIXES: tuple[str, ...] = ("__SCX_",)


@dataclass(frozen=True, slots=True)
class EnumFill:
    """One variable written: ``variable`` in ``section`` got ``value`` (the value of
    enumerator ``enumerator`` of kernel enum ``enum_type``; ``""`` when anonymous), stored
    as the variable's own type (two's complement for a negative value)."""

    variable: str
    section: str
    enumerator: str
    enum_type: str
    value: int


@dataclass(frozen=True, slots=True)
class EnumFillReport:
    """What :func:`fill_enum_variables` did to an object's enum variables.

    ``filled``: the variables written; ``missing``: variables whose enumerator the kernel
    BTF lacks (left as compiled, normally 0 -- what scx's ``SCX_ENUM_SET`` leaves too);
    ``kept``: variables the user assigned (``ObjectSpec.assigned``), not touched;
    ``skipped``: ``(variable, reason)`` for ones that could not be written (not an integer
    type, ambiguous enumerator, value does not fit, truncated 64-bit enum).
    """

    filled: tuple[EnumFill, ...] = ()
    missing: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready form: ``{"set": {var: value}, "missing": [...], "kept": [...],
        "skipped": {var: reason}}``."""
        return {
            "set": {f.variable: f.value for f in self.filled},
            "missing": list(self.missing),
            "kept": list(self.kept),
            "skipped": dict(self.skipped),
        }

    def summary(self) -> str:
        """One line for logs and the CLI, e.g. ``set 12 (__SCX_DSQ_LOCAL=0x8000000000000002,
        ...); kernel lacks 2 (__SCX_TASK_IMMED, ...)``."""
        parts = []
        if self.filled:
            vals = ", ".join(f"{f.variable}={f.value:#x}" for f in self.filled)
            parts.append(f"set {len(self.filled)} ({vals})")
        if self.missing:
            parts.append(f"kernel lacks {len(self.missing)} ({', '.join(self.missing)})")
        if self.kept:
            parts.append(f"kept as assigned {len(self.kept)} ({', '.join(self.kept)})")
        if self.skipped:
            parts.append(
                f"skipped {len(self.skipped)} ("
                + ", ".join(f"{v}: {why}" for v, why in self.skipped)
                + ")"
            )
        return "; ".join(parts) or "no enum variables"


def _check_prefixes(prefixes: Iterable[str]) -> tuple[str, ...]:
    out = tuple(prefixes)
    for p in out:
        if not p.startswith("__") or len(p) < 3:
            raise CustomizationError(
                f"enum variable prefix {p!r} must start with '__' and name more than that "
                "(the enumerator is the variable's name without the two underscores)"
            )
    return out


def enum_variables(
    spec: ObjectSpec, prefixes: Iterable[str] = DEFAULT_ENUM_PREFIXES
) -> list[VariableSpec]:
    """The non-static ``.rodata*`` variables of ``spec`` whose names start with one of
    ``prefixes`` (each must start with ``__``), in map then offset order. Raises
    ``CustomizationError`` for a bad prefix."""
    return [v for _, v in _candidates(spec, prefixes)]


def _candidates(spec: ObjectSpec, prefixes: Iterable[str]) -> list[tuple[MapSpec, VariableSpec]]:
    pfx = _check_prefixes(prefixes)
    return [
        (m, v)
        for m in spec.maps
        if m.kind is MapKind.RODATA
        for v in sorted(m.variables, key=lambda v: v.offset)
        if not v.static and v.name.startswith(pfx)
    ]


def _int_slot(btf: Btf, type_id: int) -> tuple[int, bool] | None:
    """(size, signed) of an integer-like variable type, ``None`` for anything else."""
    try:
        t = btf.type(btf.skip_mods_and_typedefs(type_id))
    except BtfError:
        return None
    whole = isinstance(t, Int) and not t.offset and t.bits == 8 * t.size
    if isinstance(t, Int) and whole and not t.encoding & INT_BOOL and 1 <= t.size <= 8:
        return t.size, t.signed
    if isinstance(t, Enum) and 1 <= t.size <= 8:
        return t.size, t.signed
    return None


def _encode(value: int, size: int, signed: bool) -> bytes | None:
    bits = 8 * size
    lo = -(1 << (bits - 1))
    hi = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
    if not lo <= value <= hi:
        return None
    return (value & ((1 << bits) - 1)).to_bytes(size, "little")


def fill_enum_variables(
    spec: ObjectSpec, kernel: Btf, prefixes: Iterable[str] = DEFAULT_ENUM_PREFIXES
) -> tuple[ObjectSpec, EnumFillReport]:
    """``spec`` with its enum variables (see :func:`enum_variables`) set from ``kernel``'s
    enumerators, and what was done. A variable's enumerator is its name without the two
    leading underscores (``__SCX_DSQ_LOCAL`` -> ``SCX_DSQ_LOCAL``), searched among every
    ENUM/ENUM64 of ``kernel`` (its own types; pass vmlinux). Several enumerators of that
    name with different values make it ambiguous (skipped). Returns ``spec`` itself when
    nothing changed. Raises ``CustomizationError`` for a bad prefix; never for a variable
    (those are reported)."""
    cands = _candidates(spec, prefixes)
    if not cands or spec.btf is None:
        return spec, EnumFillReport()
    local = spec.btf
    todo = [(m, v) for m, v in cands if v.name not in spec.assigned]
    kept = tuple(v.name for _, v in cands if v.name in spec.assigned)
    hits = kernel.find_enumerators(v.name[2:] for _, v in todo)
    filled: list[EnumFill] = []
    missing: list[str] = []
    skipped: list[tuple[str, str]] = []
    datas: dict[str, bytearray] = {}
    for m, v in todo:
        enumerator = v.name[2:]
        found = hits.get(enumerator)
        if not found:
            missing.append(v.name)
            continue
        values = {val for _, val in found}
        if len(values) > 1:
            shown = ", ".join(f"{kernel.type_name(t) or t}={val:#x}" for t, val in found)
            skipped.append((v.name, f"ambiguous enumerator {enumerator} ({shown})"))
            continue
        tid, value = found[0]
        etype = kernel.type(tid)
        if etype.kind is Kind.ENUM and getattr(etype, "size", 4) == 8:
            skipped.append(
                (v.name, f"{enumerator} is in an 8-byte ENUM: the kernel BTF truncated it")
            )
            continue
        slot = _int_slot(local, v.type_id)
        if slot is None or slot[0] != v.size:
            skipped.append((v.name, "not an integer variable"))
            continue
        raw = _encode(value, *slot)
        if raw is None:
            skipped.append((v.name, f"{enumerator}={value:#x} does not fit {v.size} bytes"))
            continue
        if v.offset + v.size > m.value_size:
            skipped.append((v.name, f"lies outside {m.name}"))
            continue
        # the map's data may be a prefix (zeros after it): grown to this variable only
        buf = datas.setdefault(m.name, bytearray(m.data or b""))
        if len(buf) < v.offset + v.size:
            buf += bytes(v.offset + v.size - len(buf))
        buf[v.offset : v.offset + v.size] = raw
        filled.append(EnumFill(v.name, m.name, enumerator, kernel.type_name(tid), value))
    report = EnumFillReport(tuple(filled), tuple(missing), kept, tuple(skipped))
    if not datas:
        return spec, report
    maps = tuple(replace(m, data=bytes(datas[m.name])) if m.name in datas else m for m in spec.maps)
    return replace(spec, maps=maps), report
