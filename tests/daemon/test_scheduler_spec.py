"""build_scheduler_spec, the one step between open and load, on a real scheduler object
(build/tests/vm/bpf/profiled.bpf.o with its profile) and the sid kernel's BTF (which has
sched_ext's flags): every input that changes the spec changes its freshness key."""

from __future__ import annotations

import inspect
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.elf import read_elf
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.scheduler_spec import (
    SchedulerSpec,
    build_scheduler_spec,
    read_profile_file,
    spec_inputs,
)
from schedswitchd.errors import CustomizationError, LoadError
from schedswitchd.kernel.spec_cache import SpecCache
from schedswitchd.profile.topology import Topology, read_topology
from tests.build_outputs import missing_build_output
from tests.profile.fakesys import fake_sysfs

REPO = Path(__file__).resolve().parents[2]
OBJECT = REPO / "build" / "tests" / "vm" / "bpf" / "profiled.bpf.o"
PROFILE = REPO / "tests" / "vm" / "profiles" / "profiled.toml"
SID_BTF = REPO / "build" / "sid" / "vmlinux.btf"


@dataclass
class Inputs:
    """The baseline's inputs and a second value of each, files copied under ``tmp``."""

    tmp: Path
    sid: Btf
    obj: Path
    profile: Path
    topology: Topology

    def cfg(self, profile_path: str | None = "", **more: Any) -> SchedulerConfig:
        """The configuration entry (``profile_path`` as the configuration's parser sets
        it; ``""``: the baseline's profile)."""
        cfg = SchedulerConfig.model_validate(
            {
                "object": str(self.obj),
                "struct_ops": {"flags": ["SCX_OPS_ENQ_LAST"]},
                "hotplug_seq": True,
                **more,
            }
        )
        path = str(self.profile) if profile_path == "" else profile_path
        return cfg.model_copy(update={"profile_path": path})

    def base(self) -> dict[str, Any]:
        cfg = self.cfg()
        return {
            "opened": SpecCache().open(self.obj),
            "cfg": cfg,
            "topology": self.topology,
            "vmlinux": self.sid,
            "profile": read_profile_file(self.profile),
            "hotplug_seq": 5,
            "ops_type": "sched_ext_ops",
        }


@pytest.fixture(scope="module")
def sid_btf() -> Btf:
    if not SID_BTF.is_file():
        missing_build_output(SID_BTF, "kernel")
    return Btf.from_file(SID_BTF, name="vmlinux")


@pytest.fixture
def inputs(tmp_path: Path, sid_btf: Btf) -> Inputs:
    if not OBJECT.is_file():
        missing_build_output(OBJECT, "schedulers")
    obj = tmp_path / "profiled.bpf.o"
    shutil.copyfile(OBJECT, obj)
    profile = tmp_path / "profiled.toml"
    shutil.copyfile(PROFILE, profile)
    sysfs = fake_sysfs(tmp_path / "sys4", possible=range(4), llcs=[[0, 1], [2, 3]])
    return Inputs(tmp_path, sid_btf, obj, profile, read_topology(sysfs))


def _rebuilt_object(inp: Inputs) -> dict[str, Any]:
    """The object rebuilt in place (same path) with another default ``slice_ns``: its
    ``.rodata`` bytes patched in the file."""
    raw = bytearray(inp.obj.read_bytes())
    rodata = read_elf(bytes(raw)).section_by_name(".rodata")
    assert rodata is not None
    old = struct.pack("<Q", 20_000_000)
    at = raw.index(rodata.data) + rodata.data.index(old)
    raw[at : at + 8] = struct.pack("<Q", 7_000_000)
    inp.obj.write_bytes(raw)
    return {"opened": SpecCache().open(inp.obj)}


def _rodata_key(inp: Inputs) -> dict[str, Any]:
    return {"cfg": inp.cfg(rodata={"slice_ns": 3_000_000})}


def _other_profile(inp: Inputs) -> dict[str, Any]:
    """The profile file edited in place: the configuration names the same path."""
    inp.profile.write_text(PROFILE.read_text().replace("timeout_ms = 20000", "timeout_ms = 9000"))
    return {"profile": read_profile_file(inp.profile)}


def _two_cpus(inp: Inputs) -> dict[str, Any]:
    return {"topology": read_topology(fake_sysfs(inp.tmp / "sys2", possible=range(2)))}


#: For each input of build_scheduler_spec, a second value that changes the spec it builds
#: (on_profile only reports; ops_type is checked apart, below).
VARIANTS: dict[str, Callable[[Inputs], dict[str, Any]]] = {
    "opened": _rebuilt_object,
    "cfg": _rodata_key,
    "profile": _other_profile,
    "topology": _two_cpus,
    "vmlinux": lambda inp: {"vmlinux": None},  # the named flag is dropped
    "hotplug_seq": lambda inp: {"hotplug_seq": 6},
    "ops_type": lambda inp: {},
}


def _image(built: SchedulerSpec) -> list[tuple[str, bytes, bytes]]:
    """What the loader writes into the kernel of each map: its initial data and its
    struct_ops value."""
    spec: ObjectSpec = built.spec
    return [
        (
            m.name,
            bytes(m.data or b""),
            bytes(m.struct_ops.data) if m.struct_ops is not None else b"",
        )
        for m in spec.maps
    ]


