"""The nine corpus schedulers with their shipped profiles: loaded by ``schedswitchctl object
load --profile`` (no daemon), and switched to through the daemon (one VM boot each; CI runs
the daemon's, ``SCHEDSWITCHD_PROFILE_OBJECT_LOAD=1`` adds the other).

Without the daemon (``tools.profiles_soak --object-load``): each object is loaded, its
profile applied and its struct_ops attached by ``schedswitchctl object load OBJ --profile X
[--mode M] --pin DIR``; it must be enabled, stay enabled (same ``enable_seq``) through
``SCHEDSWITCHD_PROFILE_SOAK_S`` seconds of mixed work, and be gone after ``object unload
DIR``; lavd's and bpfland's modes are read back from the pinned maps with
``BPF_MAP_LOOKUP_ELEM``.

Through the daemon:

``tools.profiles_soak`` runs inside the VM: schedswitchd with a config whose
``[schedulers.X]`` are the ``../shared/corpus`` objects with ``profile = "X"`` and whose
``[hints.p-X]`` pick them; each scheduler is hinted by a launcher, must be enabled and stay
enabled (same ``enable_seq``) through ``SCHEDSWITCHD_PROFILE_SOAK_S`` seconds (default 30) of
mixed work (CPU-bound spinners, a pipe ping-pong, a fork loop), and must be switched away
cleanly when the launcher dies. Then lavd and bpfland are hinted with two modes each and the
modes' values are read back from the loaded maps in the kernel (the maps of the object
whose struct_ops link is live). The soak is judged by time, not by its count of samples:
under TCG one reading of sysfs can take seconds.

Under TCG every scheduler gets ``struct_ops.timeout_ms = 30000`` in the test config (the
objects' own are 5000 ms for bpfland, flash, tickless and qmap): the kernel's watchdog counts
wall time, which software emulation stretches. That is the only deviation from the shipped
profiles. The daemon's config also has ``[standby] recent = false``: re-preparing each
released scheduler (lavd: minutes under TCG) would run behind the next switches.

Skips: without the corpus, or while the daemon's config has no ``profile`` key.
"""

from __future__ import annotations

import json
import os
import shlex
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
"$PY" -m tools.profiles_soak --config "$RESULTS/profiles.toml" --objects $OBJECTS_JSON \
    --out "$RESULTS/profiles.json" --log "$RESULTS/daemon.log" --soak-s "$SOAK_S" --modes
"""
LOAD_SCRIPT = r"""
set -e
cd "$REPO"
mount -t tmpfs tmpfs /boot && cp "$KMOD_ROOT/lib/modules/$KVER/config" "/boot/config-$KVER"
"$PY" -m tools.profiles_soak --object-load --objects $OBJECTS_JSON \
    --out "$RESULTS/profiles.json" --soak-s "$SOAK_S" --timeout-ms "$TIMEOUT_MS" --modes
