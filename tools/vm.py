"""Run shell scripts as root inside a qemu VM booted on Debian sid's sched_ext kernel.

The VM (recipe: ``docs/vm.md``) boots the cached kernel (:mod:`tools.sidkernel`)
with a tiny initramfs: static busybox plus the 9p modules. Its init mounts the host's ``/``
read-only over virtio-9p, mounts proc, sys, devtmpfs, bpffs, tracefs and tmpfs on ``/tmp`` and
``/run``, mounts a writable 9p share (the results directory) on ``/tmp/vm-results``, ``chroot``s
into the host root and runs the script with bash. So the script sees the host's files at the
same paths (the repository, its ``.venv``, bpftool, the kernel cache) and its writes to
``$RESULTS`` come back to the host. What the tmpfs mounts hide and the script needs (a clone
under ``/tmp``, its ``../shared``) is bound back read-only at its host path
(:func:`guest_binds`). The VM has no network device.

Acceleration: KVM when it works, else ``-accel tcg,thread=single -cpu max`` (multi-threaded
TCG oopses the guest while sched_ext schedulers attach and detach, see docs/vm.md). Whether KVM
boots this kernel is probed once (12 s at most) and remembered next to the kernel cache;
``SCHEDSWITCHD_VM_ACCEL=tcg|kvm`` forces a choice.

Ramroot mode (``run_in_vm(..., ramroot=RamRootSpec(...))``, :mod:`tools.ramroot`): the host
packs what the script needs (interpreter, libraries, stdlib, the venv's runtime packages, the
checkout's package, bench and tools, bpftool, listed extra files such as decompressed modules)
into a tar in the results share; the init unpacks it into a tmpfs, unmounts 9p, removes the
9p modules (``/sys/kernel/btf`` then holds only vmlinux), ``chroot``s into the tmpfs and runs
the script there; afterwards it re-inserts the 9p modules from the initramfs and copies
``$RESULTS`` out. For benchmarks that count module BTFs and must not pay 9p for every exec.

Entry points: :func:`run_in_vm` (one script, one boot) and :func:`run_steps` (several named
checks in one boot, each with its own exit status and output, for a pytest module).
:func:`insmod_script` loads many modules fast from decompressed copies in dependency order.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.ramroot import RamRootSpec, compute_manifest, write_archive
from tools.sidkernel import SidKernel, ensure_kernel, module_name, parse_modules_dep

QEMU = "qemu-system-x86_64"
BUSYBOX = Path("/bin/busybox")
ACCEL_ENV = "SCHEDSWITCHD_VM_ACCEL"
RESULTS_IN_VM = "/tmp/vm-results"
REPO = Path(__file__).resolve().parent.parent
DEFAULT_LOG_ROOT = REPO / "build" / "vm-logs"
INITRAMFS_MODULES = ("9p", "9pnet_virtio")  # and their dependencies (netfs, 9pnet)
READY_MARK = "@@schedswitchd-vm-ready@@"
RAMROOT_FLAG = "schedswitchd.ramroot"  # on the kernel command line: the init's ramroot mode
RAMROOT_STATS_MARK = "@@schedswitchd-ramroot@@"
RAMROOT_BUSYBOX_DIR = "/usr/libexec/schedswitchd-vm"  # busybox + applets/ inside the ramroot
RAMROOT_ARCHIVE = ".vm/root.tar"  # in the results share
#: Where the chroot init mounts a tmpfs over the host root, hiding the host's files there.
GUEST_TMPFS = ("/tmp", "/run", "/boot")
BINDS_FILE = ".vm/binds"  # in the results share: host directories the init binds back
#: The corpus of community schedulers beside the checkout (``../shared``), which tests, the
#: demo and benchmarks name by host path: always made visible to the guest.
SHARED = REPO.parent / "shared"
KVM_PROBE_TIMEOUT_S = 12.0
#: The kernel's line as it starts the initramfs's init: past it the boot is the init's.
INIT_STARTED = "Run /init as init process"
#: Seconds of console silence before init starts after which a boot counts as stalled. A
#: kernel booting under TCG prints a line at least every few seconds even on a loaded host;
#: a guest wedged in early boot (bringing up the second CPU, say) prints nothing more.
BOOT_STALL_S = 30.0
#: Boots :func:`run_in_vm` tries before it reports every one stalled (the script never ran).
BOOT_ATTEMPTS = 3

_STEP_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class VmError(Exception):
    """The VM could not run the script (no qemu, no kernel, boot failure, timeout) or a
    checked script failed. The message carries the tail of the output and console log."""


@dataclass
class VmResult:
    """What one boot produced.

    ``returncode`` is the script's exit status, or None if it never finished (timeout, kernel
    panic, init failure). ``output`` is its stdout and stderr interleaved; ``console`` the
    serial console (kernel log and init messages); ``files`` every file the script left under
    ``$RESULTS`` (relative path -> bytes). ``elapsed_s`` is wall time in seconds from qemu
    start to exit. ``log_dir`` is the kept work directory (console.log, results) when the run
    failed or ``keep=True`` was asked, else None. ``ramroot`` (ramroot mode only, once the
    init got that far) holds :func:`ramroot_stats` of the console plus the host's
    ``archive_bytes``, ``archive_s`` (seconds to compute and write it) and ``memory_mib``.
    ``stalled_boots`` counts the boots abandoned because the kernel stalled before init
    (:class:`StallWatch`); ``console``, ``elapsed_s`` and ``timed_out`` are the last boot's,
    and each stalled console is kept as ``console.stalled-N.log`` in the work directory.
    When every attempt stalled (``stalled_boots`` equals the attempts, the last boot among
    them), ``returncode`` is None and ``timed_out`` False.
    """

    returncode: int | None
    output: str
    console: str
    files: dict[str, bytes]
    elapsed_s: float
    accel: str
    timed_out: bool
    log_dir: Path | None = None
    ramroot: dict[str, float] | None = None
    stalled_boots: int = 0

    def text(self, name: str) -> str:
        """A result file decoded as UTF-8 (replacement for bad bytes); VmError if absent."""
        if name not in self.files:
            raise VmError(f"the VM wrote no {name!r}; it wrote {sorted(self.files)}\n{self.tail()}")
        return self.files[name].decode(errors="replace")

    def tail(self, lines: int = 40) -> str:
        """The last lines of output and console, for error messages."""
        out = "\n".join(self.output.splitlines()[-lines:])
        con = "\n".join(self.console.splitlines()[-lines:])
        where = f" (kept in {self.log_dir})" if self.log_dir else ""
        status = "timed out" if self.timed_out else f"exit status {self.returncode}"
        if self.stalled_boots:
            status += f", after {self.stalled_boots} boot(s) stalled before init"
        return (
            f"--- VM {status} after {self.elapsed_s:.1f}s, accel {self.accel}{where}\n"
            f"--- output (tail):\n{out}\n--- console (tail):\n{con}"
        )

    def check(self) -> VmResult:
        """Return self if the script exited 0, else raise VmError with the tails."""
        if self.returncode is None and self.stalled_boots and not self.timed_out:
            raise VmError(f"every VM boot stalled before init\n{self.tail()}")
        if self.returncode != 0:
            raise VmError(f"VM script failed\n{self.tail()}")
        return self


@dataclass
class StepResult:
    """One named step of :func:`run_steps`: exit status (124 = step timeout) and output."""

    name: str
    returncode: int
    output: str

    def check(self) -> StepResult:
        """Return self if the step exited 0, else raise VmError with its output."""
        if self.returncode != 0:
            raise VmError(f"step {self.name} exited {self.returncode}:\n{self.output}")
        return self


@dataclass
class StepsResult:
    """All steps of one boot; ``step(name)`` raises VmError if that step never finished."""

    vm: VmResult
    steps: dict[str, StepResult] = field(default_factory=dict)

    def step(self, name: str) -> StepResult:
        """The named step's result; VmError (with output and console tails) if it did not run."""
        if name not in self.steps:
            raise VmError(f"step {name!r} did not finish in the VM\n{self.vm.tail()}")
        return self.steps[name]


