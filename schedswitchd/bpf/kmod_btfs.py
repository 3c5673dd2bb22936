"""``.kmod_btfs``: the kernel modules whose BTF an object declares it needs.

schedswitchd's own convention (see ``tests/bpf/kmod_btfs.h``): without the section the
loader may search every module's BTF (libbpf's behaviour); with it, only the listed
modules. Two layouts a C macro can produce are accepted:

* fixed width: ``char name[][N]``, each entry a NUL-terminated name padded with NULs;
* pointers: ``const char *name[]``, each 8-byte slot relocated (``R_BPF_64_ABS64``, the
  addend stored in the slot, ELF REL style) to a NUL-terminated string in another
  section (clang puts literals in ``.rodata.str1.1``); NULL slots are skipped.

Names are merged in first-seen order without duplicates (``-`` is read as ``_``, as the
kernel names modules); an empty section declares "no modules". A name longer than 55
bytes (``MODULE_NAME_LEN`` 56 minus the NUL), not NUL-terminated, or with characters
outside ``[A-Za-z0-9_-]`` raises
:class:`~schedswitchd.errors.ObjectError` naming the byte offset in ``.kmod_btfs``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence

from schedswitchd.errors import ObjectError

SECTION = ".kmod_btfs"
MODULE_NAME_LEN = 56
_VALID = re.compile(rb"[A-Za-z0-9_-]+")


def parse_fixed(data: bytes, entry_size: int | None = None) -> tuple[str, ...]:
    """Names from the fixed-width layout.

    ``entry_size`` is the width ``N`` of ``char[][N]`` when known (from the section's BTF);
    without it the section is read as consecutive NUL-terminated strings with NUL padding,
    which gives the same names for every well-formed section. Empty entries are padding.
    """
    names: list[str] = []
    if entry_size is not None and entry_size > 0 and len(data) % entry_size == 0:
        for start in range(0, len(data), entry_size):
            entry = data[start : start + entry_size]
            end = entry.find(b"\0")
            if end < 0:
                raise ObjectError(
                    f"{SECTION}: entry at offset {start} is not NUL-terminated within "
                    f"its {entry_size} bytes"
                )
            if entry[end:].strip(b"\0"):
                raise ObjectError(
                    f"{SECTION}: entry at offset {start} has bytes after its terminating NUL"
                )
            if end:
                names.append(_check(entry[:end], start))
        return _dedup(names)
    pos = 0
    while pos < len(data):
        if data[pos] == 0:
            pos += 1
            continue
        end = data.find(b"\0", pos)
        if end < 0:
            raise ObjectError(f"{SECTION}: name at offset {pos} is not NUL-terminated")
        names.append(_check(data[pos:end], pos))
        pos = end + 1
    return _dedup(names)


def parse_pointers(
    data: bytes,
    targets: dict[int, tuple[int, int]],
    read_string: Callable[[int, int], bytes],
) -> tuple[str, ...]:
    """Names from the pointer layout.

    ``targets`` maps a slot's byte offset to ``(section index, symbol value)`` of its
    relocation; ``read_string(section, offset)`` returns the bytes from ``offset`` to the
    end of that section (``ObjectError`` if out of range). The slot's own 8 bytes are the
    addend. A slot without a relocation must be zero (a NULL terminator or gap).
    """
    if len(data) % 8:
        raise ObjectError(f"{SECTION}: {len(data)} bytes is not a whole number of pointers")
    names: list[str] = []
    for start in range(0, len(data), 8):
        (addend,) = struct.unpack_from("<Q", data, start)
        if start not in targets:
            if addend:
                raise ObjectError(
                    f"{SECTION}: pointer at offset {start} is not relocated but non-zero"
                )
            continue
        sec, value = targets[start]
        raw = read_string(sec, value + addend)
        end = raw.find(b"\0")
        if end < 0:
            raise ObjectError(f"{SECTION}: name pointed to at offset {start} is not NUL-terminated")
        names.append(_check(raw[:end], start))
    return _dedup(names)


def _check(name: bytes, offset: int) -> str:
    if len(name) > MODULE_NAME_LEN - 1:
        raise ObjectError(
            f"{SECTION}: name at offset {offset} is {len(name)} bytes, longer than "
            f"{MODULE_NAME_LEN - 1}"
        )
    if not _VALID.fullmatch(name):
        raise ObjectError(
            f"{SECTION}: name at offset {offset} ({name[:60]!r}) is not a valid module name"
        )
    # The kernel names modules with underscores (Kbuild turns ``kvm-intel`` into
    # ``kvm_intel``, the name under /sys/kernel/btf), so a dash declares the same module.
    return name.decode("ascii").replace("-", "_")


def _dedup(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))
