"""``make demo``: boot the sched_ext VM, run schedswitchd with the shipped configuration
(``config/schedswitchd.toml``) and play a short launcher session in it (``tools.session
demo``): hint, status, a lower- and a higher-priority hint, release, a scheduler the kernel
ejects, release all, then a switch over D-Bus as scx_loader's users make it (``busctl call
org.scx.Loader ... SwitchScheduler``) and ``RestoreDefault``, and a game launched with
``gamemoderun`` (``schedswitch-gamemode`` serving GameMode's name on a session bus of the
demo's own). Prints the session as it ran,
then its last line: a JSON summary (kernel version, switches made, median switch and gap in
ms, result).

The ``gaming`` hint runs a community scheduler with its shipped profile when one is
available (``config/profiles/``, the daemon's ``profile`` key): the object or executable named
by ``DEMO_SCHEDULER`` (with ``DEMO_PROFILE``, default its file stem, and ``DEMO_MODE``), else
scx_bpfland from ``../shared/corpus`` in its ``gaming`` mode; the demo says which. Without one
(or without profile support in this build) it stays ss_latency.

Exit status 0 only when every expectation of the session held in the kernel's own view.
The VM's output arrives when it powers off (a few minutes under TCG).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tools import vm
from tools.dbus_conf import system_bus_conf
from tools.sidkernel import ensure_kernel

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "config" / "schedswitchd.toml"
CORPUS = REPO.parent / "shared" / "corpus"
# (corpus object, profile, mode, ops name) tried for the gaming hint, in order
COMMUNITY = [("bpfland.bpf.o", "bpfland", "gaming", "bpfland")]
GAMING = '[hints.gaming]\nscheduler = "latency"\n'

SCRIPT = r"""
cd "$REPO"
# scx schedulers read __kconfig externs: give the loader this kernel's config where a distro
# keeps it (/boot/config-$KVER; the read-only host root has none for the VM's kernel)
mount -t tmpfs tmpfs /boot && cp "$KMOD_ROOT/lib/modules/$KVER/config" "/boot/config-$KVER"
# ss_latency (the 'gaming' scheduler) reads the uinput module's BTF (.kmod_btfs)
modprobe -d "$KMOD_ROOT" uinput
# A system bus of the demo's own (tools/dbus_conf.py, with the shipped org.scx.Loader
# policy) for the daemon's D-Bus face ([dbus] in demo.toml): the session's last step
# switches through it.
dbus-daemon --config-file="$RESULTS/system-bus.conf" --fork --nopidfile --print-address=3 \
    3>"$RESULTS/bus-address"
export DBUS_SYSTEM_BUS_ADDRESS="$(head -n1 "$RESULTS/bus-address")"
# A session bus, for GameMode's launchers: gamemoderun registers the game there
dbus-daemon --session --fork --nopidfile --print-address=3 3>"$RESULTS/session-bus-address"
export DBUS_SESSION_BUS_ADDRESS="$(head -n1 "$RESULTS/session-bus-address")"
"$PY" -m tools.session demo --config "$RESULTS/demo.toml" --log "$RESULTS/daemon.log"
"""


def _profile_support() -> bool:
    from schedswitchd.daemon import config as cfg

    return "profile" in getattr(getattr(cfg, "SchedulerConfig", None), "model_fields", {})


def community_gaming() -> tuple[str, str, str, str] | None:
    """(object, profile, mode, ops name) for the gaming hint, or None: ``DEMO_SCHEDULER``
    (an object or an executable embedding one) first, then the corpus."""
    if not _profile_support():
        return None
    named = os.environ.get("DEMO_SCHEDULER")
    if named:
        path = Path(named).resolve()
        profile = os.environ.get("DEMO_PROFILE") or path.name.split(".")[0].removeprefix("scx_")
        ops = os.environ.get("DEMO_OPS", profile)
        return str(path), profile, os.environ.get("DEMO_MODE", "gaming"), ops
    for obj, profile, mode, ops in COMMUNITY:
        if (CORPUS / obj).is_file():
            return str((CORPUS / obj).resolve()), profile, mode, ops
    return None


def demo_config() -> tuple[str, str, list[str]]:
    """The shipped config with absolute object paths, its gaming hint moved to a community
    scheduler when one is available; the ops name the gaming hint must show; and the host
    paths outside the checkout that the config names (for :func:`tools.vm.run_in_vm`'s
    ``share``: a clone under ``/tmp`` has its corpus there too, which the VM would hide)."""
    from tools.session import config_variant

    # The D-Bus face the session's last step drives (org.scx.Loader, docs/desktop.md).
    text = config_variant(REPO, extra='[dbus]\n[dbus.scx_names]\nscx_fifo = "fifo"\n')
    pick = community_gaming()
    if pick is None:
        print("gaming hint: ss_latency (no community scheduler with a profile available)")
        return text, "ss_latency", []
    obj, profile, mode, ops = pick
    assert GAMING in text, "config/schedswitchd.toml's [hints.gaming] changed"
    print(f"gaming hint: {ops} from {obj} with profile {profile!r}, mode {mode!r}")
    text = text.replace(GAMING, f'[hints.gaming]\nscheduler = "community"\nmode = "{mode}"\n')
    text += (
        f'\n[schedulers.community]\nobject = "{obj}"\nprofile = "{profile}"\n'
        f'description = "{ops} (community scheduler, profile {profile})"\n'
        # software emulation stretches the kernel watchdog's wall time
        "struct_ops = { timeout_ms = 30000 }\n"
    )
    return text, ops, [obj]


def main() -> int:
    kernel = ensure_kernel()
    print(
        f"make demo: booting Debian's sched_ext kernel {kernel.version} in qemu "
        "(software emulation: this takes a few minutes)...",
        flush=True,
    )
    text, gaming_ops, share = demo_config()
    start = time.monotonic()
    result = vm.run_in_vm(
        SCRIPT,
        kernel=kernel,
        timeout=900,
        cwd=str(REPO),
        env={"SCHEDSWITCHD_DEMO_GAMING_OPS": gaming_ops},
        inputs={
            "demo.toml": text,
            "system-bus.conf": system_bus_conf(
                "unix:tmpdir=/tmp", [REPO / "dbus" / "org.scx.Loader.conf"]
            ),
        },
        share=share,
    )
    print(result.output.rstrip())
    print(f"(VM: {result.accel}, {time.monotonic() - start:.0f} s)", file=sys.stderr)
    if result.returncode != 0:
        log = result.files.get("daemon.log", b"").decode(errors="replace")
        print(f"--- demo failed (rc {result.returncode}); daemon log:\n{log[-4000:]}")
        print(result.tail(30), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
