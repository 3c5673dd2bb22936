"""Fetch, unpack and cache Debian unstable's kernel, the one that has sched_ext.

The host kernel lacks ``CONFIG_SCHED_CLASS_EXT``; Debian's unstable ("sid") kernel has it,
plus ``CONFIG_DEBUG_INFO_BTF_MODULES`` and xz-compressed modules (``docs/vm.md``).
:func:`ensure_kernel` downloads it once into a machine-wide
cache, ``/var/cache/schedswitchd/kernel/<ver>/``, and derives what tests, benchmarks and the
BPF build need:

- ``vmlinux``: the uncompressed kernel ELF, cut out of the zstd payload of the bzImage;
- ``vmlinux.btf``: its ``.BTF`` section, raw (kernel doc ``Documentation/bpf/btf.rst``);
- ``vmlinux.h``: ``bpftool btf dump file vmlinux.btf format c``;
- ``btf_root/``: shaped like ``/sys/kernel/btf``: ``vmlinux`` plus one split BTF file per
  module, named by module name, each the ``.BTF`` section of that module's ``.ko``;
- ``ko/``: every module decompressed (same relative layout as ``modules.dep``), so a VM can
  ``insmod`` hundreds of them without paying for xz under TCG;
- the packages' own tree (``usr/lib/modules/<ver>/`` with ``vmlinuz``, ``config``, the
  ``.ko.xz`` files) with ``depmod`` run on it, so ``modprobe -d <root>/usr`` works.

The version is resolved at run time through the suite's ``linux-image-amd64`` dependency
chain, using a private apt configuration (sources list, lists and cache under the cache dir;
the system's apt state is never touched) whose mirror URI is read from the machine's own
``/etc/apt/sources.list.d/debian.sources``. A complete cache carries a marker file written
last; the work happens in a staging directory renamed into place, so an interrupted run never
looks complete. Concurrent callers serialise on a lock file.

CLI: ``python -m tools.sidkernel [--refresh] [--cache-dir DIR]`` prints the cache paths.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import lzma
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CACHE_DIR = Path("/var/cache/schedswitchd/kernel")
CACHE_ENV = "SCHEDSWITCHD_KERNEL_CACHE"
MARKER = ".complete"
SUITE = "sid"
META_PACKAGE = "linux-image-amd64"
SYSTEM_SOURCES = (
    Path("/etc/apt/sources.list.d/debian.sources"),
    Path("/etc/apt/sources.list"),
)
DEFAULT_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class SidKernelError(Exception):
    """The sid kernel could not be resolved, downloaded or unpacked; the message says which."""


@dataclass(frozen=True)
class SidKernel:
    """One complete cache of a Debian sid kernel (all paths absolute, all files present).

    ``version`` is the kernel release (``uname -r`` inside the VM, e.g.
    ``7.2.13+deb14-amd64``); ``root`` the cache directory of that version; ``modules_dir``
    is ``root/usr/lib/modules/<version>`` (holds ``vmlinuz``, ``config``, ``modules.dep`` and
    the ``.ko.xz`` files); ``vmlinux_btf`` raw BTF; ``btf_root`` a directory shaped like
    ``/sys/kernel/btf``; ``vmlinux`` the uncompressed ELF; ``ko_dir`` the decompressed
    modules laid out like ``modules_dir``.
    """

    version: str
    root: Path
    vmlinuz: Path
    modules_dir: Path
    vmlinux_btf: Path
    vmlinux_h: Path
    config: Path
    btf_root: Path
    vmlinux: Path
    ko_dir: Path

    def module_paths(self) -> dict[str, Path]:
        """Module name (dashes as underscores, as the kernel names it) -> its ``.ko.xz``."""
        return {module_name(rel): self.modules_dir / rel for rel in parse_modules_dep(self)}

    def decompressed_paths(self) -> dict[str, Path]:
        """Module name -> its decompressed ``.ko`` under ``ko_dir`` (ready for ``insmod``)."""
        return {module_name(rel): self.ko_dir / _strip_xz(rel) for rel in parse_modules_dep(self)}

    def module_btf_names(self) -> list[str]:
        """Names of the module split-BTF files in ``btf_root`` (without ``vmlinux``), sorted."""
        return sorted(p.name for p in self.btf_root.iterdir() if p.name != "vmlinux")


def module_name(rel_path: str) -> str:
    """``kernel/drivers/foo/snd-bar.ko.xz`` -> ``snd_bar`` (kmod's file-name-to-module rule)."""
    base = rel_path.rsplit("/", 1)[-1]
    base = base.split(".ko", 1)[0]
    return base.replace("-", "_")


def _strip_xz(rel: str) -> str:
    return rel[:-3] if rel.endswith(".xz") else rel


def parse_modules_dep(kernel: SidKernel) -> dict[str, list[str]]:
    """``modules.dep`` as {module path: [paths it needs]}, paths relative to ``modules_dir``.

    Format (``man 5 modules.dep``): ``path: dep1 dep2``, where ``depN`` must be loaded
    before ``path`` and the list is already in a valid load order (deepest first reversed:
    ``modprobe`` inserts them from the end of the list to the start).
    """
    deps: dict[str, list[str]] = {}
    text = (kernel.modules_dir / "modules.dep").read_text()
    for line in text.splitlines():
        if not line.strip():
            continue
        head, _, tail = line.partition(":")
        deps[head.strip()] = tail.split()
    return deps


# --- ELF and bzImage --------------------------------------------------------------------------


def elf_section(data: bytes | memoryview, name: str) -> bytes | None:
    """The bytes of section ``name`` of a 64-bit little-endian ELF, or None if absent.

    Works for non-allocated sections such as ``.BTF`` in a ``.ko`` (where ``objcopy -O binary``
    would need ``--set-section-flags .BTF=alloc``). Layout: ``include/uapi/linux/elf.h``
    (Elf64_Ehdr, Elf64_Shdr). Raises SidKernelError on a truncated or non-ELF64-LE file.
    """
    mv = memoryview(data)
    if len(mv) < 64 or bytes(mv[:4]) != b"\x7fELF" or mv[4] != 2 or mv[5] != 1:
        raise SidKernelError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", mv, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", mv, 0x3A)
    if shentsize < 64 or shoff + shnum * shentsize > len(mv) or shstrndx >= shnum:
        raise SidKernelError("ELF section header table out of bounds")

    def header(i: int) -> tuple[int, int, int, int]:
        sh_name, sh_type = struct.unpack_from("<II", mv, shoff + i * shentsize)
        sh_offset, sh_size = struct.unpack_from("<QQ", mv, shoff + i * shentsize + 0x18)
        return sh_name, sh_type, sh_offset, sh_size

    _, _, str_off, str_size = header(shstrndx)
    if str_off + str_size > len(mv):
        raise SidKernelError("ELF section name table out of bounds")
    strtab = bytes(mv[str_off : str_off + str_size])
    want = name.encode()
    for i in range(shnum):
        sh_name, sh_type, off, size = header(i)
        end = strtab.find(b"\0", sh_name)
        if sh_name >= len(strtab) or strtab[sh_name : end if end >= 0 else None] != want:
            continue
        if sh_type == 8:  # SHT_NOBITS: occupies no file bytes
            return b""
        if off + size > len(mv):
            raise SidKernelError(f"ELF section {name} out of bounds")
        return bytes(mv[off : off + size])
    return None


