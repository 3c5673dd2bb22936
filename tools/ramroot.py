"""The file list and archive of the VM's "ramroot": a root in tmpfs, with no 9p left behind.

In the default VM (:mod:`tools.vm`) the guest runs in the host's ``/`` over virtio-9p, so the
9p modules stay loaded (4 extra module BTFs in ``/sys/kernel/btf``) and every exec and
import goes through 9p under TCG. In ramroot mode the VM's init unpacks an archive built here
into a tmpfs, unmounts the 9p shares, removes the 9p modules and ``chroot``s into the tmpfs.

The archive holds, at their host paths (so scripts and the venv work unchanged):

- the ``executables`` (looked up in ``PATH``) and every shared library that they, the Python
  interpreter and the extension modules of the copied trees need (``ldd``), plus
  ``dlopen_libraries`` that ``ldd`` cannot see (libgcc_s, which glibc dlopens to unwind a
  cancelled thread) and ``/etc/ld.so.cache``;
- the venv's interpreter (the symlink chain to the real binary), ``pyvenv.cfg`` and its
  standard library (``sysconfig`` ``stdlib``/``platstdlib``) without the trees that nothing
  at run time imports (:data:`STDLIB_SKIP`: ``test/``, ``idlelib/``, ``tkinter/``, the static
  ``config-*`` library, optimised ``.opt-N.pyc`` files, the base interpreter's own
  ``site-packages``);
- from the venv's ``site-packages`` only the files (``RECORD``) of the ``distributions``
  asked for and of their runtime requirements, transitively (so the bench-only matplotlib and
  numpy, and the dev tools, stay out);
- ``repo_paths`` of the checkout (the package, ``bench/``, ``tools/``, ``build/bpf``) without
  ``__pycache__`` from other interpreters;
- ``extra_files`` (e.g. the decompressed modules a benchmark will ``insmod``).

Symlinks along every path (``/lib -> usr/lib``, ``python3 -> python3.11``) are kept as
symlinks, so each file is stored once under its real path. The set is computed on the host
each time (the venv's ``sys.path`` and metadata, ``ldd``), never from a hard-coded list.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_EXECUTABLES = ("bash", "bpftool", "insmod", "rmmod", "lsmod")
DEFAULT_REPO_PATHS = ("schedswitchd", "bench", "tools", "build/bpf", "pyproject.toml")
DEFAULT_DLOPEN = ("libgcc_s.so.1", "libbpf.so.1")
LD_SO_CACHE = Path("/etc/ld.so.cache")
# Standard-library entries that no run-time import needs (names relative to the stdlib dir).
STDLIB_SKIP = frozenset(
    {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages",
     "dist-packages", "pydoc_data", "turtle.py"}
)  # fmt: skip
_STDLIB_SKIP_PREFIX = ("config-",)
# Extension modules of skipped packages or of CPython's own tests (``_tkinter`` alone pulls
# in Tcl/Tk and X11).
STDLIB_SKIP_FILES = re.compile(r"^(_tkinter|_test|_xxtest|xxlimited|_ctypes_test|xxsubtype)")
# Directories of the checkout that are outputs, not inputs.
REPO_SKIP = frozenset({"results"})
_OPT_PYC = re.compile(r"\.opt-\d\.pyc$")
_LDD_LINE = re.compile(r"^\s*(?:\S+\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$")
_MAX_LINKS = 40


class RamRootError(Exception):
    """The file list could not be computed (missing executable, interpreter or
    distribution, a symlink loop, ``ldd`` failing on a binary); the message says which."""


@dataclass(frozen=True)
class RamRootSpec:
    """What the ramroot must hold (see the module docstring).

    ``python``: the venv interpreter scripts run as ``$PY``; ``distributions``: names whose
    files and runtime requirements are taken from its ``site-packages``; ``executables``:
    command names looked up in the host's ``PATH``; ``repo_paths``: files or directories
    relative to the checkout; ``extra_files``: absolute host paths;
    ``dlopen_libraries``: sonames resolved through ``ldconfig -p`` (skipped if absent).
    """

    python: Path = REPO / ".venv" / "bin" / "python"
    distributions: tuple[str, ...] = ("schedswitchd",)
    executables: tuple[str, ...] = DEFAULT_EXECUTABLES
    repo_paths: tuple[str, ...] = DEFAULT_REPO_PATHS
    extra_files: tuple[Path, ...] = ()
    dlopen_libraries: tuple[str, ...] = DEFAULT_DLOPEN


@dataclass
class Manifest:
    """The ramroot's content: ``files`` (real absolute paths of regular files, no symlink
    in any component), ``links`` (absolute symlink path -> its target as stored) and
    ``total_bytes`` (sum of the files' sizes, i.e. what the tmpfs will hold)."""

    files: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)
    total_bytes: int = 0

    def add(self, path: str | Path) -> None:
        """Add ``path`` (absolute): the symlinks met on the way and the real file at the
        end. RamRootError for a symlink loop, a missing path or a directory."""
        real = _resolve(str(path), self.links)
        if not os.path.isfile(real):
            raise RamRootError(f"{path} is not a regular file (resolved to {real})")
        if real not in self.files:
            self.files.add(real)
            self.total_bytes += os.path.getsize(real)

    def add_tree(
        self, root: Path, skip: Iterable[str] = (), skip_files: re.Pattern[str] | None = None
    ) -> None:
        """Every regular file and symlink under directory ``root`` (``skip``: names of
        direct children to leave out; ``skip_files``: file names to leave out anywhere);
        ``__pycache__`` keeps only this interpreter's plain ``.pyc`` files (no ``.opt-N``)."""
        skipped = set(skip)
        root_real = _resolve(str(root), self.links)
        tag = sys.implementation.cache_tag
        for dirpath, dirnames, filenames in os.walk(root_real):
            if dirpath == root_real:
                dirnames[:] = [
                    d
                    for d in dirnames
                    if d not in skipped and not d.startswith(_STDLIB_SKIP_PREFIX)
                ]
                filenames = [f for f in filenames if f not in skipped]
            for name in dirnames:
                full = os.path.join(dirpath, name)
                if os.path.islink(full):
                    self.links[full] = os.readlink(full)
            for name in filenames:
                full = os.path.join(dirpath, name)
                if skip_files is not None and skip_files.search(name):
                    continue
                if os.path.basename(dirpath) == "__pycache__" and (
                    _OPT_PYC.search(name) or f".{tag}." not in name
                ):
                    continue
                if os.path.islink(full):
                    self.add(full)  # keeps the link, adds its target (inside or outside)
                elif os.path.isfile(full) and full not in self.files:
                    self.files.add(full)
                    self.total_bytes += os.path.getsize(full)


