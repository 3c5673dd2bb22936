"""Make an :class:`~schedswitchd.bpf.spec.ObjectSpec` live in the running kernel.

The order and rules are libbpf's (``bpf_object__load`` in ``src/libbpf.c``): load the
object's BTF, resolve externs (kconfig,
typed/untyped ksyms, kfuncs), find struct_ops kernel types, create maps and write their
initial data (freezing ``.rodata*`` and ``.kconfig``), run CO-RE on each program, apply the
kernel-side fix-ups, load the programs with func_info/line_info/fd_array and attach ids,
bind ``.rodata`` and build each struct_ops value. Attaching (struct_ops map update and
``BPF_LINK_CREATE``) is a separate step, :meth:`LoadedObject.attach_struct_ops`, so the
daemon can do all heavy work while the previous scheduler still runs.

Kernel BTF comes through a :class:`~schedswitchd.kernel.btf.registry.TargetBtfs` (vmlinux
first, then the object's declared modules); module BTF fds through a callable (normally
``KernelBtfRegistry.open_btf_object``). Any failure closes everything created so far.
Without declared modules, every name vmlinux lacks is looked up in the modules in one batch
(:func:`~schedswitchd.kernel.btf.module_needs.object_module_lookups`) before anything else,
so a registry's lookup memo walks the module BTFs at most once per load.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import mmap
import os
import re
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, TypeVar, runtime_checkable

from schedswitchd.bpf import insn
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Kind, essential_name
from schedswitchd.bpf.core.compat import types_are_compat
from schedswitchd.bpf.core.patch import POISON_IMM
from schedswitchd.bpf.core.relo import CoreReloKind
from schedswitchd.bpf.core.relocate import CandidateCache, relocate
from schedswitchd.bpf.enum_vars import DEFAULT_ENUM_PREFIXES, EnumFillReport, fill_enum_variables
from schedswitchd.bpf.prog_ctx import context_type, encode_context
from schedswitchd.bpf.spec import (
    PIN_BY_NAME,
    ExternKind,
    ExternSpec,
    FixupKind,
    MapKind,
    MapSpec,
    ObjectSpec,
    ProgramSpec,
)
from schedswitchd.errors import BpfSyscallError, BtfError, CoreError, LoadError
from schedswitchd.kernel import bpf_uapi, kmsg
from schedswitchd.kernel.arena import ArenaMapping, map_arena
from schedswitchd.kernel.arena import page_size as arena_page_size
from schedswitchd.kernel.btf.features import BtfFeatures, btf_features
from schedswitchd.kernel.btf.module_memo import ModuleLookup
from schedswitchd.kernel.btf.module_needs import TRACING_TARGETS, object_module_lookups
from schedswitchd.kernel.btf.sanitize import sanitize_btf
from schedswitchd.kernel.fd import BtfFd, LinkFd, MapFd, OwnedFd, ProgFd
from schedswitchd.kernel.kconfig import KconfigValue, extern_bytes, read_kernel_config
from schedswitchd.kernel.kmsg import KernelLogWatch
from schedswitchd.kernel.prog_attach import AttachError, attach_program
from schedswitchd.kernel.struct_ops.link import KERNEL_LINKS, StructOpsLinkCalls
from schedswitchd.kernel.struct_ops.value import (
    StructOpsKernelType,
    StructOpsPlan,
    build_value,
    find_struct_ops_kernel_type,
    plan_struct_ops,
)
from schedswitchd.kernel.syscall import (
    btf_load,
    iter_create,
    map_create,
    map_delete_elem,
    map_freeze,
    map_info,
    map_lookup_elem,
    map_update_elem,
    obj_get,
    obj_pin,
    prog_bind_map,
    prog_info,
    prog_load,
    prog_test_run,
)

T = TypeVar("T")

#: What :func:`load_object` does with the programs of ``?`` sections: ``"try"`` each and
#: keep what the kernel accepts, or leave them ``"off"`` (libbpf's default).
OptionalPrograms = Literal["try", "off"]

#: Where libbpf pins ``LIBBPF_PIN_BY_NAME`` maps by default.
DEFAULT_PIN_ROOT = "/sys/fs/bpf"
_U32 = struct.Struct("<I")

#: ``POISON_CALL_KFUNC_BASE`` of libbpf: an unresolved weak kfunc call becomes a call of
#: helper ``base + extern index``, which the verifier rejects only if it is reachable.
POISON_CALL_KFUNC_BASE = 2002000000

#: Verifier log lines naming a call it refused or printed: ``12: (85) call unknown#N`` and
#: ``invalid func unknown#N`` (``kernel/bpf/verifier.c``, ``check_helper_call`` and the
#: instruction printer), where N is the helper id a poisoned instruction calls.
_UNKNOWN_CALL_RE = re.compile(r"^(\d+): \(85\) call unknown#(\d+)", re.MULTILINE)
_INVALID_FUNC_RE = re.compile(r"invalid func unknown#(\d+)")


#: Map types created without BTF key/value types (libbpf's ``bpf_object__create_map``).
_NO_BTF_MAP_TYPES = frozenset(
    {
        bpf_uapi.MapType.PERF_EVENT_ARRAY,
        bpf_uapi.MapType.CGROUP_ARRAY,
        bpf_uapi.MapType.STACK_TRACE,
        bpf_uapi.MapType.ARRAY_OF_MAPS,
        bpf_uapi.MapType.HASH_OF_MAPS,
        bpf_uapi.MapType.DEVMAP,
        bpf_uapi.MapType.DEVMAP_HASH,
        bpf_uapi.MapType.CPUMAP,
        bpf_uapi.MapType.XSKMAP,
        bpf_uapi.MapType.SOCKMAP,
        bpf_uapi.MapType.SOCKHASH,
        bpf_uapi.MapType.QUEUE,
        bpf_uapi.MapType.STACK,
        bpf_uapi.MapType.ARENA,
    }
)


class KernelBtfs(Protocol):
    """What the loader needs from a set of kernel BTFs (``TargetBtfs`` satisfies it)."""

    @property
    def vmlinux(self) -> Btf:
        """The kernel's own BTF (``/sys/kernel/btf/vmlinux``)."""

    def __iter__(self) -> Iterator[Btf]: ...

    def first(self, probe: Callable[[Btf], T | None]) -> tuple[Btf, T] | None:
        """libbpf's search order: ``probe(vmlinux)``, then each module BTF until ``probe``
        returns something other than ``None``; that BTF and the result, or ``None``."""


@runtime_checkable
class IndexedKernelBtfs(KernelBtfs, Protocol):
    """Kernel BTFs that answer named module lookups (``TargetBtfs`` does): the loader then
    reads only the module BTFs that hold what vmlinux lacks."""

    def prefetch(self, lookups: Iterable[ModuleLookup]) -> None:
        """Find the holders of every lookup at once, ahead of the searches that need them."""

    def modules_holding(self, lookups: Iterable[ModuleLookup]) -> list[Btf]:
        """The module BTFs that may hold a match for any of ``lookups``, in search order."""

    def first_holding(
        self, lookup: ModuleLookup, probe: Callable[[Btf], T | None]
    ) -> tuple[Btf, T] | None:
        """:meth:`first` for a probe that can succeed only on a BTF holding ``lookup``."""


@dataclass(frozen=True, slots=True)
class StaticKernelBtfs:
    """A fixed list of kernel BTFs: vmlinux and already-parsed module BTFs (``name`` of
    each module :class:`Btf` must be the module name)."""

    vmlinux: Btf
    modules: tuple[Btf, ...] = ()

    def __iter__(self) -> Iterator[Btf]:
        yield self.vmlinux
        yield from self.modules

    def first(self, probe: Callable[[Btf], T | None]) -> tuple[Btf, T] | None:
        """``probe(vmlinux)``, then each module in order, until ``probe`` returns something
        other than ``None``: that BTF and the result, or ``None``."""
        for btf in self:
            got = probe(btf)
            if got is not None:
                return btf, got
        return None


# --- results -------------------------------------------------------------------------------


@dataclass(slots=True)
class LoadedMap:
    """A created map: its spec, fd and kernel id; for an arena, ``arena_address``, its user
    address (``user_vm_start``: ``map_extra``, or where the loader's first ``mmap`` put it)."""

    spec: MapSpec
    fd: MapFd
    id: int
    arena_address: int = 0

    @property
    def name(self) -> str:
        """The map's name (its ELF symbol or section name, as the spec has it)."""
        return self.spec.name


@dataclass(slots=True)
class LoadedProgram:
    """A loaded program: its spec (with the instructions actually loaded in ``insns``),
    fd and kernel id."""

    spec: ProgramSpec
    fd: ProgFd
    id: int
    insns: bytes

    @property
    def name(self) -> str:
        """The program's name (its ELF function symbol)."""
        return self.spec.name


