"""Insert many kernel modules from one process (runs inside the VM, as root).

Reads ``NAME PATH`` lines from stdin, in load order (dependencies first, see
``tools.vm.module_load_order``), and inserts each uncompressed ``.ko`` with ``finit_module(2)``
(x86-64 syscall 313) unless ``/sys/module/NAME`` exists. Under TCG this is ~4x faster than
one ``insmod`` process per module, whose exec dominates (100 modules: ~19 s against ~88 s).
Prints ``insmod failed: NAME: REASON`` to stderr per failure and ``insmod: N loaded, M failed
in S s`` at the end; with ``--strict`` exits 1 if any failed. Standard library only, so it
runs with ``python3 -I -S`` (no site import) in the chroot.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import time

SYS_FINIT_MODULE = 313  # arch/x86/entry/syscalls/syscall_64.tbl


def main(argv: list[str]) -> int:
    """Load the modules listed on stdin; return the exit status."""
    strict = "--strict" in argv
    libc = ctypes.CDLL(None, use_errno=True)
    start = time.monotonic()
    loaded = failed = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        name, path = line.split(maxsplit=1)
        if os.path.isdir(f"/sys/module/{name}"):
            continue
        fd = os.open(path.strip(), os.O_RDONLY | os.O_CLOEXEC)
        try:
            rc = libc.syscall(SYS_FINIT_MODULE, fd, b"", 0)
            err = ctypes.get_errno()
        finally:
            os.close(fd)
        if rc == 0 or err == errno.EEXIST:
            loaded += rc == 0
        else:
            failed += 1
            print(f"insmod failed: {name}: {os.strerror(err)}", file=sys.stderr)
    took = time.monotonic() - start
    print(f"insmod: {loaded} loaded, {failed} failed in {took:.1f} s", flush=True)
    return 1 if strict and failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