def bzimage_payload(image: bytes) -> bytes:
    """The compressed kernel inside an x86 bzImage (boot protocol >= 2.08).

    ``payload_offset``/``payload_length`` are at 0x248/0x24c of the setup header and count
    from the start of the protected-mode code, which begins after ``(setup_sects + 1) * 512``
    bytes (``Documentation/arch/x86/boot.rst``). The kernel build appends the uncompressed
    size as 4 bytes to the payload, which zstd would reject as trailing garbage.
    """
    if len(image) < 0x250 or image[0x202:0x206] != b"HdrS":
        raise SidKernelError("vmlinuz is not an x86 bzImage (no HdrS)")
    (proto,) = struct.unpack_from("<H", image, 0x206)
    if proto < 0x208:
        raise SidKernelError(f"boot protocol {proto:#x} has no payload fields")
    setup_sects = image[0x1F1] or 4
    offset, length = struct.unpack_from("<II", image, 0x248)
    start = (setup_sects + 1) * 512 + offset
    if start + length > len(image) or length < 8:
        raise SidKernelError("bzImage payload out of bounds")
    return image[start : start + length]


def extract_vmlinux(vmlinuz: Path, out: Path) -> None:
    """Write the uncompressed kernel ELF of a zstd-compressed bzImage to ``out``."""
    payload = bzimage_payload(vmlinuz.read_bytes())
    if not payload.startswith(_ZSTD_MAGIC):
        raise SidKernelError(f"kernel payload is not zstd (magic {payload[:4].hex()})")
    with out.open("wb") as f:
        proc = subprocess.run(
            ["zstd", "-dc"], input=payload[:-4], stdout=f, stderr=subprocess.PIPE, check=False
        )
    if proc.returncode != 0:
        raise SidKernelError(f"zstd failed: {proc.stderr.decode(errors='replace').strip()}")
    with out.open("rb") as f:
        if f.read(4) != b"\x7fELF":
            raise SidKernelError("decompressed kernel is not an ELF file")


