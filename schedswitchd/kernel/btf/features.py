"""Which BTF kinds the running kernel accepts, probed by loading tiny BTF blobs.

An object's BTF is sanitised before ``BPF_BTF_LOAD`` only for what the kernel lacks (kinds
were added over releases: FUNC 5.0, DATASEC/VAR 5.2, global FUNC linkage 5.6, FLOAT 5.13,
DECL_TAG 5.16, TYPE_TAG 5.17, ENUM64 6.0; libbpf probes the same way in
``src/features.c``). Each probe loads a minimal BTF using the feature with
``BPF_BTF_LOAD``: success means supported, ``EINVAL``/``E2BIG`` means not. The result is
computed once per process (:func:`btf_features`).
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable
from dataclasses import dataclass, fields

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.types import FUNC_GLOBAL, FUNC_STATIC, VAR_STATIC
from schedswitchd.errors import BpfSyscallError
from schedswitchd.kernel.syscall import btf_load


def probe_btf(raw: bytes) -> bool:
    """Whether the kernel accepts the BTF ``raw``: ``False`` for ``EINVAL``/``E2BIG``
    (unknown kind, bad layout); other failures (e.g. ``EPERM``) raise
    :class:`BpfSyscallError` because they say nothing about the feature."""
    try:
        with btf_load(raw, log_size_start=4096, log_size_max=4096):
            return True
    except BpfSyscallError as e:
        if e.errno in (errno.EINVAL, errno.E2BIG):
            return False
        raise


def _with_int(add: Callable[[BtfBuilder, int], object]) -> bytes:
    b = BtfBuilder()
    add(b, b.add_int("int", 4, signed=True))
    return b.build()


def _func(linkage: int) -> bytes:
    return _with_int(lambda b, i: b.add_func("x", b.add_func_proto(i, [("a", i)]), linkage))


def _datasec(name: str) -> bytes:
    return _with_int(lambda b, i: b.add_datasec(name, 4, [(b.add_var("x", i, VAR_STATIC), 0, 4)]))


def _float() -> bytes:
    b = BtfBuilder()
    b.add_float("float", 4)
    return b.build()


def _decl_tag() -> bytes:
    return _with_int(lambda b, i: b.add_decl_tag("tag", b.add_var("x", i, VAR_STATIC)))


def _type_tag() -> bytes:
    return _with_int(lambda b, i: b.add_ptr(b.add_type_tag("tag", i)))


def _enum64() -> bytes:
    b = BtfBuilder()
    b.add_enum64("e", 8, [("E_BIG", 1 << 40)])
    return b.build()


@dataclass(frozen=True, slots=True)
class BtfFeatures:
    """One flag per probed BTF feature (``True`` = the kernel accepts it)."""

    func: bool
    func_global: bool
    datasec: bool
    qmark_datasec: bool  # DATASEC names starting with '?' (libbpf's optional sections)
    float: bool
    decl_tag: bool
    type_tag: bool
    enum64: bool

    def missing(self) -> tuple[str, ...]:
        """Names of the unsupported features (empty on a modern kernel)."""
        return tuple(f.name for f in fields(self) if not getattr(self, f.name))


#: The probe blob of each feature, by :class:`BtfFeatures` field name.
PROBES: dict[str, Callable[[], bytes]] = {
    "func": lambda: _func(FUNC_STATIC),
    "func_global": lambda: _func(FUNC_GLOBAL),
    "datasec": lambda: _datasec(".data"),
    "qmark_datasec": lambda: _datasec("?.data"),
    "float": _float,
    "decl_tag": _decl_tag,
    "type_tag": _type_tag,
    "enum64": _enum64,
}


def probe_btf_features() -> BtfFeatures:
    """Run every probe now (about 8 ``BPF_BTF_LOAD`` calls)."""
    return BtfFeatures(**{name: probe_btf(make()) for name, make in PROBES.items()})


@functools.cache
def btf_features() -> BtfFeatures:
    """:func:`probe_btf_features`, computed once per process."""
    return probe_btf_features()
