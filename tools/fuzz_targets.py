"""The five surfaces :mod:`tools.fuzz` runs, each a :class:`~tools.fuzz.Surface`.

* ``OBJECT``: ``open_object``, ``link_programs``, then one global variable and one
  struct_ops member set (``set_variable``, ``set_struct_ops_member``) on mutated ELF
  files (half written to a file and opened from its path, as the daemon does, half
  opened from bytes), seeded from
  ``build/tests/bpf``, ``build/bpf``, the executables of ``build/tests/embed`` and
  ``../shared/corpus`` (files up to 2 MiB: a copy of lavd's 23 MB per input would be
  most of the run). Mutations
  know the ELF layout: the ELF header's and every section header's fields, symbols,
  relocations, instructions, and the ``.BTF``/``.BTF.ext`` words, set to values around
  the limits that matter; plus byte flips, random bytes inside a section, truncation and
  chunks copied between places.
* ``BTF``: ``Btf.from_bytes`` and every lookup (``tests.bpf.btf.fuzz_seeds.exercise``) on
  mutated BTF: the ``.BTF`` of the test objects, every kind from the builder, a slice of
  the host's vmlinux; split BTF against its base (input's first byte ``S``, else ``B``).
* ``PROFILE``: ``parse_profile``, ``resolve_profile`` for the host's topology and the
  running kernel's enumerators, in the base and every mode, and the JSON of the result
  (what ``profile show --json`` prints): shipped profiles mutated as TOML tables, and
  small profiles whose values are generated expressions (a random grammar over the
  language's operators, built-ins, slices, comprehensions and topology attributes, or the
  shipped profiles' expressions with parts replaced).
* ``CONFIG``: ``load_config`` of the shipped daemon config (and one with profiled
  schedulers) mutated as TOML tables, then ``check_config.inspect_object`` (the
  ``--check-config`` static checks: open, link, profile, ``rodata``/``struct_ops``
  tunables) of one of its schedulers.
* ``PROTOCOL``: ``parse_request`` on mutated requests (JSON-level edits of valid requests
  of every op, byte edits, arbitrary bytes), and a tenth of them also sent over a live
  server's socket (``tests.daemon.harness.Running``: the real server and reconciler with
  a fake backend), where each line must get one well-formed reply that is not ``internal``
  and the server must keep answering.

Inputs are bytes (a reproducer is one file); every generator draws only from its
``random.Random``.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import random
import shutil
import struct
import tempfile
import tomllib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from schedswitchd.errors import CustomizationError, SchedSwitchError
from tools.fuzz import Surface

ROOT = Path(__file__).resolve().parent.parent
_MAX_SEED_BYTES = 2 << 20


def _scratch(prefix: str) -> Path:
    """A temporary directory of this worker, removed when it exits."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d


def _interesting(width: int, orig: int, rng: random.Random, file_size: int = 0) -> int:
    """A value for a field of ``width`` bytes that was ``orig``: the edges of its width,
    the kernel's array value limit, sizes near the file's, small and random numbers."""
    top = 1 << (8 * width)
    choices = [
        0, 1, 2, 3, 4, 7, 8, 16, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF,
        top - 1, top - 2, top - 16, top >> 1, (top >> 1) - 1,
        (1 << 31) - 1, 1 << 31, 1 << 30, (1 << 32) - 1, (1 << 32) - 16, 1 << 32,
        orig + 1, orig - 1, orig * 2, orig + 8, orig >> 1, orig ^ (1 << rng.randrange(8 * width)),
        file_size, file_size + 1, file_size - 8, file_size * 2,
        rng.randrange(64), rng.randrange(top), rng.randrange(1 << 16),
    ]  # fmt: skip
    return rng.choice(choices) % top


# --- objects ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Region:
    """``count`` records of ``stride`` bytes from ``base``, each with ``fields`` (offset,
    width) to set."""

    base: int
    count: int
    stride: int
    fields: tuple[tuple[int, int], ...]
    weight: float


@dataclass(frozen=True)
class _Elf:
    data: bytes
    regions: tuple[_Region, ...]
    sections: tuple[tuple[int, int], ...]  # (offset, size) of sections with file bytes


