"""The kernel's view of sched_ext, read from ``/sys/kernel/sched_ext``.

Files (``kernel/sched/ext.c``, "Sysfs interface"; ``Documentation/scheduler/sched-ext.rst``):

* ``state``: ``enabling``, ``enabled``, ``disabling`` or ``disabled`` (``prepping`` on older
  kernels), one word and a newline;
* ``switch_all`` (``0``/``1``), ``nr_rejected``, ``hotplug_seq``, ``enable_seq`` (the last
  added in 6.12): decimal integers;
* ``root/``: exists only while a BPF scheduler is attached; ``root/ops`` holds its ops name,
  ``root/events`` lines of ``SCX_EV_NAME VALUE`` (6.15+).

The root directory is a parameter (``root``; the daemon's ``KernelBackend`` takes it as
``sched_ext_root``) so tests point it at a directory of such files.
"""

from __future__ import annotations

import enum
import errno
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final

from schedswitchd.errors import SchedExtError

SCHED_EXT_ROOT: Final = Path("/sys/kernel/sched_ext")


class SchedExtUnavailable(SchedExtError):
    """The running kernel has no sched_ext (``CONFIG_SCHED_CLASS_EXT`` unset): its sysfs
    directory does not exist."""

    code = "sched_ext_unavailable"


class ScxState(enum.StrEnum):
    """``scx_enable_state_str[]`` in ``kernel/sched/ext.c``."""

    PREPPING = "prepping"
    ENABLING = "enabling"
    ENABLED = "enabled"
    DISABLING = "disabling"
    DISABLED = "disabled"


@dataclass(frozen=True, slots=True)
class SchedExtStatus:
    """One snapshot of ``/sys/kernel/sched_ext``.

    ``ops`` is the attached scheduler's ops name (``None`` when ``root/`` is absent);
    ``enable_seq`` counts schedulers ever enabled (``None`` before 6.12); ``hotplug_seq``
    counts CPU hotplug events; ``nr_rejected`` counts tasks rejected from ``SCHED_EXT``;
    ``events`` maps ``SCX_EV_*`` names to counts (empty when ``root/events`` is absent).
    The files are read one by one, so a snapshot taken during a switch may mix states.
    """

    state: ScxState
    ops: str | None
    switch_all: bool
    nr_rejected: int
    hotplug_seq: int
    enable_seq: int | None
    events: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


def _read_text(path: Path) -> str | None:
    """File text without the trailing newline; ``None`` if the file does not exist."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().rstrip("\n")
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENODEV:  # root/ files vanish while a scheduler detaches
            return None
        raise SchedExtError(f"cannot read {path}: {exc.strerror}") from exc


def _require_root(root: Path) -> None:
    if not (root / "state").exists():
        raise SchedExtUnavailable(
            f"sched_ext is not available: {root / 'state'} does not exist "
            "(kernel built without CONFIG_SCHED_CLASS_EXT?)"
        )


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        raise SchedExtError(f"{path} holds {text[:40]!r}, not an integer") from None


def _must_int(path: Path) -> int:
    value = _read_int(path)
    if value is None:
        raise SchedExtError(f"{path} is missing")
    return value


def available(root: Path = SCHED_EXT_ROOT) -> bool:
    """True if the kernel exposes sched_ext at ``root``."""
    return (root / "state").exists()


def read_state(root: Path = SCHED_EXT_ROOT) -> ScxState:
    """The current enable state. Raises :class:`SchedExtUnavailable` or
    :class:`SchedExtError` (unreadable file, unknown word)."""
    text = _read_text(root / "state")
    if text is None:
        _require_root(root)
        raise SchedExtUnavailable(f"{root / 'state'} vanished")
    try:
        return ScxState(text.strip())
    except ValueError:
        raise SchedExtError(f"{root / 'state'} holds unknown state {text[:40]!r}") from None


def read_ops(root: Path = SCHED_EXT_ROOT) -> str | None:
    """The attached scheduler's ops name, or ``None`` when none is attached."""
    _require_root(root)
    return _read_text(root / "root" / "ops")


def read_enable_seq(root: Path = SCHED_EXT_ROOT) -> int | None:
    """``enable_seq``: how many schedulers were ever enabled; ``None`` before 6.12 (no such
    file). Raises :class:`SchedExtError` when it does not hold an integer."""
    return _read_int(root / "enable_seq")


def read_hotplug_seq(root: Path = SCHED_EXT_ROOT) -> int:
    """``hotplug_seq`` (CPU hotplug events, for ``sched_ext_ops.hotplug_seq``). Raises
    :class:`SchedExtUnavailable` without sched_ext, :class:`SchedExtError` when unreadable."""
    _require_root(root)
    return _must_int(root / "hotplug_seq")


def read_events(root: Path = SCHED_EXT_ROOT) -> Mapping[str, int]:
    """``root/events`` as a read-only name → count map; empty when absent.

    Raises :class:`SchedExtError` on a line that is not ``NAME VALUE``.
    """
    path = root / "root" / "events"
    text = _read_text(path)
    out: dict[str, int] = {}
    if text is None:
        return MappingProxyType(out)
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        if not name:
            continue
        try:
            out[name] = int(value)
        except ValueError:
            raise SchedExtError(f"{path}: line {line[:80]!r} is not 'NAME VALUE'") from None
    return MappingProxyType(out)


