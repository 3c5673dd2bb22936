"""Profiles in the daemon's configuration: lookup, modes, hint variants, and
``--check-config`` applying them with the loader's own code (no kernel)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from schedswitchd.daemon.check_config import check_config
from schedswitchd.daemon.config import parse_config, struct_ops_request
from schedswitchd.daemon.launcher_wire import MODE_SEPARATOR
from schedswitchd.errors import ConfigError
from tests.profile.fakesys import fake_sysfs

SCHED_C = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
struct sched_ext_ops { u64 flags; u32 timeout_ms; char name[128]; };
const volatile u32 nr_cpu_ids = 1;
const volatile u64 slice_ns = 5000000;
u32 armed;
u64 nr_dispatched;
struct args { int cpu_id; };
__attribute__((section("syscall"), used)) int enable_cpu(struct args *ctx) { return 0; }
__attribute__((section(".struct_ops.link"), used))
struct sched_ext_ops demo_ops = { .name = "demo" };
char LICENSE[] __attribute__((section("license"), used)) = "GPL";
"""

PROFILE = """
[profile]
name = "demo"
ops_name = "demo"
userspace = "none"

[variables]
nr_cpu_ids = { expr = "topo.nr_cpu_ids" }

[struct_ops]
timeout_ms = 20000
flags = ["SCX_OPS_ENQ_LAST"]

[[run]]
program = "enable_cpu"
for_each = "online_cpu"
args = { cpu_id = { expr = "cpu.id" } }

[[stats]]
name = "dispatched"
variable = "nr_dispatched"

[modes.gaming]
[modes.gaming.variables]
slice_ns = 1000000

[modes.powersave]
[modes.powersave.after_load]
armed = 1
"""


@pytest.fixture(scope="module")
def obj(compile_bpf: Callable[[str, str], Path]) -> Path:
    return compile_bpf(SCHED_C, "demo")


@pytest.fixture
def confdir(tmp_path: Path) -> Path:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "demo.toml").write_text(PROFILE)
    return tmp_path


def _conf(confdir: Path, obj: Path, extra: str = "", sched: str = "") -> str:
    return (
        f"[schedulers.demo]\nobject = '{obj}'\nprofile = 'demo'\n{sched}\n"
        "[hints.gaming]\nscheduler = 'demo'\nmode = 'gaming'\n"
        "[hints.desk]\nscheduler = 'demo'\n" + extra
    )


