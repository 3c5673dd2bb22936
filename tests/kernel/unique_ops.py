"""Congestion-control names of this test process's own, for the host tests that register
``tcp_congestion_ops`` struct_ops.

A congestion control's ``name`` is kernel-wide: ``tcp_register_congestion_control()``
refuses one already registered (``EEXIST``), and the kernel's list
(``/proc/sys/net/ipv4/tcp_available_congestion_control``) is how the tests and
:class:`~tests.kernel.fake_sched_ext.FakeSchedExt` see what is registered. The test objects
are compiled with fixed names (``ssd_uei``, ``ssd_plain``, ...), so two host suites running
side by side (two worktrees, or ``make test`` beside a developer's run) registered the same
names: one's attach was refused, or found the other's scheduler still listed after its own
had gone. Each process here registers the objects under names with its pid in them instead
(:func:`ca_name`): a copy of the object file (:func:`unique_object`) or of its spec
(:func:`unique_spec`) whose struct_ops ``name`` members are rewritten, nothing else.
"""

from __future__ import annotations

import atexit
import io
import os
import shutil
import tempfile
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from schedswitchd.bpf.customize import set_struct_ops_member
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec, StructOpsSpec

#: TCP_CA_NAME_MAX (include/net/tcp.h): 16 bytes with the NUL.
_NAME_MAX = 15
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(n: int) -> str:
    out = ""
    while True:
        n, d = divmod(n, 36)
        out = _DIGITS[d] + out
        if n == 0:
            return out


#: This process's mark: no two processes running at once share a pid.
TOKEN = _base36(os.getpid())
_copies: dict[Path, Path] = {}
_dir: Path | None = None


def ca_name(name: str) -> str:
    """The name this process registers ``name`` under: ``ssd_uei`` -> ``s<pid>_uei``
    (the pid in base 36, at most 15 characters in all)."""
    return (f"s{TOKEN}_{name.removeprefix('ssd_')}")[:_NAME_MAX]


def _old_name(ops: StructOpsSpec) -> tuple[str, int, int] | None:
    member = ops.member("name")
    if member is None:
        return None
    raw = ops.data[member.offset : member.offset + member.size]
    return raw.split(b"\0", 1)[0].decode(), member.offset, member.size


def unique_spec(spec: ObjectSpec) -> ObjectSpec:
    """``spec`` with each struct_ops variable's ``name`` replaced by :func:`ca_name`."""
    for m in spec.struct_ops_maps:
        assert m.struct_ops is not None
        old = _old_name(m.struct_ops)
        if old is not None and old[0]:
            spec = set_struct_ops_member(spec, m.name, "name", ca_name(old[0]))
    return spec


def unique_object(path: Path) -> Path:
    """A copy of the object file at ``path`` (made once per process, in a temporary
    directory removed at exit) whose struct_ops ``name`` members read :func:`ca_name` of
    theirs. The bytes are found from the spec (the member's offset in its variable) and
    the ELF symbol table (the variable's offset in its section): nothing else changes."""
    path = Path(path)
    hit = _copies.get(path)
    if hit is not None:
        return hit
    global _dir
    if _dir is None:
        _dir = Path(tempfile.mkdtemp(prefix=f"ssd-ops-{TOKEN}-"))
        atexit.register(shutil.rmtree, _dir, True)
    data = bytearray(path.read_bytes())
    elf = ELFFile(io.BytesIO(bytes(data)))
    symtab = elf.get_section_by_name(".symtab")
    assert isinstance(symtab, SymbolTableSection), f"{path}: no symbol table"
    for m in open_object(path).struct_ops_maps:
        ops = m.struct_ops
        assert ops is not None
        old = _old_name(ops)
        if old is None or not old[0]:
            continue
        name, offset, size = old
        index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == ops.section)
        [sym] = [
            s for s in symtab.iter_symbols() if s.name == ops.var_name and s["st_shndx"] == index
        ]
        at = elf.get_section(index)["sh_offset"] + sym["st_value"] + offset
        assert data[at : at + len(name)] == name.encode(), f"{path}: {ops.var_name}.name"
        data[at : at + size] = ca_name(name).encode().ljust(size, b"\0")
    out = _dir / path.name
    out.write_bytes(bytes(data))
    _copies[path] = out
    return out
