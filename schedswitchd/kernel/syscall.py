"""The ``bpf(2)`` system call through ctypes, one function per command we use.

Layouts come from :mod:`schedswitchd.kernel.bpf_uapi` (UAPI ``include/uapi/linux/bpf.h``); the
semantics from the ``bpf(2)`` man page and ``kernel/bpf/syscall.c``. Every failure raises
:class:`~schedswitchd.errors.BpfSyscallError` with the command, the errno name and a sentence
from :mod:`schedswitchd.kernel.errmsg`; program and BTF loads attach the kernel's log. Every
fd returned is owned by a :mod:`schedswitchd.kernel.fd` object.

Arguments that are file descriptors accept an :class:`~schedswitchd.kernel.fd.OwnedFd` or a
plain ``int`` (the caller keeps ownership). Buffers are ``bytes``-like; sizes are bytes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from schedswitchd.errors import BpfSyscallError
from schedswitchd.kernel import bpf_uapi
from schedswitchd.kernel.errmsg import explain
from schedswitchd.kernel.fd import BtfFd, LinkFd, MapFd, OwnedFd, ProgFd

# __NR_bpf per architecture (arch/*/entry/syscalls, include/uapi/asm-generic/unistd.h).
_NR_BPF = {
    "x86_64": 321,
    "amd64": 321,
    "i386": 357,
    "i686": 357,
    "aarch64": 280,
    "arm64": 280,
    "riscv64": 280,
    "loongarch64": 280,
    "armv7l": 386,
    "ppc64le": 361,
    "ppc64": 361,
    "s390x": 351,
}

#: Verifier log buffer: first size tried and the cap (bytes), as libbpf's defaults.
LOG_SIZE_START = 64 * 1024
LOG_SIZE_MAX = 16 * 1024 * 1024
_PROG_LOAD_EAGAIN_RETRIES = 5

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_uint)

FdLike = OwnedFd | int
_F = TypeVar("_F", bound=OwnedFd)


def _nr_bpf() -> int:
    machine = platform.machine().lower()
    try:
        return _NR_BPF[machine]
    except KeyError:
        raise OSError(
            errno.ENOSYS, f"bpf() syscall number unknown for machine {machine!r}"
        ) from None


_NR = _nr_bpf()


@dataclass(slots=True)
class SyscallStats:
    """Time spent inside ``bpf(2)`` since the last :meth:`reset` (for benchmarks)."""

    calls: int = 0
    total_ns: int = 0

    def reset(self) -> None:
        """Zero the counters."""
        self.calls = 0
        self.total_ns = 0


#: Process-wide counters, updated on every call.
STATS = SyscallStats()


def _fdnum(fd: FdLike) -> int:
    return fd.fd if isinstance(fd, OwnedFd) else int(fd)


def _addr(buf: ctypes.Array[Any] | ctypes.Structure) -> int:
    return ctypes.addressof(buf)


def _cbuf(data: bytes | bytearray | memoryview) -> ctypes.Array[ctypes.c_char]:
    """A C copy of ``data`` (kept alive by the caller for the duration of the call)."""
    raw = bytes(data)
    return ctypes.create_string_buffer(raw, len(raw)) if raw else ctypes.create_string_buffer(1)


def sys_bpf(cmd: bpf_uapi.Cmd, attr: ctypes.Structure) -> int:
    """Issue ``bpf(cmd, &attr, sizeof(attr))``; return the non-negative result or
    ``-errno``. Retries on ``EINTR``. Most callers want :func:`bpf`."""
    size = ctypes.sizeof(attr)
    ptr = ctypes.addressof(attr)
    while True:
        start = time.perf_counter_ns()
        ret = int(_syscall(_NR, int(cmd), ptr, size))
        err = ctypes.get_errno() if ret < 0 else 0
        STATS.calls += 1
        STATS.total_ns += time.perf_counter_ns() - start
        if ret >= 0:
            return ret
        if err != errno.EINTR:
            return -err


def bpf(cmd: bpf_uapi.Cmd, attr: ctypes.Structure, *, detail: str | None = None) -> int:
    """Like :func:`sys_bpf` but raise :class:`BpfSyscallError` on failure; ``detail`` (an
    object name or path) is added to the error sentence."""
    ret = sys_bpf(cmd, attr)
    if ret < 0:
        raise BpfSyscallError(cmd.uapi_name, -ret, explain(cmd, -ret, detail))
    return ret


def _name16(name: str) -> bytes:
    # The kernel keeps 15 bytes plus NUL; longer names are truncated as libbpf does.
    return name.encode()[: bpf_uapi.OBJ_NAME_LEN - 1]


def _decode_log(buf: ctypes.Array[ctypes.c_char]) -> str:
    return buf.raw.split(b"\0", 1)[0].decode("utf-8", "replace")


# Summary lines the verifier prints after the error; the line before them names the problem.
_LOG_STATS_PREFIXES = ("processed ", "verification time", "stack depth", "mark_read")


def _last_line(log: str) -> str | None:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(_LOG_STATS_PREFIXES)]
    if useful:
        return useful[-1]
    return lines[-1] if lines else None


# --- BTF -----------------------------------------------------------------------------------


def btf_load(
    data: bytes | bytearray | memoryview,
    *,
    log_size_start: int = LOG_SIZE_START,
    log_size_max: int = LOG_SIZE_MAX,
) -> BtfFd:
    """``BPF_BTF_LOAD`` the raw BTF ``data`` (header + types + strings, kernel doc
    ``Documentation/bpf/btf.rst``). On failure the load is repeated with a log buffer
    (``log_size_start`` bytes, doubled up to ``log_size_max``) and the kernel's BTF log is
    attached to the raised :class:`BpfSyscallError` as ``verifier_log``."""
    cdata = _cbuf(data)
    attr = bpf_uapi.BtfLoadAttr(btf=_addr(cdata), btf_size=len(data))
    ret = sys_bpf(bpf_uapi.Cmd.BTF_LOAD, attr)
    if ret >= 0:
        return BtfFd(ret)
    first_err = -ret
    size = log_size_start
    while True:
        log = ctypes.create_string_buffer(size)
        attr = bpf_uapi.BtfLoadAttr(
            btf=_addr(cdata),
            btf_size=len(data),
            btf_log_buf=_addr(log),
            btf_log_size=size,
            btf_log_level=1,
        )
        ret = sys_bpf(bpf_uapi.Cmd.BTF_LOAD, attr)
        if ret >= 0:  # the first failure was transient
            return BtfFd(ret)
        err = -ret
        if err == errno.ENOSPC and size < log_size_max:
            size = min(max(size * 2, int(attr.btf_log_true_size)), log_size_max)
            continue
        text = _decode_log(log)
        if err == errno.ENOSPC and first_err != errno.ENOSPC:
            err = first_err  # report the real failure, with a truncated log
        raise BpfSyscallError(
            bpf_uapi.Cmd.BTF_LOAD.uapi_name,
            err,
            explain(bpf_uapi.Cmd.BTF_LOAD, err, _last_line(text)),
            verifier_log=text,
        )


# --- maps ----------------------------------------------------------------------------------


def map_create(
    map_type: int,
    key_size: int,
    value_size: int,
    max_entries: int,
    *,
    name: str = "",
    flags: int = 0,
    btf_fd: FdLike | None = None,
    btf_key_type_id: int = 0,
    btf_value_type_id: int = 0,
    btf_vmlinux_value_type_id: int = 0,
    value_type_btf_obj_fd: FdLike | None = None,
    inner_map_fd: FdLike | None = None,
    map_extra: int = 0,
    numa_node: int = 0,
    ifindex: int = 0,
) -> MapFd:
    """``BPF_MAP_CREATE``. Sizes in bytes; ``name`` is truncated to 15 bytes (the kernel
    accepts letters, digits, ``_`` and ``.``). ``btf_vmlinux_value_type_id`` is the
    kernel's ``bpf_struct_ops_<name>`` type id for struct_ops maps; the kernel then still
    requires ``btf_fd`` (the object's BTF, key/value type ids 0), and a module's type also
    needs ``value_type_btf_obj_fd`` (``BPF_F_VTYPE_BTF_OBJ_FD`` is then set here)."""
    attr = bpf_uapi.MapCreateAttr(
        map_type=map_type,
        key_size=key_size,
        value_size=value_size,
        max_entries=max_entries,
        map_flags=flags,
        numa_node=numa_node,
        map_name=_name16(name),
        map_ifindex=ifindex,
        btf_key_type_id=btf_key_type_id,
        btf_value_type_id=btf_value_type_id,
        btf_vmlinux_value_type_id=btf_vmlinux_value_type_id,
        map_extra=map_extra,
    )
    if btf_fd is not None:
        attr.btf_fd = _fdnum(btf_fd)
    if inner_map_fd is not None:
        attr.inner_map_fd = _fdnum(inner_map_fd)
    if value_type_btf_obj_fd is not None:
        attr.value_type_btf_obj_fd = _fdnum(value_type_btf_obj_fd)
        attr.map_flags |= bpf_uapi.F_VTYPE_BTF_OBJ_FD
    return MapFd(bpf(bpf_uapi.Cmd.MAP_CREATE, attr, detail=f"map {name!r}" if name else None))


def map_lookup_elem(map_fd: FdLike, key: bytes, value_size: int, *, flags: int = 0) -> bytes | None:
    """``BPF_MAP_LOOKUP_ELEM``: the value (``value_size`` bytes; for per-CPU maps pass
    :func:`percpu_value_size`), or ``None`` when no element has ``key``."""
    ckey = _cbuf(key)
    value = ctypes.create_string_buffer(max(value_size, 1))
    attr = bpf_uapi.MapElemAttr(
        map_fd=_fdnum(map_fd), key=_addr(ckey), value=_addr(value), flags=flags
    )
    ret = sys_bpf(bpf_uapi.Cmd.MAP_LOOKUP_ELEM, attr)
    if ret == -errno.ENOENT:
        return None
    if ret < 0:
        raise BpfSyscallError(
            bpf_uapi.Cmd.MAP_LOOKUP_ELEM.uapi_name,
            -ret,
            explain(bpf_uapi.Cmd.MAP_LOOKUP_ELEM, -ret),
        )
    return value.raw[:value_size]


def map_update_elem(map_fd: FdLike, key: bytes, value: bytes, *, flags: int = bpf_uapi.ANY) -> None:
    """``BPF_MAP_UPDATE_ELEM`` (``flags``: ``ANY``/``NOEXIST``/``EXIST``, ``F_LOCK``).
    For a struct_ops map this registers the ops (key 0, value = kernel value layout)."""
    ckey, cvalue = _cbuf(key), _cbuf(value)
    attr = bpf_uapi.MapElemAttr(
        map_fd=_fdnum(map_fd), key=_addr(ckey), value=_addr(cvalue), flags=flags
    )
    bpf(bpf_uapi.Cmd.MAP_UPDATE_ELEM, attr)


def map_delete_elem(map_fd: FdLike, key: bytes) -> bool:
    """``BPF_MAP_DELETE_ELEM``: ``True`` if deleted, ``False`` if no element had ``key``.
    (Deleting key 0 of a struct_ops map unregisters it.)"""
    ckey = _cbuf(key)
    attr = bpf_uapi.MapElemAttr(map_fd=_fdnum(map_fd), key=_addr(ckey))
    ret = sys_bpf(bpf_uapi.Cmd.MAP_DELETE_ELEM, attr)
    if ret == -errno.ENOENT:
        return False
    if ret < 0:
        raise BpfSyscallError(
            bpf_uapi.Cmd.MAP_DELETE_ELEM.uapi_name,
            -ret,
            explain(bpf_uapi.Cmd.MAP_DELETE_ELEM, -ret),
        )
    return True


def map_get_next_key(map_fd: FdLike, key: bytes | None, key_size: int) -> bytes | None:
    """``BPF_MAP_GET_NEXT_KEY``: the key after ``key`` (the first key when ``key`` is
    ``None``), or ``None`` at the end."""
    ckey = _cbuf(key) if key is not None else None
    nxt = ctypes.create_string_buffer(max(key_size, 1))
    attr = bpf_uapi.MapElemAttr(
        map_fd=_fdnum(map_fd), key=_addr(ckey) if ckey is not None else 0, value=_addr(nxt)
    )
    ret = sys_bpf(bpf_uapi.Cmd.MAP_GET_NEXT_KEY, attr)
    if ret == -errno.ENOENT:
        return None
    if ret < 0:
        raise BpfSyscallError(
            bpf_uapi.Cmd.MAP_GET_NEXT_KEY.uapi_name,
            -ret,
            explain(bpf_uapi.Cmd.MAP_GET_NEXT_KEY, -ret),
        )
    return nxt.raw[:key_size]


def map_keys(map_fd: FdLike, key_size: int) -> Iterator[bytes]:
    """All keys of a map in kernel order (``BPF_MAP_GET_NEXT_KEY`` walk)."""
    key = map_get_next_key(map_fd, None, key_size)
    while key is not None:
        yield key
        key = map_get_next_key(map_fd, key, key_size)


def map_freeze(map_fd: FdLike) -> None:
    """``BPF_MAP_FREEZE``: user space can no longer write the map (programs still can
    unless the map has ``BPF_F_RDONLY_PROG``)."""
    bpf(bpf_uapi.Cmd.MAP_FREEZE, bpf_uapi.MapElemAttr(map_fd=_fdnum(map_fd)))


def possible_cpus() -> int:
    """Number of possible CPUs (``/sys/devices/system/cpu/possible``, e.g. ``0-3``)."""
    with open("/sys/devices/system/cpu/possible", encoding="ascii") as f:
        text = f.read().strip()
    count = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count


def percpu_value_size(value_size: int) -> int:
    """Bytes of a per-CPU map value buffer: each CPU's value rounded up to 8 bytes."""
    return ((value_size + 7) // 8) * 8 * possible_cpus()


# --- programs ------------------------------------------------------------------------------


def prog_load(
    prog_type: int,
    insns: bytes | bytearray | memoryview,
    *,
    license: str = "GPL",
    name: str = "",
    expected_attach_type: int = 0,
    prog_flags: int = 0,
    btf_fd: FdLike | None = None,
    func_info: bytes = b"",
    func_info_rec_size: int = ctypes.sizeof(bpf_uapi.BpfFuncInfo),
    line_info: bytes = b"",
    line_info_rec_size: int = ctypes.sizeof(bpf_uapi.BpfLineInfo),
    attach_btf_id: int = 0,
    attach_btf_obj_fd: FdLike | None = None,
    attach_prog_fd: FdLike | None = None,
    fd_array: Sequence[int] = (),
    kern_version: int = 0,
    log_size_start: int = LOG_SIZE_START,
    log_size_max: int = LOG_SIZE_MAX,
) -> ProgFd:
    """``BPF_PROG_LOAD``. ``insns`` are 8-byte ``struct bpf_insn`` slots; ``func_info`` /
    ``line_info`` are packed ``bpf_func_info`` / ``bpf_line_info`` records (counts derived
    from the record sizes); ``fd_array`` holds the fds that kfunc calls' ``off`` and
    ``BPF_PSEUDO_MAP_IDX`` index (index 0 is vmlinux for kfuncs).

    Loads once without a log (fast path). On failure it loads again with a verifier log
    of ``log_size_start`` bytes, doubled (or grown to the kernel's ``log_true_size``) up
    to ``log_size_max`` while the kernel reports ``ENOSPC``, and raises
    :class:`BpfSyscallError` with the log in ``verifier_log`` and its last line in the
    message. ``EAGAIN`` is retried a few times, as libbpf does."""
    if len(insns) % 8 or not insns:
        raise ValueError(f"instructions must be a non-empty multiple of 8 bytes, got {len(insns)}")
    cinsns = _cbuf(insns)
    clicense = ctypes.create_string_buffer(license.encode())
    cfunc = _cbuf(func_info) if func_info else None
    cline = _cbuf(line_info) if line_info else None
    cfds = (ctypes.c_int32 * len(fd_array))(*fd_array) if fd_array else None

    def make(log: ctypes.Array[ctypes.c_char] | None) -> bpf_uapi.ProgLoadAttr:
        attr = bpf_uapi.ProgLoadAttr(
            prog_type=prog_type,
            insn_cnt=len(insns) // 8,
            insns=_addr(cinsns),
            license=_addr(clicense),
            kern_version=kern_version,
            prog_flags=prog_flags,
            prog_name=_name16(name),
            expected_attach_type=expected_attach_type,
            attach_btf_id=attach_btf_id,
        )
        if btf_fd is not None:
            attr.prog_btf_fd = _fdnum(btf_fd)
        if cfunc is not None:
            attr.func_info_rec_size = func_info_rec_size
            attr.func_info = _addr(cfunc)
            attr.func_info_cnt = len(func_info) // func_info_rec_size
        if cline is not None:
            attr.line_info_rec_size = line_info_rec_size
            attr.line_info = _addr(cline)
            attr.line_info_cnt = len(line_info) // line_info_rec_size
        if attach_btf_obj_fd is not None:
            attr.attach_btf_obj_fd = _fdnum(attach_btf_obj_fd)
        elif attach_prog_fd is not None:
            attr.attach_btf_obj_fd = _fdnum(attach_prog_fd)
        if cfds is not None:
            attr.fd_array = ctypes.addressof(cfds)
        if log is not None:
            attr.log_level = 1
            attr.log_size = len(log)
            attr.log_buf = _addr(log)
        return attr

    def load(attr: bpf_uapi.ProgLoadAttr) -> int:
        for _ in range(_PROG_LOAD_EAGAIN_RETRIES):
            ret = sys_bpf(bpf_uapi.Cmd.PROG_LOAD, attr)
            if ret != -errno.EAGAIN:
                return ret
        return ret

    ret = load(make(None))
    if ret >= 0:
        return ProgFd(ret)
    first_err = -ret
    size = log_size_start
    while True:
        log = ctypes.create_string_buffer(size)
        attr = make(log)
        ret = load(attr)
        if ret >= 0:
            return ProgFd(ret)
        err = -ret
        if err == errno.ENOSPC and size < log_size_max:
            size = min(max(size * 2, int(attr.log_true_size)), log_size_max)
            continue
        text = _decode_log(log)
        if err == errno.ENOSPC and first_err != errno.ENOSPC:
            err = first_err
        what = f"program {name!r}" if name else "program"
        last = _last_line(text)
        raise BpfSyscallError(
            bpf_uapi.Cmd.PROG_LOAD.uapi_name,
            err,
            explain(bpf_uapi.Cmd.PROG_LOAD, err, f"{what}: {last}" if last else what),
            verifier_log=text,
        )


def prog_bind_map(prog_fd: FdLike, map_fd: FdLike) -> None:
    """``BPF_PROG_BIND_MAP``: keep ``map_fd``'s map alive as long as the program (used for
    ``.rodata`` maps the program's code no longer references after optimisation)."""
    bpf(
        bpf_uapi.Cmd.PROG_BIND_MAP,
        bpf_uapi.ProgBindMapAttr(prog_fd=_fdnum(prog_fd), map_fd=_fdnum(map_fd)),
    )


@dataclass(frozen=True, slots=True)
class TestRunResult:
    """Outcome of ``BPF_PROG_TEST_RUN``: the program's return value, mean duration per run
    in ns, and the output data/context (trimmed to what the kernel wrote)."""

    __test__ = False

    retval: int
    duration_ns: int
    data_out: bytes
    ctx_out: bytes
    #: The ``ctx_in`` buffer after the run: ``BPF_PROG_TYPE_SYSCALL`` programs write their
    #: context back there (``bpf_prog_test_run_syscall``), not into ``ctx_out``.
    ctx_in_after: bytes = b""


def prog_test_run(
    prog_fd: FdLike,
    *,
    data_in: bytes = b"",
    data_out_size: int = 0,
    ctx_in: bytes = b"",
    ctx_out_size: int = 0,
    repeat: int = 0,
    flags: int = 0,
    cpu: int = 0,
) -> TestRunResult:
    """``BPF_PROG_TEST_RUN`` (``BPF_PROG_RUN``): run the program ``repeat`` times (0 means
    once) on ``data_in`` / ``ctx_in``. Socket filters need at least 14 bytes (an Ethernet
    header) of data; ``BPF_PROG_TYPE_SYSCALL`` programs take only a context and require
    ``repeat`` 0 and no flags."""
    cdin = _cbuf(data_in) if data_in else None
    cdout = ctypes.create_string_buffer(data_out_size) if data_out_size else None
    ccin = _cbuf(ctx_in) if ctx_in else None
    ccout = ctypes.create_string_buffer(ctx_out_size) if ctx_out_size else None
    attr = bpf_uapi.TestRunAttr(prog_fd=_fdnum(prog_fd), repeat=repeat, flags=flags, cpu=cpu)
    if cdin is not None:
        attr.data_in, attr.data_size_in = _addr(cdin), len(data_in)
    if cdout is not None:
        attr.data_out, attr.data_size_out = _addr(cdout), data_out_size
    if ccin is not None:
        attr.ctx_in, attr.ctx_size_in = _addr(ccin), len(ctx_in)
    if ccout is not None:
        attr.ctx_out, attr.ctx_size_out = _addr(ccout), ctx_out_size
    bpf(bpf_uapi.Cmd.PROG_TEST_RUN, attr)
    return TestRunResult(
        retval=int(attr.retval),
        duration_ns=int(attr.duration),
        data_out=cdout.raw[: min(int(attr.data_size_out), data_out_size)] if cdout else b"",
        ctx_out=ccout.raw[: min(int(attr.ctx_size_out), ctx_out_size)] if ccout else b"",
        ctx_in_after=ccin.raw[: len(ctx_in)] if ccin is not None else b"",
    )


# --- object info ---------------------------------------------------------------------------


def _get_info(fd: FdLike, info: ctypes.Structure) -> int:
    attr = bpf_uapi.InfoAttr(bpf_fd=_fdnum(fd), info_len=ctypes.sizeof(info), info=_addr(info))
    bpf(bpf_uapi.Cmd.OBJ_GET_INFO_BY_FD, attr)
    return int(attr.info_len)


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class ProgInfo:
    """``struct bpf_prog_info`` of a loaded program. ``xlated_insns`` are the instructions
    after the verifier's rewrites (8-byte slots; empty unless requested); ``map_ids`` the
    maps the program uses; ``load_time_ns`` is ns since boot; ``run_time_ns``/``run_cnt``
    count only while stats are enabled."""

    type: int
    id: int
    tag: bytes
    name: str
    xlated_insns: bytes
    map_ids: tuple[int, ...]
    btf_id: int
    load_time_ns: int
    created_by_uid: int
    gpl_compatible: bool
    verified_insns: int
    attach_btf_obj_id: int
    attach_btf_id: int
    run_time_ns: int
    run_cnt: int
    nr_func_info: int
    nr_line_info: int


def prog_info(fd: FdLike, *, xlated: bool = True) -> ProgInfo:
    """``BPF_OBJ_GET_INFO_BY_FD`` on a program: two calls, the first learning the sizes of
    the xlated instructions and map id array, the second filling them."""
    first = bpf_uapi.BpfProgInfo()
    _get_info(fd, first)
    n_maps = int(first.nr_map_ids)
    xlen = int(first.xlated_prog_len) if xlated else 0
    info = bpf_uapi.BpfProgInfo()
    ids = (ctypes.c_uint32 * max(n_maps, 1))()
    xbuf = ctypes.create_string_buffer(max(xlen, 1))
    if n_maps:
        info.nr_map_ids, info.map_ids = n_maps, ctypes.addressof(ids)
    if xlen:
        info.xlated_prog_len, info.xlated_prog_insns = xlen, _addr(xbuf)
    _get_info(fd, info)
    got_maps = min(int(info.nr_map_ids), n_maps)
    got_x = min(int(info.xlated_prog_len), xlen)
    return ProgInfo(
        type=int(info.type),
        id=int(info.id),
        tag=bytes(info.tag),
        name=_cstr(bytes(info.name)),
        xlated_insns=xbuf.raw[:got_x],
        map_ids=tuple(int(ids[i]) for i in range(got_maps)),
        btf_id=int(info.btf_id),
        load_time_ns=int(info.load_time),
        created_by_uid=int(info.created_by_uid),
        gpl_compatible=bool(info.gpl_compatible & 1),
        verified_insns=int(info.verified_insns),
        attach_btf_obj_id=int(info.attach_btf_obj_id),
        attach_btf_id=int(info.attach_btf_id),
        run_time_ns=int(info.run_time_ns),
        run_cnt=int(info.run_cnt),
        nr_func_info=int(info.nr_func_info),
        nr_line_info=int(info.nr_line_info),
    )


@dataclass(frozen=True, slots=True)
class MapInfo:
    """``struct bpf_map_info`` of a map (sizes in bytes)."""

    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    map_flags: int
    name: str
    btf_id: int
    btf_key_type_id: int
    btf_value_type_id: int
    btf_vmlinux_value_type_id: int
    btf_vmlinux_id: int
    map_extra: int


def map_info(fd: FdLike) -> MapInfo:
    """``BPF_OBJ_GET_INFO_BY_FD`` on a map."""
    info = bpf_uapi.BpfMapInfo()
    _get_info(fd, info)
    return MapInfo(
        type=int(info.type),
        id=int(info.id),
        key_size=int(info.key_size),
        value_size=int(info.value_size),
        max_entries=int(info.max_entries),
        map_flags=int(info.map_flags),
        name=_cstr(bytes(info.name)),
        btf_id=int(info.btf_id),
        btf_key_type_id=int(info.btf_key_type_id),
        btf_value_type_id=int(info.btf_value_type_id),
        btf_vmlinux_value_type_id=int(info.btf_vmlinux_value_type_id),
        btf_vmlinux_id=int(info.btf_vmlinux_id),
        map_extra=int(info.map_extra),
    )


@dataclass(frozen=True, slots=True)
class BtfInfo:
    """``struct bpf_btf_info``: ``name`` is ``"vmlinux"``, a module name, or ``""`` for
    BTF loaded from user space; ``kernel_btf`` tells vmlinux/module BTF apart; ``data`` is
    the raw BTF (only when requested; split BTF for modules)."""

    id: int
    name: str
    kernel_btf: bool
    btf_size: int
    data: bytes | None


_BTF_NAME_LEN = 64  # module names are at most MODULE_NAME_LEN (56) bytes


def btf_info(fd: FdLike, *, data: bool = False) -> BtfInfo:
    """``BPF_OBJ_GET_INFO_BY_FD`` on a BTF object; with ``data`` a second call reads the
    raw BTF bytes."""
    name = ctypes.create_string_buffer(_BTF_NAME_LEN)
    info = bpf_uapi.BpfBtfInfo(name=_addr(name), name_len=_BTF_NAME_LEN)
    _get_info(fd, info)
    raw: bytes | None = None
    if data:
        size = int(info.btf_size)
        buf = ctypes.create_string_buffer(max(size, 1))
        again = bpf_uapi.BpfBtfInfo(btf=_addr(buf), btf_size=size)
        _get_info(fd, again)
        raw = buf.raw[: min(int(again.btf_size), size)]
    return BtfInfo(
        id=int(info.id),
        name=_cstr(name.raw),
        kernel_btf=bool(info.kernel_btf),
        btf_size=int(info.btf_size),
        data=raw,
    )


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """``struct bpf_link_info``: ``type`` is a :class:`~schedswitchd.kernel.bpf_uapi.LinkType`;
    ``map_id`` is set for struct_ops links, ``attach_type``/``target_obj_id``/
    ``target_btf_id`` for tracing links, ``attach_type``/``cgroup_id`` for cgroup links
    (0 where not applicable)."""

    type: int
    id: int
    prog_id: int
    map_id: int
    attach_type: int
    target_obj_id: int
    target_btf_id: int
    cgroup_id: int


def link_info(fd: FdLike) -> LinkInfo:
    """``BPF_OBJ_GET_INFO_BY_FD`` on a link."""
    info = bpf_uapi.BpfLinkInfo()
    _get_info(fd, info)
    kind = int(info.type)
    map_id = attach_type = target_obj_id = target_btf_id = cgroup_id = 0
    if kind == bpf_uapi.LinkType.STRUCT_OPS:
        map_id = int(info.tail.struct_ops.map_id)
    elif kind == bpf_uapi.LinkType.TRACING:
        attach_type = int(info.tail.tracing.attach_type)
        target_obj_id = int(info.tail.tracing.target_obj_id)
        target_btf_id = int(info.tail.tracing.target_btf_id)
    elif kind == bpf_uapi.LinkType.CGROUP:
        cgroup_id = int(info.tail.cgroup.cgroup_id)
        attach_type = int(info.tail.cgroup.attach_type)
    return LinkInfo(
        type=kind,
        id=int(info.id),
        prog_id=int(info.prog_id),
        map_id=map_id,
        attach_type=attach_type,
        target_obj_id=target_obj_id,
        target_btf_id=target_btf_id,
        cgroup_id=cgroup_id,
    )


# --- ids -----------------------------------------------------------------------------------


def _next_id(cmd: bpf_uapi.Cmd, start_id: int) -> int | None:
    attr = bpf_uapi.GetIdAttr(start_id=start_id)
    ret = sys_bpf(cmd, attr)
    if ret == -errno.ENOENT:
        return None
    if ret < 0:
        raise BpfSyscallError(cmd.uapi_name, -ret, explain(cmd, -ret))
    return int(attr.next_id)


def btf_get_next_id(start_id: int) -> int | None:
    """``BPF_BTF_GET_NEXT_ID``: the smallest BTF object id above ``start_id``, or
    ``None`` when there is none. ``EPERM`` raises (callers walking ids may ignore it)."""
    return _next_id(bpf_uapi.Cmd.BTF_GET_NEXT_ID, start_id)


def prog_get_next_id(start_id: int) -> int | None:
    """``BPF_PROG_GET_NEXT_ID`` (see :func:`btf_get_next_id`)."""
    return _next_id(bpf_uapi.Cmd.PROG_GET_NEXT_ID, start_id)


def map_get_next_id(start_id: int) -> int | None:
    """``BPF_MAP_GET_NEXT_ID`` (see :func:`btf_get_next_id`)."""
    return _next_id(bpf_uapi.Cmd.MAP_GET_NEXT_ID, start_id)


def link_get_next_id(start_id: int) -> int | None:
    """``BPF_LINK_GET_NEXT_ID`` (see :func:`btf_get_next_id`)."""
    return _next_id(bpf_uapi.Cmd.LINK_GET_NEXT_ID, start_id)


def btf_ids() -> Iterator[int]:
    """Every BTF object id in the kernel, ascending (vmlinux, modules, loaded BTF)."""
    cur = btf_get_next_id(0)
    while cur is not None:
        yield cur
        cur = btf_get_next_id(cur)


def _fd_by_id(cmd: bpf_uapi.Cmd, obj_id: int, cls: type[_F], open_flags: int) -> _F:
    attr = bpf_uapi.GetIdAttr(start_id=obj_id, open_flags=open_flags)
    return cls(bpf(cmd, attr, detail=f"id {obj_id}"))


def btf_get_fd_by_id(btf_id: int) -> BtfFd:
    """``BPF_BTF_GET_FD_BY_ID``: a new fd for BTF object ``btf_id`` (ENOENT if freed)."""
    return _fd_by_id(bpf_uapi.Cmd.BTF_GET_FD_BY_ID, btf_id, BtfFd, 0)


def prog_get_fd_by_id(prog_id: int) -> ProgFd:
    """``BPF_PROG_GET_FD_BY_ID``."""
    return _fd_by_id(bpf_uapi.Cmd.PROG_GET_FD_BY_ID, prog_id, ProgFd, 0)


def map_get_fd_by_id(map_id: int, *, open_flags: int = 0) -> MapFd:
    """``BPF_MAP_GET_FD_BY_ID`` (``open_flags``: ``F_RDONLY``/``F_WRONLY``)."""
    return _fd_by_id(bpf_uapi.Cmd.MAP_GET_FD_BY_ID, map_id, MapFd, open_flags)


def link_get_fd_by_id(link_id: int) -> LinkFd:
    """``BPF_LINK_GET_FD_BY_ID``."""
    return _fd_by_id(bpf_uapi.Cmd.LINK_GET_FD_BY_ID, link_id, LinkFd, 0)


# --- links ---------------------------------------------------------------------------------


def link_create(
    prog_fd: FdLike,
    attach_type: int,
    *,
    target_fd: FdLike = 0,
    flags: int = 0,
    target_btf_id: int = 0,
    cookie: int = 0,
    iter_info: bytes = b"",
    perf_event_cookie: int = 0,
) -> LinkFd:
    """``BPF_LINK_CREATE``. ``prog_fd`` is the struct_ops *map* fd for
    ``attach_type=AttachType.STRUCT_OPS`` (the map must have ``BPF_F_LINK`` and its value
    must already be set with :func:`map_update_elem`); ``target_fd`` is e.g. a cgroup
    directory fd, or the ``perf_event_open(2)`` fd for ``AttachType.PERF_EVENT``;
    ``target_btf_id``/``cookie`` are for tracing programs; ``iter_info`` is the raw
    ``union bpf_iter_link_info`` of an iterator (``AttachType.TRACE_ITER``; empty for
    iterators without parameters, e.g. ``task``); ``perf_event_cookie`` the BPF cookie of
    a perf event link. The union members overlap: give only those of one link type."""
    attr = bpf_uapi.LinkCreateAttr(
        prog_fd=_fdnum(prog_fd),
        target_fd=_fdnum(target_fd),
        attach_type=attach_type,
        flags=flags,
    )
    info = _cbuf(iter_info) if iter_info else None
    if info is not None:
        attr.tail.iter.iter_info = _addr(info)
        attr.tail.iter.iter_info_len = len(iter_info)
    elif perf_event_cookie:
        attr.tail.perf_event_cookie = perf_event_cookie
    else:
        attr.tail.tracing.target_btf_id = target_btf_id
        attr.tail.tracing.cookie = cookie
    return LinkFd(bpf(bpf_uapi.Cmd.LINK_CREATE, attr))


def raw_tracepoint_open(prog_fd: FdLike, name: str, *, cookie: int = 0) -> LinkFd:
    """``BPF_RAW_TRACEPOINT_OPEN``: attach a ``BPF_PROG_TYPE_RAW_TRACEPOINT`` program to the
    raw tracepoint ``name`` (e.g. ``"sys_enter"``); returns the link (a
    ``BPF_LINK_TYPE_RAW_TRACEPOINT`` link, pinnable; closing its last reference detaches)."""
    cname = ctypes.create_string_buffer(name.encode())
    attr = bpf_uapi.RawTracepointOpenAttr(name=_addr(cname), prog_fd=_fdnum(prog_fd), cookie=cookie)
    return LinkFd(bpf(bpf_uapi.Cmd.RAW_TRACEPOINT_OPEN, attr, detail=name))


def iter_create(link_fd: FdLike) -> OwnedFd:
    """``BPF_ITER_CREATE``: a new readable fd over the iterator link ``link_fd``; each
    ``read(2)`` runs the iterator program for the next objects (end of data: ``b""``)."""
    return OwnedFd(bpf(bpf_uapi.Cmd.ITER_CREATE, bpf_uapi.IterCreateAttr(link_fd=_fdnum(link_fd))))


def link_detach(link_fd: FdLike) -> None:
    """``BPF_LINK_DETACH``: detach the link's program/struct_ops now; the fd stays open
    (and must still be closed)."""
    bpf(bpf_uapi.Cmd.LINK_DETACH, bpf_uapi.LinkDetachAttr(link_fd=_fdnum(link_fd)))


# --- pins ----------------------------------------------------------------------------------

_ANON_KINDS: dict[str, type[OwnedFd]] = {
    "anon_inode:bpf-prog": ProgFd,
    "anon_inode:bpf-map": MapFd,
    "anon_inode:bpf_link": LinkFd,  # as created by BPF_LINK_CREATE
    "anon_inode:bpf-link": LinkFd,  # as re-opened from a pin
    "anon_inode:btf": BtfFd,
}


def fd_kind(fd: FdLike) -> type[OwnedFd]:
    """The owner class matching what ``fd`` refers to (from ``/proc/self/fd``'s anon inode
    name); ``OwnedFd`` when it is not a BPF object."""
    try:
        target = os.readlink(f"/proc/self/fd/{_fdnum(fd)}")
    except OSError:
        return OwnedFd
    return _ANON_KINDS.get(target, OwnedFd)


def obj_pin(fd: FdLike, path: str | os.PathLike[str]) -> None:
    """``BPF_OBJ_PIN``: pin a program, map, link or BTF object at ``path`` on a bpf
    filesystem; the object then outlives this process until the path is unlinked."""
    cpath = ctypes.create_string_buffer(os.fsencode(path))
    attr = bpf_uapi.ObjAttr(pathname=_addr(cpath), bpf_fd=_fdnum(fd))
    bpf(bpf_uapi.Cmd.OBJ_PIN, attr, detail=os.fsdecode(path))


@overload
def obj_get(path: str | os.PathLike[str], *, expect: type[_F], file_flags: int = 0) -> _F: ...


@overload
def obj_get(
    path: str | os.PathLike[str], *, expect: None = None, file_flags: int = 0
) -> OwnedFd: ...


def obj_get(
    path: str | os.PathLike[str], *, expect: type[OwnedFd] | None = None, file_flags: int = 0
) -> OwnedFd:
    """``BPF_OBJ_GET``: open the object pinned at ``path``. The returned owner's class
    (:class:`ProgFd`, :class:`MapFd`, :class:`LinkFd`, :class:`BtfFd`) matches the object;
    with ``expect`` a different kind raises :class:`BpfSyscallError` (``EINVAL``) after
    closing the fd."""
    cpath = ctypes.create_string_buffer(os.fsencode(path))
    attr = bpf_uapi.ObjAttr(pathname=_addr(cpath), file_flags=file_flags)
    fd = bpf(bpf_uapi.Cmd.OBJ_GET, attr, detail=os.fsdecode(path))
    cls = fd_kind(fd)
    owner = cls(fd)
    if expect is not None and cls is not expect:
        owner.close()
        raise BpfSyscallError(
            bpf_uapi.Cmd.OBJ_GET.uapi_name,
            errno.EINVAL,
            f"{os.fsdecode(path)} holds a {cls.kind}, not a {expect.kind}",
        )
    return owner
