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