# --- modules ----------------------------------------------------------------------------------


def module_load_order(kernel: SidKernel, names: Iterable[str]) -> list[str]:
    """``names`` plus everything they depend on, each once, dependencies first.

    ``modules.dep`` lists a module's full dependency closure, ordered so that ``modprobe``
    loads it from the last entry to the first (``man 5 modules.dep``). Names are module
    names (underscores); KeyError for a name that is not in this kernel's modules.
    """
    deps = parse_modules_dep(kernel)
    by_name = {module_name(rel): rel for rel in deps}
    order: list[str] = []
    seen: set[str] = set()
    for name in names:
        rel = by_name[name]
        for dep in [*reversed(deps[rel]), rel]:
            dep_name = module_name(dep)
            if dep_name not in seen:
                seen.add(dep_name)
                order.append(dep_name)
    return order


# Modules that run self-tests or stress loops when inserted (minutes under TCG), or that can
# only fail without hardware or a configured subsystem: never picked by sample_modules().
_SLOW_OR_FAILING = re.compile(
    r"(^test_|_test$|_tests$|test|torture|kunit|tcrypt|^ubifs$|^dm_|^xen|^nfit|^hyperv|hv_)"
)
_SAMPLE_DIRS = ("kernel/fs/", "kernel/net/", "kernel/crypto/", "kernel/lib/")


