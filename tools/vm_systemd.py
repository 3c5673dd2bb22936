"""Boot the sched_ext VM with systemd as PID 1 and the shipped units installed.

:func:`tools.vm.run_in_vm` ``chroot``s into the read-only host root and runs a script: no
service manager, so ``systemd/schedswitchd.{service,socket}`` cannot be exercised there.
Here the initramfs (busybox, the 9p modules and ``overlay``) mounts the host's ``/``
read-only over 9p as the lower layer of an overlayfs whose upper layer is a tmpfs, so the
guest root is writable and every write stays in the VM's memory. It then copies a small
tree into that root (the units under test, unchanged, in ``/etc/systemd/system``; a test
target and a oneshot test unit; ``/usr/bin/schedswitchd`` etc., which the units'
``ExecStart=`` names, as scripts importing from the checkout's venv) and ``switch_root``s to
``/lib/systemd/systemd`` (the host's systemd 252) with ``systemd.unit=`` naming the test
target: no getty, no network, no ``multi-user.target``.

The test unit runs ``$RESULTS/.vm/script`` exactly as :func:`tools.vm.run_in_vm`'s chroot
init does (same ``env``, output and exit status files), so :func:`run_under_systemd` returns
the same :class:`tools.vm.VmResult`. The unit powers the VM off when the script ends
(``SuccessAction=``/``FailureAction=poweroff``: a clean systemd shutdown that stops every
unit, ours included).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tools import vm
from tools.sidkernel import SidKernel, ensure_kernel

#: The initramfs modules: 9p as for the chroot VM, plus overlayfs (a module in Debian's kernel).
MODULES = (*vm.INITRAMFS_MODULES, "overlay")
TARGET = "schedswitchd-vmtest.target"
TEST_UNIT = "schedswitchd-vmtest.service"
UNITS_DIR = vm.REPO / "systemd"
#: Programs installed in the guest's /usr/bin: the units' ExecStart and the CLIs on PATH.
PROGRAMS = ("schedswitchd", "schedswitchctl", "schedswitch-run")

#: Kernel command line for systemd. Units masked here would only cost boot time in a VM
#: without network or disks (timers: apt/man-db/fstrim jobs; timesyncd; binfmt automount).
#: ``tmp.mount`` is masked so ``$RESULTS`` (under /tmp) is never hidden by a tmpfs.
SYSTEMD_CMDLINE = " ".join(
    [
        f"systemd.unit={TARGET}",
        "systemd.firstboot=off",
        "systemd.show_status=error",
        *(
            f"systemd.mask={u}"
            for u in (
                "timers.target",
                "systemd-timesyncd.service",
                "proc-sys-fs-binfmt_misc.automount",
                "tmp.mount",
            )
        ),
    ]
)

_INIT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /lower /ovl /newroot
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "vm-init: $*" > /dev/console; poweroff -f; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in @MODULES@; do insmod /lib/modules/$m.ko || fail "insmod $m"; done
O=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o $O,ro hostroot /lower || fail "mount host root"
mount -t tmpfs -o mode=0755 tmpfs /ovl
mkdir -p /ovl/upper /ovl/work
mount -t overlay -o lowerdir=/lower,upperdir=/ovl/upper,workdir=/ovl/work overlay /newroot \
  || fail "mount overlay root"
mkdir -p /newroot@RESULTS@ /newroot@REPO@
mount -t 9p -o $O results /newroot@RESULTS@ || fail "mount results"
mount -t 9p -o $O,ro repo /newroot@REPO@ || fail "mount repo"
sh /newroot@RESULTS@/.vm/install.sh /newroot || fail "install units"
# The VM kernel's config where a Debian system keeps it (.kconfig externs read it).
cp /newroot@KCONFIG@ /newroot/boot/config-$(uname -r) || fail "copy the kernel config"
# The host root is a container's: systemd would see /.dockerenv, decide it runs in a
# container and ignore the kernel command line (systemd.unit=, systemd.mask=). Hide it (a
# whiteout in the tmpfs layer) and start from an empty /run, not the host's.
rm -f /newroot/.dockerenv /newroot/run/.containerenv
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /newroot/run
echo "@READY@" > /dev/console
mount --move /dev /newroot/dev
umount /proc /sys
exec switch_root /newroot /lib/systemd/systemd
"""


