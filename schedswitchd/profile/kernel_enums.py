"""Enumerator values from a BTF (the kernel's), for ``kernel_enum()``/``kernel_has()``.

The kernel's enum constants (``SCX_DSQ_LOCAL``, ``SCX_OPS_ENQ_LAST``, ``SCX_KICK_IDLE``,
...) are not a fixed ABI: scx's ``compat.h`` reads them from vmlinux BTF at load time, and
so does a profile. One scan of the BTF's ``ENUM``/``ENUM64`` types builds the table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Enum, Kind

__all__ = ["EnumTable", "enum_table"]

EnumTable = Callable[[str], "int | None"]


def enum_table(btfs: Iterable[Btf]) -> dict[str, int]:
    """Every enumerator name -> value in ``btfs`` (the first BTF holding a name wins:
    pass vmlinux first). Raises :class:`~schedswitchd.errors.BtfError` on malformed BTF."""
    out: dict[str, int] = {}
    for btf in btfs:
        for tid in btf.own_ids():
            if btf.kind(tid) not in (Kind.ENUM, Kind.ENUM64):
                continue
            t = btf.type(tid)
            assert isinstance(t, Enum)
            for ev in t.values:
                out.setdefault(ev.name, ev.value)
    return out
