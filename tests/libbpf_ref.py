"""Debian's libbpf (the system's ``libbpf.so.1``, 1.1.x, via ctypes) as the reference loader.

Two views of an object libbpf opened and loaded into the running kernel (root needed; all
it created is closed again before returning):

* :func:`libbpf_relocated_insns`: each program's instructions as libbpf finalised them
  (CO-RE applied), for comparing the slots a CO-RE relocation patched;
* :func:`libbpf_xlated`: the kernel's xlated instructions (``BPF_OBJ_GET_INFO_BY_FD``) of each
  program libbpf loaded, for comparing with ours.

Through the library rather than ``bpftool prog loadall`` because Debian's bpftool 7.1 embeds
an older libbpf snapshot (Linux 6.1's) that rejects ``.bss.NAME`` sections, and it has no
option for the pin root of ``LIBBPF_PIN_BY_NAME`` maps (always ``/sys/fs/bpf``, which need
not be a bpffs); ``bpf_object_open_opts.pin_root_path`` sets it here.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from schedswitchd.bpf.insn import INSN_SIZE
from schedswitchd.kernel import syscall


class LibbpfError(Exception):
    """libbpf could not open or load the object; carries libbpf's own log."""


_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class _OpenOpts(ctypes.Structure):
    # The leading fields of struct bpf_object_open_opts (libbpf.h); ``sz`` tells libbpf
    # where our copy ends, the rest counts as zero.
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("object_name", ctypes.c_char_p),
        ("relaxed_maps", ctypes.c_bool),
        ("pin_root_path", ctypes.c_char_p),
    ]


def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL("libbpf.so.1")
    lib.libbpf_set_print.argtypes = [_PRINT_FN]
    lib.libbpf_set_print.restype = ctypes.c_void_p
    lib.bpf_object__open_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    lib.bpf_object__open_file.restype = ctypes.c_void_p
    lib.bpf_object__load.argtypes = [ctypes.c_void_p]
    lib.bpf_object__close.argtypes = [ctypes.c_void_p]
    lib.bpf_object__next_program.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.bpf_object__next_program.restype = ctypes.c_void_p
    lib.bpf_program__name.argtypes = [ctypes.c_void_p]
    lib.bpf_program__name.restype = ctypes.c_char_p
    lib.bpf_program__fd.argtypes = [ctypes.c_void_p]
    lib.bpf_program__fd.restype = ctypes.c_int
    lib.bpf_program__insns.argtypes = [ctypes.c_void_p]
    lib.bpf_program__insns.restype = ctypes.c_void_p
    lib.bpf_program__insn_cnt.argtypes = [ctypes.c_void_p]
    lib.bpf_program__insn_cnt.restype = ctypes.c_size_t
    return lib


@contextmanager
def _loaded(path: Path, pin_root: Path | None) -> Iterator[tuple[ctypes.CDLL, int]]:
    """(library, ``struct bpf_object *``) of ``path`` opened and loaded by libbpf, with
    libbpf's log captured for :class:`LibbpfError`; closed on exit."""
    lib = _lib()
    libc = ctypes.CDLL(None)
    log: list[str] = []

    def on_print(level: int, fmt: bytes, args: int) -> int:
        buf = ctypes.create_string_buffer(2048)
        # va_list is passed as a pointer on x86-64, so vsnprintf can format it.
        libc.vsnprintf(buf, ctypes.c_size_t(len(buf)), fmt, ctypes.c_void_p(args))
        log.append(buf.value.decode(errors="replace"))
        return 0

    callback = _PRINT_FN(on_print)
    opts = _OpenOpts(sz=ctypes.sizeof(_OpenOpts))
    if pin_root is not None:
        opts.pin_root_path = str(pin_root).encode()
    previous = lib.libbpf_set_print(callback)
    try:
        obj = lib.bpf_object__open_file(str(path).encode(), ctypes.addressof(opts))
        if not obj or obj > (1 << 64) - 4096:  # NULL or an ERR_PTR
            raise LibbpfError("bpf_object__open_file failed:\n" + "".join(log))
        try:
            err = lib.bpf_object__load(obj)
            if err:
                raise LibbpfError(f"bpf_object__load failed ({err}):\n" + "".join(log))
            yield lib, obj
        finally:
            lib.bpf_object__close(obj)
    finally:
        lib.libbpf_set_print(ctypes.cast(previous, _PRINT_FN) if previous else _PRINT_FN())


def _per_program(
    path: Path, pin_root: Path | None, read: Callable[[ctypes.CDLL, int], bytes | None]
) -> dict[str, bytes]:
    with _loaded(path, pin_root) as (lib, obj):
        out: dict[str, bytes] = {}
        prog = lib.bpf_object__next_program(obj, None)
        while prog:
            got = read(lib, prog)
            if got is not None:
                out[lib.bpf_program__name(prog).decode()] = got
            prog = lib.bpf_object__next_program(obj, prog)
        return out


def libbpf_relocated_insns(path: Path) -> dict[str, bytes]:
    """Program name -> instruction bytes after libbpf's ``bpf_object__load``.

    Raises :class:`LibbpfError` with libbpf's log when it cannot open or load the object.
    """

    def insns(lib: ctypes.CDLL, prog: int) -> bytes:
        count = lib.bpf_program__insn_cnt(prog)
        return ctypes.string_at(lib.bpf_program__insns(prog), count * INSN_SIZE)

    return _per_program(path, None, insns)


def libbpf_xlated(path: Path, pin_root: Path) -> dict[str, bytes]:
    """Program name -> the kernel's xlated instructions of each program libbpf loaded from
    ``path`` (programs it did not load, e.g. from ``?`` sections, are absent). Pinned-by-name
    maps go under ``pin_root`` (a bpffs directory; the caller removes the pins).

    Raises :class:`LibbpfError` with libbpf's log when it cannot open or load the object.
    """

    def xlated(lib: ctypes.CDLL, prog: int) -> bytes | None:
        fd = lib.bpf_program__fd(prog)
        return syscall.prog_info(fd).xlated_insns if fd >= 0 else None

    return _per_program(path, pin_root, xlated)
