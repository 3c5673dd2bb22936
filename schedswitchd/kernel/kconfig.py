"""The running kernel's build configuration, for ``__kconfig`` externs of BPF objects.

Sources, first found wins (the order libbpf uses): ``/boot/config-$(uname -r)``,
``/proc/config.gz``, ``/usr/lib/modules/$(uname -r)/config``. Format: Kconfig's ``.config``
(``Documentation/kbuild/kconfig-language.rst``): ``CONFIG_X=y|m``, ``CONFIG_X=<number>``
(decimal or ``0x`` hex), ``CONFIG_X="string"`` (C escapes), ``# CONFIG_X is not set`` (= n).

Values written into a ``.kconfig`` map follow libbpf's rules for the extern's BTF type:
``bool`` takes y/n, ``enum libbpf_tristate`` takes y/n/m (1/0/2), ``char`` the letter, an
integer of 1/2/4/8 bytes takes a number that fits, ``char[N]`` a string (truncated to N-1
bytes, NUL-terminated). ``LINUX_KERNEL_VERSION`` is derived from ``uname -r``.
"""

from __future__ import annotations

import enum
import gzip
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import INT_BOOL, INT_CHAR, INT_SIGNED, Array, Enum, Int, Kind
from schedswitchd.errors import BtfError, LoadError


class Tristate(enum.Enum):
    """A y/m/n Kconfig value; ``.value`` is the letter."""

    YES = "y"
    MODULE = "m"
    NO = "n"


KconfigValue = Tristate | int | str
"""One parsed value: a tristate, a number or a string (quotes and escapes removed)."""

_LINE = re.compile(r"^(CONFIG_[A-Za-z0-9_]+)=(.*)$")
_NOT_SET = re.compile(r"^# (CONFIG_[A-Za-z0-9_]+) is not set$")
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"'}


def _unquote(text: str, where: str) -> str:
    if len(text) < 2 or not text.endswith('"'):
        raise LoadError(f"kernel config: unterminated string at {where}")
    out: list[str] = []
    body = text[1:-1]
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            out.append(_ESCAPES.get(body[i + 1], body[i + 1]))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def parse_value(text: str, where: str = "value") -> KconfigValue:
    """One right-hand side: ``y``/``m``/``n``, a number, or a quoted string.
    Raises :class:`LoadError` for anything else."""
    if text in ("y", "m", "n"):
        return Tristate(text)
    if text.startswith('"'):
        return _unquote(text, where)
    try:
        return int(text, 0)
    except ValueError:
        pass
    try:  # numbers with leading zeros ("0700") are decimal to Kconfig, not octal
        return int(text, 10)
    except ValueError:
        raise LoadError(f"kernel config: cannot parse {text!r} at {where}") from None


def parse_config(text: str, *, source: str = "<config>") -> dict[str, KconfigValue]:
    """All ``CONFIG_*`` entries of a ``.config`` text. Lines that are neither entries nor
    ``is not set`` comments are ignored; a malformed value raises :class:`LoadError`
    naming ``source`` and the line number."""
    values: dict[str, KconfigValue] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        m = _LINE.match(line)
        if m:
            values[m.group(1)] = parse_value(m.group(2), f"{source}:{lineno}")
            continue
        m = _NOT_SET.match(line)
        if m:
            values[m.group(1)] = Tristate.NO
    return values


def config_paths(release: str | None = None) -> tuple[Path, ...]:
    """Where the config of kernel ``release`` (default: running) may be, in search order."""
    rel = release or os.uname().release
    return (
        Path(f"/boot/config-{rel}"),
        Path("/proc/config.gz"),
        Path(f"/usr/lib/modules/{rel}/config"),
    )


@dataclass(frozen=True)
class KernelConfig(Mapping[str, KconfigValue]):
    """A parsed kernel config (``CONFIG_*`` name -> value) and the file it came from."""

    entries: Mapping[str, KconfigValue]
    source: str

    def __getitem__(self, key: str) -> KconfigValue:
        return self.entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def read_kernel_config(paths: Sequence[Path] | None = None) -> KernelConfig:
    """Parse the first readable file of ``paths`` (default :func:`config_paths`); ``.gz``
    files are decompressed. Raises :class:`LoadError` listing the paths when none is
    readable."""
    tried = tuple(paths) if paths is not None else config_paths()
    for path in tried:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if path.suffix == ".gz" or data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        text = data.decode("utf-8", "replace")
        return KernelConfig(parse_config(text, source=str(path)), str(path))
    names = ", ".join(str(p) for p in tried)
    raise LoadError(f"no kernel config found (tried {names}); __kconfig externs need one")


def kernel_version_code(release: str | None = None) -> int:
    """``LINUX_KERNEL_VERSION``: ``KERNEL_VERSION(major, minor, patch)`` =
    ``major << 16 | minor << 8 | min(patch, 255)`` parsed from ``uname -r`` (e.g.
    ``6.18.44-fc`` -> ``0x06122C``); a missing patch level counts as 0, and a release that
    does not start with numbers gives 0."""
    rel = release or os.uname().release
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", rel)
    if not m:
        m2 = re.match(r"(\d+)\.(\d+)", rel)
        if not m2:
            return 0
        major, minor, patch = int(m2.group(1)), int(m2.group(2)), 0
    else:
        major, minor, patch = (int(g) for g in m.groups())
    return (major << 16) + (minor << 8) + min(patch, 255)


def has_syscall_wrapper() -> bool:
    """``LINUX_HAS_SYSCALL_WRAPPER``: whether syscalls enter through arch wrappers
    (``__x64_sys_bpf`` and the like in ``/proc/kallsyms``), as libbpf probes it."""
    prefixes = ("__x64_sys_bpf", "__arm64_sys_bpf", "__s390x_sys_bpf", "__riscv_sys_bpf")
    try:
        with open("/proc/kallsyms", encoding="ascii", errors="replace") as f:
            return any(line.rstrip().endswith(prefixes) for line in f)
    except OSError:
        return False