def build_initramfs(kernel: SidKernel) -> Path:
    """The systemd-mode initramfs for ``kernel`` (cached next to it like the chroot one)."""
    order = vm.module_load_order(kernel, MODULES)
    init = (
        _INIT.replace("@MODULES@", " ".join(order))
        .replace("@RESULTS@", vm.RESULTS_IN_VM)
        .replace("@READY@", vm.READY_MARK)
        .replace("@REPO@", str(vm.REPO))
        .replace("@KCONFIG@", str(kernel.config))
    )
    return vm.cached_initramfs(kernel, "initramfs-systemd", init, order)


def _test_units() -> dict[str, str]:
    results = vm.RESULTS_IN_VM
    return {
        TARGET: (
            "[Unit]\n"
            "Description=schedswitchd VM test\n"
            "Requires=basic.target\n"
            "After=basic.target\n"
            f"Wants=schedswitchd.socket {TEST_UNIT}\n"
            "AllowIsolate=yes\n"
        ),
        TEST_UNIT: (
            "[Unit]\n"
            "Description=schedswitchd VM test script ($RESULTS/.vm/script), then power off\n"
            "After=basic.target schedswitchd.socket\n"
            "SuccessAction=poweroff\n"
            "FailureAction=poweroff\n"
            "[Service]\n"
            "Type=oneshot\n"
            f"ExecStart=/bin/bash {results}/.vm/run.sh\n"
            "TimeoutStartSec=infinity\n"
            "StandardOutput=journal+console\n"
        ),
    }


# Replaces Debian's /usr/lib/tmpfiles.d/tmp.conf ("D /tmp": empty /tmp at boot), which would
# walk and white out the host's whole /tmp through 9p (minutes under TCG) and reach into the
# results share mounted below it.
_TMPFILES_TMP = "d /tmp 1777 root root -\n"

# Same contract as the chroot init in tools/vm.py: env, cwd, output and rc files.
_RUN = r"""R=@RESULTS@/.vm
( . $R/env; cd "$VM_CWD" && exec /bin/bash $R/script ) > $R/output 2>&1 < /dev/null
echo $? > $R/rc
sync
"""


def install_files(
    units: Mapping[str, str], extra: Mapping[str, str] | None = None
) -> dict[str, bytes | str]:
    """``inputs`` for :func:`tools.vm.run_in_vm` that install ``units`` (file name -> text,
    into ``/etc/systemd/system``) and ``extra`` (absolute guest path -> text) in the guest
    root, link :data:`PROGRAMS` into ``/usr/bin`` and add the test target and unit."""
    root = ".vm/root"
    files: dict[str, bytes | str] = {f"{root}/etc/tmpfiles.d/tmp.conf": _TMPFILES_TMP}
    for name, text in {**units, **_test_units()}.items():
        files[f"{root}/etc/systemd/system/{name}"] = text
    for path, text in (extra or {}).items():
        if not path.startswith("/"):
            raise ValueError(f"guest path {path!r} is not absolute")
        files[f"{root}{path}"] = text
    for name, text in launchers().items():
        files[f"{root}/usr/bin/{name}"] = text
    programs = " ".join(f'"$1/usr/bin/{p}"' for p in PROGRAMS)
    files[".vm/install.sh"] = (
        f'set -e\ncp -a "$1{vm.RESULTS_IN_VM}/{root}/." "$1/"\nchmod 755 {programs}\n'
    )
    files[".vm/run.sh"] = _RUN.replace("@RESULTS@", vm.RESULTS_IN_VM)
    return files