def test_profile_found_next_to_the_config_and_hint_modes(confdir: Path, obj: Path) -> None:
    path = confdir / "schedswitchd.toml"
    config = parse_config(_conf(confdir, obj, sched="mode = 'powersave'"), str(path))
    demo = config.schedulers["demo"]
    assert demo.profile_path == str((confdir / "profiles" / "demo.toml").resolve())
    assert demo.mode == "powersave"
    variant = f"demo{MODE_SEPARATOR}gaming"
    assert config.hints["gaming"].scheduler == variant
    assert config.schedulers[variant].mode == "gaming"
    assert config.schedulers[variant].profile_path == demo.profile_path
    assert config.hints["desk"].scheduler == "demo"
    # a hint naming the scheduler's own mode needs no variant
    same = parse_config(_conf(confdir, obj, sched="mode = 'gaming'"), str(path))
    assert same.hints["gaming"].scheduler == "demo" and variant not in same.schedulers
    # a profile by path, relative to the config file
    by_path = parse_config(
        f"[schedulers.x]\nobject = '{obj}'\nprofile = 'profiles/demo.toml'\n", str(path)
    )
    assert by_path.schedulers["x"].profile_path == demo.profile_path


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[schedulers.a]\nobject = 'x.o'\nprofile = 'nope'\n",
         r"schedulers\.a\.profile: no profile named 'nope'"),
        ("[schedulers.a]\nobject = 'x.o'\nprofile = 'demo'\nmode = 'fast'\n",
         r"schedulers\.a\.mode: profile 'demo' has no mode 'fast' \(modes: gaming, powersave\)"),
        ("[schedulers.a]\nobject = 'x.o'\nmode = 'gaming'\n",
         r"schedulers\.a\.mode: needs a profile"),
        ("[schedulers.a]\nobject = 'x.o'\n[hints.h]\nscheduler = 'a'\nmode = 'gaming'\n",
         r"hints\.h\.mode: scheduler 'a' has no profile"),
        ("[hints.h]\nscheduler = 'kernel'\nmode = 'gaming'\n", r"hints\.h\.mode: the kernel's"),
        ("[schedulers.a]\nobject = 'x.o'\nprofile = 'demo'\n[hints.h]\nscheduler = 'a'\n"
         "mode = 'x'\n", r"hints\.h\.mode: profile 'demo' has no mode 'x'"),
        ("[schedulers.a]\nobject = 'x.o'\nprofile_path = '/x'\n", "not a configuration key"),
        ("[schedulers.a]\nobject = 'x.o'\nprofile = 'demo'\nmode = 'Bad'\n",
         r"schedulers\.a\.mode"),
    ],
)  # fmt: skip
def test_profile_config_errors(confdir: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config(text, str(confdir / "s.toml"))


def test_check_config_applies_profile_and_mode(confdir: Path, obj: Path, tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path / "sys", possible=range(4), llcs=[[0, 1, 2, 3]])
    config = parse_config(_conf(confdir, obj), str(confdir / "s.toml"))
    results = {r.name: r for r in check_config(config, None, sysfs_root=sysfs)}
    assert results["demo"].ok and results["demo@gaming"].ok, results
    notes = "\n".join(results["demo@gaming"].notes)
    assert "profile demo mode gaming" in notes and "4 program runs" in notes
    assert "ops name 'demo'" in notes
    # this host's kernel has no enum scx_ops_flags: the named flag is dropped, with a note
    if not Path("/sys/kernel/sched_ext").exists():
        assert "flag SCX_OPS_ENQ_LAST dropped" in notes


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (("nr_cpu_ids = {", "no_such = 1\nnr_cpu_ids = {"),
         "variables.no_such: no global variable"),
        (('timeout_ms = 20000', 'timeout_ms = -1'), "timeout_ms: demo_ops.timeout_ms: -1 is out"),
        (('program = "enable_cpu"', 'program = "nope"'), "has no program 'nope'"),
        (('userspace = "none"', 'userspace = "a load balancer runs every 100 ms"'),
         "needs its own user space, which the daemon cannot replace: a load balancer"),
        (('ops_name = "demo"', 'ops_name = "other"'), "registers 'demo'"),
        (('flags = ["SCX_OPS_ENQ_LAST"]', 'required_flags = ["SCX_OPS_NOPE"]'), "required flag"),
        (("armed = 1", "nr_cpu_ids = 2"), "after_load.nr_cpu_ids: 'nr_cpu_ids' is in .rodata"),
        (('variable = "nr_dispatched"', 'variable = "nope"'), "stats.dispatched: no global"),
        (('args = { cpu_id', 'args = { cpu = 1, cpu_id'), "has no member 'cpu'"),
    ],
)  # fmt: skip
def test_check_config_finds_profile_problems(
    confdir: Path, obj: Path, tmp_path: Path, edit: tuple[str, str], problem: str
) -> None:
    old, new = edit
    assert old in PROFILE
    (confdir / "profiles" / "demo.toml").write_text(PROFILE.replace(old, new, 1))
    sysfs = fake_sysfs(tmp_path / "sys", possible=range(2))
    config = parse_config(
        f"[schedulers.demo]\nobject = '{obj}'\nprofile = 'demo'\nmode = 'powersave'\n",
        str(confdir / "s.toml"),
    )
    [result] = check_config(config, None, sysfs_root=sysfs)
    assert not result.ok and any(problem in p for p in result.problems), result.problems


