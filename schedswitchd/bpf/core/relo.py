"""CO-RE relocation records, shared by the object model (which reads them from
``.BTF.ext``) and the CO-RE engine (which resolves them).

Source: ``include/uapi/linux/bpf.h`` (``enum bpf_core_relo_kind``, ``struct
bpf_core_relo``) and kernel doc ``Documentation/bpf/llvm_reloc.rst`` (CO-RE section).
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


class CoreReloKind(IntEnum):
    """``enum bpf_core_relo_kind``."""

    FIELD_BYTE_OFFSET = 0
    FIELD_BYTE_SIZE = 1
    FIELD_EXISTS = 2
    FIELD_SIGNED = 3
    FIELD_LSHIFT_U64 = 4
    FIELD_RSHIFT_U64 = 5
    TYPE_ID_LOCAL = 6
    TYPE_ID_TARGET = 7
    TYPE_EXISTS = 8
    TYPE_SIZE = 9
    ENUMVAL_EXISTS = 10
    ENUMVAL_VALUE = 11
    TYPE_MATCHES = 12


class CoreRelo(NamedTuple):
    """One CO-RE relocation of a program.

    ``insn_idx`` is the instruction slot (8-byte units) in the *linked* program's
    instructions that the relocation patches; ``type_id`` the root type in the object's
    own (local) BTF; ``access`` the access string (``"0:1:2"``), already resolved from the
    ``.BTF`` string section; ``kind`` what to compute. A named tuple, not a dataclass:
    linking builds one per relocation per program that pulls the function in, at every
    open.
    """

    insn_idx: int
    type_id: int
    access: str
    kind: CoreReloKind