@dataclass(frozen=True, slots=True)
class ProgramRun:
    """One ``BPF_PROG_RUN``: the program's return value (``retval``, signed 32-bit), the
    context as the program left it (``ctx``, bytes; empty without one) and the kernel's
    mean run time in ns (``duration_ns``; 0 for syscall programs, which it does not time)."""

    retval: int
    ctx: bytes
    duration_ns: int


@dataclass(frozen=True, slots=True)
class ResolvedExtern:
    """Where an extern landed: ``btf_name`` ("vmlinux" or a module) and ``btf_id`` for
    kfuncs and typed ksyms, ``address`` for untyped ksyms, ``resolved`` false for a weak
    extern left unresolved."""

    name: str
    kind: ExternKind
    resolved: bool
    btf_name: str = ""
    btf_id: int = 0
    fd_index: int = 0  # kfuncs: index into fd_array (0 = vmlinux)
    module_fd: int = 0  # ksyms in a module: the module BTF fd
    address: int = 0


@dataclass
class LoadedObject:
    """Everything one :func:`load_object` created. Close it (or use ``with``) to release
    the maps, programs, links and BTF; pinned objects survive.

    ``links`` are the struct_ops links by map name; ``program_links`` the links of the
    auto-attached programs by program name (:meth:`attach_programs`). ``skipped`` maps each
    optional (``?``-section) program the kernel refused, or that could not be attached, to
    the reason; ``notes`` is the load report's human-readable lines about such choices.
    ``timings_ns`` holds phase durations in ns: ``enums``, ``btf``, ``externs``, ``maps``,
    ``core`` (all programs), ``prog:<name>`` per program, ``attach_programs`` and
    ``attach`` once attached.
    ``enum_fill`` says which enum variables (``__SCX_*``) the load set from kernel BTF, which
    the kernel lacked and which were kept as assigned (:mod:`schedswitchd.bpf.enum_vars`);
    ``spec`` is the spec as loaded, with those values in its ``.rodata``."""

    spec: ObjectSpec
    btf_fd: BtfFd | None
    maps: dict[str, LoadedMap] = field(default_factory=dict)
    programs: dict[str, LoadedProgram] = field(default_factory=dict)
    externs: dict[str, ResolvedExtern] = field(default_factory=dict)
    struct_ops_values: dict[str, bytes] = field(default_factory=dict)
    struct_ops_kernel: dict[str, StructOpsKernelType] = field(default_factory=dict)
    links: dict[str, LinkFd] = field(default_factory=dict)
    program_links: dict[str, LinkFd] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    timings_ns: dict[str, int] = field(default_factory=dict)
    enum_fill: EnumFillReport = field(default_factory=EnumFillReport)
    _extra_fds: list[OwnedFd] = field(default_factory=list)
    _programs_attached: bool = False
    _registered: set[str] = field(default_factory=set)
    _updated: set[str] = field(default_factory=set)

    # --- attach ----------------------------------------------------------------------------

    def attach_struct_ops(
        self,
        name: str | None = None,
        *,
        programs: bool = True,
        links: StructOpsLinkCalls = KERNEL_LINKS,
    ) -> dict[str, LinkFd]:
        """Register struct_ops map ``name`` (default: every one not yet attached): write its
        value (``BPF_MAP_UPDATE_ELEM``, key 0), then for ``BPF_F_LINK`` maps create the
        link (``BPF_LINK_CREATE``, attach type ``BPF_STRUCT_OPS``). Returns the new links by
        map name. A link map can be attached again after :meth:`detach_struct_ops`; a
        legacy map cannot (the kernel accepts its value once). Adds the ``attach`` timing.

        With ``programs`` (the default) the object's other programs are attached first
        (:meth:`attach_programs`, once), as scx's ``SCX_OPS_ATTACH`` runs the skeleton's
        attach before it creates the struct_ops link. ``links`` issues the
        ``BPF_LINK_CREATE`` (see :mod:`schedswitchd.kernel.struct_ops.link`)."""
        if programs and not self._programs_attached:
            self.attach_programs()
        start = time.perf_counter_ns()
        names = [name] if name is not None else list(self.struct_ops_values)
        made: dict[str, LinkFd] = {}
        for n in names:
            if n not in self.struct_ops_values:
                raise LoadError(f"{n} is not a loaded struct_ops map of {self.spec.name}")
            if n in self.links or n in self._registered:
                continue
            m = self.maps[n]
            is_link = bool(m.spec.flags & bpf_uapi.F_LINK)
            if n in self._updated and not is_link:
                raise LoadError(
                    f"struct_ops map {n} was unregistered; a legacy (non-link) struct_ops map "
                    "cannot be registered again: load the object again"
                )
            link = self._with_kernel_reason(n, functools.partial(self._register, n, m, links))
            if link is not None:
                made[n] = self.links[n] = link
        self.timings_ns["attach"] = time.perf_counter_ns() - start
        return made

    def write_struct_ops_value(self, name: str) -> bool:
        """Write the value of ``BPF_F_LINK`` struct_ops map ``name`` now
        (``BPF_MAP_UPDATE_ELEM``, key 0), ahead of :meth:`attach_struct_ops`, which then only
        creates the link. For a link map the update registers nothing: the kernel checks
        and copies the members (``init_member``/``check_member``), builds a trampoline per
        program and calls ``validate`` (``bpf_struct_ops_map_update_elem()``,
        ``kernel/bpf/bpf_struct_ops.c``); ``reg`` runs at ``BPF_LINK_CREATE``. So the
        daemon does this in prepare, while the previous scheduler still runs, and not in
        the no-scheduler gap. Returns False (nothing written) for a legacy map, whose update
        would register it, or a value already written. Raises ``BpfSyscallError`` (with the
        kernel log's reason when it gave one) or ``LoadError`` (no such map). Adds the
        ``struct_ops_value`` timing (ns)."""
        if name not in self.struct_ops_values:
            raise LoadError(f"{name} is not a loaded struct_ops map of {self.spec.name}")
        if name in self._updated or not self.maps[name].spec.flags & bpf_uapi.F_LINK:
            return False
        start = time.perf_counter_ns()
        self._with_kernel_reason(name, lambda: self._update_value(name))
        self.timings_ns["struct_ops_value"] = time.perf_counter_ns() - start
        return True

    def _register(self, name: str, m: LoadedMap, links: StructOpsLinkCalls) -> LinkFd | None:
        """Write the value if not yet written; then create the link (link maps; returned)
        or count the map registered (legacy maps: the update registered it)."""
        self._update_value(name)
        if m.spec.flags & bpf_uapi.F_LINK:
            return links.create(m.fd)
        self._registered.add(name)
        return None

    def _update_value(self, name: str) -> None:
        """``BPF_MAP_UPDATE_ELEM`` of struct_ops map ``name``'s value, once: the kernel
        takes a struct_ops value once."""
        if name not in self._updated:
            map_update_elem(self.maps[name].fd, b"\0\0\0\0", self.struct_ops_values[name])
            self._updated.add(name)

    def _with_kernel_reason(self, name: str, call: Callable[[], T]) -> T:
        """``call()`` (a bpf() command on struct_ops map ``name``); its ``BpfSyscallError``
        re-raised with the kernel log's lines about the map when the log gave any (the
        reason for refusing ops -- a missing required member, a failed ``validate`` or
        ``reg`` callback -- is often only there), ``EEXIST`` as a ``LoadError`` naming the
        ops already registered. The log is watched from just before the call, so only
        records logged meanwhile count."""
        with KernelLogWatch() as klog:
            try:
                return call()
            except BpfSyscallError as exc:
                if exc.errno == errno.EEXIST:
                    raise self._already_registered(name) from exc
                said = kmsg.mentioning(klog.new_records(), (self._ops_name(name), name))
                if said:
                    raise BpfSyscallError(
                        exc.command,
                        exc.errno,
                        f"struct_ops {name}: the kernel log says: {'; '.join(said)}",
                        kernel_log=tuple(said),
                    ) from exc
                raise

    def _ops_name(self, map_name: str) -> str:
        """The ``name`` member of struct_ops map ``map_name``'s value ("" without one)."""
        spec = self.maps[map_name].spec.struct_ops
        member = spec.member("name") if spec is not None else None
        if spec is None or member is None:
            return ""
        raw = spec.data[member.offset : member.offset + member.size]
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    def _already_registered(self, map_name: str) -> LoadError:
        """The error for ``EEXIST`` on registering struct_ops ``map_name``: the kernel's
        ``reg`` callback found ops of the same name (``tcp_register_congestion_control``
        and friends return ``-EEXIST``)."""
        spec = self.maps[map_name].spec.struct_ops
        ops_name = self._ops_name(map_name)
        type_name = spec.type_name if spec is not None else "struct_ops"
        what = f"{type_name} '{ops_name}'" if ops_name else f"struct_ops map {map_name}"
        return LoadError(
            f"struct_ops {map_name}: {what} is already registered (a scheduler or "
            "congestion control of that name is loaded; unload it first, or load this one "
            f"under another name, e.g. --set {map_name}.name=NEW)"
        )

    def detach_struct_ops(self, name: str | None = None) -> None:
        """Undo :meth:`attach_struct_ops`: close the link (link maps) or delete key 0
        (legacy maps, which unregisters the ops)."""
        names = [name] if name is not None else list(self.struct_ops_values)
        for n in names:
            link = self.links.pop(n, None)
            if link is not None:
                link.close()
            if n in self._registered:
                self._registered.discard(n)
                map_delete_elem(self.maps[n].fd, b"\0\0\0\0")

    def attach_programs(self, names: Iterable[str] | None = None) -> dict[str, LinkFd]:
        """Attach the loaded programs that a libbpf skeleton's attach would attach
        (fentry/fexit/fmod_ret, tp_btf, lsm, iter, raw_tp, tracepoint; see
        :mod:`schedswitchd.kernel.prog_attach`), in object order, skipping those already
        attached. ``names`` limits it to those programs (each must be loaded). Returns the
        new links by program name (also kept in :attr:`program_links`). Adds the
        ``attach_programs`` timing (ns).

        An optional (``?``-section) program whose attach fails is detached from nothing,
        recorded in :attr:`skipped` and :attr:`notes`, and the rest go on. Any other failure
        raises :class:`~schedswitchd.kernel.prog_attach.AttachError` after closing the links
        this call made."""
        start = time.perf_counter_ns()
        if names is None:
            wanted = list(self.programs)
            self._programs_attached = True
        else:
            wanted = list(names)
            for n in wanted:
                if n not in self.programs:
                    raise LoadError(f"{self.spec.name} has no loaded program {n!r}")
        made: dict[str, LinkFd] = {}
        try:
            for n in wanted:
                if n in self.program_links:
                    continue
                prog = self.programs[n]
                try:
                    link = attach_program(prog.spec, prog.fd)
                except AttachError as exc:
                    if prog.spec.autoload:
                        raise
                    self._skip(n, f"not attached: {exc}")
                    continue
                if link is not None:
                    made[n] = self.program_links[n] = link
        except BaseException:
            for n, link in reversed(made.items()):
                self.program_links.pop(n, None)
                link.close()
            if names is None:
                self._programs_attached = False
            raise
        finally:
            _timed(self, "attach_programs", start)
        return made

    def detach_programs(self) -> None:
        """Close the program links made by :meth:`attach_programs`, newest first."""
        for n in reversed(list(self.program_links)):
            self.program_links.pop(n).close()
        self._programs_attached = False

    def _skip(self, name: str, reason: str) -> None:
        self.skipped[name] = reason
        self.notes.append(f"optional program {name} skipped: {reason}")

    def read_iter(self, name: str, *, limit: int = 16 << 20) -> bytes:
        """Run iterator program ``name`` (attached: ``iter/...``) once through a new
        ``BPF_ITER_CREATE`` fd and return everything it printed, at most ``limit`` bytes.
        Raises :class:`LoadError` when it is not an attached iterator,
        :class:`~schedswitchd.errors.BpfSyscallError` when the kernel refuses."""
        link = self.program_links.get(name)
        if (
            link is None
            or self.programs[name].spec.expected_attach_type != bpf_uapi.AttachType.TRACE_ITER
        ):
            raise LoadError(f"{self.spec.name}: {name!r} is not an attached iterator program")
        out = bytearray()
        with iter_create(link) as it:
            while len(out) < limit:
                try:
                    chunk = os.read(it.fd, min(1 << 16, limit - len(out)))
                except OSError as exc:
                    raise LoadError(f"reading iterator {name}: {exc.strerror}") from exc
                if not chunk:
                    break
                out += chunk
        return bytes(out)

    # --- running programs (BPF_PROG_RUN) ---------------------------------------------------

    def context(self, name: str, values: Mapping[str, object] | None = None) -> bytes:
        """The context bytes for :meth:`run_program` of program ``name``: its first
        argument's pointee struct in the object's BTF, zero-filled, with ``values`` (BTF
        member name -> value, as :func:`schedswitchd.bpf.customize.encode_value` accepts)
        encoded over it; ``b""`` for a program without a struct argument. Raises
        :class:`~schedswitchd.errors.CustomizationError` naming the member."""
        return encode_context(self.spec, self._loaded_program(name).spec, values)

    def _loaded_program(self, name: str) -> LoadedProgram:
        prog = self.programs.get(name)
        if prog is not None:
            return prog
        if name in self.skipped:
            raise LoadError(f"program {name} was not loaded: {self.skipped[name]}")
        if any(p.name == name for p in self.spec.programs):
            raise LoadError(f"program {name} of {self.spec.name} is not loaded (autoload off)")
        raise LoadError(f"{self.spec.name} has no program {name!r}")

    def run_program(
        self, name: str, ctx: bytes | Mapping[str, object] = b"", *, cpu: int | None = None
    ) -> int:
        """Run program ``name`` once with ``BPF_PROG_RUN`` and return its return value
        (the C ``int`` a ``SEC("syscall")`` program returns, sign-extended from the
        kernel's u32). ``ctx``: the context bytes, or a dict of member values laid out by
        :meth:`context`. See :meth:`run_program_result` for ``cpu`` and the errors."""
        return self.run_program_result(name, ctx, cpu=cpu).retval

    def run_program_result(
        self, name: str, ctx: bytes | Mapping[str, object] = b"", *, cpu: int | None = None
    ) -> ProgramRun:
        """Run program ``name`` once (``BPF_PROG_RUN``, UAPI ``include/uapi/linux/bpf.h``),
        before or after attach. ``ctx`` as for :meth:`run_program`. ``cpu``: for a
        ``SEC("syscall")`` program (which runs in the caller's context and whose run the
        kernel cannot place) the calling thread is bound to that CPU for the run
        (``sched_setaffinity``) and its affinity restored afterwards; for other program
        types it becomes ``BPF_F_TEST_RUN_ON_CPU`` (the kernel accepts it for raw
        tracepoints only).

        Returns a :class:`ProgramRun`: ``retval`` (signed 32-bit), ``ctx`` (the context as
        the program left it: syscall programs write it back; other types give their
        ``ctx_out``), ``duration_ns``. Raises :class:`LoadError` for an unknown or unloaded
        program, :class:`~schedswitchd.errors.CustomizationError` for a bad ``ctx`` dict,
        :class:`ProgramRunError` (with ``errno``) when the kernel refuses the run (e.g.
        ``EINVAL`` for a context shorter than what the program reads, ``ENOTSUPP`` for a
        type without test runs) or the CPU cannot be used."""
        prog = self._loaded_program(name)
        raw = self.context(name, ctx) if isinstance(ctx, Mapping) else bytes(ctx)
        is_syscall = prog.spec.prog_type == bpf_uapi.ProgType.SYSCALL
        old_affinity: set[int] | None = None
        flags, run_cpu = 0, 0
        if cpu is not None:
            if is_syscall:
                old_affinity = os.sched_getaffinity(0)
                try:
                    os.sched_setaffinity(0, {cpu})
                except (OSError, ValueError) as exc:
                    raise ProgramRunError(
                        name, f"cannot run on CPU {cpu}: {exc}", getattr(exc, "errno", 0) or 0
                    ) from exc
            else:
                flags, run_cpu = bpf_uapi.F_TEST_RUN_ON_CPU, cpu
        try:
            res = prog_test_run(
                prog.fd,
                ctx_in=raw,
                ctx_out_size=0 if is_syscall or not raw else len(raw),
                flags=flags,
                cpu=run_cpu,
            )
        except BpfSyscallError as exc:
            hint = ""
            if exc.errno == errno.EINVAL and is_syscall:
                ct = context_type(self.spec, prog.spec) if prog.spec.btf_func_id else None
                if ct is not None and len(raw) < ct.size:
                    hint = f" (context is {len(raw)} bytes; struct {ct.name} is {ct.size})"
            raise ProgramRunError(name, f"BPF_PROG_RUN refused: {exc}{hint}", exc.errno) from exc
        finally:
            if old_affinity is not None:
                os.sched_setaffinity(0, old_affinity)
        retval = res.retval - (1 << 32) if res.retval & 0x80000000 else res.retval
        return ProgramRun(retval, res.ctx_in_after if is_syscall else res.ctx_out, res.duration_ns)

    # --- variables -------------------------------------------------------------------------

    def _variable(self, name: str) -> tuple[LoadedMap, int, int]:
        for m in self.maps.values():
            var = m.spec.variable(name)
            if var is not None:
                return m, var.offset, var.size
        raise LoadError(f"{self.spec.name} has no global variable {name!r}")

    def arena_mapping(self) -> ArenaMapping:
        """A new ``mmap`` of the object's arena at its address, for reading and writing
        arena memory by byte offset (close it, or use ``with``). The loader unmaps the arena
        once the globals are written, so that another load of the same object (an arena at
        the same fixed address) can map its own; while this mapping is open, it cannot.
        Raises :class:`LoadError` when the object has no arena or it cannot be mapped."""
        m = next((m for m in self.maps.values() if m.spec.kind is MapKind.ARENA), None)
        if m is None:
            raise LoadError(f"{self.spec.name} has no arena map")
        return map_arena(m.fd.fd, m.spec.max_entries, m.arena_address, m.name)

    def read_variable(self, name: str) -> bytes:
        """The current bytes of global variable ``name`` (from its data map, key 0, or for
        an arena global through a mapping of the arena)."""
        m, off, size = self._variable(name)
        if m.spec.kind is MapKind.ARENA:
            with self.arena_mapping() as arena:
                return arena.read(off, size)
        value = map_lookup_elem(m.fd, b"\0\0\0\0", m.spec.value_size)
        if value is None:  # an array map always has key 0
            raise LoadError(f"data map {m.name} has no element 0")
        return value[off : off + size]

    def write_variable(self, name: str, data: bytes) -> None:
        """Overwrite global variable ``name`` (exactly its size). Mmapable data maps are
        written in place through ``mmap`` so concurrent program writes to other variables
        are not lost; others by read-modify-write. Frozen maps (``.rodata``, ``.kconfig``)
        raise
        :class:`~schedswitchd.errors.BpfSyscallError` (``EPERM``)."""
        m, off, size = self._variable(name)
        if len(data) != size:
            raise LoadError(f"variable {name} is {size} bytes, got {len(data)}")
        if m.spec.kind is MapKind.ARENA:
            with self.arena_mapping() as arena:
                arena.write(off, data)
            return
        frozen = m.spec.kind in (MapKind.RODATA, MapKind.KCONFIG)
        if m.spec.flags & bpf_uapi.F_MMAPABLE and not frozen:
            length = max(m.spec.value_size, 1)
            with mmap.mmap(m.fd.fd, length, mmap.MAP_SHARED) as mm:
                mm[off : off + size] = data
            return
        value = bytearray(self.read_variable_map(m))
        value[off : off + size] = data
        map_update_elem(m.fd, b"\0\0\0\0", bytes(value))

    @staticmethod
    def read_variable_map(m: LoadedMap) -> bytes:
        """Element 0 of a data map (``.bss``/``.data``/``.rodata``: one value, ``value_size``
        bytes) as the kernel holds it (``BPF_MAP_LOOKUP_ELEM``). Raises
        :class:`~schedswitchd.errors.LoadError` if it has none."""
        value = map_lookup_elem(m.fd, b"\0\0\0\0", m.spec.value_size)
        if value is None:
            raise LoadError(f"data map {m.name} has no element 0")
        return value

    # --- lifetime --------------------------------------------------------------------------

    def fds(self) -> list[OwnedFd]:
        """Every fd this object owns, in creation order."""
        out: list[OwnedFd] = []
        if self.btf_fd is not None:
            out.append(self.btf_fd)
        out += self._extra_fds
        out += [m.fd for m in self.maps.values()]
        out += [p.fd for p in self.programs.values()]
        # Closed in reverse: the struct_ops links first (the scheduler goes while its
        # tracing hooks still run), then the program links, newest first.
        out += list(self.program_links.values())
        out += list(self.links.values())
        return out

    def leave_attached(self) -> None:
        """Make :meth:`close` leave legacy struct_ops maps registered (their ownership
        moved elsewhere, e.g. to pins). Links still detach when their last reference, fd
        or pin, goes."""
        self._registered.clear()

    def close(self) -> None:
        """Unregister legacy struct_ops maps (the kernel holds those until key 0 is
        deleted), then close every fd, newest first (links detach as they close)."""
        for n in list(self._registered):
            with contextlib.suppress(BpfSyscallError, ValueError):
                map_delete_elem(self.maps[n].fd, b"\0\0\0\0")
        for fd in reversed(self.fds()):
            fd.close()
        self.links.clear()
        self.program_links.clear()
        self._registered.clear()

    def __enter__(self) -> LoadedObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- loading -------------------------------------------------------------------------------