def sample_modules(kernel: SidKernel, count: int) -> list[str]:
    """``count`` module names that insert cleanly without hardware, for tests and benchmarks.

    Taken in ``modules.order`` order from fs/, net/, crypto/ and lib/, skipping self-tests
    and the like; the list holds ``count`` names (their dependencies are extra, added by
    :func:`module_load_order`). ValueError if the kernel has fewer such modules.
    """
    order = (kernel.modules_dir / "modules.order").read_text().split()
    picked = []
    for rel in order:
        name = module_name(rel)
        if rel.startswith(_SAMPLE_DIRS) and not _SLOW_OR_FAILING.search(name):
            picked.append(name)
            if len(picked) == count:
                return picked
    raise ValueError(f"only {len(picked)} sample modules in {kernel.version}, {count} asked")


def insmod_script(kernel: SidKernel, names: Iterable[str], *, strict: bool = False) -> str:
    """Shell lines that insert ``names`` (plus dependencies) from the decompressed copies.

    Under TCG, ``modprobe`` of an xz module costs ~0.25 s of decompression and each
    ``insmod`` process most of a second; these copies are already decompressed on the host
    (reached through the read-only 9p root) and one Python process inserts them all with
    ``finit_module(2)`` (``tools/insmod_many.py``). Modules already present are skipped.
    Output: ``insmod failed: NAME: REASON`` on stderr per failure, then
    ``insmod: N loaded, M failed in S s``; with ``strict`` the lines exit 1 on a failure.
    """
    paths = kernel.decompressed_paths()
    listing = "".join(f"{n} {paths[n]}\n" for n in module_load_order(kernel, names))
    flag = " --strict" if strict else ""
    return (
        f"python3 -I -S {shlex.quote(str(REPO / 'tools' / 'insmod_many.py'))}{flag} "
        f"<<'SCHEDSWITCHD_MODULES'\n{listing}SCHEDSWITCHD_MODULES\n"
    )


# --- initramfs --------------------------------------------------------------------------------


def _cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """An uncompressed ``newc`` cpio archive (``Documentation/driver-api/early-userspace/
    buffer-format.rst``): (path, mode, data) per entry, directories before their files."""
    out = bytearray()

    def add(name: str, mode: int, data: bytes, ino: int) -> None:
        raw = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw), 0)
        out.extend(b"070701" + b"".join(b"%08x" % f for f in fields) + raw)
        out.extend(b"\0" * (-len(out) % 4))
        out.extend(data)
        out.extend(b"\0" * (-len(out) % 4))

    for ino, (name, mode, data) in enumerate(entries, start=1):
        add(name, mode, data, ino)
    add("TRAILER!!!", 0, b"", 0)
    return bytes(out)


_INIT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /newroot
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "vm-init: $*" > /dev/console; poweroff -f; }
# Ramroot mode (tools/ramroot.py): unpack the archive from the results share into a tmpfs,
# drop every 9p mount and module, run the script there, then bring 9p back to copy the
# results out. Never returns.
ramroot() {
  mkdir -p /share
  mount -t 9p -o $O results /share || fail "mount results"
  mount -t tmpfs -o mode=0755 tmpfs /newroot || fail "mount the tmpfs root"
  t0=$(cut -d' ' -f1 /proc/uptime)
  tar -xf /share/.vm/root.tar -C /newroot || fail "unpack the ramroot"
  t1=$(cut -d' ' -f1 /proc/uptime)
  umount /share || fail "umount results"
  for m in @RMMODULES@; do rmmod $m || fail "rmmod $m"; done
  used=$(df -k /newroot | tail -n 1 | tr -s ' ' | cut -d' ' -f3)
  avail=$(grep MemAvailable /proc/meminfo | tr -s ' ' | cut -d' ' -f2)
  btf=$(ls /sys/kernel/btf | tr '\n' ,)
  echo "@RAMROOT_STATS@ tmpfs_kib=$used unpack_start_s=$t0 unpack_end_s=$t1" \
    "mem_available_kib=$avail btf=$btf" > /dev/console
  mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/run /newroot/tmp @BBDIR_IN@/bin
  chmod 1777 /newroot/tmp
  mount -t proc proc /newroot/proc
  mount -t sysfs sysfs /newroot/sys
  mount -t devtmpfs devtmpfs /newroot/dev
  mount -t tmpfs tmpfs /newroot/run
  mount -t bpf bpf /newroot/sys/fs/bpf
  mount -t tracefs tracefs /newroot/sys/kernel/tracing
  mount -t debugfs debugfs /newroot/sys/kernel/debug
  cp /bin/busybox @BBDIR_IN@/busybox
  chroot /newroot @BBDIR@/busybox --install -s @BBDIR@/bin || fail "busybox applets"
  echo "@READY@" > /dev/console
  R=@RESULTS@/.vm
  chroot /newroot /bin/bash -c ". $R/env; cd \"\$VM_CWD\" && exec /bin/bash $R/script" \
    > /newroot$R/output 2>&1 < /dev/null
  echo $? > /newroot$R/rc
  # The script may have inserted some of them itself (netfs is a dependency of other fs).
  for m in @MODULES@; do
    [ -d /sys/module/$m ] || insmod /lib/modules/$m.ko || fail "insmod $m again"
  done
  mount -t 9p -o $O results /share || fail "mount results again"
  tar -cf - -C /newroot@RESULTS@ . | tar -xf - -C /share || fail "copy the results out"
  sync
  umount /share
  poweroff -f
}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in @MODULES@; do insmod /lib/modules/$m.ko || fail "insmod $m"; done
O=trans=virtio,version=9p2000.L,msize=512000
grep -qw @RAMROOT_FLAG@ /proc/cmdline && ramroot
mount -t 9p -o $O,ro hostroot /newroot || fail "mount host root"
# The host's root as it is before the tmpfs mounts below hide parts of it (a private bind:
# later mounts under /newroot do not show here), the source of the binds listed in
# $RESULTS/@BINDS@.
mkdir -p /host && mount -o bind /newroot /host || fail "bind the host root"
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp
mount -t tmpfs tmpfs /newroot/run
mount -t bpf bpf /newroot/sys/fs/bpf
mount -t tracefs tracefs /newroot/sys/kernel/tracing
mount -t debugfs debugfs /newroot/sys/kernel/debug
# The VM kernel's config goes where a Debian system keeps it (libbpf's first place for
# .kconfig externs; the host's /boot holds none for this kernel): a tmpfs over the read-only
# /boot, filled once the binds below made the kernel cache visible wherever it lies.
mount -t tmpfs -o mode=0755 tmpfs /newroot/boot || fail "mount /boot"
mkdir -p /newroot@RESULTS@
mount -t 9p -o $O results /newroot@RESULTS@ || fail "mount results"
# Host directories the script reads that lie under one of the tmpfs mounts above (a clone
# under /tmp and its ../shared, a kernel cache there): read-only binds at their host paths.
while IFS= read -r p; do
  mkdir -p "/newroot$p" && mount -o bind "/host$p" "/newroot$p" || fail "bind $p"