def test_config_rodata_applies_on_top_of_the_profile(
    confdir: Path, obj: Path, tmp_path: Path
) -> None:
    """The configured rodata keys win over the profile's values (the check applies both
    with the loader's code; a wrong key is found in either)."""
    sysfs = fake_sysfs(tmp_path / "sys", possible=range(2))
    config = parse_config(
        f"[schedulers.demo]\nobject = '{obj}'\nprofile = 'demo'\nrodata = {{ nr_cpu_ids = 9 }}\n"
        "struct_ops = { timeout_ms = 5000 }\n",
        str(confdir / "s.toml"),
    )
    [result] = check_config(config, None, sysfs_root=sysfs)
    assert result.ok, result.problems
    from schedswitchd.bpf.object import open_object
    from schedswitchd.bpf.scheduler import apply_tunables
    from schedswitchd.profile.apply import profile_spec
    from schedswitchd.profile.model import load_profile
    from schedswitchd.profile.topology import read_topology

    cfg = config.schedulers["demo"]
    assert cfg.profile_path is not None
    ps = profile_spec(open_object(obj), load_profile(cfg.profile_path), read_topology(sysfs))
    spec = apply_tunables(ps.spec, "demo_ops", cfg.rodata, struct_ops_request(cfg))
    rodata = spec.map(".rodata")
    var = rodata.variable("nr_cpu_ids")
    assert var is not None and rodata.data is not None
    assert rodata.data[var.offset : var.offset + 4] == (9).to_bytes(4, "little")
    so = spec.map("demo_ops").struct_ops
    assert so is not None
    member = so.member("timeout_ms")
    assert member is not None
    assert so.data[member.offset : member.offset + 4] == (5000).to_bytes(4, "little")


