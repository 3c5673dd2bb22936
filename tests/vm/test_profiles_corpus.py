"""The nine corpus schedulers through the daemon with their shipped profiles (one VM boot).

``tools.profiles_soak`` runs inside the VM: schedswitchd with a config whose
``[schedulers.X]`` are the ``../shared/corpus`` objects with ``profile = "X"`` and whose
``[hints.p-X]`` pick them; each scheduler is hinted by a launcher, must be enabled and stay
enabled (same ``enable_seq``) through ``SCHEDSWITCHD_PROFILE_SOAK_S`` seconds (default 30) of
mixed work (CPU-bound spinners, a pipe ping-pong, a fork loop), and must be switched away
cleanly when the launcher dies. Then lavd and bpfland are hinted with two modes each and the
modes' values are read back from the loaded maps in the kernel.

Under TCG every scheduler gets ``struct_ops.timeout_ms = 30000`` in the test config (the
objects' own are 5000 ms for bpfland, flash, tickless and qmap): the kernel's watchdog counts
wall time, which software emulation stretches. That is the only deviation from the shipped
profiles.

Skips: without the corpus, or while the daemon's config has no ``profile`` key (the profile
framework of issue 13 has not landed in this checkout); and, for now, behind an explicit gate
in :func:`runs` until the nine schedulers are confirmed through the daemon on main.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tools import vm
from tools.profiles_soak import MODE_CHECKS, SCHEDULERS
from tools.session import config_variant
from tools.sidkernel import SidKernel

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
CORPUS = (REPO.parent / "shared" / "corpus").resolve()
OBJECTS = {
    "bpfland": "bpfland.bpf.o",
    "flash": "flash.bpf.o",
    "tickless": "tickless.bpf.o",
    "lavd": "lavd.bpf.o",
    "p2dq": "p2dq.bpf.o",
    "scx_simple": "k_simple.bpf.o",
    "scx_qmap": "k_qmap.bpf.o",
    "scx_central": "k_central.bpf.o",
    "scx_flatcg": "k_flatcg.bpf.o",
}
SOAK_S = float(os.environ.get("SCHEDSWITCHD_PROFILE_SOAK_S", "30"))
TCG_TIMEOUT_MS = 30000

SCRIPT = r"""
set -e
cd "$REPO"
# scx schedulers read __kconfig externs: give the loader this kernel's config where a distro
# keeps it (/boot/config-$KVER; the read-only host root has none for the VM's kernel)
mount -t tmpfs tmpfs /boot && cp "$KMOD_ROOT/lib/modules/$KVER/config" "/boot/config-$KVER"
"$PY" -m tools.profiles_soak --config "$RESULTS/profiles.toml" --objects "$OBJECTS_JSON" \
    --out "$RESULTS/profiles.json" --log "$RESULTS/daemon.log" --soak-s "$SOAK_S" --modes