done < /newroot@RESULTS@/@BINDS@
# The checkout may live under /tmp (CI clones anywhere), which the tmpfs above hides: give it
# its own share at the same path.
mkdir -p /newroot@REPO@
mount -t 9p -o $O,ro repo /newroot@REPO@ || fail "mount repo"
cp /newroot@KCONFIG@ /newroot/boot/config-$(uname -r) || fail "copy the kernel config"
echo "@READY@" > /dev/console
R=@RESULTS@/.vm
chroot /newroot /bin/bash -c ". $R/env; cd \"\$VM_CWD\" && exec /bin/bash $R/script" \
  > /newroot$R/output 2>&1 < /dev/null
echo $? > /newroot@RESULTS@/.vm/rc
sync
umount /newroot@RESULTS@
umount /newroot@REPO@
poweroff -f
"""


def build_initramfs(kernel: SidKernel) -> Path:
    """The initramfs for ``kernel`` (cached next to it, rebuilt when its inputs change)."""
    order = module_load_order(kernel, INITRAMFS_MODULES)
    init = (
        _INIT.replace("@MODULES@", " ".join(order))
        .replace("@RMMODULES@", " ".join(reversed(order)))
        .replace("@RAMROOT_FLAG@", RAMROOT_FLAG)
        .replace("@RAMROOT_STATS@", RAMROOT_STATS_MARK)
        .replace("@BBDIR_IN@", "/newroot" + RAMROOT_BUSYBOX_DIR)
        .replace("@BBDIR@", RAMROOT_BUSYBOX_DIR)
        .replace("@RESULTS@", RESULTS_IN_VM)
        .replace("@BINDS@", BINDS_FILE)
        .replace("@READY@", READY_MARK)
        .replace("@REPO@", str(REPO))
        .replace("@KCONFIG@", str(kernel.config))
    )
    return cached_initramfs(kernel, "initramfs", init, order)


def cached_initramfs(kernel: SidKernel, stem: str, init: str, modules: Sequence[str]) -> Path:
    """A newc initramfs of busybox, ``init`` (a busybox sh script) and ``modules`` (names,
    decompressed ``.ko`` files under ``/lib/modules``), cached in ``<kernel cache>/vm`` as
    ``<stem>-<digest>.cpio``: the digest covers all of its contents, so a changed script,
    busybox or module builds a new file and an unchanged one is reused."""
    busybox = BUSYBOX.read_bytes()
    kos = {n: kernel.decompressed_paths()[n].read_bytes() for n in modules}
    digest = hashlib.sha256(init.encode() + busybox + b"".join(kos.values())).hexdigest()[:16]
    out_dir = kernel.root / "vm"
    out = out_dir / f"{stem}-{digest}.cpio"
    if out.is_file():
        return out
    entries: list[tuple[str, int, bytes]] = [
        ("bin", 0o40755, b""),
        ("lib", 0o40755, b""),
        ("lib/modules", 0o40755, b""),
        ("bin/busybox", 0o100755, busybox),
        ("init", 0o100755, init.encode()),
        *((f"lib/modules/{n}.ko", 0o100644, data) for n, data in kos.items()),
    ]
    out_dir.mkdir(exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(_cpio_newc(entries))
    tmp.rename(out)
    return out


# --- qemu -------------------------------------------------------------------------------------


def _qemu_argv(
    kernel: SidKernel,
    initramfs: Path,
    results: Path,
    console: Path,
    *,
    accel: str,
    memory_mib: int,
    cpus: int,
    cmdline: str,
    numa_nodes: int = 1,
) -> list[str]:
    accel_args = (
        ["-accel", "kvm", "-cpu", "host"]
        if accel == "kvm"
        else ["-accel", "tcg,thread=single", "-cpu", "max"]
    )
    virtfs = "local,security_model=none,multidevs=remap"
    return [
        QEMU,
        *accel_args,
        "-m", str(memory_mib),
        "-smp", str(cpus),
        *_numa_args(numa_nodes, cpus, memory_mib),
        "-nodefaults", "-display", "none", "-no-reboot",
        "-nic", "none",
        "-serial", f"file:{console}",
        "-kernel", str(kernel.vmlinuz),
        "-initrd", str(initramfs),
        "-append", f"console=ttyS0 panic=-1 rdinit=/init {cmdline}".strip(),
        "-virtfs", f"{virtfs},path=/,mount_tag=hostroot,readonly=on",
        "-virtfs", f"{virtfs},path={results},mount_tag=results",
        "-virtfs", f"{virtfs},path={REPO},mount_tag=repo,readonly=on",
    ]  # fmt: skip


def _numa_args(nodes: int, cpus: int, memory_mib: int) -> list[str]:
    """qemu ``-numa`` options for ``nodes`` NUMA nodes (1: none): memory split evenly (the
    last node takes the remainder), the
    CPUs dealt out over the first ``min(nodes, cpus)`` nodes in turn, so nodes past the
    CPUs hold memory only (a CPU-less node, as on machines with CXL or HBM memory)."""
    if nodes <= 1:
        return []
    size = memory_mib // nodes
    out: list[str] = []
    for n in range(nodes):
        mine_mib = size if n < nodes - 1 else memory_mib - size * (nodes - 1)  # qemu: sum = -m
        out += ["-object", f"memory-backend-ram,id=numa{n},size={mine_mib}M"]
        mine = [c for c in range(cpus) if c % min(nodes, cpus) == n]
        cpu_opt = "".join(f",cpus={c}" for c in mine)
        out += ["-numa", f"node,nodeid={n}{cpu_opt},memdev=numa{n}"]
    return out


@dataclass
class StallWatch:
    """The stall rule for one boot's console file: stalled once it has not grown for
    ``limit_s`` seconds while the kernel had neither started init (:data:`INIT_STARTED`)
    nor the init reported ready (:data:`READY_MARK`). Past init a silent console is the
    script's business, bounded by the caller's timeout. A kernel command line with
    ``quiet`` (or a ``loglevel`` below 7) hides the init line, and the watch then lasts
    until the ready mark. ``grew_at`` and the ``now`` passed in are monotonic seconds."""

    limit_s: float
    grew_at: float
    size: int = 0
    init_started: bool = False

    def stalled(self, console: Path, now: float) -> bool:
        """Whether the boot writing ``console`` is stalled at ``now``; reads the file only
        when it grew."""
        if self.init_started:
            return False
        size = console.stat().st_size
        if size != self.size:
            self.size, self.grew_at = size, now
            data = console.read_bytes()
            self.init_started = INIT_STARTED.encode() in data or READY_MARK.encode() in data
            return False
        return now - self.grew_at >= self.limit_s


@dataclass
class _Boot:
    """One qemu run: whether the timeout or the stall rule ended it, seconds, console."""

    timed_out: bool
    stalled: bool
    elapsed_s: float
    console: str


def _die_with_parent() -> None:
    """In the qemu child: get SIGKILL when the Python process that started it dies, so a
    killed test run never leaves a VM behind (prctl(2) PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def _boot(
    kernel: SidKernel,
    work: Path,
    *,
    accel: str,
    timeout: float,
    memory_mib: int,
    cpus: int,
    cmdline: str,
    stop_on_ready: bool = False,
    initramfs: Path | None = None,
    numa_nodes: int = 1,
    stall_s: float | None = None,
) -> _Boot:
    """Boot once. ``stop_on_ready`` ends the VM as soon as init reports the root mounted (for
    the KVM probe); ``initramfs`` replaces the default chroot one (:func:`build_initramfs`);
    ``stall_s`` ends it when a :class:`StallWatch` with that limit says so."""
    console = work / "console.log"
    console.write_bytes(b"")
    argv = _qemu_argv(
        kernel,
        initramfs or build_initramfs(kernel),
        work / "results",
        console,
        accel=accel,
        memory_mib=memory_mib,
        cpus=cpus,
        cmdline=cmdline,
        numa_nodes=numa_nodes,
    )
    (work / "qemu.argv").write_text(shlex.join(argv) + "\n")
    start = time.monotonic()
    with (work / "qemu.stderr").open("wb") as err:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, preexec_fn=_die_with_parent
        )
        timed_out = stalled = False
        watch = StallWatch(stall_s, start) if stall_s is not None else None
        try:
            while proc.poll() is None:
                now = time.monotonic()
                if now - start > timeout:
                    timed_out = True
                    break
                if stop_on_ready and READY_MARK.encode() in console.read_bytes():
                    break
                if watch is not None and watch.stalled(console, now):
                    stalled = True
                    break
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    elapsed = time.monotonic() - start
    text = console.read_text(errors="replace")
    if proc.returncode not in (0, None, -9) and not (timed_out or stalled):
        text += "\n--- qemu stderr:\n" + (work / "qemu.stderr").read_text(errors="replace")
    return _Boot(timed_out, stalled, elapsed, text)