#: Where the unit's sandbox (ProtectHome=, PrivateTmp=) hides files from the service.
_HIDDEN = ("/root", "/home", "/run/user", "/tmp", "/var/tmp")


def launchers(venv: Path = vm.REPO / ".venv") -> dict[str, str]:
    """``/usr/bin/NAME`` scripts for :data:`PROGRAMS` as ``pip install`` into the system
    Python would write them, importing from the checkout's venv.

    Not links to the venv's own scripts: their interpreter may live where the unit's
    ``ProtectHome=yes`` hides it (a pyenv build under ``/root``: ``ExecStart=`` then fails
    with 203/EXEC, ENOENT), which says nothing about the unit. The interpreter is the venv's
    own when the service can see it, else ``/usr/bin/python3.X`` of the same version.
    """
    cfg = dict(
        line.split(" = ", 1)
        for line in (venv / "pyvenv.cfg").read_text().splitlines()
        if " = " in line
    )
    version = ".".join(cfg.get("version", cfg.get("version_info", "")).split(".")[:2])
    python = (venv / "bin" / "python").resolve()
    if any(python.is_relative_to(h) for h in _HIDDEN):
        python = Path(f"/usr/bin/python{version}")
    site = venv / "lib" / f"python{version}" / "site-packages"
    scripts = tomllib.loads((vm.REPO / "pyproject.toml").read_text())["project"]["scripts"]
    out = {}
    for name in PROGRAMS:
        module, _, func = scripts[name].partition(":")
        out[name] = (
            f"#!{python}\n"
            "import site\n"
            "import sys\n"
            f"site.addsitedir({str(site)!r})  # also runs its .pth files (editable install)\n"
            f"from {module} import {func}\n"
            f"sys.exit({func}())\n"
        )
    return out


def checkout_dropin(repo: Path = vm.REPO) -> dict[str, str]:
    """``extra_files`` that keep the checkout visible to the service when the unit's
    ``PrivateTmp=yes`` would hide it (a CI clone under ``/tmp`` or ``/var/tmp``): a drop-in
    with ``BindReadOnlyPaths=`` of the checkout, standing in for a package install under
    ``/usr``. Empty when the checkout lives elsewhere, so the shipped unit runs unchanged."""
    if not repo.is_relative_to("/tmp") and not repo.is_relative_to("/var/tmp"):
        return {}
    return {
        "/etc/systemd/system/schedswitchd.service.d/checkout.conf": (
            f"[Service]\nBindReadOnlyPaths={repo}\n"
        )
    }


def shipped_units() -> dict[str, str]:
    """``systemd/*.service`` and ``*.socket`` of this checkout, unchanged."""
    return {
        p.name: p.read_text()
        for p in sorted(UNITS_DIR.iterdir())
        if p.suffix in (".service", ".socket")
    }


def run_under_systemd(
    script: str,
    *,
    kernel: SidKernel | None = None,
    units: Mapping[str, str] | None = None,
    extra_files: Mapping[str, str] | None = None,
    inputs: Mapping[str, bytes | str] | None = None,
    cmdline: str = "",
    **kwargs: Any,
) -> vm.VmResult:
    """Boot with systemd as PID 1, ``units`` (default: :func:`shipped_units`) and
    ``extra_files`` installed, and run ``script`` from the test unit once ``basic.target``
    is up. Same environment, arguments (``timeout``, ``env``, ``cwd``, ``keep`` ...) and
    result as :func:`tools.vm.run_in_vm`; ``cmdline`` is added to :data:`SYSTEMD_CMDLINE`.
    """
    kernel = kernel or ensure_kernel()
    files = {**(inputs or {}), **install_files(units or shipped_units(), extra_files)}
    return vm.run_in_vm(
        script,
        kernel=kernel,
        inputs=files,
        cmdline=f"{SYSTEMD_CMDLINE} {cmdline}".strip(),
        initramfs=build_initramfs(kernel),
        **kwargs,
    )
