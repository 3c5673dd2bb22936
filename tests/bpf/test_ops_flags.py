"""``sched_ext_ops.flags`` by name (:mod:`schedswitchd.bpf.ops_flags`), the one resolver of
the CLI, the daemon configuration (:func:`schedswitchd.bpf.scheduler.apply_tunables`) and
profiles, against real kernel BTF: the cached sid kernel's (the VM kernel: ``enum
scx_ops_flags`` is an ENUM64 there, with 7.x's flags and without the removed
``SCX_OPS_HAS_CGROUP_WEIGHT``), the host's (no sched_ext: no such enum) and a built BTF
holding only the enum (as a plain ENUM, the form of kernels before ENUM64 BTF). Values as
the kernel defines them in ``kernel/sched/ext_internal.h``: KEEP_BUILTIN_IDLE 1 << 0,
ENQ_LAST 1 << 1, ENQ_EXITING 1 << 2, SWITCH_PARTIAL 1 << 3."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.ops_flags import OpsFlag, ops_flags_table, resolve_ops_flags, set_ops_flags
from schedswitchd.bpf.scheduler import apply_tunables, flags_by_name, sched_ext_map
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.cli.object_cmd import apply_ops_flags
from schedswitchd.daemon.config import SchedulerConfig, parse_config, struct_ops_request
from schedswitchd.errors import ConfigError, CustomizationError
from tests.build_outputs import missing_build_output, sid_kernel

REPO = Path(__file__).resolve().parents[2]
HOST_BTF = Path("/sys/kernel/btf/vmlinux")
FIFO = REPO / "build" / "bpf" / "fifo.bpf.o"
#: scx's compat flag that kernels since 6.18 no longer define (cgroup weights are always on)
GONE = "SCX_OPS_HAS_CGROUP_WEIGHT"


@pytest.fixture(scope="module")
def sid() -> Btf:
    return Btf.from_file(sid_kernel().vmlinux_btf, name="vmlinux")


@pytest.fixture(scope="module")
def fifo() -> ObjectSpec:
    if not FIFO.is_file():
        missing_build_output(FIFO, "schedulers")
    return open_object(FIFO)


def _flags_of(spec: ObjectSpec, ops_map: str) -> int:
    so = spec.map(ops_map).struct_ops
    assert so is not None
    mem = so.member("flags")
    assert mem is not None
    return int.from_bytes(so.data[mem.offset : mem.offset + mem.size], "little")


def test_table_of_the_vm_kernel(sid: Btf) -> None:
    table = ops_flags_table(sid)
    assert table["SCX_OPS_KEEP_BUILTIN_IDLE"] == 1
    assert table["SCX_OPS_ENQ_LAST"] == 1 << 1
    assert table["SCX_OPS_ENQ_EXITING"] == 1 << 2
    assert table["SCX_OPS_SWITCH_PARTIAL"] == 1 << 3
    assert GONE not in table
    assert not any(n.startswith("__") for n in table)  # the kernel's internal mask


def test_table_from_a_plain_enum() -> None:
    b = BtfBuilder()
    b.add_int("int", 4, signed=True)
    b.add_enum("scx_ops_flags", 4, [("SCX_OPS_ENQ_LAST", 2), ("SCX_OPS_X", 16)])
    b.add_enum("other", 4, [("SCX_OPS_NOT_HERE", 4)])
    btf = Btf.from_bytes(b.build(), name="fake")
    assert ops_flags_table(btf) == {"SCX_OPS_ENQ_LAST": 2, "SCX_OPS_X": 16}


def test_names_resolve_and_unknown_ones_drop(sid: Btf) -> None:
    res = resolve_ops_flags(
        ops_flags_table(sid),
        ["SCX_OPS_ENQ_LAST", OpsFlag("SCX_OPS_SWITCH_PARTIAL", required=True), GONE, GONE],
    )
    assert res.found == (("SCX_OPS_ENQ_LAST", 1 << 1), ("SCX_OPS_SWITCH_PARTIAL", 1 << 3))
    assert res.value == (1 << 1) | (1 << 3)
    assert res.dropped == (GONE,)
    assert res.notes == (f"sched_ext_ops.flags: flag {GONE} dropped: the kernel lacks it",)
    assert res.as_dict() == {
        "value": 10,
        "set": {"SCX_OPS_ENQ_LAST": 2, "SCX_OPS_SWITCH_PARTIAL": 8},
        "dropped": [GONE],
    }
    assert resolve_ops_flags(ops_flags_table(sid), []).value == 0


def test_required_flag_the_kernel_lacks_is_refused(sid: Btf) -> None:
    with pytest.raises(CustomizationError, match=f"required flag {GONE}: the kernel lacks") as e:
        resolve_ops_flags(ops_flags_table(sid), [OpsFlag(GONE, required=True)], where="here")
    assert str(e.value).startswith("here: ")
    assert "SCX_OPS_ENQ_LAST" in str(e.value)  # it says what the kernel has
    with pytest.raises(CustomizationError, match="no kernel BTF"):
        resolve_ops_flags(None, [OpsFlag("SCX_OPS_ENQ_LAST", required=True)])
    assert resolve_ops_flags(None, ["SCX_OPS_ENQ_LAST"]).dropped == ("SCX_OPS_ENQ_LAST",)


def test_host_kernel_without_sched_ext() -> None:
    if not HOST_BTF.is_file():
        pytest.skip("the host kernel exposes no vmlinux BTF")
    host = ops_flags_table(Btf.from_file(HOST_BTF, name="vmlinux"))
    assert host == {}
    res = resolve_ops_flags(host, ["SCX_OPS_ENQ_LAST"])
    assert res.value == 0 and res.dropped == ("SCX_OPS_ENQ_LAST",)
    assert "no enum scx_ops_flags" in res.notes[0]
    with pytest.raises(CustomizationError, match="no enum scx_ops_flags"):
        resolve_ops_flags(host, [OpsFlag("SCX_OPS_ENQ_LAST", required=True)])


def test_cli_replaces_the_object_flags(sid: Btf, fifo: ObjectSpec) -> None:
    ops = sched_ext_map(fifo)
    new, res = apply_ops_flags(fifo, sid, ["SCX_OPS_ENQ_EXITING", GONE], ["SCX_OPS_SWITCH_PARTIAL"])
    assert res is not None and res.value == (1 << 2) | (1 << 3) and res.dropped == (GONE,)
    assert res.notes[0].startswith("--ops-flag: ")
    assert _flags_of(new, ops) == res.value
    assert _flags_of(fifo, ops) != res.value  # specs are values: the input is untouched
    assert apply_ops_flags(fifo, sid, [], []) == (fifo, None)
    with pytest.raises(CustomizationError, match="required"):
        apply_ops_flags(fifo, sid, [], [GONE])


def test_config_names_through_apply_tunables(sid: Btf, fifo: ObjectSpec, tmp_path: Path) -> None:
    """The daemon's path: config -> :func:`struct_ops_request` -> :func:`apply_tunables`."""
    text = (
        "[schedulers.a]\n"
        'object = "a.bpf.o"\n'
        "[schedulers.a.struct_ops]\n"
        f'flags = ["SCX_OPS_ENQ_LAST", "{GONE}", '
        '{ name = "SCX_OPS_SWITCH_PARTIAL", required = true }]\n'
        "timeout_ms = 5000\n"
    )
    cfg = parse_config(text, str(tmp_path / "c.toml")).schedulers["a"]
    request = struct_ops_request(cfg)
    assert request["flags"] == [
        OpsFlag("SCX_OPS_ENQ_LAST"),
        OpsFlag(GONE),
        OpsFlag("SCX_OPS_SWITCH_PARTIAL", required=True),
    ]
    assert flags_by_name(request) and not flags_by_name({"flags": 3})
    ops = sched_ext_map(fifo)
    notes: list[str] = []
    out = apply_tunables(fifo, ops, {}, request, ops_flags=ops_flags_table(sid), notes=notes)
    assert _flags_of(out, ops) == (1 << 1) | (1 << 3)
    assert len(notes) == 1 and GONE in notes[0] and "struct_ops.flags" in notes[0]
    strict = parse_config(
        text.replace(f'"{GONE}", ', "").replace("SCX_OPS_SWITCH_PARTIAL", GONE),
        str(tmp_path / "c.toml"),
    ).schedulers["a"]
    with pytest.raises(CustomizationError, match=f"required flag {GONE}"):
        apply_tunables(fifo, ops, {}, struct_ops_request(strict), ops_flags=ops_flags_table(sid))