def _extract_modules(jobs: list[tuple[str, str, str]]) -> list[tuple[str, int]]:
    """Pool worker: decompress each ``.ko.xz`` to a ``.ko`` and write its ``.BTF`` section.

    Returns (btf file path, BTF size in bytes; -1 if the module has no BTF) per job.
    """
    done = []
    for src, ko_out, btf_out in jobs:
        with open(src, "rb") as f:
            raw = lzma.decompress(f.read())
        Path(ko_out).parent.mkdir(parents=True, exist_ok=True)
        Path(ko_out).write_bytes(raw)
        btf = elf_section(raw, ".BTF")
        if btf:
            Path(btf_out).write_bytes(btf)
        done.append((btf_out, len(btf) if btf else -1))
    return done


# --- apt --------------------------------------------------------------------------------------


def system_mirror(sources: tuple[Path, ...] = SYSTEM_SOURCES) -> tuple[str, Path]:
    """(archive URI, keyring) of the machine's main Debian archive, read from its apt sources.

    Parses deb822 ``.sources`` (``man 5 sources.list``) and falls back to one-line format;
    the security archive is skipped because it carries no sid. Raises SidKernelError if none.
    """
    for path in sources:
        if not path.is_file():
            continue
        text = path.read_text()
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if "deb" not in fields.get("types", "").split():
                    continue
                for uri in fields.get("uris", "").split():
                    if "security" in uri:
                        continue
                    key = Path(fields.get("signed-by", str(DEFAULT_KEYRING)))
                    return uri, key if key.is_file() else DEFAULT_KEYRING
        else:
            for line in text.splitlines():
                parts = re.sub(r"\[[^\]]*\]", "", line).split()
                if len(parts) >= 3 and parts[0] == "deb" and "security" not in parts[1]:
                    return parts[1], DEFAULT_KEYRING
    raise SidKernelError(
        "no Debian archive found in " + ", ".join(str(p) for p in sources) + "; cannot fetch sid"
    )