def _resolve(path: str, links: dict[str, str]) -> str:
    """The real path of ``path``, recording every symlink met (in a directory component or
    at the end) in ``links``; components after the root are resolved one by one so that
    ``..`` in a link target applies to the link's real parent."""
    parts = [p for p in path.split("/") if p]
    cur = "/"
    hops = 0
    i = 0
    while i < len(parts):
        nxt = os.path.join(cur, parts[i])
        if os.path.islink(nxt):
            hops += 1
            if hops > _MAX_LINKS:
                raise RamRootError(f"too many symlinks resolving {path}")
            target = os.readlink(nxt)
            links[nxt] = target
            base = "/" if target.startswith("/") else cur
            parts = [p for p in target.split("/") if p] + parts[i + 1 :]
            cur, i = base, 0
            # Normalise ".." and "." against the real prefix as we go.
            while parts and parts[0] in ("..", "."):
                if parts.pop(0) == "..":
                    cur = os.path.dirname(cur) or "/"
            continue
        if parts[i] == "..":
            cur = os.path.dirname(cur) or "/"
        elif parts[i] != ".":
            cur = nxt
        i += 1
    if not os.path.lexists(cur):
        raise RamRootError(f"{path}: {cur} does not exist")
    return cur


# --- the interpreter's side (runs inside the venv python, standard library only) ------------

_PY_PROBE = r"""
import json, re, sys, sysconfig
from importlib import metadata

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

def wanted(req):
    # "name[extra] (>=1) ; marker": runtime requirements only (no `extra == ...` markers).
    head, _, marker = req.partition(";")
    if "extra" in marker:
        return None
    if marker.strip():
        try:
            from packaging.markers import Marker
            if not Marker(marker).evaluate():
                return None
        except ImportError:
            pass  # without packaging, keep it: an extra file is harmless
    return norm(re.split(r"[\s\[<>=!~;(]", head.strip(), maxsplit=1)[0])

dists = {norm(d.metadata["Name"]): d for d in metadata.distributions()}
todo, seen, missing, files = [norm(n) for n in sys.argv[1:]], set(), [], []
while todo:
    name = todo.pop()
    if name in seen:
        continue
    seen.add(name)
    d = dists.get(name)
    if d is None:
        missing.append(name)
        continue
    for f in d.files or ():
        files.append(str(d.locate_file(f)))
    todo.extend(r for r in map(wanted, d.requires or ()) if r)
paths = sysconfig.get_paths()
print(json.dumps({
    "executable": sys.executable, "prefix": sys.prefix, "base_prefix": sys.base_prefix,
    "stdlib": sorted({paths["stdlib"], paths["platstdlib"]}), "files": files,
    "distributions": sorted(seen), "missing": missing, "cache_tag": sys.implementation.cache_tag,
}))
"""


