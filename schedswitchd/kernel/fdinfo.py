"""What ``/proc/self/fdinfo/<fd>`` says about a BPF map or program fd.

The kernel prints ``key:\\tvalue`` lines for BPF fds (``bpf_map_show_fdinfo()`` and
``bpf_prog_show_fdinfo()`` in ``kernel/bpf/syscall.c``); ``memlock`` is the memory the
object is charged for, in bytes: for a map, its accounted allocation
(``bpf_map_memory_usage()``); for a program, its image size rounded up to pages. These are
the numbers the kernel itself reports for an object's cost.
"""

from __future__ import annotations

import os


def fdinfo(fd: int, proc_root: str = "/proc") -> dict[str, str]:
    """The ``key: value`` lines of ``<proc_root>/self/fdinfo/<fd>`` as strings.

    Raises :class:`OSError` when the fd is not open."""
    with open(os.path.join(proc_root, "self", "fdinfo", str(fd)), encoding="ascii") as f:
        out = {}
        for line in f:
            key, sep, value = line.partition(":")
            if sep:
                out[key.strip()] = value.strip()
        return out


def memlock_bytes(fd: int, proc_root: str = "/proc") -> int:
    """``memlock`` of a BPF map or program fd, bytes; 0 when the fd shows none (not a BPF
    fd) or is closed."""
    try:
        return int(fdinfo(fd, proc_root).get("memlock", "0"))
    except (OSError, ValueError):
        return 0