class _PrivateApt:
    """apt-get/apt-cache bound to a private sources list, lists dir and package cache."""

    def __init__(self, state_dir: Path) -> None:
        uri, keyring = system_mirror()
        self.state_dir = state_dir
        lists = state_dir / "lists"
        (lists / "partial").mkdir(parents=True, exist_ok=True)
        (state_dir / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        self.source_list = state_dir / "sources.list"
        self.source_list.write_text(f"deb [signed-by={keyring}] {uri} {SUITE} main\n")
        self.options = [
            "-o", f"Dir::Etc::SourceList={self.source_list}",
            "-o", "Dir::Etc::SourceParts=/dev/null",
            "-o", f"Dir::State::Lists={lists}",
            "-o", f"Dir::Cache={state_dir / 'cache'}",
            "-o", "APT::Sandbox::User=root",
            "-o", "Acquire::Retries=3",
        ]  # fmt: skip

    def run(self, tool: str, *args: str, cwd: Path | None = None) -> str:
        proc = subprocess.run(
            [tool, *self.options, *args], cwd=cwd, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise SidKernelError(
                f"{tool} {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}"
            )
        return proc.stdout

    def update(self) -> None:
        out = self.run("apt-get", "-q", "update")
        if "sid" not in " ".join(p.name for p in (self.state_dir / "lists").iterdir()):
            raise SidKernelError(f"apt-get update fetched no sid lists:\n{out}")

    def depends(self, package: str) -> list[str]:
        """Names in the candidate's Depends field (first alternative of each), in order."""
        text = self.run("apt-cache", "show", "--no-all-versions", package)
        for line in text.splitlines():
            if line.startswith("Depends:"):
                return [alt.split("|")[0].split()[0] for alt in line[8:].split(",")]
        return []


def resolve_packages(apt: _PrivateApt) -> tuple[str, list[str]]:
    """(kernel release, packages to download) through ``linux-image-amd64``'s dependencies.

    ``linux-image-amd64`` -> ``linux-image-<ver>``, which (since the 2025 split) depends on
    ``linux-binary-<ver>``, ``linux-modules-<ver>`` and ``linux-base-<ver>``; an older
    monolithic ``linux-image-<ver>`` has no such dependencies and is downloaded itself.
    """
    images = [d for d in apt.depends(META_PACKAGE) if d.startswith("linux-image-")]
    if len(images) != 1:
        raise SidKernelError(f"{META_PACKAGE} in {SUITE} depends on {images!r}, expected one")
    image = images[0]
    version = image.removeprefix("linux-image-")
    parts = [
        d
        for d in apt.depends(image)
        if d.startswith("linux-") and d.endswith("-" + version) and d != image
    ]
    return version, parts or [image]


# --- the cache --------------------------------------------------------------------------------


def _kernel_at(root: Path, version: str) -> SidKernel:
    modules_dir = root / "usr" / "lib" / "modules" / version
    vmlinuz = modules_dir / "vmlinuz"
    if not vmlinuz.is_file():
        vmlinuz = root / "boot" / f"vmlinuz-{version}"
    config = modules_dir / "config"
    if not config.is_file():
        config = root / "boot" / f"config-{version}"
    return SidKernel(
        version=version,
        root=root,
        vmlinuz=vmlinuz,
        modules_dir=modules_dir,
        vmlinux_btf=root / "vmlinux.btf",
        vmlinux_h=root / "vmlinux.h",
        config=config,
        btf_root=root / "btf_root",
        vmlinux=root / "vmlinux",
        ko_dir=root / "ko",
    )


def _complete(cache_dir: Path) -> list[tuple[float, SidKernel]]:
    found = []
    if cache_dir.is_dir():
        for marker in cache_dir.glob(f"*/{MARKER}"):
            try:
                info = json.loads(marker.read_text())
                found.append((float(info["created"]), _kernel_at(marker.parent, info["version"])))
            except (OSError, ValueError, KeyError):
                continue  # a damaged marker means an unusable cache, not a crash
    return sorted(found, key=lambda x: x[0])


def cached_kernel(*, cache_dir: Path | None = None) -> SidKernel | None:
    """The newest complete cache (as :func:`ensure_kernel` would return it), or None when
    there is none; never touches the network."""
    found = _complete(Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR))
    return found[-1][1] if found else None


@contextmanager
def _locked(cache_dir: Path) -> Iterator[None]:
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _log(msg: str) -> None:
    print(f"sidkernel: {msg}", file=sys.stderr, flush=True)


def _build(apt: _PrivateApt, cache_dir: Path, version: str, packages: list[str]) -> SidKernel:
    stage = Path(tempfile.mkdtemp(prefix=f".{version}.partial.", dir=cache_dir))
    try:
        debs = stage / ".debs"
        debs.mkdir()
        t0 = time.monotonic()
        apt.run("apt-get", "-q", "download", *packages, cwd=debs)
        _log(f"downloaded {', '.join(packages)} in {time.monotonic() - t0:.1f}s")
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(stage)], check=True)
        shutil.rmtree(debs)
        kernel = _kernel_at(stage, version)
        for need in (kernel.vmlinuz, kernel.config, kernel.modules_dir / "modules.order"):
            if not need.is_file():
                raise SidKernelError(f"{need.relative_to(stage)} missing from {packages}")
        subprocess.run(
            ["depmod", "-b", str(stage / "usr"), version], check=True, capture_output=True
        )
        extract_vmlinux(kernel.vmlinuz, kernel.vmlinux)
        btf = elf_section(kernel.vmlinux.read_bytes(), ".BTF")
        if not btf:
            raise SidKernelError("the kernel ELF has no .BTF section")
        kernel.vmlinux_btf.write_bytes(btf)
        with kernel.vmlinux_h.open("w") as out:
            subprocess.run(
                ["bpftool", "btf", "dump", "file", str(kernel.vmlinux_btf), "format", "c"],
                stdout=out,
                check=True,
            )
        n_btf = _build_btf_root(kernel)
        _log(f"unpacked; {n_btf} module BTFs in {time.monotonic() - t0:.1f}s total")
        (stage / MARKER).write_text(
            json.dumps({"version": version, "packages": packages, "created": time.time()}, indent=1)
        )
        final = cache_dir / version
        if final.exists():
            shutil.rmtree(final)  # an older incomplete attempt without a marker
        stage.rename(final)
        return _kernel_at(final, version)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _build_btf_root(kernel: SidKernel) -> int:
    kernel.btf_root.mkdir()
    shutil.copyfile(kernel.vmlinux_btf, kernel.btf_root / "vmlinux")
    jobs = [
        (
            str(kernel.modules_dir / rel),
            str(kernel.ko_dir / _strip_xz(rel)),
            str(kernel.btf_root / module_name(rel)),
        )
        for rel in parse_modules_dep(kernel)
    ]
    chunks = [jobs[i : i + 64] for i in range(0, len(jobs), 64)]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = [r for chunk in pool.map(_extract_modules, chunks) for r in chunk]
    with_btf = sum(1 for _, size in results if size > 0)
    if with_btf < len(jobs) // 2:
        raise SidKernelError(f"only {with_btf} of {len(jobs)} modules carry .BTF")
    return with_btf


