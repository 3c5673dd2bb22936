"""``make demo``: boot the sched_ext VM, run schedswitchd with the shipped configuration
(``config/schedswitchd.toml``) and play a short launcher session in it (``tools.session
demo``): hint, status, a lower- and a higher-priority hint, release, a scheduler the kernel
ejects, release all. Prints the session as it ran, then its last line: a JSON summary
(kernel version, switches made, median switch and gap in ms, result).

Exit status 0 only when every expectation of the session held in the kernel's own view.
The VM's output arrives when it powers off (a few minutes under TCG).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tools import vm
from tools.sidkernel import ensure_kernel

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "config" / "schedswitchd.toml"

SCRIPT = r"""
cd "$REPO"
# ss_latency (the 'gaming' scheduler) reads the uinput module's BTF (.kmod_btfs)
modprobe -d "$KMOD_ROOT" uinput
"$PY" -m tools.session demo --config "$CONFIG" --log "$RESULTS/daemon.log"
"""


def main() -> int:
    kernel = ensure_kernel()
    print(
        f"make demo: booting Debian's sched_ext kernel {kernel.version} in qemu "
        "(software emulation: this takes a few minutes)...",
        flush=True,
    )
    start = time.monotonic()
    result = vm.run_in_vm(
        SCRIPT, kernel=kernel, timeout=900, cwd=str(REPO), env={"CONFIG": str(CONFIG)}
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
