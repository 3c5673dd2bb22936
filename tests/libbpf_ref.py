"""Debian's libbpf (the system's ``libbpf.so.1``, 1.1.x, via ctypes) as the reference loader.

Two views of an object libbpf opened and loaded into the running kernel (root needed; all
it created is closed again before returning), plus :func:`loaded` for callers that go on
(``tests/vm/corpus_driver.py`` attaches the struct_ops maps, with another libbpf build:
``library=``):

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
    """libbpf could not open or load the object; carries libbpf's own log. ``stage`` is
    ``"open"`` or ``"load"``."""

    def __init__(self, message: str, stage: str) -> None:
        super().__init__(message)
        self.stage = stage


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


#: ``BPF_MAP_TYPE_STRUCT_OPS`` (``include/uapi/linux/bpf.h``)
MAP_TYPE_STRUCT_OPS = 26
#: ``enum libbpf_print_level`` (``libbpf.h``): WARN 0, INFO 1, DEBUG 2
PRINT_DEBUG = 2


def _lib(library: str = "libbpf.so.1") -> ctypes.CDLL:
    lib = ctypes.CDLL(library)
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
    vp, cp, ci = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    for name, args, res in (
        ("libbpf_version_string", [], cp),
        ("bpf_object__next_map", [vp, vp], vp),
        ("bpf_map__type", [vp], ci),
        ("bpf_map__name", [vp], cp),
        ("bpf_map__attach_struct_ops", [vp], vp),
        ("bpf_link__destroy", [vp], ci),
    ):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def is_err(ptr: int | None) -> bool:
    """A libbpf pointer result that means failure: NULL (libbpf 1.0 mode) or an ERR_PTR."""
    return not ptr or ptr > (1 << 64) - 4096


@contextmanager
def loaded(
    path: Path,
    pin_root: Path | None = None,
    *,
    library: str = "libbpf.so.1",
    log: list[str] | None = None,
    debug: bool = True,
) -> Iterator[tuple[ctypes.CDLL, int]]:
    """(library, ``struct bpf_object *``) of ``path`` opened and loaded by libbpf (the
    shared object ``library``), closed on exit. libbpf's messages go to ``log`` (a new list
    when None) and into :class:`LibbpfError`, raised when open or load fails; ``debug=False``
    drops its debug level unformatted (tens of thousands of lines for a big scheduler, each
    a Python call: minutes under TCG)."""
    lib = _lib(library)
    libc = ctypes.CDLL(None)
    if log is None:
        log = []

    def on_print(level: int, fmt: bytes, args: int) -> int:
        if level >= PRINT_DEBUG and not debug:
            return 0
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
        if is_err(obj):
            raise LibbpfError("bpf_object__open_file failed:\n" + "".join(log), "open")
        try:
            err = lib.bpf_object__load(obj)
            if err:
                raise LibbpfError(f"bpf_object__load failed ({err}):\n" + "".join(log), "load")
            yield lib, obj
        finally:
            lib.bpf_object__close(obj)
    finally:
        lib.libbpf_set_print(ctypes.cast(previous, _PRINT_FN) if previous else _PRINT_FN())


def _per_program(
    path: Path, pin_root: Path | None, read: Callable[[ctypes.CDLL, int], bytes | None]
) -> dict[str, bytes]:
    with loaded(path, pin_root) as (lib, obj):
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