def choose_accel(kernel: SidKernel) -> str:
    """``"kvm"`` if KVM boots this kernel to init here, else ``"tcg"``; probed once per kernel.

    Nested KVM on these machines hangs in the kernel's decompressor (docs/vm.md), so the probe
    boots with a 12 s limit and the verdict is stored in ``<kernel.root>/vm/accel``.
    """
    forced = os.environ.get(ACCEL_ENV, "").strip()
    if forced in ("kvm", "tcg"):
        return forced
    verdict = kernel.root / "vm" / "accel"
    if verdict.is_file() and verdict.read_text().strip() in ("kvm", "tcg"):
        return verdict.read_text().strip()
    accel = "tcg"
    if os.access("/dev/kvm", os.R_OK | os.W_OK):
        with tempfile.TemporaryDirectory(prefix="schedswitchd-kvm-probe-") as tmp:
            work = Path(tmp)
            (work / "results" / ".vm").mkdir(parents=True)
            _write_script(work / "results", "true\n", {}, "/", [])
            probe = _boot(
                kernel,
                work,
                accel="kvm",
                timeout=KVM_PROBE_TIMEOUT_S,
                memory_mib=512,
                cpus=1,
                cmdline="",
                stop_on_ready=True,
            )
            if READY_MARK in probe.console:
                accel = "kvm"
    try:
        verdict.parent.mkdir(exist_ok=True)
        verdict.write_text(accel + "\n")
    except OSError:
        pass  # a read-only cache just means probing again next time
    return accel


