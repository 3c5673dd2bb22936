"""``schedswitchctl object load/unload`` on the host kernel with the struct_ops object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.cli.ctl import main
from schedswitchd.cli.object_cmd import apply_sets, parse_value
from schedswitchd.errors import CustomizationError
from tests.build_outputs import missing_build_output
from tests.kernel.unique_ops import ca_name, unique_object

pytestmark = pytest.mark.root

OBJ = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf" / "struct_ops.bpf.o"
CA_LIST = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
#: The congestion controls registered, named for this process (tests/kernel/unique_ops.py).
PLAIN, LINK, CLI = ca_name("ssd_plain"), ca_name("ssd_link"), ca_name("ssd_cli")


def _obj() -> str:
    if not OBJ.is_file():
        missing_build_output(OBJ, "test-objects")
    return str(unique_object(OBJ))


def test_load_pin_then_unload(bpffs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pin_dir = bpffs / "cli"
    assert (
        main(
            [
                "object",
                "load",
                _obj(),
                "--pin",
                str(pin_dir),
                "--json",
                "--set",
                f"ssd_link.name={CLI}",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in out["programs"]} >= {"ssd_ssthresh", "ssd_undo_cwnd"}
    assert all(p["id"] > 0 for p in out["programs"])
    assert out["links"] == ["ssd_link"]
    assert {"btf", "maps"} <= set(out["timings_ns"]) and "attach" in out["timings_ns"]
    assert CLI in CA_LIST.read_text().split()  # live after the command returned
    assert main(["object", "unload", str(pin_dir)]) == 0
    assert CLI not in CA_LIST.read_text().split()
    assert PLAIN not in CA_LIST.read_text().split()
    assert not pin_dir.exists()


def test_load_without_pin_leaves_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["object", "load", _obj()]) == 0
    assert "unloaded" in capsys.readouterr().out
    assert LINK not in CA_LIST.read_text().split()
    assert PLAIN not in CA_LIST.read_text().split()


def test_set_parsing() -> None:
    assert parse_value("0x10") == 16 and parse_value("true") is True and parse_value("x") == "x"
    spec = open_object(_obj())
    with pytest.raises(CustomizationError, match="VAR=VALUE"):
        apply_sets(spec, ["novalue"])
    edited = apply_sets(spec, ["ssd_plain.flags=0"])
    so = edited.map("ssd_plain").struct_ops
    assert so is not None and so.data != spec.map("ssd_plain").struct_ops.data  # type: ignore[union-attr]


def test_pin_to_a_missing_directory_off_bpffs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "a" / "b"
    assert main(["object", "load", _obj(), "--pin", str(target)]) == 1
    err = capsys.readouterr().err
    assert "not on a bpf filesystem" in err and err.count("\n") == 1
    assert not (tmp_path / "a").exists()  # nothing created off bpffs
    assert LINK not in CA_LIST.read_text().split()


def test_second_load_of_a_registered_struct_ops_names_it(
    bpffs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pin_dir = bpffs / "first"
    assert main(["object", "load", _obj(), "--pin", str(pin_dir)]) == 0
    capsys.readouterr()
    try:
        assert main(["object", "load", _obj()]) == 1
        err = capsys.readouterr().err
        assert f"tcp_congestion_ops '{PLAIN}'" in err and "is already registered" in err
        assert "EEXIST" not in err and err.count("\n") == 1
    finally:
        assert main(["object", "unload", str(pin_dir)]) == 0
    assert LINK not in CA_LIST.read_text().split()


def _failing_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """``object load`` then opens an object whose ``indexed`` program reads past ``counter``
    when ``tunable`` is 4096: the verifier refuses it (a real load, not a fake)."""
    from tests.kernel.loader_specs import object_spec, with_indexed_read

    monkeypatch.setattr(
        "schedswitchd.cli.object_cmd.open_object_noted",
        lambda path: (with_indexed_read(object_spec()), None),
    )


def test_verifier_failure_shows_the_log_on_request(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _failing_spec(monkeypatch)
    argv = ["object", "load", "x.bpf.o", "--set", "tunable=4096"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--verbose" in err and "indexed" in err
    assert main([*argv, "--verbose"]) == 1
    err = capsys.readouterr().err
    assert "invalid access to map value" in err and err.count("\n") > 2
    assert main([*argv, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["error"]["code"] == "load" and "indexed" in out["error"]["message"]
    assert "invalid access to map value" in out["error"]["verifier_log"]


def test_required_ops_flag_refused_on_a_kernel_without_sched_ext(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--require-ops-flag`` against the host's vmlinux BTF (no ``enum scx_ops_flags``):
    refused before anything is loaded, naming the flag; ``--ops-flag`` on an object without
    ``sched_ext_ops`` is refused too (there is no flags member it could mean)."""
    fifo = OBJ.parents[2] / "bpf" / "fifo.bpf.o"
    if not fifo.is_file():
        missing_build_output(fifo, "schedulers")
    assert main(["object", "load", str(fifo), "--require-ops-flag", "SCX_OPS_ENQ_LAST"]) == 1
    err = capsys.readouterr().err
    assert "required flag SCX_OPS_ENQ_LAST" in err and "no enum scx_ops_flags" in err, err
    assert main(["object", "load", _obj(), "--ops-flag", "SCX_OPS_ENQ_LAST"]) == 1
    assert "no struct sched_ext_ops" in capsys.readouterr().err


def test_a_scheduler_on_a_kernel_without_sched_ext_says_why_it_cannot_load(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On the host kernel a sched_ext scheduler fails at its first kfunc; the one-line error
    says the kernel has no sched_ext (as the daemon does), still code ``load``. An object
    that is not a scheduler loads as before (test_load_without_pin_leaves_nothing)."""
    if Path("/sys/kernel/sched_ext").exists():
        pytest.skip("this kernel has sched_ext")
    fifo = OBJ.parents[2] / "bpf" / "fifo.bpf.o"
    if not fifo.is_file():
        missing_build_output(fifo, "schedulers")
    assert main(["object", "load", str(fifo)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found in kernel BTF" in err, err
    assert "this kernel has no sched_ext" in err and "CONFIG_SCHED_CLASS_EXT" in err, err
    assert main(["object", "load", str(fifo), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["error"]["code"] == "load" and "no sched_ext" in out["error"]["message"]
