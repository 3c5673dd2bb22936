"""Config: the shipped file validates; unknown keys and bad values name file, key and reason."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.bpf.elf import read_elf
from schedswitchd.daemon import check_config
from schedswitchd.daemon.config import Config, json_schema, load_config, parse_config
from schedswitchd.errors import ConfigError
from tests.build_outputs import missing_build_output

from .fakes import FakeBackend

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "config" / "schedswitchd.toml"

MINIMAL = """
default = "fifo"
[schedulers.fifo]
object = "fifo.bpf.o"
[hints.gaming]
scheduler = "fifo"
priority = 5
"""


def error_of(text: str, path: str = "/etc/s.toml") -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, path)
    return str(exc.value)


def test_shipped_config_is_valid() -> None:
    config = load_config(SHIPPED)
    assert config.source == str(SHIPPED)
    assert set(config.hints) >= {"gaming", "video-call", "battery"}
    assert config.hints["gaming"].scheduler == "latency"
    assert set(config.schedulers) == {"fifo", "vtime", "latency", "faulty"}
    for name, spec in config.schedulers.items():
        assert Path(spec.object).is_absolute(), name
        assert spec.object.startswith(str(ROOT / "build" / "bpf"))


def test_minimal_and_defaults() -> None:
    config = parse_config(MINIMAL, "/etc/schedswitchd/x.toml")
    assert config.schedulers["fifo"].object == "/etc/schedswitchd/fifo.bpf.o"
    assert config.auth.admin_uids == [0] and config.limits.max_message_bytes == 4096
    assert parse_config("").default == "kernel"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bogus = 1", "/etc/s.toml: bogus: unknown key"),
        ("[limits]\nmax_conections = 3", "limits.max_conections: unknown key"),
        ('[limits]\nmax_connections = "3"', "limits.max_connections: Input should be a valid"),
        ("[limits]\nmax_connections = 0", "limits.max_connections: Input should be greater"),
        ("[socket]\npath = 'rel.sock'", "socket.path: must be an absolute path"),
        ("[socket]\nmode = 0o1777", "socket.mode"),
        ("[auth]\nadmin_gids = ['no-such-group-xyz']", "unknown group 'no-such-group-xyz'"),
        ("[auth]\nadmin_uids = [-1]", "auth.admin_uids.0"),
        ('default = "nope"', "default 'nope' is neither 'kernel' nor a scheduler"),
        ('[hints.gaming]\nscheduler = "nope"', "hints.gaming.scheduler 'nope' is not a configured"),
        ("[schedulers.Fifo]\nobject = 'x'", "'Fifo' is not a valid name"),
        ("[schedulers.kernel]\nobject = 'x'", "'kernel' is reserved"),
        ("[schedulers.x]\nobjekt = 'x'", "schedulers.x.objekt: unknown key"),
        ("[schedulers.x]\nobject = 'x'\nrodata = { 'a-b' = 1 }", "'a-b' is not a C identifier"),
        ("[schedulers.x]\nobject = 'x'\nrodata = { a = 'str' }", "schedulers.x.rodata.a"),
        (
            "[schedulers.x]\nobject = 'x'\nstruct_ops = { name = 1 }",
            "'name' is not a settable sched_ext_ops field",
        ),
        (
            "[schedulers.x]\nobject = 'x'\nstruct_ops = { flags = -1 }",
            "does not fit an unsigned 64-bit field",
        ),
        ("[backoff]\nbase_s = 10.0\nmax_s = 1.0", "max_s must be >= base_s"),
        ("[logging]\nlevel = 'loud'", "logging.level"),
        ("source = 'x'", "'source' is not a configuration key"),
        ("default = ", "(syntax)"),
    ],
)
def test_errors_name_file_key_reason(text: str, expected: str) -> None:
    message = error_of(text)
    assert message.startswith("/etc/s.toml: ")
    assert expected in message


def test_all_problems_reported_at_once() -> None:
    message = error_of("a = 1\nb = 2\n[limits]\nmax_connections = 0")
    assert message.count("\n") == 2


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"default = '\xff'")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(bad)


def test_schema_is_json_and_covers_keys() -> None:
    schema = json_schema()
    json.dumps(schema)
    props = schema["properties"]
    assert {"socket", "auth", "schedulers", "hints", "default", "btf_cache", "logging"} <= set(
        props
    )
    assert "source" not in props
    assert schema["additionalProperties"] is False


# --- --check-config's object inspection ------------------------------------------------------

SCHED_C = r"""
struct sched_ext_ops { char name[128]; unsigned int timeout_ms; };
const volatile unsigned long long slice_ns = 5000000;
__attribute__((section(".kmod_btfs"), used)) const char kmods[] = "nf_tables\0kvm\0";
__attribute__((section(".struct_ops.link"), used))
struct sched_ext_ops test_ops = { .name = "test" };
"""


@pytest.fixture(scope="module")
def bpf_object(compile_bpf: Callable[[str, str], Path]) -> Path:
    return compile_bpf(SCHED_C, "t")


def conf_for(path: Path, rodata: str = "") -> Config:
    return parse_config(f"[schedulers.t]\nobject = '{path}'\n{rodata}", "/etc/s.toml")


def test_check_accepts_scheduler_object(bpf_object: Path) -> None:
    config = conf_for(bpf_object, "rodata = { slice_ns = 1000 }")
    [result] = check_config.check_config(config, None)
    assert result.ok and result.depth == "object", result.problems
    assert ".kmod_btfs declares: nf_tables, kvm" in result.notes
    report = check_config.format_report(config, [result], None)
    assert "NOT checked: CO-RE" in report and "t: ok [object]" in report
    assert "ops name 'test'" in result.notes


def _misaligned_line_info(raw: bytes) -> bytes:
    """``raw`` with its first line_info record 4 bytes off its instruction: refused when
    the program using it is linked (at first use, not in open_object)."""
    ext = read_elf(raw).section_by_name(".BTF.ext")
    assert ext is not None
    (hdr_len,) = struct.unpack_from("<I", ext.data, 4)  # struct btf_ext_header
    (li_off,) = struct.unpack_from("<I", ext.data, 16)
    first = raw.index(ext.data) + hdr_len + li_off + 4 + 8  # rec_size, group header
    out = bytearray(raw)
    struct.pack_into("<I", out, first, struct.unpack_from("<I", out, first)[0] + 4)
    return bytes(out)


def test_check_rejects_bad_objects(bpf_object: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.o"
    junk.write_bytes(b"\x7fELF" + b"\x02\x01\x01" + b"\0" * 20)
    linked = Path(__file__).resolve().parents[2] / "build/tests/bpf/shared_subprogs.bpf.o"
    if not linked.exists():
        missing_build_output(linked)
    bad_code = tmp_path / "bad_code.bpf.o"
    bad_code.write_bytes(_misaligned_line_info(linked.read_bytes()))
    exe = Path(__file__).resolve().parents[2] / "build" / "tests" / "embed" / "no_obj"
    if not exe.exists():
        missing_build_output(exe)
    cases = [
        (conf_for(tmp_path / "missing.o"), "No such file"),
        (conf_for(exe), "embeds no BPF object"),
        (conf_for(bpf_object, "rodata = { nope = 1 }"), "rodata.nope: no such .rodata variable"),
        (conf_for(bpf_object, "struct_ops = { flags = 1 }"), "sched_ext_ops has no member 'flags'"),
        (conf_for(junk), "truncated ELF file"),
        (conf_for(bad_code), "is misaligned"),
    ]
    for config, problem in cases:
        [result] = check_config.check_config(config, None)
        assert not result.ok and any(problem in p for p in result.problems), result.problems


def test_check_prepares_through_backend(bpf_object: Path) -> None:
    config = conf_for(bpf_object)
    backend = FakeBackend()
    [result] = check_config.check_config(config, backend)
    assert result.ok and result.depth == "prepared" and backend.calls == ["prepare t", "discard t"]
    assert not backend.live
    backend = FakeBackend(verifier_reject={"t"})
    [result] = check_config.check_config(config, backend)
    assert not result.ok and "verifier log:\nR1 invalid mem access" in result.notes


def test_check_without_sched_ext_says_so_and_skips_prepare(bpf_object: Path) -> None:
    config = conf_for(bpf_object)
    backend = FakeBackend(state="unavailable")
    [result] = check_config.check_config(config, backend)
    assert result.ok and result.depth == "object" and backend.calls == []
    report = check_config.format_report(config, [result], "kernel", no_sched_ext=True)
    lines = report.splitlines()
    assert lines[0].startswith("NOTE: this kernel has no sched_ext (/sys/kernel/sched_ext")
    assert "NOT checked: CO-RE and loading" in report


def test_whole_file_errors_have_no_empty_key_prefix() -> None:
    message = error_of('[hints.gaming]\nscheduler = "nope"')
    assert message.startswith("/etc/s.toml: hints.gaming.scheduler 'nope'"), message
    assert "(top level)" not in message


def test_the_report_names_the_kernel_btf_it_checked_against(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = parse_config("", "/etc/s.toml")
    given = tmp_path / "vmlinux.btf"
    assert f"kernel BTF: {given} (given)\n" in check_config.format_report(
        config, [], None, vmlinux=given
    )
    running = tmp_path / "running"
    running.write_bytes(b"")
    monkeypatch.setattr(check_config, "VMLINUX", running)
    assert f"kernel BTF: {running} (the running kernel's)\n" in check_config.format_report(
        config, [], None
    )
    running.unlink()
    assert f"kernel BTF: none ({running} is absent" in check_config.format_report(config, [], None)