def test_config_refuses_bad_names_and_lists_elsewhere(tmp_path: Path) -> None:
    base = '[schedulers.a]\nobject = "a.bpf.o"\n[schedulers.a.struct_ops]\n'
    with pytest.raises(ConfigError, match="only 'flags' takes a list"):
        parse_config(base + 'timeout_ms = ["SCX_OPS_ENQ_LAST"]\n', str(tmp_path / "c.toml"))
    with pytest.raises(ConfigError, match=r"struct_ops\.flags"):
        parse_config(base + 'flags = ["enq_last"]\n', str(tmp_path / "c.toml"))


def test_set_ops_flags_needs_the_member(sid: Btf, fifo: ObjectSpec) -> None:
    with pytest.raises(CustomizationError):
        set_ops_flags(fifo, "no_such_map", ops_flags_table(sid), ["SCX_OPS_ENQ_LAST"])


def test_check_config_resolves_names(sid: Btf, fifo: ObjectSpec, tmp_path: Path) -> None:
    """``--check-config``'s static check runs the same resolver: a dropped name is a note,
    a required one the kernel lacks is a problem."""
    from schedswitchd.daemon.check_config import inspect_object

    def cfg(flags: str) -> SchedulerConfig:
        text = f'[schedulers.a]\nobject = "{FIFO}"\n[schedulers.a.struct_ops]\nflags = {flags}\n'
        return parse_config(text, str(tmp_path / "c.toml")).schedulers["a"]

    problems, notes = inspect_object(cfg(f'["SCX_OPS_ENQ_LAST", "{GONE}"]'), vmlinux=sid)
    assert not problems and any(f"flag {GONE} dropped" in n for n in notes), notes
    problems, _ = inspect_object(cfg(f'[{{ name = "{GONE}", required = true }}]'), vmlinux=sid)
    assert any(f"required flag {GONE}" in p for p in problems), problems