def test_check_config_command_with_another_sysfs(
    confdir: Path, obj: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``schedswitchd --check-config --sysfs ROOT``: profiles resolved for that tree,
    statically only; a profile problem makes the exit status 1."""
    from schedswitchd.daemon.service import main

    sysfs = fake_sysfs(tmp_path / "sys", possible=range(3))
    path = confdir / "s.toml"
    path.write_text(_conf(confdir, obj))
    assert main(["--config", str(path), "--check-config", "--sysfs", str(sysfs)]) == 0
    out = capsys.readouterr().out
    assert "static checks only" in out and "demo@gaming: ok [object]" in out
    assert "3 program runs" in out  # one per online CPU of the fake tree
    (confdir / "profiles" / "demo.toml").write_text(
        PROFILE.replace("slice_ns = 1000000", "slice_ns = -1")
    )
    assert main(["--config", str(path), "--check-config", "--sysfs", str(sysfs)]) == 1
    assert "demo@gaming: FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["missing", "not sysfs"])
def test_check_config_refuses_a_sysfs_tree_that_is_not_one(
    obj: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """``--sysfs ROOT`` names a tree that does not exist, or holds no topology: exit 1 (as
    for a configuration that does not load) with the reason, also when no scheduler has a
    profile to resolve for it (the old code then checked the objects and exited 0)."""
    from schedswitchd.daemon.service import main

    root = tmp_path / "nosys"
    if kind == "not sysfs":
        root.mkdir()
    path = tmp_path / "s.toml"
    path.write_text(f"[schedulers.demo]\nobject = '{obj}'\n")  # no profile
    assert main(["--config", str(path), "--check-config", "--sysfs", str(root)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing was checked
    expected = (
        f"{root} does not exist (expected a sysfs tree: devices/system/cpu/possible)"
        if kind == "missing"
        else f"{root}/devices/system/cpu/possible is missing: not a sysfs tree"
    )
    assert captured.err == f"schedswitchd: --sysfs: {expected}\n"


SID_BTF = Path(__file__).resolve().parents[2] / "build" / "sid" / "vmlinux.btf"


def test_check_config_checks_every_mode_on_every_machine(
    confdir: Path, obj: Path, tmp_path: Path
) -> None:
    """A mode no hint names, with a misspelt member in a step that runs zero times on
    the configured machine (no SMT) and a key that fails only on the bundled 1-CPU
    tree: both found, each problem listed (not the first per scheduler)."""
    extra = (
        '[modes.unnamed]\n[[modes.unnamed.run]]\nprogram = "enable_cpu"\n'
        'for_each = "smt_pair"\nargs = { cpu_idx = { expr = "pair.cpu" } }\n'
        '[modes.unnamed.variables]\nslice_ns = { expr = "topo.cpus[1].id" }\n'
    )
    (confdir / "profiles" / "demo.toml").write_text(PROFILE + extra)
    sysfs = fake_sysfs(tmp_path / "sys", possible=range(2))
    config = parse_config(
        f"[schedulers.demo]\nobject = '{obj}'\nprofile = 'demo'\nmode = 'gaming'\n",
        str(confdir / "s.toml"),
    )
    [result] = check_config(config, None, sysfs_root=sysfs)
    assert not result.ok
    assert "mode unnamed: run[1] enable_cpu: args: args has no member 'cpu_idx'" in result.problems
    assert any(p.startswith("mode unnamed on bundled one_cpu: ") for p in result.problems)
    assert any(p.startswith("mode unnamed on bundled smt: ") for p in result.problems)
    assert any("every mode checked on " in n and "bundled numa" in n for n in result.notes)


def test_check_config_against_a_target_kernels_btf(
    confdir: Path, obj: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--vmlinux build/sid/vmlinux.btf``: flags resolve against the sched_ext kernel's
    BTF (none dropped) and kernel_enum() answers, on a host without sched_ext."""
    from schedswitchd.daemon.service import main

    if not SID_BTF.is_file():
        from tests.build_outputs import missing_build_output

        missing_build_output(SID_BTF)
    (confdir / "profiles" / "demo.toml").write_text(
        PROFILE.replace(
            "slice_ns = 1000000", "slice_ns = { expr = \"kernel_enum('SCX_SLICE_DFL')\" }"
        )
    )
    sysfs = fake_sysfs(tmp_path / "sys", possible=range(2))
    path = confdir / "s.toml"
    path.write_text(_conf(confdir, obj))
    argv = ["--config", str(path), "--check-config", "--sysfs", str(sysfs)]
    assert main([*argv, "--vmlinux", str(SID_BTF)]) == 0
    out = capsys.readouterr().out
    assert "demo@gaming: ok" in out and "dropped" not in out
    assert f"kernel BTF: {SID_BTF} (given)" in out
    missing = tmp_path / "nope"
    assert main([*argv, "--vmlinux", str(missing)]) == 1
    assert capsys.readouterr().err == f"schedswitchd: --vmlinux: {missing} is not a file\n"
    not_btf = tmp_path / "not.btf"
    not_btf.write_bytes(b"\x9f\xeb" + bytes(40))  # BTF's magic, then no valid header
    assert main([*argv, "--vmlinux", str(not_btf)]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(f"schedswitchd: --vmlinux: {not_btf}: "), captured.err
    assert "checking schedulers" not in captured.out  # nothing checked against no BTF
    if not Path("/sys/kernel/sched_ext").exists():  # this host's BTF has no sched_ext
        assert main(argv) == 1
        assert "kernel_enum" in capsys.readouterr().out


def test_check_config_reports_a_mode_run_as_its_executable(
    confdir: Path, obj: Path, tmp_path: Path
) -> None:
    """A mode whose user space the daemon cannot do, with the scheduler's program
    configured, is checked as that program (depth ``executable``), not refused; the other
    modes are checked as objects."""
    polling = PROFILE + '\n[modes.polling]\nuserspace = "its user space polls every 250 ms"\n'
    (confdir / "profiles" / "demo.toml").write_text(polling)
    exe = confdir / "scx_demo"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    sysfs = fake_sysfs(tmp_path / "sys", possible=range(2))
    config = parse_config(
        f"[schedulers.demo]\nobject = '{obj}'\nprofile = 'demo'\nexecutable = 'scx_demo'\n"
        "[schedulers.demo.modes.polling]\nargs = ['-p', '250']\n"
        "[hints.poll]\nscheduler = 'demo'\nmode = 'polling'\n",
        str(confdir / "s.toml"),
    )
    results = {r.name: r for r in check_config(config, None, sysfs_root=sysfs)}
    assert results["demo"].ok and results["demo"].depth == "object", results["demo"]
    polled = results["demo@polling"]
    assert polled.ok and polled.depth == "executable", polled
    assert polled.notes == [f"runs as its executable (docs/executables.md): {exe} -p 250"]