_EHDR = _Region(0, 1, 64, ((16, 2), (18, 2), (20, 4), (24, 8), (32, 8), (40, 8), (48, 4),
                           (52, 2), (54, 2), (56, 2), (58, 2), (60, 2), (62, 2), (4, 1),
                           (5, 1)), 1.0)  # fmt: skip
_SHDR_FIELDS = ((0, 4), (4, 4), (8, 8), (16, 8), (24, 8), (32, 8), (40, 4), (44, 4), (48, 8),
                (56, 8))  # fmt: skip
_SYM_FIELDS = ((0, 4), (4, 1), (5, 1), (6, 2), (8, 8), (16, 8))
_REL_FIELDS = ((0, 8), (8, 4), (12, 4))
_INSN_FIELDS = ((0, 1), (1, 1), (2, 2), (4, 4))
_WORD = ((0, 4),)


def _elf_layout(data: bytes) -> _Elf:
    """The mutable places of a little-endian ELF64 file."""
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shnum, shstrndx = struct.unpack_from("<HH", data, 0x3C)
    regions = [_EHDR, _Region(shoff, shnum, 64, _SHDR_FIELDS, 4.0)]
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)]
    str_off, str_size = secs[shstrndx][4], secs[shstrndx][5]
    names = data[str_off : str_off + str_size]
    sections = []
    for name_off, sh_type, _flags, _addr, off, size, *_ in secs:
        name = names[name_off : names.index(b"\0", name_off)].decode(errors="replace")
        if sh_type == 8 or not size or off + size > len(data) or name.startswith(".debug"):
            continue  # NOBITS, empty, or DWARF (never read by the loader)
        sections.append((off, size))
        if sh_type == 2:  # SYMTAB
            regions.append(_Region(off, size // 24, 24, _SYM_FIELDS, 3.0))
        elif sh_type == 9:  # REL
            regions.append(_Region(off, size // 16, 16, _REL_FIELDS, 3.0))
        elif name == ".BTF" and size >= 24:
            (hdr_len,) = struct.unpack_from("<I", data, off + 4)
            regions.append(_Region(off, 6, 4, _WORD, 2.0))  # magic..str_len
            regions.append(_Region(off + hdr_len, (size - hdr_len) // 4, 4, _WORD, 5.0))
        elif name == ".BTF.ext":
            regions.append(_Region(off, size // 4, 4, _WORD, 3.0))
        elif sh_type == 1 and (_flags & 4):  # PROGBITS, SHF_EXECINSTR: code
            regions.append(_Region(off, size // 8, 8, _INSN_FIELDS, 2.0))
        elif sh_type == 1:  # data, .maps, license, ...
            regions.append(_Region(off, size // 4, 4, _WORD, 1.0))
    return _Elf(data, tuple(r for r in regions if r.count > 0), tuple(sections))


def _object_paths() -> list[Path]:
    paths = sorted((ROOT / "build/tests/bpf").glob("*.bpf.o"))
    paths += sorted((ROOT / "build/bpf").glob("*.bpf.o"))
    paths += sorted((ROOT / "build/tests/embed").glob("*_obj"))  # executables embedding them
    paths += sorted((ROOT.parent / "shared/corpus").glob("*.bpf.o"))
    return [p for p in paths if p.stat().st_size <= _MAX_SEED_BYTES]


@dataclass(frozen=True)
class _Objects:
    seeds: list[_Elf]
    file: Path  # where an input opened as a file is written


def _object_setup() -> _Objects:
    seeds = [_elf_layout(p.read_bytes()) for p in _object_paths()]
    if not seeds:
        raise RuntimeError("no seed objects: run `make test-objects` first")
    return _Objects(seeds, _scratch("fuzz-object-") / "input.bpf.o")


def _set_field(buf: bytearray, at: int, width: int, rng: random.Random) -> None:
    if at < 0 or at + width > len(buf):
        return
    orig = int.from_bytes(buf[at : at + width], "little")
    buf[at : at + width] = _interesting(width, orig, rng, len(buf)).to_bytes(width, "little")


def _mutate_elf(elf: _Elf, rng: random.Random, others: list[_Elf]) -> bytes:
    buf = bytearray(elf.data)
    weights = [r.weight for r in elf.regions]
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        op = rng.random()
        if op < 0.6:  # a field of a header, symbol, relocation, instruction, BTF word
            r = rng.choices(elf.regions, weights)[0]
            off, width = rng.choice(r.fields)
            _set_field(buf, r.base + r.stride * rng.randrange(r.count) + off, width, rng)
        elif op < 0.75 and elf.sections:  # random bytes inside one section
            off, size = rng.choice(elf.sections)
            for _ in range(rng.randint(1, 8)):
                at = off + rng.randrange(size)
                if at < len(buf):  # (an earlier cut may have shortened the file)
                    buf[at] = rng.randrange(256)
        elif op < 0.85:  # flips anywhere
            for _ in range(rng.randint(1, 4)):
                buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        elif op < 0.92 and elf.sections:  # a chunk of another section (or object) copied in
            src = rng.choice(others)
            if src.sections:
                s_off, s_size = rng.choice(src.sections)
                d_off, d_size = rng.choice(elf.sections)
                n = min(rng.randint(1, 256), s_size, d_size)
                at = d_off + rng.randrange(d_size - n + 1)
                frm = s_off + rng.randrange(s_size - n + 1)
                if at + n <= len(buf):
                    buf[at : at + n] = src.data[frm : frm + n]
        else:  # cut short
            del buf[rng.randrange(len(buf)) :]
    return bytes(buf)


def _object_generate(s: _Objects, rng: random.Random) -> bytes:
    return _mutate_elf(rng.choice(s.seeds), rng, s.seeds)


_VALUES: tuple[object, ...] = (0, 1, -1, 255, 1 << 31, (1 << 64) - 1, 1 << 64, True, "x" * 20,
                               [1, 2, 3], b"\x01" * 9, 1.5, None)  # fmt: skip


def _object_run(s: _Objects, data: bytes) -> str:
    from schedswitchd.bpf.customize import set_struct_ops_member, set_variable
    from schedswitchd.bpf.object import open_object

    # Chosen by the input, so that a replay does the same: half are opened as a file is
    # (what the daemon does: only the sections kept are read, and an executable is
    # searched for the object it embeds), half from bytes.
    pick = random.Random(zlib.crc32(data[-4096:]) ^ len(data))
    if pick.random() < 0.5:
        s.file.write_bytes(data)
        spec = open_object(s.file)
    else:
        spec = open_object(data)
    spec.link_programs()
    # Then what a config's rodata and struct_ops keys do to it: one global variable and
    # one struct_ops member set.
    done = refused = 0
    variables = [(m.name, v.name) for m in spec.maps for v in m.variables]
    if variables:
        section, name = pick.choice(variables)
        try:
            spec = set_variable(spec, name, pick.choice(_VALUES), section=section)
            done += 1
        except CustomizationError:
            refused += 1
    members = [(m.name, mem.name) for m in spec.struct_ops_maps if m.struct_ops is not None
               for mem in m.struct_ops.members]  # fmt: skip
    if members:
        map_name, member = pick.choice(members)
        try:
            set_struct_ops_member(spec, map_name, member, pick.choice(_VALUES))
            done += 1
        except CustomizationError:
            refused += 1
    # Counted apart: an edit made, or only refused (CustomizationError, a typed error).
    return "opened, edited" if done else "opened, edits refused" if refused else "opened"


OBJECT = Surface("object", _object_setup, _object_generate, _object_run)


# --- BTF ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _BtfSeeds:
    base: list[bytes]
    split: bytes
    split_base: Any


def _btf_setup() -> _BtfSeeds:
    from elftools.elf.elffile import ELFFile

    from tests.bpf.btf.fuzz_seeds import seeds, split_base, split_seed

    base = list(seeds())
    for p in sorted((ROOT / "build/tests/bpf").glob("*.bpf.o")):
        with open(p, "rb") as f:
            sec = ELFFile(f).get_section_by_name(".BTF")
            if sec is not None and sec.data_size <= 64 << 10:
                base.append(sec.data())
    return _BtfSeeds(base, split_seed(), split_base())


def _mutate_btf(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    hdr_len = int.from_bytes(buf[4:8], "little") if len(buf) >= 8 else 0
    for _ in range(rng.choice((1, 1, 2, 3, 4))):
        op = rng.random()
        words = len(buf) // 4
        if op < 0.15 and len(buf) >= 24:  # a header word
            _set_field(buf, 4 * rng.randrange(1, 6), 4, rng)
        elif op < 0.65 and words > hdr_len // 4 + 1:  # a type-area word (info, size, type)
            _set_field(buf, 4 * rng.randrange(hdr_len // 4, words), 4, rng)
        elif op < 0.75 and words:  # a u16 or a byte (vlen, kind, bitfield sizes)
            _set_field(buf, rng.randrange(len(buf) - 1), rng.choice((1, 2)), rng)
        elif op < 0.9 and buf:
            for _ in range(rng.randint(1, 4)):
                buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif buf:
            del buf[rng.randrange(len(buf)) :]
    return bytes(buf)


def _btf_generate(s: _BtfSeeds, rng: random.Random) -> bytes:
    if rng.random() < 0.3:
        return b"S" + _mutate_btf(s.split, rng)
    return b"B" + _mutate_btf(rng.choice(s.base), rng)


def _btf_run(s: _BtfSeeds, data: bytes) -> str:
    from schedswitchd.bpf.btf.reader import Btf
    from tests.bpf.btf.fuzz_seeds import exercise

    base = s.split_base if data[:1] == b"S" else None
    exercise(Btf.from_bytes(data[1:], base=base))
    return "parsed"


BTF = Surface("btf", _btf_setup, _btf_generate, _btf_run)


# --- TOML tables --------------------------------------------------------------------------

_STRINGS = (
    "", "a", "x" * 300, "ss_fifo", "bpfland", "gaming", "kernel", "../x", "/dev/zero",
    "/proc/self/fd/0", "a\0b", "\u00e9", "SCX_OPS_SWITCH_PARTIAL", "0x10",
    "loop/x.o", ".", "/", "fifo@gaming", "@", "1e309", "nan", "-1", "topo", "{expr}",
)  # fmt: skip
_INTS = (0, 1, -1, 2, 7, 64, 255, 256, 4096, 65535, 65536, 1 << 31, (1 << 31) - 1, 1 << 32,
         (1 << 63) - 1, -(1 << 63), 10**18)  # fmt: skip


def _random_scalar(rng: random.Random, exprs: list[str]) -> Any:
    kind = rng.randrange(8)
    if kind == 0:
        return rng.choice(_INTS)
    if kind == 1:
        return rng.randrange(-5, 100)
    if kind == 2:
        return rng.choice((0.0, -1.5, 1e308, math.inf, -math.inf, math.nan, 0.001))
    if kind == 3:
        return rng.choice((True, False))
    if kind == 4:
        return rng.choice(_STRINGS)
    if kind == 5:
        return {"expr": gen_expr(rng) if rng.random() < 0.6 else _mutate_expr(rng, exprs)}
    if kind == 6:
        return [rng.choice(_INTS) for _ in range(rng.randrange(4))]
    return {rng.choice(_STRINGS) or "k": rng.choice(_INTS)}


def _like(orig: Any, rng: random.Random, exprs: list[str]) -> Any:
    """A value of ``orig``'s type (so that more files pass validation and reach what
    uses them), or any value for tables and lists."""
    if isinstance(orig, bool):
        return not orig
    if isinstance(orig, int):
        return _interesting(8, orig % (1 << 64), rng) - rng.choice((0, 0, 1 << 63))
    if isinstance(orig, float):
        return rng.choice((0.0, -1.0, 1e-9, 1e308, math.inf, math.nan, orig * 1000))
    if isinstance(orig, str):
        return rng.choice((rng.choice(_STRINGS), orig + rng.choice(_STRINGS), orig[:1]))
    return _random_scalar(rng, exprs)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path of a TOML document (tables and arrays walked)."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _mutate_doc(doc: dict[str, Any], rng: random.Random, exprs: list[str]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))  # a deep copy (TOML documents hold JSON's types)
    for _ in range(rng.choice((1, 1, 2, 3, 5))):
        path = rng.choice(_paths(doc)[1:] or [()])
        if not path:
            continue
        *parent_path, key = path
        parent: Any = doc
        for k in parent_path:
            parent = parent[k]
        op = rng.random()
        if op < 0.35:
            parent[key] = _like(parent[key], rng, exprs)
        elif op < 0.5:
            parent[key] = _random_scalar(rng, exprs)
        elif op < 0.65:
            del parent[key]
        elif op < 0.8 and isinstance(parent, dict):
            parent[rng.choice(_STRINGS) or "extra"] = _random_scalar(rng, exprs)
        elif op < 0.9 and isinstance(parent[key], dict):
            parent[key][rng.choice(_STRINGS) or "extra"] = _random_scalar(rng, exprs)
        else:
            parent[key] = [parent[key]] if rng.random() < 0.5 else {"x": parent[key]}
    return doc


def _toml(doc: dict[str, Any], rng: random.Random) -> bytes:
    try:
        text = tomli_w.dumps(doc).encode()
    except (TypeError, ValueError):  # e.g. a list of mixed tables and values
        text = json.dumps(doc).encode()
    if rng.random() < 0.1 and text:  # a few byte edits on top: the TOML parser's errors
        buf = bytearray(text)
        for _ in range(rng.randint(1, 3)):
            buf[rng.randrange(len(buf))] = rng.choice(b"[]{}=\"'.\n\\#x0\xff")
        text = bytes(buf)
    return text


# --- expressions --------------------------------------------------------------------------

_TOPO_ATTRS = ("nr_cpus", "nr_llcs", "nr_nodes", "nr_cores", "mask_bytes", "max_capacity",
               "has_big_little", "big_cpus", "little_cpus", "cpus", "llcs", "nodes",
               "smt_pairs", "smt_active", "nr_cpu_ids", "cores", "online")  # fmt: skip
_CPU_ATTRS = ("id", "capacity", "online", "llc_id", "node", "core_id", "sibling", "max_freq")
_FUNCS = ("len", "min", "max", "sum", "abs", "any", "all", "sorted", "range", "int", "bool",
          "ilog2", "roundup_pow2", "cpumask", "cpumask_u64", "kernel_enum",
          "kernel_has")  # fmt: skip
_BINOPS = ("+", "-", "*", "/", "//", "%", "**", "<<", ">>", "|", "&", "^")
_CMPS = ("==", "!=", "<", "<=", ">", ">=", "in", "not in")
_ATOMS = ("0", "1", "-1", "2", "63", "64", "4096", "65536", "65535", "2**31", "4095",
          "True", "False", "None", "0.5", "-1.0", "1e308", "'a'", "'SCX_DSQ_GLOBAL'", "''",
          "topo", "mode", "x", "y", "[]", "()", "{}", "b''")  # fmt: skip


def gen_expr(rng: random.Random, depth: int = 0) -> str:
    """A random expression of the profile language (or near it: some are refused by
    :func:`~schedswitchd.profile.expr.compile_expr`, as a user's may be)."""
    if depth > 4 or rng.random() < 0.25:
        return rng.choice(_ATOMS)
    k = rng.randrange(14)

    def sub() -> str:
        return gen_expr(rng, depth + 1)

    if k == 0:
        return f"({sub()} {rng.choice(_BINOPS)} {sub()})"
    if k == 1:
        return f"({rng.choice(('-', '+', '~', 'not '))}{sub()})"
    if k == 2:
        return f"({sub()} {rng.choice(_CMPS)} {sub()})"
    if k == 3:
        return f"({sub()} {rng.choice(('and', 'or'))} {sub()})"
    if k == 4:
        return f"({sub()} if {sub()} else {sub()})"
    if k == 5:
        return "[" + ", ".join(sub() for _ in range(rng.randrange(4))) + "]"
    if k == 6:
        return f"{sub()}[{sub()}]"
    if k == 7:
        parts = [rng.choice(("", sub())) for _ in range(rng.choice((2, 3)))]
        return f"{sub()}[{':'.join(parts)}]"
    if k == 8:
        args = ", ".join(sub() for _ in range(rng.randrange(4)))
        if rng.random() < 0.2:
            args += (", " if args else "") + rng.choice(("nbytes", "nwords", "key", "reverse"))
            args += f"={sub()}"
        return f"{rng.choice(_FUNCS)}({args})"
    if k == 9:
        var = rng.choice(("x", "y", "c"))
        cond = f" if {sub()}" if rng.random() < 0.3 else ""
        return f"[{sub()} for {var} in {sub()}{cond}]"
    if k == 10:
        return f"topo.{rng.choice(_TOPO_ATTRS)}"
    if k == 11:
        return f"topo.cpus[{rng.choice(('0', '-1', '1', sub()))}].{rng.choice(_CPU_ATTRS)}"
    if k == 12:
        return f"[c.{rng.choice(_CPU_ATTRS)} for c in topo.{rng.choice(_TOPO_ATTRS)}]"
    keys = ("'a'", "'slice_ns'", "'x'", sub())  # member names in quotes, mostly
    return "{" + ", ".join(f"{rng.choice(keys)}: {sub()}" for _ in range(rng.randrange(3))) + "}"


def _mutate_expr(rng: random.Random, exprs: list[str]) -> str:
    """One of ``exprs`` with a name, number or operator replaced by a generated one."""
    if not exprs:
        return gen_expr(rng)
    src = rng.choice(exprs)
    for _ in range(rng.randint(1, 3)):
        if not src:
            break
        at = rng.randrange(len(src))
        end = min(len(src), at + rng.randint(1, 8))
        src = src[:at] + rng.choice((gen_expr(rng, 3), rng.choice(_ATOMS), "")) + src[end:]
    return src


# --- profiles -----------------------------------------------------------------------------


@dataclass
class _Profiles:
    docs: list[dict[str, Any]]
    exprs: list[str]
    topo: Any
    kernel: Any
    scratch: Path = field(default_factory=lambda: _scratch("fuzz-profile-"))


def _exprs_of(doc: Any) -> list[str]:
    if isinstance(doc, dict):
        if isinstance(doc.get("expr"), str):
            return [doc["expr"]]
        return [e for v in doc.values() for e in _exprs_of(v)]
    if isinstance(doc, list):
        return [e for v in doc for e in _exprs_of(v)]
    return []


def _profile_setup() -> _Profiles:
    from schedswitchd.cli.profile_cmd import kernel_facts
    from schedswitchd.profile.topology import read_topology

    docs = [tomllib.loads(p.read_text()) for p in sorted((ROOT / "config/profiles").glob("*.toml"))]
    exprs = sorted({e for d in docs for e in _exprs_of(d)})
    vmlinux = "/sys/kernel/btf/vmlinux"
    kernel = kernel_facts(vmlinux if os.path.exists(vmlinux) else None)
    return _Profiles(docs, exprs, read_topology("/sys"), kernel)


def _small_profile(rng: random.Random, exprs: list[str]) -> dict[str, Any]:
    """A profile whose values are generated expressions, in the tables that take them."""

    def e() -> dict[str, str]:
        return {"expr": gen_expr(rng) if rng.random() < 0.7 else _mutate_expr(rng, exprs)}

    doc: dict[str, Any] = {"profile": {"name": "fuzz", "summary": "s", "userspace": "none"}}
    doc["variables"] = {f"v{i}": e() for i in range(rng.randint(1, 3))}
    if rng.random() < 0.3:
        doc["struct_ops"] = {"timeout_ms": e()}
    if rng.random() < 0.2:
        doc["modes"] = {"m": {"variables": {"v0": e()}}}
    return doc


def _profile_generate(s: _Profiles, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        doc = _small_profile(rng, s.exprs)
    else:  # named as the file the run writes (a profile's name is its file's stem)
        base = rng.choice(s.docs)
        doc = _mutate_doc({**base, "profile": {**base["profile"], "name": "fuzz"}}, rng, s.exprs)
    return _toml(doc, rng)


def _profile_run(s: _Profiles, data: bytes) -> str:
    from schedswitchd.profile.model import parse_profile
    from schedswitchd.profile.resolve import resolve_profile

    prof = parse_profile(data, path=str(s.scratch / "fuzz.toml"))
    for mode in (None, *prof.modes):
        res = resolve_profile(prof, s.topo, mode=mode, kernel=s.kernel)
        json.dumps({"topology": s.topo.describe(), **res.as_dict()})  # profile show --json
    return "resolved"


PROFILE = Surface("profile", _profile_setup, _profile_generate, _profile_run)


# --- configs ------------------------------------------------------------------------------


@dataclass
class _Configs:
    docs: list[dict[str, Any]]
    exprs: list[str]
    topo: Any
    vmlinux: Any
    dir: Path


def _config_setup() -> _Configs:
    from schedswitchd.daemon.check_config import kernel_btf
    from schedswitchd.profile.topology import read_topology

    shipped = tomllib.loads((ROOT / "config/schedswitchd.toml").read_text())
    d = _scratch("fuzz-config-")
    (d / "loop").symlink_to("loop")  # a symlink loop for object paths to meet
    os.mkfifo(d / "fifo")
    # Object paths of the shipped file are relative to config/: make them absolute here.
    for sched in shipped.get("schedulers", {}).values():
        sched["object"] = str((ROOT / "config" / sched["object"]).resolve())
    profiled = json.loads(json.dumps(shipped))
    corpus = ROOT.parent / "shared/corpus"
    scheds = profiled["schedulers"]
    if (corpus / "bpfland.bpf.o").exists():
        scheds["bpfland"] = {"object": str(corpus / "bpfland.bpf.o"), "profile": "bpfland"}
        scheds["bpfland_pow"] = {"object": str(corpus / "bpfland.bpf.o"),
                                 "profile": "bpfland", "mode": "powersave"}  # fmt: skip
        profiled["hints"]["gaming"] = {"scheduler": "bpfland", "priority": 50, "mode": "gaming"}
    exprs = sorted({e for p in (ROOT / "config/profiles").glob("*.toml")
                    for e in _exprs_of(tomllib.loads(p.read_text()))})  # fmt: skip
    return _Configs([shipped, profiled], exprs, read_topology("/sys"), kernel_btf(), d)


_TUNABLES = {
    "rodata": ("slice_ns", "boost_slice_ns", "error_after", "slice_max", "nope", "debug"),
    "struct_ops": ("timeout_ms", "flags", "exit_dump_len", "dispatch_max_batch", "name",
                   "hotplug_seq", "nope", "enqueue", "ops"),
}  # fmt: skip


def _config_generate(s: _Configs, rng: random.Random) -> bytes:
    if rng.random() < 0.5:  # one tunable of one scheduler: most such files validate
        doc = json.loads(json.dumps(rng.choice(s.docs)))
        sched = rng.choice(list(doc["schedulers"].values()))
        table = rng.choice(list(_TUNABLES))
        value: Any = rng.choice((_interesting(8, 0, rng) - rng.choice((0, 1 << 63)),
                                 rng.choice(_INTS), rng.choice((True, False)),
                                 rng.choice(_STRINGS), [rng.choice(_STRINGS)]))  # fmt: skip
        sched.setdefault(table, {})[rng.choice(_TUNABLES[table])] = value
        return _toml(doc, rng)
    doc = _mutate_doc(rng.choice(s.docs), rng, s.exprs)
    scheds = doc.get("schedulers")
    if rng.random() < 0.05 and isinstance(scheds, dict):  # a path the file system makes hard
        for sched in scheds.values():
            if isinstance(sched, dict):
                # A FIFO rarely: while an open of one blocks, each costs the stall limit.
                sched["object"] = rng.choices(_HARD_PATHS, (20, 20, 20, 20, 20, 10, 1))[0]
                break
    return _toml(doc, rng)


_HARD_PATHS = ("loop/x.o", "loop", "/dev/null", "a\0b", "/proc/self/mem", "..", "fifo")


def _config_run(s: _Configs, data: bytes) -> str:
    from schedswitchd.daemon.check_config import inspect_object
    from schedswitchd.daemon.config import load_config

    path = s.dir / "schedswitchd.toml"
    path.write_bytes(data)
    cfg = load_config(path)
    scheds = sorted(cfg.schedulers)
    if not scheds:
        return "parsed"
    # One scheduler per input (chosen by the input, so a replay checks the same one).
    name = scheds[sum(data) % len(scheds)]
    problems, _ = inspect_object(cfg.schedulers[name], topology=s.topo, vmlinux=s.vmlinux)
    return "checked with problems" if problems else "checked"


CONFIG = Surface("config", _config_setup, _config_generate, _config_run)


# --- protocol -----------------------------------------------------------------------------

_REQUESTS: tuple[dict[str, Any], ...] = (
    {"v": 1, "op": "hint", "workload": "gaming"},
    {"v": 1, "op": "hint", "workload": "gaming", "ttl_s": 30, "id": 7},
    {"v": 1, "op": "prepare", "workload": "gaming", "ttl_s": 5},
    {"v": 1, "op": "release", "lease": "x"},
    {"v": 1, "op": "status", "id": "a"},
    {"v": 1, "op": "list"},
    {"v": 1, "op": "history", "limit": 3},
    {"v": 1, "op": "switch", "scheduler": "fifo"},
    {"v": 1, "op": "switch", "scheduler": "fifo@gaming"},
    {"v": 1, "op": "stop"},
    {"v": 1, "op": "reload"},
)
_JSON_VALUES: tuple[Any, ...] = (None, True, False, 0, -1, 1 << 64, 1.5, 1e400, "", "x" * 5000,
                                 [], {}, [1], {"a": 1}, "status", "\u0000", 10**400)  # fmt: skip


@dataclass
class _Protocol:
    server: Any = None
    served: int = 0


def _protocol_setup() -> _Protocol:
    from tests.daemon.harness import Running

    return _Protocol(Running())


def _protocol_generate(_s: _Protocol, rng: random.Random) -> bytes:
    k = rng.random()
    if k < 0.6:
        req = dict(rng.choice(_REQUESTS))
        for _ in range(rng.randint(1, 3)):
            keys = [*req, "v", "op", "id", "extra", "ttl_s", "pid", "workload"]
            key = rng.choice(keys)
            r = rng.random()
            if r < 0.6:
                req[key] = rng.choice((*_JSON_VALUES, rng.choice(_INTS), rng.choice(_STRINGS)))
            elif key in req:
                del req[key]
        text = json.dumps(req, allow_nan=True).encode()
        if rng.random() < 0.15:  # duplicate keys, trailing garbage, nesting
            text = rng.choice((text[:-1] + b', "op": "status"}', text + b"x", b"[" * 50 + text,
                               text.replace(b" ", b""), text * 2))  # fmt: skip
    elif k < 0.85:
        buf = bytearray(json.dumps(rng.choice(_REQUESTS)).encode())
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        text = bytes(buf)
    else:
        text = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    socket_too = b"W" if rng.random() < 0.1 else b"P"
    return socket_too + text


def _protocol_run(s: _Protocol, data: bytes) -> str:
    from schedswitchd.daemon import protocol as proto

    line = data[1:]
    try:
        proto.parse_request(line)
        outcome = "parsed"
    except proto.RequestError as exc:
        outcome = f"RequestError:{exc.code}"
    if data[:1] == b"W":
        _over_the_socket(s, line)
        outcome += ", served"
    return outcome


class ServerDefect(Exception):
    """The live server answered a line with an ``internal`` error, a malformed reply or
    none (an untyped exception for the oracle)."""


def _over_the_socket(s: _Protocol, line: bytes) -> None:
    from schedswitchd.daemon import protocol as proto

    c = s.server.client()
    try:
        c.send_raw(line.replace(b"\n", b" ") + b"\n")
        if line.strip(b" \t\r\n"):
            reply = c.recv_line()
            if reply is None:
                raise ServerDefect("connection closed without a reply")
            parsed = proto.parse_reply(json.dumps(reply).encode())
            if isinstance(parsed, proto.ErrorReply) and parsed.error.code == "internal":
                raise ServerDefect(f"internal error: {parsed.error.message}")
    finally:
        c.close()
    s.served += 1
    if s.served % 100 == 0 and not s.server.client().request(op="status")["ok"]:
        raise ServerDefect("status not answered after the fuzz lines")


def _protocol_teardown(s: _Protocol) -> None:
    s.server.stop()


PROTOCOL = Surface(
    "protocol", _protocol_setup, _protocol_generate, _protocol_run, _protocol_teardown
)

__all__ = ["BTF", "CONFIG", "OBJECT", "PROFILE", "PROTOCOL", "SchedSwitchError", "gen_expr"]
