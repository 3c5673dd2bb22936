"""``schedswitchctl object inspect``: text and JSON output, CO-RE against host vmlinux."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.cli import ctl

Obj = Callable[[str], Path]
VMLINUX = Path("/sys/kernel/btf/vmlinux")


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert ctl.main(["object", "inspect", *argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert isinstance(out, dict)
    return out


def test_inspect_struct_ops_json(bpf_object: Obj, capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, str(bpf_object("struct_ops")))
    assert d["name"] == "struct_ops" and d["kmod_btfs"] is None and d["core"] is None
    maps = {m["name"]: m for m in d["maps"]}  # type: ignore[attr-defined]
    assert maps["ssd_link"]["flags"] == 0x2000
    assert maps["ssd_link"]["struct_ops"]["programs"]["release"] == "ssd_release"
    progs = {p["name"]: p for p in d["programs"]}  # type: ignore[attr-defined]
    assert progs["ssd_release"]["sleepable"] and not progs["ssd_release"]["autoload"]


def test_inspect_kmods_and_text(bpf_object: Obj, capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, str(bpf_object("kmod_fixed")))
    assert d["kmod_btfs"] == ["nf_tables", "xfs", "no_such_module_xyz"]
    assert ctl.main(["object", "inspect", str(bpf_object("globals"))]) == 0
    text = capsys.readouterr().out
    assert "globals.rodata" in text and "nr_cpus" in text and "kmod_btfs: (none declared" in text


@pytest.mark.skipif(not VMLINUX.exists(), reason="host kernel has no /sys/kernel/btf/vmlinux")
def test_inspect_core_against_host_vmlinux(
    bpf_object: Obj, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _json(capsys, str(bpf_object("core_kinds")))
    core = d["core"]
    assert isinstance(core, list) and len(core) == 26
    kinds = {c["kind"] for c in core}
    assert {"FIELD_BYTE_OFFSET", "TYPE_SIZE", "ENUMVAL_VALUE", "TYPE_ID_TARGET"} <= kinds
    assert any(c["poisoned"] for c in core)
    assert all(c["target_btf"] in (None, "vmlinux", "local") for c in core)
    # TYPE_ID_LOCAL needs no target: found, in the object's own BTF, and the text says so
    local = [c for c in core if c["kind"] == "TYPE_ID_LOCAL"]
    assert local and all(c["found"] and c["target_btf"] == "local" for c in local)
    assert all(c["local"] == c["target"] for c in local)
    assert ctl.main(["object", "inspect", str(bpf_object("core_kinds"))]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "TYPE_ID_LOCAL" in ln]
    assert lines and all(ln.endswith("[local]") for ln in lines), lines


def test_inspect_bad_file_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "x.bpf.o"
    bad.write_bytes(b"\x7fELF" + bytes(100))
    assert ctl.main(["object", "inspect", str(bad)]) == 1
    assert "schedswitchctl:" in capsys.readouterr().err


OPS_C = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
struct sched_ext_ops {
	u32 dispatch_max_batch; u64 flags; u32 timeout_ms; u32 exit_dump_len; char name[128];
	void *priv;
};
__attribute__((section(".struct_ops.link"), used))
struct sched_ext_ops ssd_scalars = {
	.dispatch_max_batch = 8, .flags = 0x46 | (1ULL << 40), .timeout_ms = 7000,
	.exit_dump_len = 4096, .name = "scalars",
};
char LICENSE[] __attribute__((section("license"), used)) = "GPL";
"""
SID_BTF = Path(__file__).resolve().parents[2] / "build" / "sid" / "vmlinux.btf"


def test_inspect_shows_struct_ops_scalars(
    compile_bpf: Callable[[str, str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """timeout_ms, exit_dump_len, dispatch_max_batch and the name as compiled; flags by
    name from a sched_ext kernel's BTF (bits no name covers in hex), a pointer left out."""
    obj = compile_bpf(OPS_C, "ops")
    if not SID_BTF.is_file():
        from tests.build_outputs import missing_build_output

        missing_build_output(SID_BTF)
    d = _json(capsys, str(obj), "--vmlinux", str(SID_BTF))
    [ops] = [m["struct_ops"] for m in d["maps"] if "struct_ops" in m]  # type: ignore[attr-defined]
    assert ops["scalars"] == {
        "dispatch_max_batch": 8,
        "flags": 0x46 | (1 << 40),
        "timeout_ms": 7000,
        "exit_dump_len": 4096,
        "name": "scalars",
        "flags_names": [
            "SCX_OPS_ENQ_LAST",
            "SCX_OPS_ENQ_EXITING",
            "SCX_OPS_BUILTIN_IDLE_PER_NODE",
            "0x10000000000",
        ],
    }
    assert ctl.main(["object", "inspect", str(obj), "--vmlinux", str(SID_BTF)]) == 0
    text = capsys.readouterr().out
    assert ".timeout_ms = 7000" in text and ".dispatch_max_batch = 8" in text
    assert ".exit_dump_len = 4096" in text
    assert (
        ".flags = 0x10000000046 (SCX_OPS_ENQ_LAST | SCX_OPS_ENQ_EXITING | "
        "SCX_OPS_BUILTIN_IDLE_PER_NODE | 0x10000000000)" in text
    )
