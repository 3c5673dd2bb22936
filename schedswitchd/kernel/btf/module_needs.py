"""The names an object needs from module BTFs: everything it looks up that vmlinux lacks.

libbpf consults module BTFs for a kfunc or typed ksym extern, a struct_ops type, a tracing
attach target or a CO-RE relocation's root type only when vmlinux has no match
(``src/libbpf.c``: ``bpf_object__resolve_ksym_*``, ``find_struct_ops_kern_types``,
``find_kernel_btf_id``, ``bpf_core_find_cands``). Collecting all of them before loading
lets one module walk answer them together (see
:class:`~schedswitchd.kernel.btf.module_memo.LookupMemo`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Kind, essential_name
from schedswitchd.bpf.core.relo import CoreReloKind
from schedswitchd.bpf.core.relocate import CandidateCache
from schedswitchd.bpf.spec import ExternKind, ObjectSpec
from schedswitchd.errors import BtfError, CoreError
from schedswitchd.kernel import bpf_uapi
from schedswitchd.kernel.btf.module_memo import ModuleLookup
from schedswitchd.kernel.struct_ops.value import VALUE_PREFIX

#: Tracing attach types whose ``attach_to`` names a kernel BTF type: (kind, name prefix);
#: the loader resolves ``attach_to`` with this same table.
TRACING_TARGETS: dict[int, tuple[Kind, str]] = {
    bpf_uapi.AttachType.TRACE_FENTRY: (Kind.FUNC, ""),
    bpf_uapi.AttachType.TRACE_FEXIT: (Kind.FUNC, ""),
    bpf_uapi.AttachType.MODIFY_RETURN: (Kind.FUNC, ""),
    bpf_uapi.AttachType.TRACE_RAW_TP: (Kind.TYPEDEF, "btf_trace_"),
    bpf_uapi.AttachType.TRACE_ITER: (Kind.FUNC, "bpf_iter_"),
    bpf_uapi.AttachType.LSM_MAC: (Kind.FUNC, "bpf_lsm_"),
}


@dataclass(slots=True)
class ObjectLookups:
    """``core``: CO-RE root types without a vmlinux candidate; ``other``: kfuncs, typed
    ksyms, struct_ops types and attach targets vmlinux lacks. No duplicates."""

    core: list[ModuleLookup] = field(default_factory=list)
    other: list[ModuleLookup] = field(default_factory=list)

    @property
    def all(self) -> list[ModuleLookup]:
        """``core`` then ``other``."""
        return [*self.core, *self.other]


def core_lookup(local: Btf, type_id: int) -> ModuleLookup | None:
    """The module lookup of CO-RE candidates for local root type ``type_id`` (``None`` for
    an anonymous or invalid type: relocating reports those)."""
    try:
        return ModuleLookup.core(local, type_id)
    except BtfError:
        return None


def object_module_lookups(spec: ObjectSpec, vmlinux: Btf, cache: CandidateCache) -> ObjectLookups:
    """What ``spec`` would look up in module BTFs when loaded against ``vmlinux``.

    ``cache``: the load's CO-RE candidate cache (the vmlinux-only candidate lists computed
    here are the ones the loader asks for next). A superset is harmless (an extra name costs
    a memo entry, never a wrong answer): programs that will not be loaded are included.
    """
    out = ObjectLookups()

    def add(bucket: list[ModuleLookup], lk: ModuleLookup | None) -> None:
        if lk is not None and lk not in bucket:
            bucket.append(lk)

    for ext in spec.externs:
        if ext.kind is ExternKind.KFUNC and not vmlinux.find_ids(ext.essential_name, Kind.FUNC):
            add(out.other, ModuleLookup(ext.essential_name, (Kind.FUNC,)))
        elif (
            ext.kind is ExternKind.KSYM_VAR
            and ext.type_id
            and not vmlinux.find_ids(ext.essential_name, Kind.VAR)
        ):
            add(out.other, ModuleLookup(ext.essential_name, (Kind.VAR,)))
    for m in spec.struct_ops_maps:
        so = m.struct_ops
        if so is None:
            continue
        tname = essential_name(so.type_name)
        if not (
            vmlinux.find_ids(tname, Kind.STRUCT)
            and vmlinux.find_ids(VALUE_PREFIX + tname, Kind.STRUCT)
        ):
            add(out.other, ModuleLookup(tname, (Kind.STRUCT,)))
    vmlinux_only = [vmlinux]
    for prog in spec.programs:
        target = TRACING_TARGETS.get(prog.expected_attach_type)
        if target is not None and prog.prog_type in (
            bpf_uapi.ProgType.TRACING,
            bpf_uapi.ProgType.LSM,
        ):
            kind, prefix = target
            module, sep, name = prog.attach_to.partition(":")
            if not sep:
                module, name = "", module
            name = prefix + name
            if module or not vmlinux.find_ids(name, kind):
                add(out.other, ModuleLookup(name, (kind,)))
        if spec.btf is None:
            continue
        for relo in prog.core_relos:
            if relo.kind is CoreReloKind.TYPE_ID_LOCAL:
                continue
            try:
                if len(cache.get(spec.btf, relo.type_id, vmlinux_only)):
                    continue
            except CoreError:
                continue  # relocating raises it again, naming the relocation
            add(out.core, core_lookup(spec.btf, relo.type_id))
    return out
