"""Opening an object file without blocking on what is not one.

A configured ``object`` path may name anything: a FIFO, whose ``open(2)`` for reading
blocks until a writer comes (the daemon's one switch worker would wait there for ever), a
device, whose open alone may act (``/dev/watchdog`` arms the watchdog), a symlink loop, a
path with a NUL byte. :func:`open_object_file` opens only a regular file, and turns every
way of failing into an :class:`~schedswitchd.errors.ObjectError`.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

from schedswitchd.errors import ObjectError, unreadable

#: What an object file must be, for the error messages.
OBJECT_FILE = "a .bpf.o BPF ELF object, or an executable embedding one"

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: os.strerror(errno.EISDIR),  # as open(2) of one for writing says
}


def _not_regular(path: str, mode: int) -> ObjectError:
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    return ObjectError(f"cannot read BPF object {path!r}: {kind} (expected {OBJECT_FILE})")


def open_object_file(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading (binary, buffered), if it is a regular file.

    The file is looked at (``stat(2)``) before it is opened, so that no device is opened,
    then opened with ``O_NONBLOCK`` (a FIFO put there meanwhile does not block the open)
    and looked at again through the descriptor (``fstat(2)``): what is read is a regular
    file whatever happened at the path in between. Raises
    :class:`~schedswitchd.errors.ObjectError` naming ``path`` for a path that cannot be
    opened (errno's reason), one with a NUL byte, or one that names something other than
    a regular file."""
    where = os.fspath(path)
    try:
        st = os.stat(where)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(where, st.st_mode)
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ObjectError(
            f"cannot read BPF object {where!r}: {unreadable(exc, OBJECT_FILE)}"
        ) from exc
    except ValueError:  # os.stat's "embedded null byte"
        raise ObjectError(f"cannot read BPF object {where!r}: the path has a NUL byte") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(where, st.st_mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