def python_probe(python: Path, distributions: Iterable[str]) -> dict[str, object]:
    """Ask ``python`` for its stdlib directories, prefix and the files (``RECORD``) of
    ``distributions`` plus their runtime requirements. RamRootError if it cannot run or a
    distribution is not installed."""
    try:
        proc = subprocess.run(
            [str(python), "-I", "-c", _PY_PROBE, *distributions],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as e:
        raise RamRootError(f"{python} could not describe itself: {e}") from e
    if proc.returncode != 0:
        raise RamRootError(f"{python} could not describe itself: {proc.stderr.strip()}")
    info: dict[str, object] = json.loads(proc.stdout)
    if info["missing"]:
        raise RamRootError(f"not installed in {python}'s environment: {info['missing']}")
    return info


def ldd_closure(binaries: Iterable[str]) -> set[str]:
    """Every shared library (absolute path, as the loader finds it) that ``binaries`` need,
    transitively (``ldd``, which reports the whole closure), including the ELF interpreter.
    Non-ELF files and static binaries give nothing. RamRootError if a library is missing."""
    elves = [b for b in binaries if _is_elf(b)]
    libs: set[str] = set()
    for start in range(0, len(elves), 200):
        chunk = elves[start : start + 200]
        proc = subprocess.run(
            ["ldd", *chunk],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
        )
        for line in proc.stdout.splitlines():
            if "=> not found" in line:
                raise RamRootError(f"ldd: a library is missing: {line.strip()}")
            m = _LDD_LINE.match(line)
            if m:
                libs.add(m.group(1))
    return libs


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _ldconfig_paths(sonames: Iterable[str]) -> list[str]:
    wanted = set(sonames)
    if not wanted:
        return []
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    proc = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=False)
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"^\s*(\S+) \(([^)]*)\) => (\S+)$", line)
        if m and m.group(1) in wanted and "x86-64" in m.group(2):
            found.setdefault(m.group(1), m.group(3))
    return list(found.values())


def compute_manifest(spec: RamRootSpec) -> Manifest:
    """The ramroot's files and symlinks for ``spec`` (see the module docstring).
    RamRootError when something asked for cannot be found."""
    man = Manifest()
    for name in spec.executables:
        found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        if found is None:
            raise RamRootError(f"executable {name!r} not found in PATH")
        man.add(found)
    python = Path(os.path.abspath(spec.python))
    info = python_probe(python, spec.distributions)
    man.add(python)
    cfg = Path(str(info["prefix"])) / "pyvenv.cfg"
    if cfg.is_file():
        man.add(cfg)
    stdlib = info["stdlib"]
    assert isinstance(stdlib, list)
    for d in stdlib:
        man.add_tree(Path(d), skip=STDLIB_SKIP, skip_files=STDLIB_SKIP_FILES)
    dist_files = info["files"]
    assert isinstance(dist_files, list)
    for f in dist_files:
        if os.path.lexists(f) and not os.path.isdir(f):
            if "/__pycache__/" in f and _OPT_PYC.search(f):
                continue
            man.add(f)
    for rel in spec.repo_paths:
        p = REPO / rel
        if p.is_dir():
            man.add_tree(p, skip=REPO_SKIP)
        elif p.exists():
            man.add(p)
    for extra in spec.extra_files:
        man.add(extra)
    for lib in _ldconfig_paths(spec.dlopen_libraries):
        man.add(lib)
    if LD_SO_CACHE.is_file():
        man.add(LD_SO_CACHE)
    for lib in ldd_closure(sorted(f for f in man.files if _needs_ldd(f))):
        man.add(lib)
    return man


def _needs_ldd(path: str) -> bool:
    name = os.path.basename(path)
    return ".so" in name or (os.access(path, os.X_OK) and not name.endswith((".py", ".sh")))


def write_archive(man: Manifest, out: Path, extra: Mapping[str, Path] | None = None) -> int:
    """Write ``man`` as an uncompressed GNU tar at ``out`` (members relative to ``/``, links
    before files so directory symlinks exist first); ``extra`` adds arcname -> host file or
    directory (recursively). Returns the archive's size in bytes."""
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
        for link in sorted(man.links):
            tar.add(link, arcname=link.lstrip("/"), recursive=False)
        for f in sorted(man.files):
            tar.add(f, arcname=f.lstrip("/"), recursive=False)
        for arcname, path in (extra or {}).items():
            tar.add(path, arcname=arcname.lstrip("/"), recursive=True)
    return out.stat().st_size