def _timed(obj: LoadedObject, key: str, start: int) -> None:
    obj.timings_ns[key] = obj.timings_ns.get(key, 0) + time.perf_counter_ns() - start


class _Loader:
    def __init__(
        self,
        spec: ObjectSpec,
        kernel: KernelBtfs,
        open_btf_object: Callable[[str], BtfFd] | None,
        kernel_config: Mapping[str, KconfigValue] | None,
        pin_root: str | os.PathLike[str],
        features: BtfFeatures | None = None,
        autoload: Mapping[str, bool] | None = None,
        optional_programs: OptionalPrograms = "try",
    ) -> None:
        self.spec = spec
        self.autoload: Mapping[str, bool] = autoload or {}
        self.optional_programs = optional_programs
        self.btf_features = features
        self.kernel = kernel
        self.open_btf_object = open_btf_object
        self.kernel_config = kernel_config
        self.obj = LoadedObject(spec, None)
        self.fd_array: list[int] = []  # index 0 reserved for vmlinux
        self.module_fds: dict[str, BtfFd] = {}
        self.plans: dict[str, StructOpsPlan] = {}
        self.core_cache = CandidateCache()
        self.pin_root = Path(pin_root)
        self.new_pins: list[Path] = []
        self.index = kernel if isinstance(kernel, IndexedKernelBtfs) else None
        self._core_modules: list[Btf] | None = None
        self._core_lookups: list[ModuleLookup] = []

    # --- helpers ---------------------------------------------------------------------------

    def module_fd(self, btf: Btf) -> BtfFd:
        name = btf.name
        fd = self.module_fds.get(name)
        if fd is None:
            if self.open_btf_object is None:
                raise LoadError(f"{self.spec.name}: module {name} needs a BTF fd source")
            fd = self.open_btf_object(name)
            self.module_fds[name] = fd
            self.obj._extra_fds.append(fd)
        return fd

    def fd_index(self, btf: Btf) -> int:
        if btf is self.kernel.vmlinux:
            return 0
        fd = self.module_fd(btf).fd
        if not self.fd_array:
            self.fd_array.append(0)
        if fd not in self.fd_array[1:]:
            self.fd_array.append(fd)
        return self.fd_array.index(fd, 1)

    def _first(
        self, lookup: ModuleLookup, probe: Callable[[Btf], T | None]
    ) -> tuple[Btf, T] | None:
        if self.index is not None:
            return self.index.first_holding(lookup, probe)
        return self.kernel.first(probe)

    # --- steps -----------------------------------------------------------------------------

    def fill_enums(self, prefixes: Sequence[str]) -> None:
        """Set the object's enum variables (``__SCX_*`` by default) from vmlinux's
        enumerators, as scx's ``SCX_ENUM_INIT`` does in the scheduler's user space; the
        variables the user assigned keep their values. Must run before the maps exist."""
        start = time.perf_counter_ns()
        spec, report = fill_enum_variables(self.spec, self.kernel.vmlinux, prefixes)
        self.spec = self.obj.spec = spec
        self.obj.enum_fill = report
        _timed(self.obj, "enums", start)

    def prefetch_module_lookups(self) -> None:
        """Look up, in one batch, every name of the object that vmlinux lacks (kfuncs,
        typed ksyms, struct_ops types, attach targets, CO-RE root types)."""
        if self.index is None:
            return
        lookups = object_module_lookups(self.spec, self.kernel.vmlinux, self.core_cache)
        self._core_lookups = lookups.core
        self.index.prefetch(lookups.all)

    def load_btf(self) -> None:
        start = time.perf_counter_ns()
        if self.spec.btf is not None:
            feats = self.btf_features if self.btf_features is not None else btf_features()
            self.btf_features = feats
            raw = self.spec.btf.raw
            if feats.missing():  # only for kinds this kernel lacks (libbpf's rule)
                raw = sanitize_btf(self.spec.btf, feats)
            self.obj.btf_fd = btf_load(raw)
        _timed(self.obj, "btf", start)

    def resolve_externs(self) -> None:
        start = time.perf_counter_ns()
        for ext in self.spec.externs:
            if ext.kind is ExternKind.KFUNC:
                self.obj.externs[ext.name] = self._resolve_kfunc(ext)
            elif ext.kind is ExternKind.KSYM_VAR:
                self.obj.externs[ext.name] = self._resolve_ksym(ext)
        _timed(self.obj, "externs", start)

    def _first_named(self, name: str, kind: Kind) -> tuple[Btf, int] | None:
        """The first kernel BTF (vmlinux, then modules as :meth:`_first` orders them) with
        a type ``name`` of ``kind``, and that type's first id there; ``None`` if none has."""

        def probe(btf: Btf) -> int | None:
            ids = btf.find_ids(name, kind)
            return ids[0] if ids else None

        return self._first(ModuleLookup(name, (kind,)), probe)

    def _resolve_kfunc(self, ext: ExternSpec) -> ResolvedExtern:
        local = self._local_btf()

        hit = self._first_named(ext.essential_name, Kind.FUNC)
        if hit is not None:
            btf, fid = hit
            proto = btf.type(fid)
            proto_id = getattr(proto, "type", 0)
            if ext.type_id and not types_are_compat(local, ext.type_id, btf, proto_id):
                if not ext.weak:
                    raise LoadError(
                        f"kfunc {ext.name}: prototype does not match {btf.name}'s "
                        f"{ext.essential_name}"
                    )
                hit = None
            else:
                in_module = btf is not self.kernel.vmlinux
                return ResolvedExtern(
                    ext.name,
                    ext.kind,
                    True,
                    btf.name,
                    fid,
                    fd_index=self.fd_index(btf),
                    # an ld_imm64 of the kfunc's address names its module BTF by fd
                    module_fd=self.module_fd(btf).fd if in_module else 0,
                )
        if ext.weak:
            return ResolvedExtern(ext.name, ext.kind, False)
        raise LoadError(f"kfunc {ext.name} not found in kernel BTF ({self._searched()})")

    def _resolve_ksym(self, ext: ExternSpec) -> ResolvedExtern:
        if not ext.type_id:  # untyped: an address from kallsyms
            addr = _kallsyms().get(ext.essential_name)
            if addr is None:
                if ext.weak:
                    return ResolvedExtern(ext.name, ext.kind, False)
                raise LoadError(f"ksym {ext.name} not found in /proc/kallsyms")
            return ResolvedExtern(ext.name, ext.kind, True, address=addr)
        local = self._local_btf()

        hit = self._first_named(ext.essential_name, Kind.VAR)
        if hit is not None:
            btf, vid = hit
            var_type = getattr(btf.type(vid), "type", 0)
            if types_are_compat(local, ext.type_id, btf, var_type):
                mod_fd = 0 if btf is self.kernel.vmlinux else self.module_fd(btf).fd
                return ResolvedExtern(ext.name, ext.kind, True, btf.name, vid, module_fd=mod_fd)
            if not ext.weak:
                raise LoadError(f"ksym {ext.name}: type does not match {btf.name}'s")
        if ext.weak:
            return ResolvedExtern(ext.name, ext.kind, False)
        raise LoadError(f"ksym {ext.name} not found in kernel BTF ({self._searched()})")

    def _searched(self) -> str:
        text = self._searched_names()
        missing = self._missing_modules()
        if missing:
            text += f"; declared module(s) not loaded: {', '.join(missing)}"
        return text

    def _missing_modules(self) -> tuple[str, ...]:
        """Declared modules whose BTF is absent (``TargetBtfs.report.missing``; none for a
        :class:`StaticKernelBtfs`)."""
        report = getattr(self.kernel, "report", None)
        return tuple(getattr(report, "missing", ()))

    def _unresolved(
        self, prog: ProgramSpec, core: tuple[tuple[int, str], ...], log: str
    ) -> tuple[str, str]:
        """Why a rejected program may have failed, as ``(hint, note)``. ``hint`` leads the
        error: the declared modules that are not loaded, then what the verifier log shows
        it reached among the poisoned instructions -- CO-RE relocations without a candidate
        (``core``: instruction index and description) and calls of unresolved weak kfuncs
        (``call unknown#<POISON_CALL_KFUNC_BASE + extern index>``). ``note`` follows the
        kernel's message: poisoned sites the verifier did not reach, which a weak extern
        legitimately leaves (guarded by ``bpf_ksym_exists()`` or a CO-RE check), so they
        are context, not the cause. Either may be ""."""
        missing = self._missing_modules()
        weak = sorted(
            {
                fx.extern
                for fx in prog.fixups
                if fx.kind is FixupKind.KFUNC_CALL
                and not getattr(self.obj.externs.get(fx.extern), "resolved", False)
            }
        )
        # helper id -> instruction indices the log shows calling it (none: only named)
        calls: dict[int, set[int]] = {}
        for m in _UNKNOWN_CALL_RE.finditer(log):
            calls.setdefault(int(m.group(2)), set()).add(int(m.group(1)))
        for m in _INVALID_FUNC_RE.finditer(log):
            calls.setdefault(int(m.group(1)), set())
        reached: list[str] = []
        unreached: list[str] = []
        core_at = calls.get(POISON_IMM)
        for idx, what in core:
            # every poisoned CO-RE site calls the same id: the instruction index (in the
            # log when the verifier printed the call) tells which; without it, all count
            hit = core_at is not None and (not core_at or idx in core_at)
            (reached if hit else unreached).append(what)
        for k in weak:
            hit = POISON_CALL_KFUNC_BASE + self._extern_index(k) in calls
            (reached if hit else unreached).append(f"kfunc {k}")
        parts = []
        if missing:
            parts.append(f"declared module(s) not loaded: {', '.join(missing)}")
        if reached:
            parts.append(f"not found ({self._searched_names()}): {', '.join(reached)}")
        note = ""
        if unreached:
            note = (
                f"absent from the kernel ({self._searched_names()}) but not where the "
                f"verifier failed: {', '.join(unreached)}"
            )
        return "; ".join(parts), note

    def _searched_names(self) -> str:
        names = getattr(self.kernel, "searched", None)
        return "searched " + ", ".join(names) if names else "searched vmlinux"

    def _local_btf(self) -> Btf:
        if self.spec.btf is None:
            raise LoadError(f"{self.spec.name}: externs need the object's BTF")
        return self.spec.btf

    def kconfig_data(self, m: MapSpec) -> bytes:
        data = bytearray(m.data or bytes(m.value_size))
        externs = [e for e in self.spec.externs if e.kind is ExternKind.KCONFIG]
        if not externs:
            return bytes(data)
        btf = self._local_btf()
        needs_config = any(e.name.startswith("CONFIG_") for e in externs)
        config: Mapping[str, KconfigValue] = self.kernel_config or {}
        if needs_config and self.kernel_config is None:
            config = read_kernel_config()
        for e in externs:
            value = extern_bytes(btf, e.type_id, e.essential_name, config, weak=e.weak)
            data[e.offset : e.offset + len(value)] = value
        return bytes(data)

    def plan_struct_ops(self) -> None:
        for m in self.spec.struct_ops_maps:
            so = m.struct_ops
            if so is None or not getattr(m, "autocreate", True):
                continue
            tname = so.type_name

            def probe(btf: Btf, tname: str = tname) -> StructOpsKernelType | None:
                return find_struct_ops_kernel_type(btf, tname)

            hit = self._first(ModuleLookup(essential_name(tname), (Kind.STRUCT,)), probe)
            if hit is None:
                raise LoadError(
                    f"struct_ops {so.var_name}: kernel has no struct_ops type {so.type_name} "
                    f"({self._searched()})"
                )
            programs = {mem.name for mem in so.members if mem.program}
            plan = plan_struct_ops(self._local_btf(), so.type_id, so.data, hit[1], programs)
            self.plans[m.name] = plan
            self.obj.struct_ops_kernel[m.name] = hit[1]

    def create_maps(self) -> None:
        start = time.perf_counter_ns()
        btf_fd = self.obj.btf_fd
        for m in self.spec.maps:
            if not getattr(m, "autocreate", True):
                continue
            reused = self._reuse_pinned(m) if m.pinning == PIN_BY_NAME else None
            fd = reused if reused is not None else self._create_map(m, btf_fd)
            loaded = LoadedMap(m, fd, 0)
            self.obj.maps[m.name] = loaded
            loaded.id = map_info(fd).id
            if m.pinning == PIN_BY_NAME and reused is None:
                path = self.pin_root / m.name
                obj_pin(fd, path)
                self.new_pins.append(path)
            if m.kind is MapKind.ARENA:
                # mapped even when reused: a pinned arena keeps its pages, but its user
                # address must be known (and fixed) before programs load
                loaded.arena_address = self._init_arena(m, fd, write=reused is None)
            if reused is not None:
                continue  # a reused pinned map keeps its contents (libbpf does the same)
            if m.kind in (MapKind.DATA, MapKind.RODATA, MapKind.BSS, MapKind.KCONFIG):
                data = self.kconfig_data(m) if m.kind is MapKind.KCONFIG else m.data
                if data:
                    _write_initial(fd, m, data)
                if m.kind in (MapKind.RODATA, MapKind.KCONFIG):
                    map_freeze(fd)
        for m in self.spec.maps:  # map-in-map initial slots, once every map exists
            if m.init_slots and m.type != bpf_uapi.MapType.PROG_ARRAY and m.name in self.obj.maps:
                for index, target in m.init_slots:
                    inner = self.obj.maps.get(target)
                    if inner is None:
                        raise LoadError(f"map {m.name}: slot {index} names unknown map {target}")
                    map_update_elem(
                        self.obj.maps[m.name].fd, _U32.pack(index), _U32.pack(inner.fd.fd)
                    )
        _timed(self.obj, "maps", start)

    def _init_arena(self, m: MapSpec, fd: MapFd, *, write: bool) -> int:
        """Map arena ``m`` (fixing its user address for the verifier's resolution of arena
        globals), make the pages of its globals present, write their initialised part, and
        unmap; returns the arena's user address. libbpf copies the whole ``.addr_space.1``
        image, zeros included; here only ``m.data`` (up to the last non-zero byte) is
        written, and the zero pages are populated without a copy. The globals sit at offset
        0 of the arena (libbpf's placement on kernels before 6.17's full-range ld_imm64
        offsets, valid on every kernel with arenas)."""
        page = arena_page_size()
        globals_size = max(m.data_size, len(m.data or b""))
        arena_size = m.max_entries * page
        if -(-globals_size // page) * page > arena_size:
            raise LoadError(
                f"arena {m.name}: its {m.max_entries} pages ({arena_size} bytes) cannot hold "
                f"the {globals_size} bytes of arena globals in {m.section}"
            )
        with map_arena(fd.fd, m.max_entries, m.map_extra, m.name) as arena:
            if write:
                arena.populate(0, globals_size)
                if m.data:
                    arena.write(0, m.data)
            return arena.address

    def _reuse_pinned(self, m: MapSpec) -> MapFd | None:
        """The map pinned at ``<pin_root>/<name>`` if it exists and matches ``m``
        (type, key/value size, max_entries, flags), else ``None``; a mismatch raises."""
        path = self.pin_root / m.name
        if not path.exists():
            return None
        fd = obj_get(path, expect=MapFd)
        info = map_info(fd)
        want = (m.type, m.key_size, m.value_size, map_max_entries(m), m.flags)
        have = (info.type, info.key_size, info.value_size, info.max_entries, info.map_flags)
        if want != have:
            fd.close()
            raise LoadError(
                f"map {m.name}: the map pinned at {path} does not match the object's "
                f"definition (type, key, value, entries, flags {have} != {want})"
            )
        return fd

    def _create_map(self, m: MapSpec, btf_fd: BtfFd | None) -> MapFd:
        name = m.kernel_name
        if m.kind is MapKind.STRUCT_OPS:
            kt = self.obj.struct_ops_kernel[m.name]
            if btf_fd is None:
                raise LoadError(f"struct_ops map {m.name} needs the object's BTF")
            vfd = None if kt.btf is self.kernel.vmlinux else self.module_fd(kt.btf)
            return map_create(
                bpf_uapi.MapType.STRUCT_OPS,
                4,
                kt.value_size,
                1,
                name=name,
                flags=m.flags,
                btf_fd=btf_fd,
                btf_vmlinux_value_type_id=kt.value_type_id,
                value_type_btf_obj_fd=vfd,
            )
        inner_fd: MapFd | None = None
        if m.inner is not None:
            inner_fd = self._create_map(m.inner, btf_fd)
        try:
            use_btf = (
                btf_fd is not None
                and bool(m.value_type_id or m.key_type_id)
                and m.type not in _NO_BTF_MAP_TYPES
            )

            def create(with_btf: bool) -> MapFd:
                return map_create(
                    m.type,
                    m.key_size,
                    m.value_size,
                    map_max_entries(m),
                    name=name,
                    flags=m.flags,
                    btf_fd=btf_fd if with_btf else None,
                    btf_key_type_id=m.key_type_id if with_btf else 0,
                    btf_value_type_id=m.value_type_id if with_btf else 0,
                    inner_map_fd=inner_fd,
                    map_extra=m.map_extra,
                    numa_node=m.numa_node,
                )

            try:
                return create(use_btf)
            except BpfSyscallError:
                if not use_btf:
                    raise
                # libbpf retries without BTF key/value types (old kernels, odd types)
                return create(False)
        finally:
            if inner_fd is not None:
                inner_fd.close()  # only a template: the outer map keeps what it needs

    def struct_ops_binding(self, prog: ProgramSpec) -> tuple[StructOpsKernelType, int] | None:
        """(kernel type, member index) of the struct_ops slot ``prog`` fills, if any."""
        found: tuple[StructOpsKernelType, int] | None = None
        for map_name, plan in self.plans.items():
            so = self.spec.map(map_name).struct_ops
            if so is None:
                continue
            for mem in so.members:
                if mem.program != prog.name:
                    continue
                try:
                    kidx = plan.member(mem.name).kern_index
                except KeyError:
                    continue  # member the kernel lacks: this binding does not load it
                here = (plan.kernel, kidx)
                if found is not None and (found[0].type_id, found[1]) != (
                    here[0].type_id,
                    here[1],
                ):
                    raise LoadError(
                        f"program {prog.name} fills struct_ops slots of different types or members"
                    )
                found = here
        return found

    def load_programs(self) -> None:
        for prog in self.spec.programs:
            binding = None
            optional = False
            if prog.prog_type == bpf_uapi.ProgType.STRUCT_OPS:
                # libbpf (bpf_object_adjust_struct_ops_autoload): a struct_ops program loads
                # exactly when a created struct_ops map uses it, whatever its '?' prefix.
                binding = self.struct_ops_binding(prog)
                if binding is None:
                    continue
            elif prog.name in self.autoload:
                if not self.autoload[prog.name]:
                    continue
            elif not prog.autoload:
                if self.optional_programs == "off":
                    continue
                # A '?' section: libbpf loads it only when user space turns autoload on,
                # which scx schedulers do for the kernels that support the program. We try
                # it and keep it when the kernel takes it; a refusal is a note, not a failure.
                optional = True
            try:
                self._load_program(prog, binding)
            except (LoadError, CoreError) as exc:
                if not optional:
                    raise
                self.obj._skip(prog.name, _first_line(str(exc)))

    def _load_program(
        self, prog: ProgramSpec, binding: tuple[StructOpsKernelType, int] | None
    ) -> None:
        start = time.perf_counter_ns()
        insns, poisoned = self.relocate(prog)
        self.obj.timings_ns["core"] = self.obj.timings_ns.get("core", 0) + (
            time.perf_counter_ns() - start
        )
        start = time.perf_counter_ns()
        insns = self.apply_fixups(prog, insns)
        try:
            fd = self._load_one(prog, insns, binding)
        except ProgramLoadError as e:
            hint, note = self._unresolved(prog, poisoned, e.verifier_log or "")
            if not hint and not note:
                raise
            raise e.with_hint(hint, self._missing_modules(), note) from e.__cause__
        loaded = LoadedProgram(prog, fd, 0, insns)
        self.obj.programs[prog.name] = loaded
        loaded.id = prog_info(fd, xlated=False).id
        rodata = self.obj.maps.get(".rodata")
        if rodata is not None:
            prog_bind_map(fd, rodata.fd)
        _timed(self.obj, f"prog:{prog.name}", start)

    def relocate(self, prog: ProgramSpec) -> tuple[bytes, tuple[tuple[int, str], ...]]:
        """CO-RE-relocated instructions, and (instruction index, description) of each
        poisoned relocation (no candidate in the target BTFs: the verifier rejects it if it
        is reachable)."""
        if not prog.core_relos:
            return prog.insns, ()
        local = self._local_btf()
        res = relocate(
            local, prog.insns, prog.core_relos, self._core_targets(local, prog), self.core_cache
        )
        poisoned = tuple(
            (
                r.relo.insn_idx,
                f"CO-RE {r.kind.name} of {_local_type_name(local, r.relo.type_id)} "
                f"(insn #{r.relo.insn_idx})",
            )
            for r in res.results
            if r.poisoned
        )
        return res.insns, poisoned

    def _core_targets(self, local: Btf, prog: ProgramSpec) -> list[Btf]:
        """vmlinux alone when it has candidates for every relocated type, else vmlinux and
        the module BTFs. libbpf consults module BTFs only for a local type with *no*
        candidate in vmlinux (a field or enumerator missing from a vmlinux candidate does
        not count), and so does the engine, so the results are the same; walking the
        module list eagerly would make an object without ``.kmod_btfs`` read every loaded
        module's BTF, the cost this project removes.

        With named lookups (``IndexedKernelBtfs``) the modules are only those holding a
        candidate for any CO-RE root type of the object that vmlinux lacks; one list for
        every program, so candidate pruning is shared across programs as with the full list.
        """
        vmlinux_only = [self.kernel.vmlinux]
        for relo in prog.core_relos:
            if relo.kind is CoreReloKind.TYPE_ID_LOCAL:
                continue
            try:
                found = len(self.core_cache.get(local, relo.type_id, vmlinux_only))
            except CoreError:
                return vmlinux_only  # relocate() raises it again, naming the relocation
            if not found:
                return self._core_module_targets(local)
        return vmlinux_only

    def _core_module_targets(self, local: Btf) -> list[Btf]:
        if self.index is None:
            return list(self.kernel)
        if self._core_modules is None:
            lookups = self._core_lookups
            if not lookups:  # no prefetch ran (load_object always runs it)
                lookups = object_module_lookups(
                    self.spec, self.kernel.vmlinux, self.core_cache
                ).core
            self._core_modules = [self.kernel.vmlinux, *self.index.modules_holding(lookups)]
        return self._core_modules

    def apply_fixups(self, prog: ProgramSpec, insns: bytes) -> bytes:
        buf = bytearray(insns)
        n = insn.count(buf)
        for fx in prog.fixups:
            if not 0 <= fx.insn_idx < n:
                raise LoadError(
                    f"program {prog.name}: fixup at instruction {fx.insn_idx} "
                    f"outside its {n} instructions"
                )
            ins = insn.decode(buf, fx.insn_idx)
            want_call = fx.kind is FixupKind.KFUNC_CALL
            if (ins.code == insn.CALL) != want_call or (not want_call and not ins.is_ld_imm64):
                raise LoadError(
                    f"program {prog.name}: {fx.kind.value} fixup at instruction {fx.insn_idx} "
                    f"does not point at {'a call' if want_call else 'an ld_imm64'}"
                )
            if fx.kind in (FixupKind.MAP_FD, FixupKind.MAP_VALUE):
                m = (
                    self.spec.maps[fx.map_index]
                    if 0 <= fx.map_index < len(self.spec.maps)
                    else None
                )
                loaded = self.obj.maps.get(m.name) if m is not None else None
                if loaded is None:
                    raise LoadError(
                        f"program {prog.name}: reference to a map that was not created "
                        f"(index {fx.map_index})"
                    )
                src = insn.PSEUDO_MAP_FD if fx.kind is FixupKind.MAP_FD else insn.PSEUDO_MAP_VALUE
                insn.encode_into(
                    buf, fx.insn_idx, insn.Insn(ins.code, ins.dst, src, ins.off, loaded.fd.fd)
                )
            elif fx.kind is FixupKind.KFUNC_CALL:
                r = self.obj.externs.get(fx.extern)
                if r is None or not r.resolved:
                    idx = self._extern_index(fx.extern)
                    insn.encode_into(
                        buf,
                        fx.insn_idx,
                        insn.Insn(insn.CALL, 0, 0, 0, POISON_CALL_KFUNC_BASE + idx),
                    )
                else:
                    insn.encode_into(
                        buf,
                        fx.insn_idx,
                        insn.Insn(ins.code, ins.dst, insn.PSEUDO_KFUNC_CALL, r.fd_index, r.btf_id),
                    )
            elif fx.kind is FixupKind.KSYM:
                self._fix_ksym(prog, buf, fx.insn_idx, fx.extern)
        return bytes(buf)

    def _extern_index(self, name: str) -> int:
        for i, e in enumerate(self.spec.externs):
            if e.name == name:
                return i
        return 0

    def _fix_ksym(self, prog: ProgramSpec, buf: bytearray, idx: int, name: str) -> None:
        if idx + 1 >= insn.count(buf):
            raise LoadError(f"program {prog.name}: ksym {name} at the last instruction")
        ins, hi = insn.decode(buf, idx), insn.decode(buf, idx + 1)
        r = self.obj.externs.get(name)
        if r is None or not r.resolved:
            src, lo_imm, hi_imm = 0, 0, 0
        elif r.btf_id:
            src, lo_imm, hi_imm = insn.PSEUDO_BTF_ID, r.btf_id, r.module_fd
        else:
            src = 0
            lo_imm = _s32(r.address & 0xFFFFFFFF)
            hi_imm = _s32(r.address >> 32)
        insn.encode_into(buf, idx, insn.Insn(ins.code, ins.dst, src, ins.off, lo_imm))
        insn.encode_into(buf, idx + 1, insn.Insn(hi.code, hi.dst, hi.src, hi.off, hi_imm))

    def _load_one(
        self, prog: ProgramSpec, insns: bytes, binding: tuple[StructOpsKernelType, int] | None
    ) -> ProgFd:
        attach_btf_id = 0
        attach_obj: BtfFd | None = None
        eat = prog.expected_attach_type
        if binding is not None:
            kt, kidx = binding
            attach_btf_id, eat = kt.type_id, kidx
            if kt.btf is not self.kernel.vmlinux:
                attach_obj = self.module_fd(kt.btf)
        elif eat in TRACING_TARGETS and prog.prog_type in (
            bpf_uapi.ProgType.TRACING,
            bpf_uapi.ProgType.LSM,
        ):
            attach_btf_id, attach_obj = self._attach_target(prog)
        btf = self.obj.btf_fd
        # the records are decoded from the object's .BTF.ext only now, as libbpf does
        with_ext = btf is not None and self._has_func()
        func_info = prog.ext_info.func_info_bytes() if with_ext else b""
        line_info = prog.ext_info.line_info_bytes() if with_ext else b""
        try:
            return prog_load(
                prog.prog_type,
                insns,
                license=self.spec.license,
                name=prog.name,
                expected_attach_type=eat,
                prog_flags=bpf_uapi.F_SLEEPABLE if prog.sleepable else 0,
                btf_fd=btf,
                # without kernel FUNC support libbpf drops func and line info too
                func_info=func_info,
                line_info=line_info,
                attach_btf_id=attach_btf_id,
                attach_btf_obj_fd=attach_obj,
                fd_array=self.fd_array,
                kern_version=self.spec.kern_version,
            )
        except BpfSyscallError as e:
            raise _prog_error(prog.name, e) from e

    def _has_func(self) -> bool:
        return self.btf_features is None or self.btf_features.func

    def _attach_target(self, prog: ProgramSpec) -> tuple[int, BtfFd | None]:
        kind, prefix = TRACING_TARGETS[prog.expected_attach_type]
        target = prog.attach_to
        module = None
        if ":" in target:
            module, target = target.split(":", 1)
        name = prefix + target

        def probe(btf: Btf) -> int | None:
            if module is not None and btf.name != module:
                return None
            ids = btf.find_ids(name, kind)
            return ids[0] if ids else None

        hit = self._first(ModuleLookup(name, (kind,)), probe)
        if hit is None:
            raise LoadError(
                f"program {prog.name}: attach target {name} not found ({self._searched()})"
            )
        btf, tid = hit
        return tid, None if btf is self.kernel.vmlinux else self.module_fd(btf)

    def fill_prog_arrays(self) -> None:
        """``.values`` initialisers of PROG_ARRAY maps: slot -> program fd."""
        for m in self.spec.maps:
            if (
                m.type != bpf_uapi.MapType.PROG_ARRAY
                or not m.init_slots
                or m.name not in self.obj.maps
            ):
                continue
            for index, prog_name in m.init_slots:
                prog = self.obj.programs.get(prog_name)
                if prog is None:
                    raise LoadError(
                        f"map {m.name}: slot {index} names program {prog_name}, "
                        "which was not loaded"
                    )
                map_update_elem(self.obj.maps[m.name].fd, _U32.pack(index), _U32.pack(prog.fd.fd))

    def build_struct_ops_values(self) -> None:
        for map_name, plan in self.plans.items():
            so = self.spec.map(map_name).struct_ops
            if so is None:
                continue
            fds: dict[str, int] = {}
            for mem in so.members:
                if mem.program is not None and mem.program in self.obj.programs:
                    fds[mem.name] = self.obj.programs[mem.program].fd.fd
            self.obj.struct_ops_values[map_name] = build_value(plan, so.data, fds)


def _first_line(text: str) -> str:
    """The first line of an error message (a verifier log follows it in some)."""
    return text.split("\n", 1)[0]


_RINGBUF_TYPES = frozenset({bpf_uapi.MapType.RINGBUF, bpf_uapi.MapType.USER_RINGBUF})


def ringbuf_size(size: int, page: int) -> int:
    """A ring buffer's ``max_entries`` (its data size in bytes) as the kernel takes it: a
    power-of-2 number of ``page``-byte pages. Other sizes are rounded up to the next one, as
    libbpf does for ``BPF_MAP_TYPE_RINGBUF``/``USER_RINGBUF`` maps; 0 stays 0 (the kernel
    then says what is wrong), and a size with no such multiple below 2**32 is left as is."""
    if size == 0:
        return 0
    pages = 1
    while pages * page < (1 << 32):
        if pages * page >= size:
            return pages * page
        pages <<= 1
    return size


def map_max_entries(m: MapSpec) -> int:
    """The ``max_entries`` the loader creates ``m`` with: the spec's, with ring buffer sizes
    rounded up to a power-of-2 number of system pages (:func:`ringbuf_size`)."""
    if m.type in _RINGBUF_TYPES:
        return ringbuf_size(m.max_entries, mmap.PAGESIZE)
    return m.max_entries


def _write_initial(fd: MapFd, m: MapSpec, data: bytes) -> None:
    """Write a new data map's initial value: ``data``, zeros after it (the kernel created
    the map zeroed). A prefix of a mmapable map is written through ``mmap`` (unmapped
    again before the map is frozen), so a large ``.bss`` with one variable set costs the
    pages written, not a buffer of the whole value; others by ``BPF_MAP_UPDATE_ELEM``."""
    if len(data) >= m.value_size:
        map_update_elem(fd, b"\0\0\0\0", data[: m.value_size])
    elif m.flags & bpf_uapi.F_MMAPABLE:
        with mmap.mmap(fd.fd, m.value_size, mmap.MAP_SHARED) as mm:
            mm[: len(data)] = data
    else:
        map_update_elem(fd, b"\0\0\0\0", data + bytes(m.value_size - len(data)))


def _local_type_name(btf: Btf, type_id: int) -> str:
    """``struct foo`` / ``enum bar`` / ``[id]`` for a local type, for error messages."""
    try:
        t = btf.type(type_id)
    except BtfError:  # relocate() already named a bad id; never fail while explaining
        return f"[{type_id}]"
    name = t.name or f"[{type_id}]"
    prefix = _KIND_PREFIX.get(t.kind, "")
    return prefix + name


_KIND_PREFIX = {
    Kind.STRUCT: "struct ",
    Kind.UNION: "union ",
    Kind.ENUM: "enum ",
    Kind.ENUM64: "enum ",
}


def _s32(v: int) -> int:
    return v - (1 << 32) if v & 0x80000000 else v


class ProgramLoadError(LoadError):
    """A program the kernel refused; ``program`` names it, ``verifier_log`` holds the log
    and ``errno_name`` the kernel's errno (from the underlying
    :class:`~schedswitchd.errors.BpfSyscallError`)."""

    def __init__(
        self,
        program: str,
        cause: BpfSyscallError,
        *,
        hint: str = "",
        missing_modules: tuple[str, ...] = (),
        note: str = "",
    ) -> None:
        self.program = program
        self.cause = cause
        self.verifier_log = cause.verifier_log
        self.errno_name = cause.errno_name
        #: declared modules (``.kmod_btfs`` / configured) that were not loaded at load time
        self.missing_modules = missing_modules
        head = f"program {program}: {hint}: " if hint else f"program {program}: "
        tail = f" [{note}]" if note else ""
        super().__init__(head + str(cause) + tail)

    def with_hint(
        self, hint: str, missing_modules: tuple[str, ...], note: str = ""
    ) -> ProgramLoadError:
        """The same error with ``hint`` (what the verifier reached that was not found,
        which declared modules were absent) put before the kernel's message and ``note``
        (absent externs the verifier did not reach) after it."""
        return ProgramLoadError(
            self.program, self.cause, hint=hint, missing_modules=missing_modules, note=note
        )


class ProgramRunError(LoadError):
    """``BPF_PROG_RUN`` of a loaded program failed: ``program`` names it, ``errno`` is the
    kernel's (or the affinity call's) errno, ``errno_name`` its name."""

    def __init__(self, program: str, message: str, errno_value: int) -> None:
        self.program = program
        self.errno = errno_value
        self.errno_name = errno.errorcode.get(errno_value, str(errno_value))
        super().__init__(f"program {program}: {message}")


def _prog_error(name: str, e: BpfSyscallError) -> ProgramLoadError:
    return ProgramLoadError(name, e)


_KALLSYMS: dict[str, int] | None = None


def _kallsyms() -> dict[str, int]:
    """``/proc/kallsyms`` as name -> address (first occurrence; read once per process)."""
    global _KALLSYMS
    if _KALLSYMS is None:
        table: dict[str, int] = {}
        with open("/proc/kallsyms", encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    table.setdefault(parts[2], int(parts[0], 16))
        _KALLSYMS = table
    return _KALLSYMS


def load_object(
    spec: ObjectSpec,
    kernel: KernelBtfs,
    *,
    open_btf_object: Callable[[str], BtfFd] | None = None,
    kernel_config: Mapping[str, KconfigValue] | None = None,
    pin_root: str | os.PathLike[str] = DEFAULT_PIN_ROOT,
    btf_features: BtfFeatures | None = None,
    fill_enums: bool = True,
    enum_prefixes: Sequence[str] = DEFAULT_ENUM_PREFIXES,
    autoload: Mapping[str, bool] | None = None,
    optional_programs: OptionalPrograms = "try",
) -> LoadedObject:
    """Load ``spec`` into the kernel (everything but attaching).

    ``kernel``: the kernel BTFs to resolve against (``KernelBtfRegistry.targets(...)`` or
    :class:`StaticKernelBtfs`); ``open_btf_object``: fds of module BTF objects by name
    (``KernelBtfRegistry.open_btf_object``), needed only when something resolves into a
    module; ``kernel_config``: overrides reading the running kernel's config;
    ``pin_root``: the bpffs directory of ``LIBBPF_PIN_BY_NAME`` maps (an existing pin is
    reused when it matches, else the new map is pinned there); ``btf_features``: the
    kernel's BTF features (default: probed once per process), deciding what the object's
    BTF is sanitised for. ``fill_enums``: first set every non-static ``.rodata`` variable
    named ``<prefix>...`` (``enum_prefixes``, default ``__SCX_``) to the value of the vmlinux
    enumerator named like it without the leading ``__`` (scx's ``SCX_ENUM_INIT``), except
    variables in ``spec.assigned``; the result is ``LoadedObject.enum_fill``.
    ``autoload``: program name -> load it or not (libbpf's ``bpf_program__set_autoload``;
    struct_ops programs keep following their maps).

    Programs of ``?``-prefixed sections (autoload off in libbpf) that ``autoload`` does not
    name are optional. With ``optional_programs="try"`` (the default) each is tried, and
    one that fails (verifier rejection, attach target missing from the kernel, ...) is left
    out with its reason in ``LoadedObject.skipped`` and a line in ``LoadedObject.notes``;
    the load goes on. This stands in for scx user space, which turns such programs on when
    the kernel supports them; an object whose ``?`` programs are *alternatives* (scx_lavd's
    futex fexit hooks or, failing those, tracepoints) needs ``autoload`` choices, or both
    sets run. ``"off"`` is libbpf's default: they are not loaded. A program ``autoload``
    turns on must load like any other.

    Raises :class:`LoadError` (e.g. a missing strong kfunc, a struct_ops member the kernel
    lacks with a non-zero value; :class:`ProgramLoadError` with the verifier log for a
    rejected program), :class:`~schedswitchd.errors.BpfSyscallError`,
    :class:`~schedswitchd.errors.CoreError`. On any failure everything created so far is
    closed before the error propagates.
    """
    unknown = sorted(set(autoload or {}) - {p.name for p in spec.programs})
    if unknown:
        raise LoadError(f"autoload names unknown program(s) of {spec.name}: {', '.join(unknown)}")
    if optional_programs not in ("try", "off"):
        raise LoadError(f"optional_programs must be 'try' or 'off', not {optional_programs!r}")
    loader = _Loader(
        spec,
        kernel,
        open_btf_object,
        kernel_config,
        pin_root,
        btf_features,
        autoload,
        optional_programs,
    )
    try:
        if fill_enums:
            loader.fill_enums(enum_prefixes)
        loader.load_btf()
        loader.prefetch_module_lookups()
        loader.resolve_externs()
        loader.plan_struct_ops()
        loader.create_maps()
        loader.load_programs()
        loader.fill_prog_arrays()
        loader.build_struct_ops_values()
    except BaseException:
        loader.obj.close()
        for path in loader.new_pins:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise
    return loader.obj


__all__ = [
    "IndexedKernelBtfs",
    "KernelBtfs",
    "LoadedMap",
    "LoadedObject",
    "LoadedProgram",
    "ProgramLoadError",
    "ProgramRun",
    "ProgramRunError",
    "ResolvedExtern",
    "StaticKernelBtfs",
    "load_object",
    "map_max_entries",
    "ringbuf_size",
]
