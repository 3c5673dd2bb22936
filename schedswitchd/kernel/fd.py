"""Ownership of the file descriptors ``bpf(2)`` returns.

A BPF program, map, BTF object or link lives while any fd (or pin, or attachment) refers to
it, so a leaked fd leaks kernel memory and, for a struct_ops link, keeps a scheduler
attached. Every fd the syscall layer returns is wrapped in an :class:`OwnedFd` subclass that
closes it exactly once: on :meth:`OwnedFd.close`, at the end of a ``with`` block, or (as a
safety net) when garbage-collected. After closing, the number is forgotten so a later close
can never hit an unrelated fd that reused the number.
"""

from __future__ import annotations

import os
import threading
from typing import ClassVar, Self


class OwnedFd:
    """One owned file descriptor (a non-negative int) of kind :attr:`kind`.

    Use as a context manager or call :meth:`close`; :attr:`fd` raises ``ValueError`` once
    closed. :meth:`detach` hands the number to the caller, who then owns it.
    """

    kind: ClassVar[str] = "fd"
    __slots__ = ("__weakref__", "_fd", "_lock")

    def __init__(self, fd: int) -> None:
        if fd < 0:
            raise ValueError(f"{self.kind} fd must be >= 0, got {fd}")
        self._fd = fd
        self._lock = threading.Lock()

    @property
    def fd(self) -> int:
        """The descriptor number; ``ValueError`` if closed or detached."""
        fd = self._fd
        if fd < 0:
            raise ValueError(f"{self.kind} fd is closed")
        return fd

    def fileno(self) -> int:
        """Same as :attr:`fd` (lets ``select``/``os`` helpers accept the owner)."""
        return self.fd

    @property
    def closed(self) -> bool:
        """Whether the fd was closed (or released): it is then -1."""
        return self._fd < 0

    def close(self) -> None:
        """Close the fd; later calls do nothing."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def detach(self) -> int:
        """Give up ownership and return the number without closing it."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd < 0:
            raise ValueError(f"{self.kind} fd is closed")
        return fd

    def dup(self) -> Self:
        """A new owner of a duplicate (close-on-exec) of this fd."""
        return type(self)(os.dup(self.fd))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Safety net only: interpreter shutdown may have torn down os already.
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            self._fd = -1
            try:  # noqa: SIM105 (contextlib may be gone at interpreter shutdown)
                os.close(fd)
            except (OSError, TypeError, AttributeError):
                pass

    def __repr__(self) -> str:
        state = "closed" if self._fd < 0 else str(self._fd)
        return f"<{type(self).__name__} {state}>"


class ProgFd(OwnedFd):
    """A loaded BPF program."""

    kind = "prog"
    __slots__ = ()


class MapFd(OwnedFd):
    """A BPF map."""

    kind = "map"
    __slots__ = ()


class BtfFd(OwnedFd):
    """A BTF object in the kernel (loaded by us, or vmlinux/module BTF opened by id)."""

    kind = "btf"
    __slots__ = ()


class LinkFd(OwnedFd):
    """A BPF link (the attachment of a program or a struct_ops map)."""

    kind = "link"
    __slots__ = ()