"""

#: The object-load pass costs a second boot of about the same length (each load starts the
#: CLI; lavd's takes ~4 min under TCG): CI runs the daemon pass, the one that checks the daemon, and
#: this one runs with SCHEDSWITCHD_PROFILE_OBJECT_LOAD=1.
OBJECT_LOAD = os.environ.get("SCHEDSWITCHD_PROFILE_OBJECT_LOAD") == "1"

#: Mode read-backs through the daemon known not to work, with what was seen (none: lavd's
#: gaming and powersave values read back in the clean-clone run of 2026-12-01 15:16 UTC).
READ_BACK_GAPS: dict[str, str] = {}

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
    # No standby of the last hint's scheduler: re-preparing each released one (lavd: ~4 min
    # of verification under TCG) would run behind the next switches and soaks.
    parts.append("[standby]\nrecent = false\n")
    return config_variant(REPO, extra="\n".join(parts))


@pytest.fixture(scope="module")
def runs(sid_kernel: SidKernel) -> dict[str, Any]:
    objects = _corpus_objects()
    if not _profile_support():
        pytest.skip("the daemon's config has no 'profile' key yet")
    result = vm.run_in_vm(
        SCRIPT.replace("$OBJECTS_JSON", shlex.quote(json.dumps(objects))).replace(
            "$SOAK_S", str(SOAK_S)
        ),
        kernel=sid_kernel,
        # a bound: lavd alone takes ~4 min to load under TCG; 9 switches and 4 mode hints
        timeout=int(600 + 13 * (SOAK_S + 240)),
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
    (REPO / "build").mkdir(exist_ok=True)
    (REPO / "build" / "profiles-daemon.json").write_bytes(raw)
    data: dict[str, Any] = json.loads(raw)
    data["_daemon_log"] = log
    data["_elapsed_s"] = result.elapsed_s
    data["_rc"] = result.returncode
    return data


def _corpus_objects() -> dict[str, str]:
    if not CORPUS.is_dir():
        pytest.skip("../shared/corpus is absent")
    objects = {k: str(CORPUS / f) for k, f in OBJECTS.items() if (CORPUS / f).is_file()}
    if not objects:
        pytest.skip("no corpus object present")
    return objects


@pytest.fixture(scope="module")
def loads(sid_kernel: SidKernel) -> dict[str, Any]:
    """The object-load pass (no daemon), one boot."""
    if not OBJECT_LOAD:
        pytest.skip("the object-load pass runs with SCHEDSWITCHD_PROFILE_OBJECT_LOAD=1")
    objects = _corpus_objects()
    script = (
        LOAD_SCRIPT.replace("$OBJECTS_JSON", shlex.quote(json.dumps(objects)))
        .replace("$SOAK_S", str(SOAK_S))
        .replace("$TIMEOUT_MS", str(TCG_TIMEOUT_MS))
    )
    result = vm.run_in_vm(
        script,
        kernel=sid_kernel,
        # a bound, not the expected time: under TCG a load takes 45-90 s (the CLI's start
        # included) and lavd's ~240 s (its verification); 9 schedulers and 4 mode loads
        timeout=int(600 + 13 * (SOAK_S + 240)),
        cwd=str(REPO),
    )
    raw = result.files.get("profiles.json")
    if raw is None:
        pytest.fail(
            f"object-load driver in the VM failed (rc {result.returncode}, "
            f"{result.elapsed_s:.0f} s)\n{result.tail(60)}"
        )
    # kept for a look after the run (the measured figures of the README's table)
    (REPO / "build").mkdir(exist_ok=True)
    (REPO / "build" / "profiles-object-load.json").write_bytes(raw)
    data: dict[str, Any] = json.loads(raw)
    data["_elapsed_s"] = result.elapsed_s
    data["_rc"] = result.returncode
    return data


def _why_load(r: dict[str, Any]) -> str:
    return json.dumps(
        {"load": r.get("load"), "kernel": r.get("kernel"), "kmsg": r.get("kmsg")}, indent=1
    )[:5000]


def _soaked(s: dict[str, Any]) -> None:
    """The soak covered SOAK_S seconds of wall time with the same enable_seq (time, not a
    count of samples: under TCG one reading can take several seconds)."""
    assert s["elapsed_s"] >= SOAK_S, s
    assert s["stayed_enabled"] and s["enabled_s"] >= SOAK_S, s
    assert s["workload_exit_codes"] == [0, 0, 0, 0], s


def test_object_load_driver_completed(loads: dict[str, Any]) -> None:
    assert loads.get("done") is True, loads.get("_rc")
    assert loads["initial"]["state"] == "disabled"


@pytest.mark.parametrize("key,ops", SCHEDULERS)
def test_object_load_runs_through_the_soak(loads: dict[str, Any], key: str, ops: str) -> None:
    r = loads["schedulers"].get(key)
    if r is None:
        pytest.skip(f"corpus object {OBJECTS[key]} absent")
    if key in KNOWN_LIMITS and not r.get("enabled"):
        pytest.xfail(f"known limit: {KNOWN_LIMITS[key]}\n{_why_load(r)}")
    assert r["load"]["rc"] == 0, _why_load(r)
    assert r["enabled"], f"{key} not enabled after object load:\n{_why_load(r)}"
    _soaked(r["soak"])
    assert r["unload"]["rc"] == 0, r["unload"]
    assert r["released"] and r["after_release"]["state"] == "disabled", _why_load(r)
    # detached by the unload, not ejected: the kernel logged no error exit for it
    assert not [k for k in r["kmsg"] if "error" in k.lower()], _why_load(r)


@pytest.mark.parametrize(
    "key,mode,expected", MODE_CHECKS, ids=[f"{k}-{m}" for k, m, _ in MODE_CHECKS]
)
def test_object_load_mode_values_reach_the_kernel(
    loads: dict[str, Any], key: str, mode: str, expected: dict[str, int]
) -> None:
    got = [m for m in loads["modes"] if m["scheduler"] == key and m["mode"] == mode]
    if not got:
        pytest.skip(f"corpus object {OBJECTS[key]} absent")
    m = got[0]
    assert m["enabled"], _why_load(m)
    assert m["load"]["profile"]["mode"] == mode, m["load"]
    assert m.get("read") == expected, json.dumps(m, indent=1)[:4000]
    # the same values found from the kernel alone (the running struct_ops link's object)
    assert m.get("read_running") == expected, json.dumps(m, indent=1)[:4000]


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
    _soaked(r["soak"])
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
    if key in READ_BACK_GAPS and m.get("read") != expected:
        pytest.xfail(f"{READ_BACK_GAPS[key]}\n{json.dumps(m.get('running_found'))}")
    assert m["enabled"], json.dumps(m, indent=1)[:3000]
    # still running when read: a switch the daemon rolled back shows the kernel's ops
    # only for a moment (every mode switch did so while X@MODE could not name a pin)
    assert m["kernel_at_read"]["ops"] == dict(SCHEDULERS)[key], json.dumps(m, indent=1)[:3000]
    assert m.get("read") == expected, json.dumps(m, indent=1)[:3000]
