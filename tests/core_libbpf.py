"""libbpf (the system's ``libbpf.so.1``, via ctypes) as a reference CO-RE implementation.

``libbpf_relocated_insns(path)`` opens and loads a BPF object with libbpf against the
running kernel (this needs root and really loads the programs; they are closed again) and
returns each program's instructions as libbpf finalised them: CO-RE relocations applied,
along with libbpf's other relocations (map fds, ...). Tests compare only the slots a CO-RE
relocation patched.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from schedswitchd.bpf.insn import INSN_SIZE


class LibbpfError(Exception):
    """libbpf could not open or load the object; carries libbpf's own log."""


_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


def libbpf_relocated_insns(path: Path) -> dict[str, bytes]:
    """Program name -> instruction bytes after libbpf's ``bpf_object__load``."""
    lib = ctypes.CDLL("libbpf.so.1")
    libc = ctypes.CDLL(None)
    log: list[str] = []

    def on_print(level: int, fmt: bytes, args: int) -> int:
        buf = ctypes.create_string_buffer(2048)
        # va_list is passed as a pointer on x86-64, so vsnprintf can format it.
        libc.vsnprintf(buf, ctypes.c_size_t(len(buf)), fmt, ctypes.c_void_p(args))
        log.append(buf.value.decode(errors="replace"))
        return 0

    callback = _PRINT_FN(on_print)
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
    lib.bpf_program__insns.argtypes = [ctypes.c_void_p]
    lib.bpf_program__insns.restype = ctypes.c_void_p
    lib.bpf_program__insn_cnt.argtypes = [ctypes.c_void_p]
    lib.bpf_program__insn_cnt.restype = ctypes.c_size_t

    previous = lib.libbpf_set_print(callback)
    try:
        obj = lib.bpf_object__open_file(str(path).encode(), None)
        if not obj or obj > (1 << 64) - 4096:  # NULL or an ERR_PTR
            raise LibbpfError("bpf_object__open_file failed:\n" + "".join(log))
        try:
            err = lib.bpf_object__load(obj)
            if err:
                raise LibbpfError(f"bpf_object__load failed ({err}):\n" + "".join(log))
            out: dict[str, bytes] = {}
            prog = lib.bpf_object__next_program(obj, None)
            while prog:
                name = lib.bpf_program__name(prog).decode()
                ptr = lib.bpf_program__insns(prog)
                count = lib.bpf_program__insn_cnt(prog)
                out[name] = ctypes.string_at(ptr, count * INSN_SIZE)
                prog = lib.bpf_object__next_program(obj, prog)
            return out
        finally:
            lib.bpf_object__close(obj)
    finally:
        lib.libbpf_set_print(ctypes.cast(previous, _PRINT_FN) if previous else _PRINT_FN())