#: libbpf's other virtual ``LINUX_*`` externs (``bpf_object__resolve_externs``); BPF
#: cookies exist on every kernel this daemon supports (5.15+).
_VIRTUAL = {
    "LINUX_HAS_BPF_COOKIE": lambda: True,
    "LINUX_HAS_SYSCALL_WRAPPER": has_syscall_wrapper,
}


# --- encoding a value for an extern's BTF type -------------------------------------------------


class KcfgType(enum.Enum):
    """How libbpf classifies a ``__kconfig`` extern's type."""

    BOOL = "bool"
    CHAR = "char"
    TRISTATE = "tristate"
    INT = "int"
    CHAR_ARR = "char_arr"


@dataclass(frozen=True, slots=True)
class KcfgSlot:
    """An extern's storage: classification, size in bytes, signedness for ``INT``."""

    kind: KcfgType
    size: int
    signed: bool = False


def classify(btf: Btf, type_id: int, name: str) -> KcfgSlot:
    """Classify the extern ``name`` of BTF type ``type_id`` (modifiers and typedefs
    skipped). Raises :class:`LoadError` for types a kconfig value cannot fill."""
    try:
        tid = btf.skip_mods_and_typedefs(type_id)
        t = btf.type(tid)
        if isinstance(t, Int):
            if t.size == 1 and t.encoding & INT_BOOL:
                return KcfgSlot(KcfgType.BOOL, 1)
            if t.size == 1 and t.encoding & INT_CHAR:
                return KcfgSlot(KcfgType.CHAR, 1)
            if t.size in (1, 2, 4, 8) and t.bits == t.size * 8 and t.offset == 0:
                return KcfgSlot(KcfgType.INT, t.size, bool(t.encoding & INT_SIGNED))
        elif isinstance(t, Enum) and t.kind == Kind.ENUM and t.name == "libbpf_tristate":
            return KcfgSlot(KcfgType.TRISTATE, t.size)
        elif isinstance(t, Array) and t.nelems > 0:
            elem = btf.type(btf.skip_mods_and_typedefs(t.type))
            if isinstance(elem, Int) and elem.size == 1 and elem.bits == 8:
                return KcfgSlot(KcfgType.CHAR_ARR, t.nelems)
    except BtfError as e:
        raise LoadError(f"kconfig extern {name}: bad BTF type {type_id}: {e}") from e
    raise LoadError(
        f"kconfig extern {name}: type {btf.type_name(tid) or f'#{tid}'} is not bool, char, "
        "enum libbpf_tristate, an 8/16/32/64-bit integer or a char array"
    )


_TRI_VALUE = {Tristate.NO: 0, Tristate.YES: 1, Tristate.MODULE: 2}


def encode_value(slot: KcfgSlot, name: str, value: KconfigValue) -> bytes:
    """The little-endian bytes (``slot.size`` long) libbpf would store for ``value``.
    Raises :class:`LoadError` when the value does not fit the type (e.g. ``m`` for a
    ``bool``, a string for an integer, a number out of range)."""
    if isinstance(value, Tristate):
        if slot.kind is KcfgType.BOOL:
            if value is Tristate.MODULE:
                raise LoadError(f"kconfig extern {name}: value 'm' needs a tristate or char")
            return bytes([value is Tristate.YES])
        if slot.kind is KcfgType.TRISTATE:
            return _TRI_VALUE[value].to_bytes(slot.size, "little")
        if slot.kind is KcfgType.CHAR:
            return value.value.encode()
        raise LoadError(f"kconfig extern {name}: value '{value.value}' does not fit its type")
    if isinstance(value, str):
        if slot.kind is not KcfgType.CHAR_ARR:
            raise LoadError(f"kconfig extern {name}: string value needs a char array")
        data = value.encode()[: slot.size - 1]
        return data + bytes(slot.size - len(data))
    if slot.kind is KcfgType.BOOL and value in (0, 1):
        return bytes([value])
    if slot.kind not in (KcfgType.INT, KcfgType.CHAR):
        raise LoadError(f"kconfig extern {name}: number {value} needs an integer type")
    bits = slot.size * 8
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if slot.signed else (0, (1 << bits) - 1)
    if not lo <= value <= hi:
        raise LoadError(f"kconfig extern {name}: value {value:#x} overflows {slot.size} bytes")
    return value.to_bytes(slot.size, "little", signed=slot.signed)


def extern_bytes(
    btf: Btf,
    type_id: int,
    name: str,
    config: Mapping[str, KconfigValue],
    *,
    weak: bool,
    release: str | None = None,
) -> bytes:
    """Bytes for the ``__kconfig`` extern ``name`` (type ``type_id`` in ``btf``): from
    ``config``, ``LINUX_KERNEL_VERSION`` from ``release``, or libbpf's virtual
    ``LINUX_HAS_BPF_COOKIE`` / ``LINUX_HAS_SYSCALL_WRAPPER``. An unknown name is all zero
    when ``weak`` and a :class:`LoadError` otherwise."""
    slot = classify(btf, type_id, name)
    if name == "LINUX_KERNEL_VERSION":
        return encode_value(slot, name, kernel_version_code(release))
    if name in _VIRTUAL:
        return encode_value(slot, name, int(_VIRTUAL[name]()))
    value = config.get(name)
    if value is None:
        if weak:
            return bytes(slot.size)
        raise LoadError(f"kconfig extern {name} is not set in the kernel config (strong extern)")
    return encode_value(slot, name, value)
