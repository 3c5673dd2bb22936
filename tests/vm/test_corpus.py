"""The community scheduler corpus (``../shared/corpus``, see its README) through our loader
and through libbpf in the sched_ext VM, in one boot: a child process per object and loader
(:mod:`tests.vm.corpus_driver`, each with its own time limit), no profile (what each loader
does alone; ``tests/vm/test_profiles_corpus.py`` runs them with their user space's settings).

Asserted per object, from what this boot measured (``docs/corpus.md``): our outcome ranks at
least as high as libbpf's (``load_error`` < ``init_error`` < ``ejected`` < ``runs``); when
both stop at the scheduler's own ``ops.init``, with the same error; every ejection or failed
``ops.init`` of either loader comes with the kernel's reason (its log's ``disabled (KIND)``
and message lines), and ours with the same message in the scheduler's exit record; every
object loaded by us has its ``__SCX_*`` enum variables set from the VM kernel's BTF.

Outcome classes: ``runs`` (enabled, still enabled with the same ``enable_seq`` after the
workload), ``ejected`` (enabled, then disabled by the kernel), ``init_error`` (never enabled:
``enable_seq`` unchanged), ``load_error`` (stopped before attach). The reference libbpf is
the one the ``pylibbpf`` wheel links into its extension module (1.6; Debian 12's 1.1 cannot
open the arena schedulers), called through ctypes; ``SCHEDSWITCHD_LIBBPF`` names another
build. Without either, the comparison skips and the rest still runs (under ``make test``,
which installs the wheel, it fails). Skipped with a reason when the corpus is absent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.build_outputs import missing_build_output
from tests.corpus import OBJECTS, corpus_dir
from tools import vm

from .drivers import driver_line

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
#: Seconds of workload per enabled scheduler: ``runs`` means "survived this long".
RUN_S = 5.0
#: A bound per object and loader, not the expected time: lavd's load takes ~4 min under TCG
#: on a loaded host (its verification; libbpf's as long), the others well under 1 min.
OBJECT_TIMEOUT_S = 900
#: The whole boot: a bound (9 objects, 2 loaders; lavd twice).
VM_TIMEOUT_S = 60 * 60
LOADERS = ("ours", "libbpf")

RANK = {"load_error": 0, "init_error": 1, "ejected": 2, "runs": 3}


def libbpf_library() -> str | None:
    """The reference libbpf: ``$SCHEDSWITCHD_LIBBPF``, else the ``pylibbpf`` wheel's
    extension module (it exports libbpf's C API), else None."""
    env = os.environ.get("SCHEDSWITCHD_LIBBPF")
    if env:
        return env
    spec = importlib.util.find_spec("pylibbpf")
    dirs = (spec.submodule_search_locations or []) if spec is not None else []
    for d in dirs:
        for so in sorted(Path(d).glob("pylibbpf*.so")):
            return str(so)
    return None


def _present() -> list[str]:
    d = corpus_dir()
    return [n for n in OBJECTS if (d / f"{n}.bpf.o").is_file()]


def classify(r: dict[str, Any]) -> str:
    """The outcome class of one driver record."""
    if r.get("stage") in ("open", "load"):
        return "load_error"
    if int(r.get("enable_seq_after", -1)) <= int(r.get("enable_seq_before", 0)):
        return "init_error"  # never enabled (or the attach call failed: no counter after)
    soaked = r.get("soak") or {}
    return "runs" if soaked.get("stayed_enabled") else "ejected"


_DISABLED = re.compile(r'sched_ext: BPF scheduler "[^"]*" disabled \(([^)]*)\)')
_MESSAGE = re.compile(r"sched_ext: (?!BPF scheduler )[^:\s]+: (.+)")


def kernel_reason(r: dict[str, Any]) -> tuple[str, str]:
    """``(KIND, MESSAGE)`` of the kernel's disable lines (``kernel/sched/ext.c`` logs
    ``sched_ext: BPF scheduler "X" disabled (KIND)``, then ``sched_ext: X: MESSAGE`` for an
    error exit); ``("", "")`` when it logged none."""
    kind = msg = ""
    for line in r.get("kmsg", []):
        m = _DISABLED.search(line)
        if m and not kind:
            kind = m.group(1)
        elif kind and not msg and (m := _MESSAGE.search(line)):
            msg = m.group(1).strip()
    return kind, msg


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not run"
    if "exception" in r:
        return f"driver exception: {r['exception']}"
    out = classify(r)
    kind, msg = kernel_reason(r)
    if out == "load_error":
        out += f" [{(r.get('error') or {}).get('message', '')[:200]}]"
    elif out != "runs":  # a scheduler that ran was unregistered by the driver: no reason
        out += f" [{kind}: {msg}]"
    # libbpf's load_s counts its open too (bpf_object__open_file + __load); ours has open_s
    secs = (r.get("open_s") or 0) + (r.get("load_s") or 0)
    return f"{out}, open+load {secs:.1f} s"


def table(observed: dict[str, dict[str, Any]]) -> str:
    """One line per object: ours and libbpf's outcome with the kernel's reason."""
    return "\n".join(
        f"{name:10} ours: {_cell(observed.get(f'{name}.ours'))} | "
        f"libbpf: {_cell(observed.get(f'{name}.libbpf'))}"
        for name in _present()
    )


@pytest.fixture(scope="module")
def observed(vm_run: Callable[..., vm.VmResult]) -> dict[str, dict[str, Any]]:
    objects = " ".join(f'"{corpus_dir().resolve() / n}.bpf.o"' for n in _present())
    lib = libbpf_library()
    script = driver_line(
        "corpus_driver",
        '"$RESULTS"',
        objects,
        f"--run-s {RUN_S:g} --timeout-s {OBJECT_TIMEOUT_S}",
        *([f'--libbpf "{lib}"'] if lib else []),
    )
    res = vm_run(script, timeout=VM_TIMEOUT_S, share=[corpus_dir()])
    out: dict[str, dict[str, Any]] = {}
    for name in _present():
        for who in LOADERS:
            raw = res.files.get(f"{name}.{who}.json")
            if raw is not None:
                out[f"{name}.{who}"] = json.loads(raw)
    walls = json.loads(res.files.get("walls.json", b"{}"))
    report = table(out)
    (REPO / "build").mkdir(exist_ok=True)
    (REPO / "build" / "corpus-vm.json").write_text(json.dumps({**out, "walls": walls}, indent=1))
    (REPO / "build" / "corpus-vm.txt").write_text(report + "\n")
    print(
        f"corpus in the VM: boot {res.elapsed_s:.0f} s, driver rc {res.returncode}, "
        f"wall s {json.dumps(walls)}\n{report}"
    )
    if "walls.json" not in res.files:
        pytest.fail(f"the corpus driver did not finish in the VM\n{res.tail(60)}")
    return out


@pytest.fixture(scope="module", autouse=True)
def _corpus() -> None:
    if not _present():
        pytest.skip(f"no corpus object in {corpus_dir()} (see tests/corpus.py)")


def _record(observed: dict[str, dict[str, Any]], name: str, who: str) -> dict[str, Any]:
    if who == "libbpf" and libbpf_library() is None:
        # make deps installs it: under make test (CI) its absence is a failure
        missing_build_output(
            "the pylibbpf wheel (the reference libbpf) or $SCHEDSWITCHD_LIBBPF", "deps"
        )
    if name not in _present():
        pytest.skip(f"{name}.bpf.o absent from {corpus_dir()}")
    r = observed.get(f"{name}.{who}")
    assert r is not None, f"{name}.{who} did not run in the VM"
    assert "exception" not in r, r.get("tb") or r
    return r


def _why(*records: dict[str, Any]) -> str:
    keep = ("loader", "stage", "error", "after_attach", "soak", "uei", "kmsg", "log", "load_s")
    return json.dumps([{k: r.get(k) for k in keep if k in r} for r in records], indent=1)[:6000]


@pytest.mark.parametrize("name", OBJECTS)
def test_gets_as_far_as_libbpf(observed: dict[str, dict[str, Any]], name: str) -> None:
    ours, theirs = _record(observed, name, "ours"), _record(observed, name, "libbpf")
    mine, ref = classify(ours), classify(theirs)
    assert RANK[mine] >= RANK[ref], f"ours {mine}, libbpf {ref}\n{_why(ours, theirs)}"
    if mine == ref == "init_error":
        # the same failure of the scheduler's own init, as the kernel reported it for each
        assert kernel_reason(ours) == kernel_reason(theirs), _why(ours, theirs)
    assert ours["final"] == theirs["final"] == "disabled", _why(ours, theirs)


@pytest.mark.parametrize("who", LOADERS)
@pytest.mark.parametrize("name", OBJECTS)
def test_kernel_reason_recorded(observed: dict[str, dict[str, Any]], name: str, who: str) -> None:
    """A scheduler that was ejected, or whose ``ops.init`` failed, has the kernel's reason in
    the record; for ours the scheduler's exit record (``uei``, read back from its map) holds
    the same message as the kernel's log."""
    r = _record(observed, name, who)
    outcome = classify(r)
    if outcome not in ("ejected", "init_error"):
        return
    kind, msg = kernel_reason(r)
    assert kind, f"{outcome} without the kernel's reason\n{_why(r)}"
    uei = r.get("uei") or {}
    if who == "ours":
        # ops.exit ran for every disable it was registered for: an exit record is expected
        assert uei.get("recorded") or r.get("uei") is None, _why(r)
        if uei.get("recorded"):
            assert uei["reason"] == kind, _why(r)
            # the kernel logs the message line for error exits only (SCX_EXIT_ERROR and up)
            if msg:
                assert str(uei["message"]).splitlines()[0].strip() == msg, _why(r)


#: ``SCX_DSQ_FLAG_BUILTIN | SCX_DSQ_LOCAL`` and ``SCX_SLICE_DFL`` (``include/linux/sched/ext.h``)
SCX_DSQ_LOCAL = (1 << 63) | 2
SCX_SLICE_DFL_NS = 20_000_000


@pytest.mark.parametrize("name", OBJECTS)
def test_enum_variables_filled(observed: dict[str, dict[str, Any]], name: str) -> None:
    """Every object loaded by us has its ``__SCX_*`` variables set from the VM kernel's BTF."""
    r = _record(observed, name, "ours")
    fill = r.get("enum_fill")
    assert fill is not None, _why(r)
    assert not fill["skipped"], fill
    assert fill["set"]["__SCX_DSQ_LOCAL"] == SCX_DSQ_LOCAL, fill
    assert fill["set"]["__SCX_SLICE_DFL"] == SCX_SLICE_DFL_NS, fill