def ensure_kernel(*, cache_dir: Path | None = None, refresh: bool = False) -> SidKernel:
    """Return a complete cache of Debian sid's kernel, downloading it if there is none.

    ``cache_dir`` defaults to ``$SCHEDSWITCHD_KERNEL_CACHE`` or
    ``/var/cache/schedswitchd/kernel``. An existing complete cache is returned without any
    network access (the newest one); ``refresh=True`` resolves sid's current version and
    builds it if it is not cached yet. A first build downloads ~125 MB and takes about a
    minute on 2 cores. Raises SidKernelError (apt, mirror, package layout) or
    subprocess.CalledProcessError (dpkg-deb, depmod, bpftool).
    """
    cache_dir = Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR)
    if not refresh and (found := _complete(cache_dir)):
        return found[-1][1]
    with _locked(cache_dir):
        if not refresh and (found := _complete(cache_dir)):
            return found[-1][1]  # another process built it while we waited
        apt = _PrivateApt(cache_dir / ".apt")
        apt.update()
        version, packages = resolve_packages(apt)
        for _, kernel in _complete(cache_dir):
            if kernel.version == version:
                return kernel
        _log(f"building cache for {version} in {cache_dir}")
        return _build(apt, cache_dir, version, packages)


def link_into(directory: Path, targets: list[Path]) -> None:
    """Point ``directory/<name>`` at each target, replacing a link only when it changes (so
    make sees an unchanged mtime)."""
    directory.mkdir(parents=True, exist_ok=True)
    for target in targets:
        link = directory / target.name
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        tmp = directory / f".{target.name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        tmp.replace(link)


def main(argv: list[str] | None = None) -> int:
    """CLI: ensure the cache exists and print its paths as ``key: value`` lines."""
    parser = argparse.ArgumentParser(prog="python -m tools.sidkernel", description=__doc__)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--refresh", action="store_true", help="re-resolve sid's version")
    parser.add_argument(
        "--link-dir", type=Path, help="symlink vmlinux.h and vmlinux.btf into this directory"
    )
    args = parser.parse_args(argv)
    try:
        k = ensure_kernel(cache_dir=args.cache_dir, refresh=args.refresh)
    except SidKernelError as e:
        print(f"sidkernel: error: {e}", file=sys.stderr)
        return 1
    if args.link_dir:
        link_into(args.link_dir, [k.vmlinux_h, k.vmlinux_btf])
    keys = ("version", "root", "vmlinuz", "modules_dir", "config", "vmlinux", "vmlinux_btf")
    for key in (*keys, "vmlinux_h", "btf_root", "ko_dir"):
        print(f"{key}: {getattr(k, key)}")
    print(f"module_btfs: {len(k.module_btf_names())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