def read_status(root: Path = SCHED_EXT_ROOT) -> SchedExtStatus:
    """A :class:`SchedExtStatus` snapshot. Raises :class:`SchedExtUnavailable` when the
    kernel has no sched_ext, :class:`SchedExtError` on unreadable or malformed files."""
    _require_root(root)
    state = read_state(root)
    return SchedExtStatus(
        state=state,
        ops=_read_text(root / "root" / "ops"),
        switch_all=_must_int(root / "switch_all") != 0,
        nr_rejected=_must_int(root / "nr_rejected"),
        hotplug_seq=_must_int(root / "hotplug_seq"),
        enable_seq=_read_int(root / "enable_seq"),
        events=read_events(root),
    )


class StateFiles:
    """The reads on a switch's path, cheap: ``state``, ``enable_seq`` and ``hotplug_seq``
    through descriptors opened once, each read with one ``pread(2)`` at offset 0 (a sysfs
    attribute's ``show`` runs again on every read from offset 0: ``seq_read_iter()`` in
    ``fs/seq_file.c`` resets its buffer there), and ``root/ops`` opened relative to a
    descriptor of the root directory (``root/`` belongs to the attached scheduler and goes
    with it, so it cannot be held). An ``open(2)`` of a sysfs path costs about as much as two
    reads (docs/performance.md, standby hit).

    ``keep_open``: hold the descriptors; default: when ``root`` is under ``/sys``, whose
    attribute files stay the same files while the kernel runs (a test's directory of plain
    files may be rewritten by replacing them: there each read is the module's ``read_*``
    function's). Thread-safe. Errors as those functions':
    :class:`SchedExtUnavailable` when ``state`` is missing, :class:`SchedExtError` for an
    unreadable file or an unknown word.
    """

    def __init__(self, root: Path = SCHED_EXT_ROOT, *, keep_open: bool | None = None) -> None:
        self.root = root
        self.keep_open = root.is_relative_to("/sys") if keep_open is None else keep_open
        #: File name -> descriptor, or -1 for a file that does not exist.
        self._fds: dict[str, int] = {}
        self._dir_fd: int | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the held descriptors (later reads open them again)."""
        with self._lock:
            fds = [fd for fd in self._fds.values() if fd >= 0]
            if self._dir_fd is not None:
                fds.append(self._dir_fd)
            self._fds.clear()
            self._dir_fd = None
        for fd in fds:
            os.close(fd)

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is not None:
            return fd
        with self._lock:
            fd = self._fds.get(name)
            if fd is None:
                try:
                    fd = os.open(self.root / name, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    fd = -1
                except OSError as exc:
                    raise SchedExtError(f"cannot open {self.root / name}: {exc.strerror}") from exc
                self._fds[name] = fd
            return fd

    def _text(self, name: str) -> str | None:
        fd = self._fd(name)
        if fd < 0:
            return None
        try:
            data = os.pread(fd, 4096, 0)
        except OSError as exc:
            raise SchedExtError(f"cannot read {self.root / name}: {exc.strerror}") from exc
        return data.decode("ascii", "replace").rstrip("\n")

    def state(self) -> ScxState:
        """As :func:`read_state`."""
        if not self.keep_open:
            return read_state(self.root)
        text = self._text("state")
        if text is None:
            _require_root(self.root)
            raise SchedExtUnavailable(f"{self.root / 'state'} vanished")
        try:
            return ScxState(text.strip())
        except ValueError:
            raise SchedExtError(
                f"{self.root / 'state'} holds unknown state {text[:40]!r}"
            ) from None

    def enable_seq(self) -> int | None:
        """As :func:`read_enable_seq`."""
        if not self.keep_open:
            return read_enable_seq(self.root)
        return self._int("enable_seq")

    def hotplug_seq(self) -> int:
        """As :func:`read_hotplug_seq`."""
        if not self.keep_open:
            return read_hotplug_seq(self.root)
        value = self._int("hotplug_seq")
        if value is None:
            _require_root(self.root)
            raise SchedExtError(f"{self.root / 'hotplug_seq'} is missing")
        return value

    def _int(self, name: str) -> int | None:
        text = self._text(name)
        if text is None:
            return None
        try:
            return int(text.strip())
        except ValueError:
            raise SchedExtError(f"{self.root / name} holds {text[:40]!r}, not an integer") from None

    def ops(self) -> str | None:
        """As :func:`read_ops`: the attached scheduler's ops name, ``None`` without one."""
        if not self.keep_open:
            return read_ops(self.root)
        dir_fd = self._dir_fd
        if dir_fd is None:
            with self._lock:
                if self._dir_fd is None:
                    try:
                        self._dir_fd = os.open(
                            self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
                        )
                    except FileNotFoundError:
                        raise SchedExtUnavailable(f"{self.root} does not exist") from None
                    except OSError as exc:
                        raise SchedExtError(f"cannot open {self.root}: {exc.strerror}") from exc
                dir_fd = self._dir_fd
        try:
            fd = os.open("root/ops", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ENODEV:  # root/ goes while a scheduler detaches
                return None
            raise SchedExtError(f"cannot read {self.root / 'root/ops'}: {exc.strerror}") from exc
        try:
            data = os.read(fd, 4096)
        except OSError as exc:
            if exc.errno == errno.ENODEV:
                return None
            raise SchedExtError(f"cannot read {self.root / 'root/ops'}: {exc.strerror}") from exc
        finally:
            os.close(fd)
        return data.decode("ascii", "replace").rstrip("\n")