def guest_binds(paths: Iterable[Path | str]) -> list[str]:
    """Which of ``paths`` the chroot VM must bind back from the host, as the lines of
    ``$RESULTS/.vm/binds`` that its init reads: absolute host directories, each made visible
    read-only at the same path in the guest.

    A path is resolved (symlinks followed; a file stands for its directory) and kept when it
    exists and lies under a tmpfs the init mounts (:data:`GUEST_TMPFS`: the guest would see an
    empty ``/tmp`` there) outside the checkout (its own share). The result is sorted and holds
    no directory inside another it holds. ValueError for a path with a newline (the init
    reads one path per line).
    """
    kept: set[Path] = set()
    for raw in paths:
        if "\n" in str(raw):
            raise ValueError(f"a path for the VM with a newline: {str(raw)!r}")
        path = Path(raw).resolve()
        if path.is_file():
            path = path.parent
        if not path.is_dir() or path.is_relative_to(REPO):
            continue
        if any(path.is_relative_to(t) and path != Path(t) for t in GUEST_TMPFS):
            kept.add(path)
    return sorted(str(p) for p in kept if not any(p != q and p.is_relative_to(q) for q in kept))


def _write_script(
    results: Path, script: str, env: Mapping[str, str], cwd: str, binds: Sequence[str]
) -> None:
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    (results / ".vm" / "env").write_text("\n".join(lines) + f"\nVM_CWD={shlex.quote(cwd)}\n")
    (results / ".vm" / "script").write_text(script)
    (results / BINDS_FILE).write_text("".join(f"{b}\n" for b in binds))


def _collect(results: Path) -> dict[str, bytes]:
    files = {}
    for path in sorted(results.rglob("*")):
        rel = path.relative_to(results).as_posix()
        if path.is_file() and not rel.startswith(".vm/"):
            files[rel] = path.read_bytes()
    return files


def ramroot_stats(console: str) -> dict[str, float] | None:
    """What the ramroot init reported on the console, or None if it did not get that far:
    ``tmpfs_kib`` (used by the unpacked root), ``unpack_s`` (seconds to unpack it from the
    results share), ``unpacked_at_s`` (guest uptime when done), ``mem_available_kib`` (after
    unpacking) and ``module_btfs`` (entries of ``/sys/kernel/btf`` besides vmlinux once the
    9p modules were removed: 0 when it worked)."""
    for line in console.splitlines():
        if line.startswith(RAMROOT_STATS_MARK):
            fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
            btfs = [n for n in fields.get("btf", "").split(",") if n and n != "vmlinux"]
            start, end = float(fields["unpack_start_s"]), float(fields["unpack_end_s"])
            return {
                "tmpfs_kib": float(fields["tmpfs_kib"]),
                "unpack_s": end - start,
                "unpacked_at_s": end,
                "mem_available_kib": float(fields["mem_available_kib"]),
                "module_btfs": float(len(btfs)),
            }
    return None


