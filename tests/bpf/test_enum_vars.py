"""The pure enum-variable fill (:mod:`schedswitchd.bpf.enum_vars`) and the enumerator
lookup behind it (``Btf.find_enumerators``), against real kernel BTF: the host's vmlinux and
the cached sid kernel's (``build/sid/vmlinux.btf``, the VM kernel, which has sched_ext), and
the corpus' scx_simple when ``../shared/corpus`` is present. scx values checked against the
kernel's ``include/linux/sched/ext.h`` / ``kernel/sched/ext/ext_internal.h`` definitions:
``SCX_DSQ_FLAG_BUILTIN`` = 1 << 63, ``SCX_DSQ_GLOBAL`` = builtin | 1, ``SCX_DSQ_LOCAL`` =
builtin | 2, ``SCX_SLICE_DFL`` = 20 ms in ns, ``SCX_ENQ_WAKEUP`` = 1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import Enum, Kind
from schedswitchd.bpf.customize import set_variable
from schedswitchd.bpf.enum_vars import enum_variables, fill_enum_variables
from schedswitchd.bpf.object import open_object
from schedswitchd.errors import CustomizationError
from tests.corpus import corpus_object

REPO = Path(__file__).resolve().parents[2]
SID_BTF = REPO / "build" / "sid" / "vmlinux.btf"
HOST_BTF = Path("/sys/kernel/btf/vmlinux")
BUILTIN = 1 << 63


@pytest.fixture(scope="module")
def sid() -> Btf:
    if not SID_BTF.is_file():
        pytest.skip(f"{SID_BTF} absent: `make kernel` caches the sid kernel")
    return Btf.from_file(SID_BTF, name="vmlinux")


@pytest.fixture(scope="module")
def host() -> Btf:
    if not HOST_BTF.is_file():
        pytest.skip("the host kernel exposes no vmlinux BTF")
    return Btf.from_file(HOST_BTF, name="vmlinux")


def _all_enumerators(btf: Btf) -> dict[str, list[tuple[int, int]]]:
    """The slow reference: decode every ENUM/ENUM64 type."""
    out: dict[str, list[tuple[int, int]]] = {}
    for tid in btf.own_ids():
        if btf.kind(tid) in (Kind.ENUM, Kind.ENUM64):
            t = btf.type(tid)
            assert isinstance(t, Enum)
            for ev in t.values:
                out.setdefault(ev.name, []).append((tid, ev.value))
    return out


@pytest.mark.parametrize("which", ["host", "sid"])
def test_find_enumerators_matches_decoding_every_enum(
    which: str, request: pytest.FixtureRequest
) -> None:
    btf: Btf = request.getfixturevalue(which)
    ref = _all_enumerators(btf)
    # every 97th name (signed, unsigned, ENUM64, duplicated ones among them) plus misses
    names = [*sorted(ref)[::97], "CPUHP_INVALID", "PERF_CONTEXT_KERNEL", "Opt_mode"]
    got = btf.find_enumerators([*names, "NO_SUCH_ENUMERATOR_QQ", ""])
    assert got == {n: ref[n] for n in names}


def test_scx_values_in_the_vm_kernel(sid: Btf) -> None:
    got = sid.find_enumerators(
        ["SCX_DSQ_LOCAL", "SCX_DSQ_GLOBAL", "SCX_DSQ_INVALID", "SCX_SLICE_DFL", "SCX_ENQ_WAKEUP"]
    )
    assert {n: [v for _, v in hits] for n, hits in got.items()} == {
        "SCX_DSQ_LOCAL": [BUILTIN | 2],
        "SCX_DSQ_GLOBAL": [BUILTIN | 1],
        "SCX_DSQ_INVALID": [BUILTIN],
        "SCX_SLICE_DFL": [20_000_000],
        "SCX_ENQ_WAKEUP": [1],
    }
    assert sid.type_name(got["SCX_DSQ_LOCAL"][0][0]) == "scx_dsq_id_flags"


def test_enum_vars_object_against_the_vm_kernel(
    sid: Btf, bpf_object: Callable[[str], Path]
) -> None:
    spec = open_object(bpf_object("enum_vars"))
    assert [v.name for v in enum_variables(spec)] == ["__SCX_DSQ_LOCAL", "__SCX_SLICE_DFL"]
    new, report = fill_enum_variables(spec, sid)
    assert {f.variable: f.value for f in report.filled} == {
        "__SCX_DSQ_LOCAL": BUILTIN | 2,
        "__SCX_SLICE_DFL": 20_000_000,
    }
    assert report.missing == report.kept == ()
    assert report.skipped == ()
    ro = new.map(".rodata")
    v = ro.variable("__SCX_DSQ_LOCAL")
    assert v is not None and ro.data is not None
    assert ro.data[v.offset : v.offset + 8] == (BUILTIN | 2).to_bytes(8, "little")
    assert spec.map(".rodata").data != ro.data  # the input spec is unchanged
    # an assigned variable is kept; nothing else changes
    assigned = set_variable(spec, "__SCX_SLICE_DFL", 5)
    _, report = fill_enum_variables(assigned, sid)
    assert report.kept == ("__SCX_SLICE_DFL",)
    assert [f.variable for f in report.filled] == ["__SCX_DSQ_LOCAL"]
    with pytest.raises(CustomizationError, match="must start with '__'"):
        fill_enum_variables(spec, sid, ("SCX_",))


def test_corpus_scx_simple_gets_every_enum_the_vm_kernel_has(sid: Btf) -> None:
    spec = open_object(corpus_object("k_simple"))
    names = [v.name for v in enum_variables(spec)]
    assert "__SCX_DSQ_LOCAL" in names and "__SCX_SLICE_DFL" in names
    _new, report = fill_enum_variables(spec, sid)
    ref = _all_enumerators(sid)
    filled = {f.variable: f.value for f in report.filled}
    for name in names:  # filled exactly when the kernel has it, with its value
        hits = ref.get(name[2:])
        if hits:
            assert filled[name] == hits[0][1]
        else:
            assert name in report.missing
    assert filled["__SCX_DSQ_LOCAL"] == BUILTIN | 2
