"""The context struct of a program run with ``BPF_PROG_RUN`` (``SEC("syscall")`` programs).

A ``BPF_PROG_TYPE_SYSCALL`` program's only argument points at a context the caller lays out
in memory and passes as ``ctx_in`` (``bpf_prog_test_run_syscall`` in the kernel's
``net/bpf/test_run.c`` copies it in, runs the program and copies it back). The layout is the
program's own: the pointee struct of the first parameter of the program's ``FUNC_PROTO`` in
the object's BTF (``SEC("syscall") int prog(struct args *ctx)`` -> ``struct args``). This
module finds that struct and encodes a ``dict`` of member values into its bytes, the way
:func:`~schedswitchd.bpf.customize.encode_value` encodes global variables (same accepted
Python values per BTF kind; unnamed members and padding stay zero). Pure: no syscalls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Composite, Func, FuncProto, Kind, Ref
from schedswitchd.bpf.customize import encode_value
from schedswitchd.bpf.spec import ObjectSpec, ProgramSpec
from schedswitchd.errors import BtfError, CustomizationError

__all__ = ["ContextType", "context_type", "encode_context"]


@dataclass(frozen=True, slots=True)
class ContextType:
    """The context struct of a program: its BTF ``type_id`` in the object's BTF, ``name``
    (``""`` for an anonymous struct) and ``size`` in bytes."""

    type_id: int
    name: str
    size: int


def context_type(spec: ObjectSpec, prog: ProgramSpec) -> ContextType | None:
    """The struct ``prog``'s first argument points at, from the object's BTF (the program's
    ``FUNC`` -> ``FUNC_PROTO`` -> first parameter -> ``PTR`` -> struct/union, modifiers and
    typedefs skipped). ``None`` when the program takes no argument or a ``void *``/scalar
    pointer (it then reads no structured context). Raises
    :class:`~schedswitchd.errors.CustomizationError` when the object has no BTF for the
    program."""
    btf = spec.btf
    if btf is None or not prog.btf_func_id:
        raise CustomizationError(
            f"program {prog.name}: the object has no BTF FUNC for it (built without -g?), so "
            "its context layout is unknown"
        )
    try:
        func = btf.type(prog.btf_func_id)
        if not isinstance(func, Func):
            raise CustomizationError(f"program {prog.name}: BTF [{prog.btf_func_id}] is no FUNC")
        proto = btf.type(func.type)
        if not isinstance(proto, FuncProto):
            raise CustomizationError(f"program {prog.name}: its FUNC has no FUNC_PROTO")
        if not proto.params:
            return None
        ptr_id = btf.skip_mods_and_typedefs(proto.params[0].type)
        ptr = btf.type(ptr_id)
        if ptr.kind != Kind.PTR or not isinstance(ptr, Ref):
            return None
        target_id = btf.skip_mods_and_typedefs(ptr.type)
        target = btf.type(target_id)
        if not isinstance(target, Composite):
            return None
        return ContextType(target_id, target.name, target.size)
    except BtfError as exc:
        raise CustomizationError(f"program {prog.name}: unreadable BTF: {exc}") from exc


def _btf(spec: ObjectSpec) -> Btf:
    if spec.btf is None:  # context_type() already refused
        raise CustomizationError(f"object {spec.name} has no BTF")
    return spec.btf


def encode_context(
    spec: ObjectSpec, prog: ProgramSpec, values: Mapping[str, object] | None = None
) -> bytes:
    """The context bytes for running ``prog``: its context struct (see
    :func:`context_type`) zero-filled, then each ``values`` member (by BTF member name;
    nested structs as dicts, arrays as sequences, ``char[]`` as ``str``/``bytes``, enums
    by enumerator name or int) encoded over it. Little endian, exactly the struct's size.

    Raises :class:`~schedswitchd.errors.CustomizationError` naming the member for an
    unknown member, a value out of range or of the wrong kind, and when the program takes
    no struct context but ``values`` is not empty (an empty or ``None`` ``values`` then
    gives ``b""``)."""
    ctx = context_type(spec, prog)
    if ctx is None:
        if values:
            raise CustomizationError(
                f"program {prog.name}: its argument is not a struct pointer, so members "
                f"{', '.join(sorted(values))} cannot be laid out; pass the bytes instead"
            )
        return b""
    what = f"{prog.name} context {ctx.name or 'struct'}"
    return encode_value(_btf(spec), ctx.type_id, dict(values or {}), bytes(ctx.size), what)