"""

#: An explicit gate, to be lifted (set to None) by the corpus schedulers' engineer once the
#: nine run through the daemon on main: the daemon reads ``profile`` since the framework
#: landed, which the check below keyed on.
GATE: str | None = (
    "gated: the daemon reads profiles now, but the nine corpus schedulers through it are not "
    "yet confirmed on main (issue 13); lift GATE when they pass"
)

# Known limits on this kernel, with the reason shown by the test when they are not enabled.
KNOWN_LIMITS: dict[str, str] = {}


def _profile_support() -> bool:
    from schedswitchd.daemon import config as cfg

    model = getattr(cfg, "SchedulerConfig", None)
    fields = getattr(model, "model_fields", {})
    return "profile" in fields


def _config(objects: dict[str, str]) -> str:
    parts = []
    for key, path in objects.items():
        parts.append(
            f'[schedulers.{key}]\nobject = "{path}"\nprofile = "{key}"\n'
            f'description = "{key} from the corpus with its shipped profile"\n'
            f"struct_ops = {{ timeout_ms = {TCG_TIMEOUT_MS} }}\n"
            f'[hints.p-{key}]\nscheduler = "{key}"\npriority = 40\n'
        )
    for key, mode, _ in MODE_CHECKS:
        if key in objects:
            parts.append(
                f'[hints.p-{key}-{mode}]\nscheduler = "{key}"\nmode = "{mode}"\npriority = 40\n'
            )
    return config_variant(REPO, extra="\n".join(parts))


@pytest.fixture(scope="module")
def runs(sid_kernel: SidKernel) -> dict[str, Any]:
    if not CORPUS.is_dir():
        pytest.skip("../shared/corpus is absent")
    objects = {k: str(CORPUS / f) for k, f in OBJECTS.items() if (CORPUS / f).is_file()}
    if not objects:
        pytest.skip("no corpus object present")
    if not _profile_support():
        pytest.skip("the daemon's config has no 'profile' key yet (issue 13 framework)")
    if GATE is not None:
        pytest.skip(GATE)
    result = vm.run_in_vm(
        SCRIPT.replace("$OBJECTS_JSON", "'" + json.dumps(objects) + "'").replace(
            "$SOAK_S", str(SOAK_S)
        ),
        kernel=sid_kernel,
        timeout=int(900 + 9 * (SOAK_S + 60)),
        cwd=str(REPO),
        inputs={"profiles.toml": _config(objects)},
    )
    raw = result.files.get("profiles.json")
    log = result.files.get("daemon.log", b"").decode(errors="replace")
    if raw is None:
        pytest.fail(
            f"driver in the VM failed (rc {result.returncode}, {result.elapsed_s:.0f} s)\n"
            f"{result.tail(60)}\n--- daemon log ---\n{log[-6000:]}"
        )
    data: dict[str, Any] = json.loads(raw)
    data["_daemon_log"] = log
    data["_elapsed_s"] = result.elapsed_s
    data["_rc"] = result.returncode
    return data


def _why(r: dict[str, Any]) -> str:
    hist = r.get("history") or []
    exits = [h.get("exit") for h in hist if h.get("exit")]
    errors = [h.get("error") for h in hist if h.get("error")]
    return json.dumps(
        {"reply": r.get("reply"), "exits": exits, "errors": errors, "kmsg": r.get("kmsg")},
        indent=1,
    )[:4000]


def test_driver_completed(runs: dict[str, Any]) -> None:
    assert runs.get("done") is True, runs.get("_rc")
    assert runs["initial"]["state"] == "disabled"


@pytest.mark.parametrize("key,ops", SCHEDULERS)
def test_scheduler_runs_through_the_soak(runs: dict[str, Any], key: str, ops: str) -> None:
    r = runs["schedulers"].get(key)
    if r is None:
        pytest.skip(f"corpus object {OBJECTS[key]} absent")
    if key in KNOWN_LIMITS and not r.get("enabled"):
        pytest.xfail(f"known limit: {KNOWN_LIMITS[key]}\n{_why(r)}")
    assert "lease" in r["reply"], _why(r)
    assert r["enabled"], f"{key} never enabled:\n{_why(r)}"
    s = r["soak"]
    assert s["seconds"] >= SOAK_S and s["samples"] >= int(SOAK_S) - 1
    assert s["stayed_enabled"], f"{key} did not stay enabled: {s}\n{_why(r)}"
    assert s["workload_exit_codes"] == [0, 0, 0, 0], s
    assert r["released"] and r["after_release"]["state"] == "disabled", _why(r)
    # switched away cleanly: no ejection of this scheduler recorded
    assert not [h for h in r.get("history", []) if h.get("result") == "ejected"], _why(r)


@pytest.mark.parametrize(
    "key,mode,expected", MODE_CHECKS, ids=[f"{k}-{m}" for k, m, _ in MODE_CHECKS]
)
def test_mode_values_reach_the_kernel(
    runs: dict[str, Any], key: str, mode: str, expected: dict[str, int]
) -> None:
    got = [m for m in runs["modes"] if m["scheduler"] == key and m["mode"] == mode]
    if not got:
        pytest.skip(f"corpus object {OBJECTS[key]} absent")
    m = got[0]
    assert m["enabled"], json.dumps(m, indent=1)[:3000]
    assert m.get("read") == expected, json.dumps(m, indent=1)[:3000]
