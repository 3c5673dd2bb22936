"""Debian's libbpf (the system's ``libbpf.so.1``, 1.1.x, via ctypes) loading a BPF object into
the running kernel, for comparing the kernel's xlated instructions with ours.

Through the library rather than ``bpftool prog loadall`` because Debian's bpftool 7.1 embeds
an older libbpf snapshot (Linux 6.1's) that rejects ``.bss.NAME`` sections, and it has no
option for the pin root of ``LIBBPF_PIN_BY_NAME`` maps (always ``/sys/fs/bpf``, which need
not be a bpffs); ``bpf_object_open_opts.pin_root_path`` sets it here.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from schedswitchd.kernel import syscall as S
from tests.core_libbpf import LibbpfError

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
    return lib


def libbpf_xlated(path: Path, pin_root: Path) -> dict[str, bytes]:
    """Program name -> the kernel's xlated instructions (``BPF_OBJ_GET_INFO_BY_FD``) of each
    program libbpf loaded from ``path`` (programs it did not load, e.g. from ``?``
    sections, are absent). Pinned-by-name maps go under ``pin_root`` (a bpffs directory;
    the caller removes the pins). Everything libbpf created is closed before returning.

    Raises :class:`LibbpfError` with libbpf's log when it cannot open or load the object.
    """
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
    opts = _OpenOpts(sz=ctypes.sizeof(_OpenOpts), pin_root_path=str(pin_root).encode())
    previous = lib.libbpf_set_print(callback)
    try:
        obj = lib.bpf_object__open_file(str(path).encode(), ctypes.addressof(opts))
        if not obj or obj > (1 << 64) - 4096:  # NULL or an ERR_PTR
            raise LibbpfError("bpf_object__open_file failed:\n" + "".join(log))
        try:
            err = lib.bpf_object__load(obj)
            if err:
                raise LibbpfError(f"bpf_object__load failed ({err}):\n" + "".join(log))
            out: dict[str, bytes] = {}
            prog = lib.bpf_object__next_program(obj, None)
            while prog:
                fd = lib.bpf_program__fd(prog)
                if fd >= 0:
                    out[lib.bpf_program__name(prog).decode()] = S.prog_info(fd).xlated_insns
                prog = lib.bpf_object__next_program(obj, prog)
            return out
        finally:
            lib.bpf_object__close(obj)
    finally:
        lib.libbpf_set_print(ctypes.cast(previous, _PRINT_FN) if previous else _PRINT_FN())
