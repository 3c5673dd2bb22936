"""The Debian sid kernel cache: apt source parsing, ELF/bzImage cutting, a complete cache.

The cache tests use the real cache (downloaded on first use, ~125 MB) because the point is
that its files are what the kernel and bpftool agree they are.
"""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest

from tests.build_outputs import sid_kernel
from tools import sidkernel
from tools.sidkernel import SidKernel, SidKernelError, ensure_kernel

BTF_MAGIC = b"\x9f\xeb"  # little-endian 0xeb9f, include/uapi/linux/btf.h


@pytest.fixture(scope="module")
def kernel() -> SidKernel:
    return sid_kernel()


def test_mirror_from_deb822(tmp_path: Path) -> None:
    src = tmp_path / "debian.sources"
    src.write_text(
        "Types: deb\n# comment\nURIs: http://mirror.invalid/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n\n"
        "Types: deb-src deb\nURIs: http://mirror.invalid/debian\nSuites: bookworm\n"
        f"Components: main\nSigned-By: {tmp_path / 'missing.gpg'}\n"
    )
    uri, keyring = sidkernel.system_mirror((src,))
    assert uri == "http://mirror.invalid/debian"
    assert keyring == sidkernel.DEFAULT_KEYRING  # a Signed-By file that does not exist


def test_mirror_from_one_line_format(tmp_path: Path) -> None:
    src = tmp_path / "sources.list"
    src.write_text(
        "deb http://mirror.invalid/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://mirror.invalid/debian bookworm main\n"
    )
    assert sidkernel.system_mirror((src,))[0] == "http://mirror.invalid/debian"


def test_no_mirror_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SidKernelError, match="no Debian archive"):
        sidkernel.system_mirror((tmp_path / "none.sources",))


def test_elf_section_rejects_garbage() -> None:
    with pytest.raises(SidKernelError, match="not a 64-bit"):
        sidkernel.elf_section(b"\x7fELF" + bytes(10), ".BTF")
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, 1 << 40)  # section table far beyond the file
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)
    with pytest.raises(SidKernelError, match="out of bounds"):
        sidkernel.elf_section(bytes(header), ".BTF")


def test_bzimage_payload_rejects_non_bzimage() -> None:
    with pytest.raises(SidKernelError, match="HdrS"):
        sidkernel.bzimage_payload(bytes(4096))


def test_module_name_rule() -> None:
    assert sidkernel.module_name("kernel/sound/pci/snd-hda-intel.ko.xz") == "snd_hda_intel"
    assert sidkernel.module_name("kernel/fs/9p/9p.ko.xz") == "9p"


def test_cache_is_complete(kernel: SidKernel) -> None:
    assert kernel.root.name == kernel.version
    assert (kernel.root / sidkernel.MARKER).is_file()
    assert "CONFIG_SCHED_CLASS_EXT=y" in kernel.config.read_text().splitlines()
    assert kernel.vmlinux_btf.read_bytes()[:2] == BTF_MAGIC
    assert (kernel.btf_root / "vmlinux").read_bytes() == kernel.vmlinux_btf.read_bytes()
    assert "struct sched_ext_ops {" in kernel.vmlinux_h.read_text()
    with kernel.vmlinux.open("rb") as f:
        assert f.read(4) == b"\x7fELF"


def test_modules_and_their_btf(kernel: SidKernel) -> None:
    paths = kernel.module_paths()
    assert len(paths) > 4000
    for name in ("netfs", "9pnet", "9pnet_virtio", "9p"):
        assert paths[name].is_file(), name
        assert kernel.decompressed_paths()[name].read_bytes()[:4] == b"\x7fELF"
        assert (kernel.btf_root / name).read_bytes()[:2] == BTF_MAGIC
    # modules.dep produced by depmod for this tree: 9p needs 9pnet and netfs first.
    deps = sidkernel.parse_modules_dep(kernel)
    assert sorted(sidkernel.module_name(d) for d in deps["kernel/fs/9p/9p.ko.xz"]) == [
        "9pnet",
        "netfs",
    ]
    assert len(kernel.module_btf_names()) > 4000


def test_module_btf_matches_objcopy(kernel: SidKernel, tmp_path: Path) -> None:
    # The recipe in docs/vm.md uses objcopy; our in-process ELF cut must give the same bytes.
    ko = kernel.decompressed_paths()["9pnet_virtio"]
    out = tmp_path / "btf"
    flags = ["--set-section-flags", ".BTF=alloc", "-O", "binary", "--only-section=.BTF"]
    subprocess.run(["objcopy", *flags, str(ko), str(out)], check=True)
    assert out.read_bytes() == (kernel.btf_root / "9pnet_virtio").read_bytes()
    # ... and bpftool reads it as split BTF on top of the vmlinux BTF.
    dump = subprocess.run(
        ["bpftool", "btf", "dump", "file", str(out), "-B", str(kernel.vmlinux_btf)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "virtio_9p" in dump or "p9_virtio" in dump


def test_complete_cache_is_reused_without_network(
    kernel: SidKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_apt(*_: object, **__: object) -> None:
        raise AssertionError("apt must not run when a complete cache exists")

    monkeypatch.setattr(sidkernel, "_PrivateApt", no_apt)
    assert ensure_kernel(cache_dir=kernel.root.parent) == kernel


def test_partial_cache_never_looks_complete(tmp_path: Path) -> None:
    (tmp_path / "1.0-amd64").mkdir()  # an interrupted build: no marker
    (tmp_path / ".1.1-amd64.partial.x").mkdir()
    damaged = tmp_path / "1.2-amd64"
    damaged.mkdir()
    (damaged / sidkernel.MARKER).write_text("{not json")
    assert sidkernel._complete(tmp_path) == []
    good = tmp_path / "1.3-amd64"
    good.mkdir()
    (good / sidkernel.MARKER).write_text(json.dumps({"version": "1.3-amd64", "created": 1.0}))
    assert [k.version for _, k in sidkernel._complete(tmp_path)] == ["1.3-amd64"]


@pytest.mark.slow  # apt-cache over the cached sid lists
def test_resolve_through_the_cached_apt_lists(kernel: SidKernel) -> None:
    # Offline: the private lists fetched when the cache was built answer apt-cache.
    apt = sidkernel._PrivateApt(kernel.root.parent / ".apt")
    version, packages = sidkernel.resolve_packages(apt)
    assert version.endswith("-amd64")
    assert f"linux-modules-{version}" in packages
    assert f"linux-binary-{version}" in packages
    marker = json.loads((kernel.root / sidkernel.MARKER).read_text())
    if version == kernel.version:
        assert sorted(marker["packages"]) == sorted(packages)
    # The private sources list points at the machine's own mirror, suite sid.
    uri, _ = sidkernel.system_mirror()
    assert f" {uri} sid main" in apt.source_list.read_text()
