"""Enum variables (scx's ``__SCX_*`` pattern) filled by our loader from the running
kernel's BTF, on the host: ``build/tests/bpf/enum_vars.bpf.o`` is loaded, its syscall
program copies every enum variable into ``.bss`` (``seen[]``) and the test reads what the
verified program saw. The host kernel has no sched_ext, so the real ``__SCX_*`` names are
missing here (the VM corpus test covers them); generic names of other vmlinux enumerators
are filled through extra prefixes. Expected values come from the UAPI headers, not from our
BTF reader: ``BPF_MAP_TYPE_ARRAY`` = 2, ``BPF_F_MMAPABLE`` = 1 << 10
(``include/uapi/linux/bpf.h``), ``PERF_CONTEXT_KERNEL`` = (u64)-128
(``include/uapi/linux/perf_event.h``), ``CPUHP_INVALID`` = -1 (``include/linux/cpuhotplug.h``).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from schedswitchd.bpf.customize import set_variable
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.cli.ctl import main
from schedswitchd.errors import CustomizationError
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import LoadedObject, load_object
from schedswitchd.kernel.syscall import prog_test_run
from tests.build_outputs import missing_build_output

pytestmark = pytest.mark.root

OBJ = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf" / "enum_vars.bpf.o"
PREFIXES = ("__SCX_", "__BPF_", "__CPUHP_", "__PERF_", "__Opt_")
U64 = (1 << 64) - 1

#: seen[] slot of each variable (tests/bpf/enum_vars.bpf.c)
SLOTS = {
    "__SCX_DSQ_LOCAL": 0,
    "__SCX_SLICE_DFL": 1,
    "__BPF_MAP_TYPE_ARRAY": 2,
    "__BPF_F_MMAPABLE": 3,
    "__CPUHP_INVALID": 4,
    "__PERF_CONTEXT_KERNEL": 5,
    "__PERF_TXN_ABORT_MASK": 6,
    "__Opt_mode": 7,
    "__BPF_MAP_TYPE_HASH": 8,
    "__BPF_NO_SUCH_ENUMERATOR_ZZ": 9,
    "__BPF_PROG_TYPE_KPROBE": 10,
}
#: what the object compiles in (the fill must leave these where it refuses or is off)
COMPILED = {"__Opt_mode": 77, "__BPF_NO_SUCH_ENUMERATOR_ZZ": 5, "__BPF_PROG_TYPE_KPROBE": 99}


def _spec() -> ObjectSpec:
    if not OBJ.is_file():
        missing_build_output(OBJ, "test-objects")
    return open_object(OBJ)


def _seen(
    spec: ObjectSpec, registry: KernelBtfRegistry, **kw: object
) -> tuple[LoadedObject, dict[str, int]]:
    obj = load_object(
        spec,
        registry.targets(spec.kmod_btfs),
        open_btf_object=registry.open_btf_object,
        **kw,  # type: ignore[arg-type]
    )
    try:
        assert prog_test_run(obj.programs["read_enums"].fd).retval == 0
        seen = struct.unpack("<12Q", obj.read_variable("seen"))
    finally:
        obj.close()
    return obj, {name: seen[slot] for name, slot in SLOTS.items()}


def test_generic_prefixes_fill_from_kernel_btf(registry: KernelBtfRegistry) -> None:
    spec = set_variable(_spec(), "__BPF_PROG_TYPE_KPROBE", 12345)
    obj, seen = _seen(spec, registry, enum_prefixes=PREFIXES)
    assert seen["__BPF_MAP_TYPE_ARRAY"] == 2
    assert seen["__BPF_F_MMAPABLE"] == 1 << 10  # from an anonymous enum, into a u32
    assert seen["__CPUHP_INVALID"] == U64  # -1 into a u64: two's complement
    assert seen["__PERF_CONTEXT_KERNEL"] == (-128) & U64  # an ENUM64 above 32 bits
    # refused, so left as compiled: does not fit a u32, ambiguous, not an integer
    assert seen["__PERF_TXN_ABORT_MASK"] == 0
    assert seen["__Opt_mode"] == COMPILED["__Opt_mode"]
    assert seen["__BPF_MAP_TYPE_HASH"] == 0
    # missing in the kernel: left as compiled; assigned by the user: the user's value wins
    assert seen["__BPF_NO_SUCH_ENUMERATOR_ZZ"] == COMPILED["__BPF_NO_SUCH_ENUMERATOR_ZZ"]
    assert seen["__SCX_DSQ_LOCAL"] == seen["__SCX_SLICE_DFL"] == 0  # no sched_ext here
    assert seen["__BPF_PROG_TYPE_KPROBE"] == 12345

    r = obj.enum_fill
    assert {f.variable: f.value for f in r.filled} == {
        "__BPF_MAP_TYPE_ARRAY": 2,
        "__BPF_F_MMAPABLE": 1 << 10,
        "__CPUHP_INVALID": -1,
        "__PERF_CONTEXT_KERNEL": (-128) & U64,
    }
    by_var = {f.variable: f for f in r.filled}
    assert by_var["__BPF_MAP_TYPE_ARRAY"].enum_type == "bpf_map_type"
    assert by_var["__BPF_F_MMAPABLE"].enum_type == ""  # anonymous
    assert by_var["__CPUHP_INVALID"].enumerator == "CPUHP_INVALID"
    assert set(r.missing) == {"__SCX_DSQ_LOCAL", "__SCX_SLICE_DFL", "__BPF_NO_SUCH_ENUMERATOR_ZZ"}
    assert r.kept == ("__BPF_PROG_TYPE_KPROBE",)
    reasons = dict(r.skipped)
    assert set(reasons) == {"__PERF_TXN_ABORT_MASK", "__Opt_mode", "__BPF_MAP_TYPE_HASH"}
    assert "does not fit 4 bytes" in reasons["__PERF_TXN_ABORT_MASK"]
    assert "ambiguous" in reasons["__Opt_mode"]
    assert "not an integer" in reasons["__BPF_MAP_TYPE_HASH"]
    assert "enums" in obj.timings_ns
    # the static look-alike and the unprefixed variable are no enum variables
    names = {f.variable for f in r.filled} | set(r.missing) | set(r.kept) | set(reasons)
    assert "__BPF_PROG_TYPE_XDP" not in names and "BPF_MAP_TYPE_QUEUE_copy" not in names


def test_default_is_scx_names_only(registry: KernelBtfRegistry) -> None:
    obj, seen = _seen(_spec(), registry)
    assert obj.enum_fill.filled == ()
    assert obj.enum_fill.missing == ("__SCX_DSQ_LOCAL", "__SCX_SLICE_DFL")
    assert seen["__BPF_MAP_TYPE_ARRAY"] == 0 and seen["__Opt_mode"] == 77


def test_fill_can_be_turned_off(registry: KernelBtfRegistry) -> None:
    obj, seen = _seen(_spec(), registry, fill_enums=False, enum_prefixes=PREFIXES)
    assert obj.enum_fill.filled == () and obj.enum_fill.missing == ()
    assert "enums" not in obj.timings_ns
    assert seen["__BPF_MAP_TYPE_ARRAY"] == 0 and seen["__CPUHP_INVALID"] == 0
    for name, value in COMPILED.items():
        assert seen[name] == value


def test_bad_prefix_is_a_customization_error(registry: KernelBtfRegistry) -> None:
    spec = _spec()
    with pytest.raises(CustomizationError, match="must start with '__'"):
        load_object(spec, registry.targets(spec.kmod_btfs), enum_prefixes=("BPF_",))


def test_cli_reports_and_switches_off(capsys: pytest.CaptureFixture[str]) -> None:
    _spec()
    assert main(["object", "load", str(OBJ), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["enum_fill"]["missing"] == ["__SCX_DSQ_LOCAL", "__SCX_SLICE_DFL"]
    assert out["enum_fill"]["set"] == {}
    assert main(["object", "load", str(OBJ)]) == 0
    text = capsys.readouterr().out
    assert "enums: kernel lacks 2 (__SCX_DSQ_LOCAL, __SCX_SLICE_DFL)" in text
    assert main(["object", "load", str(OBJ), "--no-fill-enums", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["enum_fill"] == {"set": {}, "missing": [], "kept": [], "skipped": {}}
    # --set wins over the fill (and is reported as kept)
    assert main(["object", "load", str(OBJ), "--json", "--set", "__SCX_DSQ_LOCAL=3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["enum_fill"]["kept"] == ["__SCX_DSQ_LOCAL"]
    assert out["enum_fill"]["missing"] == ["__SCX_SLICE_DFL"]
