"""Drop-ins: ``<config dir>/conf.d/*.toml`` merged in name order over the main file.

A package or an admin adds or changes a few keys in a file of their own instead of editing
``schedswitchd.toml`` (as systemd's ``*.conf.d/`` directories do for units). The files are
those of ``conf.d/`` beside the main file whose name ends in ``.toml`` and does not start
with a dot (an editor's backup), read in the byte order of their names (``10-x.toml``
before ``20-y.toml``); a missing ``conf.d/`` means none.

The merge, file after file over the main file's table: a key that is a table on both sides
is merged key by key the same way (so ``[schedulers.fifo] object = ...`` in a drop-in keeps
that scheduler's other keys and the other schedulers); any other value, arrays included,
replaces the one before it whole, whatever its type. The merged table is then validated as
one file, and every problem names the file that set the key (:meth:`Layers.origin`), or,
for a check across keys, the main file with the drop-ins merged into it.

Errors are :class:`~schedswitchd.errors.ConfigError`: a drop-in that cannot be read, is not
a regular file, is not UTF-8 or not TOML names that drop-in.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedswitchd.errors import ConfigError, unreadable

#: The drop-in directory's name, beside the main configuration file.
DROPIN_DIR = "conf.d"
DROPIN_SUFFIX = ".toml"


def dropin_files(config_path: str | Path) -> list[Path]:
    """The drop-ins of the configuration file ``config_path``, in the order they apply.

    Raises :class:`ConfigError` when ``conf.d/`` exists but cannot be listed, or when an
    entry that would be read is not a regular file (a directory or a FIFO named
    ``x.toml``: reading a FIFO would block the daemon's start or reload)."""
    directory = Path(config_path).parent / DROPIN_DIR
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(
            f"{directory}: cannot list: {unreadable(exc, 'a directory of drop-in files')}"
        ) from None
    chosen = sorted(
        (n for n in names if n.endswith(DROPIN_SUFFIX) and not n.startswith(".")),
        key=os.fsencode,
    )
    out = []
    for name in chosen:
        path = directory / name
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {unreadable(exc, 'a TOML file')}") from None
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{path}: not a regular file (a drop-in is a TOML file)")
        out.append(path)
    return out


def read_toml(data: bytes | str, path: str) -> dict[str, Any]:
    """``data`` (the text of ``path``) parsed as TOML 1.0. Raises :class:`ConfigError`
    naming ``path`` for bytes that are not UTF-8 and for a syntax error."""
    try:
        text = data.decode("utf-8", errors="strict") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: (syntax): {exc}") from None


def read_file(path: str | Path) -> bytes:
    """The bytes of configuration file ``path``. Raises :class:`ConfigError` if it cannot
    be read."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        why = unreadable(exc, "the daemon's TOML configuration file")
        raise ConfigError(f"{path}: cannot read: {why}") from None


@dataclass
class Layers:
    """The main file's table with drop-ins merged over it, remembering which file set each
    key. ``raw`` is the merged table; ``main`` the main file's path; ``dropins`` the paths
    merged so far, in order."""

    main: str
    raw: dict[str, Any] = field(default_factory=dict)
    dropins: list[str] = field(default_factory=list)
    # dotted key path -> the file that set it (a replaced table takes its keys with it)
    _origins: dict[tuple[str, ...], str] = field(default_factory=dict)

    def merge(self, table: dict[str, Any], origin: str) -> None:
        """Merge ``table`` (read from file ``origin``) over what is there (module docstring)."""
        self._merge(self.raw, table, origin, ())
        if origin != self.main:
            self.dropins.append(origin)

    def _merge(
        self, into: dict[str, Any], table: dict[str, Any], origin: str, prefix: tuple[str, ...]
    ) -> None:
        for key, value in table.items():
            here = (*prefix, key)
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                self._merge(into[key], value, origin, here)
                continue
            into[key] = value
            for stale in [k for k in self._origins if k[: len(here)] == here]:
                del self._origins[stale]
            self._origins[here] = origin

    def origin(self, loc: Sequence[str | int]) -> str:
        """The file that set key ``loc`` (a pydantic error location: keys and list indexes),
        or that set the closest table holding it; the main file for a key no file set."""
        keys = tuple(str(k) for k in loc)
        for end in range(len(keys), 0, -1):
            found = self._origins.get(keys[:end])
            if found is not None:
                return found
        return self.main

    def whole(self) -> str:
        """How a problem across keys names the configuration: the main file, with the
        drop-ins merged into it when there are any."""
        if not self.dropins:
            return self.main
        return f"{self.main} (with {', '.join(self.dropins)})"


def load_layers(config_path: str | Path) -> Layers:
    """The main file ``config_path`` and its drop-ins, read and merged. Raises
    :class:`ConfigError` naming the file that could not be read or parsed."""
    main = str(config_path)
    layers = Layers(main)
    layers.merge(read_toml(read_file(main), main), main)
    for path in dropin_files(config_path):
        layers.merge(read_toml(read_file(path), str(path)), str(path))
    return layers