def test_every_input_of_the_build_has_a_variant() -> None:
    """A new input of build_scheduler_spec needs a variant here (and a place in the key)."""
    params = set(inspect.signature(build_scheduler_spec).parameters) - {"on_profile"}
    assert params == set(VARIANTS)


@pytest.mark.parametrize("name", [n for n in VARIANTS if n != "ops_type"])
def test_an_input_that_changes_the_spec_changes_its_key(inputs: Inputs, name: str) -> None:
    base_args = inputs.base()
    base = build_scheduler_spec(**base_args)
    other = build_scheduler_spec(**(base_args | VARIANTS[name](inputs)))
    assert _image(other) != _image(base), f"the {name} variant does not reach the spec"
    assert other.inputs != base.inputs, f"{name} changes the spec but not its key"
    # the same inputs again: the same key (a standby built from them stays fresh)
    assert build_scheduler_spec(**base_args).inputs == base.inputs


def test_the_ops_type_is_part_of_the_key(inputs: Inputs) -> None:
    """No object holds schedulers of two struct_ops types, so no build differs by the
    type alone: the object is refused under another one, and the key tells them apart."""
    args = inputs.base()
    with pytest.raises(LoadError, match="tcp_congestion_ops"):
        build_scheduler_spec(**(args | {"ops_type": "tcp_congestion_ops"}))
    built = build_scheduler_spec(**args)
    assert built.inputs._replace(ops_type="tcp_congestion_ops") != built.inputs


def test_inputs_that_do_not_reach_the_spec_stay_out_of_the_key(inputs: Inputs) -> None:
    """Without a profile the topology is not read into the spec, and without
    ``hotplug_seq = true`` the kernel's value is not written: a CPU coming or going leaves
    such a standby fresh. Without named flags or a profile the kernel BTF is not read."""
    args = inputs.base() | {
        "cfg": inputs.cfg(profile_path=None, struct_ops={}, hotplug_seq=False),
        "profile": None,
    }
    base = build_scheduler_spec(**args)
    for change in ({"hotplug_seq": 6}, _two_cpus(inputs), {"vmlinux": None}):
        other = build_scheduler_spec(**(args | change))
        assert _image(other) == _image(base) and other.inputs == base.inputs, change


def test_the_build_applies_profile_then_configuration(inputs: Inputs) -> None:
    """The configuration's keys win over the profile's values (its mode's ``slice_ns``
    here), the flags come from the
    kernel BTF given, ``hotplug_seq`` is written, and the profile's plan is kept."""
    args = inputs.base() | {"cfg": inputs.cfg(rodata={"slice_ns": 3_000_000}, mode="short")}
    seen: list[str] = []
    built = build_scheduler_spec(**args, on_profile=lambda p, applied: seen.append(p.name))
    assert seen == ["profiled"] and built.ops_name == "ss_profiled"
    assert built.plan is not None and len(built.plan.runs) == 4  # one per online CPU
    rodata = built.spec.map(".rodata")
    slice_ns = rodata.variable("slice_ns")
    assert slice_ns is not None and rodata.data is not None
    assert rodata.data[slice_ns.offset : slice_ns.offset + 8] == struct.pack("<Q", 3_000_000)
    so = built.spec.map(built.ops_map).struct_ops
    assert so is not None
    values = {}
    for member in ("hotplug_seq", "flags", "timeout_ms"):
        m = so.member(member)
        assert m is not None
        size = 4 if member == "timeout_ms" else 8
        values[member] = int.from_bytes(so.data[m.offset : m.offset + size], "little")
    assert values["hotplug_seq"] == 5 and values["timeout_ms"] == 20000
    assert values["flags"] != 0 and not built.flag_notes
    without_btf = build_scheduler_spec(**(args | {"vmlinux": None}))
    assert any("SCX_OPS_ENQ_LAST" in n for n in without_btf.flag_notes)


def test_a_bad_key_fails_after_the_profile_was_reported(inputs: Inputs) -> None:
    seen: list[str] = []
    with pytest.raises(CustomizationError, match=r"rodata\.nope"):
        build_scheduler_spec(
            **(inputs.base() | {"cfg": inputs.cfg(rodata={"nope": 1})}),
            on_profile=lambda p, applied: seen.append(p.name),
        )
    assert seen == ["profiled"]


def test_the_key_follows_the_files_not_their_names(inputs: Inputs) -> None:
    """A rewritten object file (same path, new inode or mtime) is another input."""
    base = build_scheduler_spec(**inputs.base())
    os.utime(inputs.obj, ns=(1, 1))
    again = build_scheduler_spec(**inputs.base())
    assert again.inputs.object != base.inputs.object and again.inputs != base.inputs
    assert (
        spec_inputs(
            base.inputs.object,
            base.inputs.config,
            profile_key=base.inputs.profile,
            topology=base.inputs.topology,
            vmlinux=base.inputs.vmlinux,
            hotplug_seq=base.inputs.hotplug_seq,
            ops_type=base.inputs.ops_type,
        )
        == base.inputs
    )