def _pack_ramroot(
    spec: RamRootSpec, work: Path, results: Path, kernel: SidKernel
) -> dict[str, float]:
    """Write the ramroot archive (``spec``'s files, the results dir at RESULTS_IN_VM and
    ``kernel``'s config as ``/boot/config-<version>``) into the results share; host-side
    figures for VmResult.ramroot."""
    start = time.monotonic()
    manifest = compute_manifest(spec)
    tmp = work / "root.tar"
    # the kernel's config where a Debian system keeps it (.kconfig externs read it)
    boot_config = f"/boot/config-{kernel.version}"
    size = write_archive(manifest, tmp, extra={RESULTS_IN_VM: results, boot_config: kernel.config})
    tmp.rename(results / RAMROOT_ARCHIVE)
    return {
        "archive_bytes": float(size),
        "archive_s": time.monotonic() - start,
        "files": float(len(manifest.files)),
        "tree_bytes": float(manifest.total_bytes),
    }


def run_in_vm(
    script: str,
    *,
    kernel: SidKernel | None = None,
    timeout: float = 300.0,
    env: Mapping[str, str] | None = None,
    cwd: str = "/",
    inputs: Mapping[str, bytes | str] | None = None,
    memory_mib: int = 2048,
    cpus: int = 2,
    accel: str | None = None,
    cmdline: str = "",
    keep: bool = False,
    log_root: Path | None = None,
    ramroot: RamRootSpec | None = None,
    initramfs: Path | None = None,
    share: Iterable[Path | str] = (),
    numa_nodes: int = 1,
    boot_stall_s: float = BOOT_STALL_S,
    boot_attempts: int = BOOT_ATTEMPTS,
) -> VmResult:
    """Boot the sched_ext VM, run ``script`` with bash as root in the host root, power off.

    The script runs with ``cwd`` as working directory and these variables besides ``env``:
    ``RESULTS`` (writable dir whose files come back in ``VmResult.files``; ``inputs`` are
    placed there before boot), ``KVER`` (kernel release), ``KMOD_ROOT`` (for
    ``modprobe -d $KMOD_ROOT``), ``REPO`` (this repository) and ``PY`` (its venv python).
    ``timeout`` (seconds) bounds the whole boot; the VM is killed when it expires. A boot
    whose kernel stalls before init (no console output for ``boot_stall_s`` seconds, see
    :class:`StallWatch`) is killed and tried again, up to ``boot_attempts`` boots in all,
    each with the whole ``timeout``; ``VmResult.stalled_boots`` says how many were abandoned.

    The script sees the host's files at their host paths, except under the tmpfs mounts of
    :data:`GUEST_TMPFS`; of those it sees the checkout, ``../shared`` (:data:`SHARED`), the
    kernel cache and the directories (or files' directories) in ``share``, read-only
    (:func:`guest_binds`): pass there any host path under ``/tmp`` that the script reads.
    (A ramroot holds the files its spec lists at their host paths; ``share`` is unused there.)
    The work directory (console log, qemu command line, results) is deleted on success and
    kept under ``log_root`` (default ``build/vm-logs``) on failure, after a stalled boot or
    with ``keep``.

    With ``ramroot`` the script runs instead in a tmpfs root holding only what the spec lists
    (:mod:`tools.ramroot`; files at their host paths, ``$RESULTS`` inside the tmpfs, copied
    out after the script) with no 9p mount and no module loaded: ``/sys/kernel/btf`` holds
    only vmlinux until the script inserts modules. Commands the spec does not list come from
    busybox (appended to ``PATH``); ``KMOD_ROOT`` and the host's ``python3`` are absent (use
    ``$PY``). ``memory_mib`` is raised by the tmpfs's size, rounded up to 256 MiB, so the
    script keeps the memory it would have had. RamRootError if the file list cannot be built.

    ``initramfs`` replaces the default one; its init must run ``$RESULTS/.vm/script`` the
    same way (``tools/vm_systemd.py`` boots systemd and runs it from a unit).
    ``numa_nodes`` > 1 boots that many NUMA nodes (:func:`_numa_args`: the CPUs dealt over
    the first nodes, the rest memory only).

    Raises VmError if qemu is not installed; a script failure is reported in the result, not
    raised (use ``VmResult.check()``).
    """
    if shutil.which(QEMU) is None:
        raise VmError(f"{QEMU} not found: install Debian's qemu-system-x86 (make deps)")
    kernel = kernel or ensure_kernel()
    accel = accel or choose_accel(kernel)
    log_root = log_root or DEFAULT_LOG_ROOT
    log_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=time.strftime("vm-%Y%m%d-%H%M%S-"), dir=log_root))
    results = work / "results"
    (results / ".vm").mkdir(parents=True)
    for name, data in (inputs or {}).items():
        target = results / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    full_env = {
        "RESULTS": RESULTS_IN_VM,
        "KVER": kernel.version,
        "KMOD_ROOT": str(kernel.root / "usr"),
        "REPO": str(REPO),
        "PY": str(REPO / ".venv" / "bin" / "python"),
        "PATH": path if ramroot is None else f"{path}:{RAMROOT_BUSYBOX_DIR}/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        **(env or {}),
    }
    binds = guest_binds([SHARED, kernel.root, *share])
    _write_script(results, script, full_env, cwd, binds)
    host_stats: dict[str, float] = {}
    if ramroot is not None:
        try:
            host_stats = _pack_ramroot(ramroot, work, results, kernel)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        memory_mib += -(-int(host_stats["tree_bytes"]) // (256 << 20)) * 256
        host_stats["memory_mib"] = float(memory_mib)
        cmdline = f"{cmdline} {RAMROOT_FLAG}".strip()
    stalled_boots = 0
    try:
        while True:
            boot = _boot(
                kernel, work, accel=accel, timeout=timeout, memory_mib=memory_mib, cpus=cpus,
                cmdline=cmdline, initramfs=initramfs, numa_nodes=numa_nodes,
                stall_s=boot_stall_s,
            )  # fmt: skip
            if not boot.stalled:
                break
            stalled_boots += 1
            (work / f"console.stalled-{stalled_boots}.log").write_text(boot.console)
            if stalled_boots >= boot_attempts:
                break
    finally:
        (results / RAMROOT_ARCHIVE).unlink(missing_ok=True)  # ~100+ MB, never worth keeping
    rc_file = results / ".vm" / "rc"
    rc_text = rc_file.read_text().strip() if rc_file.is_file() else ""
    out_file = results / ".vm" / "output"
    result = VmResult(
        returncode=int(rc_text) if rc_text.lstrip("-").isdigit() else None,
        output=out_file.read_text(errors="replace") if out_file.is_file() else "",
        console=boot.console,
        files=_collect(results),
        elapsed_s=boot.elapsed_s,
        accel=accel,
        timed_out=boot.timed_out,
        stalled_boots=stalled_boots,
    )
    if ramroot is not None:
        guest = ramroot_stats(boot.console)
        result.ramroot = {**host_stats, **guest} if guest is not None else None
    if keep or result.returncode != 0 or stalled_boots:
        result.log_dir = work
    else:
        shutil.rmtree(work, ignore_errors=True)
    return result


def run_steps(
    steps: Mapping[str, str],
    *,
    prelude: str = "",
    common: str = "",
    step_timeout: float = 120.0,
    inputs: Mapping[str, bytes | str] | None = None,
    **kwargs: Any,
) -> StepsResult:
    """Run several named checks in one boot, each in its own bash with its own status.

    ``prelude`` runs once first (a failure there stops the run: no step results); ``common``
    is sourced by every step (shell functions, variables). Each step is bounded by
    ``step_timeout`` seconds (exit 124 when it expires). Other keyword arguments go to
    :func:`run_in_vm` (``timeout`` should cover all steps); ``inputs`` are placed in
    ``$RESULTS`` as for :func:`run_in_vm`. The prelude's output is ``steps/_prelude.out``
    in the result files. Raises ValueError for a step name
    outside ``[A-Za-z0-9_.-]``.
    """
    files: dict[str, bytes | str] = {
        **(inputs or {}),
        ".steps/common.sh": common,
        ".steps/_prelude.sh": prelude,
    }
    lines = [
        'mkdir -p "$RESULTS/steps"',
        'if ! bash "$RESULTS/.steps/_prelude.sh" > "$RESULTS/steps/_prelude.out" 2>&1; then',
        '  echo "prelude failed:"; cat "$RESULTS/steps/_prelude.out"; exit 1',
        "fi",
    ]
    for name, body in steps.items():
        if not _STEP_NAME.match(name):
            raise ValueError(f"bad step name {name!r}")
        files[f".steps/{name}.sh"] = f'. "$RESULTS/.steps/common.sh"\n{body}\n'
        lines.append(
            f'timeout -k 5 {step_timeout:g} bash "$RESULTS/.steps/{name}.sh" '
            f'> "$RESULTS/steps/{name}.out" 2>&1; echo $? > "$RESULTS/steps/{name}.rc"'
        )
    vm = run_in_vm("\n".join(lines) + "\n", inputs=files, **kwargs)
    result = StepsResult(vm)
    for name in steps:
        rc = vm.files.get(f"steps/{name}.rc", b"").decode().strip()
        if rc.lstrip("-").isdigit():
            out = vm.files.get(f"steps/{name}.out", b"").decode(errors="replace")
            result.steps[name] = StepResult(name, int(rc), out)
    return result
