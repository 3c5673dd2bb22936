"""Host-side pieces of the VM harness: initramfs archive, module order, rodata patching."""

from __future__ import annotations

import io
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from tests.build_outputs import full_suite, missing_build_output, sid_kernel
from tools import vm
from tools.rodata import RodataError, set_rodata
from tools.sidkernel import SidKernel

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kernel() -> SidKernel:
    return sid_kernel()


@pytest.fixture(scope="module")
def fifo_obj() -> bytes:
    obj = REPO / "build" / "bpf" / "fifo.legacy.bpf.o"
    if full_suite():
        subprocess.run(["make", "-s", "schedulers"], cwd=REPO, check=True)
    elif not obj.is_file():
        missing_build_output(obj, "schedulers")
    return obj.read_bytes()


def test_cpio_newc_is_read_by_cpio(tmp_path: Path) -> None:
    archive = vm._cpio_newc(
        [("d", 0o40755, b""), ("d/f", 0o100644, b"abc"), ("x", 0o100755, b"\x00" * 5)]
    )
    subprocess.run(
        ["cpio", "-id", "--quiet"], input=archive, cwd=tmp_path, check=True, capture_output=True
    )
    assert (tmp_path / "d" / "f").read_bytes() == b"abc"
    assert (tmp_path / "x").read_bytes() == b"\x00" * 5
    assert (tmp_path / "x").stat().st_mode & 0o777 == 0o755


def test_load_order_puts_dependencies_first(kernel: SidKernel) -> None:
    assert vm.module_load_order(kernel, ["9p", "9pnet_virtio"]) == [
        "netfs",
        "9pnet",
        "9p",
        "9pnet_virtio",
    ]
    with pytest.raises(KeyError):
        vm.module_load_order(kernel, ["no_such_module"])


def test_insmod_script_uses_decompressed_copies(kernel: SidKernel) -> None:
    script = vm.insmod_script(kernel, ["9p"], strict=True)
    paths = kernel.decompressed_paths()
    assert script.index(f"netfs {paths['netfs']}\n") < script.index(f"9p {paths['9p']}\n")
    assert ".xz" not in script
    assert "--strict" in script


def test_insmod_many_reports_failures(tmp_path: Path) -> None:
    # On the host (no modules allowed to load here): a non-module file fails with a reason.
    bogus = tmp_path / "bogus.ko"
    bogus.write_bytes(b"not an ELF module")
    script = REPO / "tools" / "insmod_many.py"
    for strict, want_rc in ((True, 1), (False, 0)):
        proc = subprocess.run(
            ["python3", "-I", "-S", str(script), *(["--strict"] if strict else [])],
            input=f"no_such_mod_xyz {bogus}\n",
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == want_rc
        assert proc.stderr.startswith("insmod failed: no_such_mod_xyz: ")
        assert proc.stdout == "insmod: 0 loaded, 1 failed in " + proc.stdout.split(" in ")[1]


def test_sample_modules_skip_self_tests(kernel: SidKernel) -> None:
    names = vm.sample_modules(kernel, 300)
    assert len(names) == len(set(names)) == 300
    assert not [n for n in names if "test" in n or "torture" in n]
    with pytest.raises(ValueError, match="sample modules"):
        vm.sample_modules(kernel, 100000)


def test_initramfs_has_init_busybox_and_9p(kernel: SidKernel, tmp_path: Path) -> None:
    image = vm.build_initramfs(kernel)
    assert vm.build_initramfs(kernel) == image  # cached by content
    listing = subprocess.run(
        ["cpio", "-t", "--quiet"], input=image.read_bytes(), capture_output=True, check=True
    ).stdout.decode()
    for name in ("init", "bin/busybox", "lib/modules/9p.ko", "lib/modules/9pnet_virtio.ko"):
        assert name in listing.split()


def test_set_rodata_patches_only_that_variable(fifo_obj: bytes) -> None:
    patched = set_rodata(fifo_obj, "error_after", 50)
    assert len(patched) == len(fifo_obj)
    diff = [i for i, (a, b) in enumerate(zip(fifo_obj, patched, strict=True)) if a != b]
    assert len(diff) == 1 and patched[diff[0]] == 50
    rodata = ELFFile(io.BytesIO(patched)).get_section_by_name(".rodata")
    assert rodata is not None
    start = rodata["sh_offset"]
    assert start <= diff[0] < start + rodata["sh_size"]


def test_set_rodata_errors(fifo_obj: bytes) -> None:
    with pytest.raises(RodataError, match=r"no \.rodata variable"):
        set_rodata(fifo_obj, "nr_enqueued", 1)  # a .bss variable
    with pytest.raises(RodataError, match="does not fit"):
        set_rodata(fifo_obj, "error_after", 1 << 64)


def test_guest_binds_keeps_what_the_guest_tmpfs_hides() -> None:
    """Host paths under a tmpfs the chroot init mounts come back as binds: a file as its
    directory, resolved through symlinks, nested ones once; paths the guest sees anyway (the
    checkout, the rest of the host root) and absent ones do not."""
    hidden = Path(tempfile.mkdtemp(dir=vm.GUEST_TMPFS[0], prefix="schedswitchd-binds-"))
    try:
        corpus = hidden / "shared" / "corpus"
        corpus.mkdir(parents=True)
        (corpus / "a.bpf.o").write_bytes(b"")
        link = hidden / "link"
        link.symlink_to(corpus)
        assert vm.guest_binds([corpus / "a.bpf.o"]) == [str(corpus)]
        assert vm.guest_binds([corpus, hidden / "shared", link]) == [str(hidden / "shared")]
        assert vm.guest_binds([link / "a.bpf.o"]) == [str(corpus)]
        assert vm.guest_binds([hidden / "absent", vm.REPO / "build", "/usr/lib"]) == []
        assert vm.guest_binds([vm.GUEST_TMPFS[0]]) == []  # never the whole tmpfs
        with pytest.raises(ValueError, match="newline"):
            vm.guest_binds([hidden / "a\nb"])
    finally:
        shutil.rmtree(hidden)


def test_stall_watch_only_before_init_and_only_when_silent_long_enough(tmp_path: Path) -> None:
    """A console that stopped before the kernel started init counts as stalled once silent
    for the limit, counted from its last growth; once it shows init starting (or the init's
    ready mark) no silence counts any more."""
    console = tmp_path / "console.log"
    console.write_bytes(b"")
    watch = vm.StallWatch(30.0, grew_at=100.0)
    assert not watch.stalled(console, 129.9)
    assert watch.stalled(console, 130.0)  # nothing at all since qemu started
    console.write_bytes(b"[    0.884286] smpboot: x86: Booting SMP configuration:\n")
    assert not watch.stalled(console, 140.0)  # it grew: the silence starts again
    assert not watch.stalled(console, 169.9)
    assert watch.stalled(console, 170.0)
    with console.open("ab") as f:
        f.write(f"[    6.1] {vm.INIT_STARTED}\n".encode())
    assert not watch.stalled(console, 171.0)
    assert not watch.stalled(console, 10_000.0)
    ready = vm.StallWatch(vm.BOOT_STALL_S, grew_at=0.0)
    console.write_bytes(vm.READY_MARK.encode())  # `quiet` hides the kernel's init line
    assert not ready.stalled(console, 1.0) and not ready.stalled(console, 1000.0)
