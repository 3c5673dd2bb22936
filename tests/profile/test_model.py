"""Profile TOML -> model -> values resolved for a (fake) machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedswitchd.errors import ProfileError
from schedswitchd.profile.model import (
    Expr,
    find_profile,
    load_profile,
    parse_profile,
    shipped_profiles,
)
from schedswitchd.profile.resolve import KernelFacts, resolve_profile
from schedswitchd.profile.topology import read_topology
from tests.profile.fakesys import fake_sysfs

FULL = """
[profile]
name = "demo"
ops_name = "demo"
summary = "every table"
source = "nowhere"
userspace = "none"
min_cpus = 2

[variables]
slice_ns = 20_000_000
nr_cpu_ids = { expr = "topo.nr_cpu_ids" }
caps = { expr = "[c.capacity for c in topo.cpus]" }
nested = { a = 1, b = [1, { expr = "topo.nr_llcs" }] }

[resize]
".data.cpu_ctxs" = { expr = "topo.nr_cpu_ids" }

[struct_ops]
timeout_ms = 30000
flags = ["SCX_OPS_ENQ_LAST"]
required_flags = ["SCX_OPS_ENQ_LAST"]

[after_load]
armed = true

[[map_updates]]
map = "cpu_ctx"
for_each = "online_cpu"
key = { expr = "cpu.id" }
value = { llc = { expr = "cpu.llc_id" }, idx = { expr = "i" } }

[[run]]
program = "enable_sibling_cpu"
for_each = "smt_pair"
args = { cpu_id = { expr = "pair.cpu" }, sibling_cpu_id = { expr = "pair.sibling" } }

[[run]]
program = "init_llc"
for_each = "llc"
only_if = "len(llc.cpus) > 1"
args = { id = { expr = "llc.id" }, mask = { expr = "llc.mask" } }
cpu = { expr = "llc.cpus[0]" }
when = "after_attach"
expect_retval = 0

[attach]
cpu = { expr = "topo.online_cpus[-1]" }

[[stats]]
name = "dispatched"
variable = "nr_dispatched"

[[stats]]
name = "per_cpu"
map = "stats"
key = 1
field = "nr"

[modes.gaming]
summary = "short slices"
[modes.gaming.variables]
slice_ns = 5_000_000
[modes.gaming.struct_ops]
add_flags = ["SCX_OPS_ENQ_EXITING"]
[[modes.gaming.run]]
program = "set_gaming"
args = { on = 1 }
"""


@pytest.fixture
def smt(tmp_path: Path) -> Path:
    return fake_sysfs(
        tmp_path / "sys",
        possible=range(4),
        siblings=[[0, 2], [1, 3]],
        llcs=[[0, 2], [1, 3]],
    )


def test_full_profile_resolves(tmp_path: Path, smt: Path) -> None:
    prof = parse_profile(FULL, str(tmp_path / "demo.toml"))
    assert isinstance(prof.variables["nr_cpu_ids"], Expr)
    res = resolve_profile(prof, read_topology(smt))
    assert res.variables == {
        "slice_ns": 20_000_000,
        "nr_cpu_ids": 4,
        "caps": [1024] * 4,
        "nested": {"a": 1, "b": [1, 2]},
    }
    assert res.resize == {".data.cpu_ctxs": 4}
    assert res.struct_ops == {"timeout_ms": 30000} and res.flags == ["SCX_OPS_ENQ_LAST"]
    assert [(u.key, u.value) for u in res.map_updates] == [
        (0, {"llc": 0, "idx": 0}),
        (1, {"llc": 1, "idx": 1}),
        (2, {"llc": 0, "idx": 2}),
        (3, {"llc": 1, "idx": 3}),
    ]
    sib = [r.args for r in res.runs if r.program == "enable_sibling_cpu"]
    assert sib == [
        {"cpu_id": 0, "sibling_cpu_id": 2},
        {"cpu_id": 1, "sibling_cpu_id": 3},
        {"cpu_id": 2, "sibling_cpu_id": 0},
        {"cpu_id": 3, "sibling_cpu_id": 1},
    ]
    llc = [r for r in res.runs if r.program == "init_llc"]
    assert [(r.args["id"], r.args["mask"], r.cpu, r.when) for r in llc] == [
        (0, b"\x05", 0, "after_attach"),
        (1, b"\x0a", 1, "after_attach"),
    ]
    assert "cpu 1" in res.map_updates[1].label and "llc 1" in llc[1].label
    assert res.attach_cpu == 3 and res.stat_keys == {"per_cpu": 1}
    assert [s.name for s in res.stats] == ["dispatched", "per_cpu"]


def test_mode_overlays(tmp_path: Path, smt: Path) -> None:
    prof = parse_profile(FULL, str(tmp_path / "demo.toml"))
    res = resolve_profile(prof, read_topology(smt), mode="gaming")
    assert res.mode == "gaming" and res.variables["slice_ns"] == 5_000_000
    assert res.variables["nr_cpu_ids"] == 4  # base keys stay
    assert res.flags == ["SCX_OPS_ENQ_LAST"] and res.add_flags == ["SCX_OPS_ENQ_EXITING"]
    assert res.runs[-1].program == "set_gaming" and res.runs[-1].args == {"on": 1}
    with pytest.raises(ProfileError, match=r"no mode 'nope' \(modes: gaming\)"):
        resolve_profile(prof, read_topology(smt), mode="nope")


def test_min_cpus(tmp_path: Path) -> None:
    one = fake_sysfs(tmp_path / "one", possible=[0])
    with pytest.raises(ProfileError, match="at least 2 online CPUs"):
        resolve_profile(parse_profile(FULL), read_topology(one))


def test_kernel_facts(tmp_path: Path, smt: Path) -> None:
    text = FULL.replace(
        "slice_ns = 20_000_000",
        "slice_ns = { expr = \"kernel_enum('SCX_SLICE_DFL') "
        "if kernel_has('SCX_SLICE_DFL') else 1\" }",
    )
    prof = parse_profile(text)
    topo = read_topology(smt)
    table = {"SCX_SLICE_DFL": 20000000}
    facts = KernelFacts(lambda n: table.get(n))
    assert resolve_profile(prof, topo, kernel=facts).variables["slice_ns"] == 20000000
    none = KernelFacts(lambda n: None)
    assert resolve_profile(prof, topo, kernel=none).variables["slice_ns"] == 1
    with pytest.raises(ProfileError, match="no kernel BTF"):
        resolve_profile(prof, topo)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (("[variables]", "[variables]\nbad-name = 1"), r"x\.toml: variables: 'bad-name' is not"),
        (("[profile]", "[profile]\nnmae = 1"), r"x\.toml: profile\.nmae: unknown key"),
        (("[attach]", "[attach]\nspeed = 1"), r"attach\.speed: unknown key"),
        (('for_each = "online_cpu"', 'for_each = "cpus"'), r"map_updates\.0\.for_each"),
        (
            ("caps = {", 'caps = { expr = "topo.__class__" }\nx = {'),
            r"variables\.caps: .*__class__",
        ),
        (("a = 1, b", 'a = { expr = "1 +" }, b'), r"variables\.nested: .*does not parse.* at a"),
        (('when = "after_attach"', 'when = "later"'), r"run\.1\.when"),
        (('flags = ["SCX_OPS_ENQ_LAST"]', 'flags = ["enq_last"]'), r"struct_ops\.flags"),
        (("timeout_ms = 30000", 'timeout_ms = 30000\nname = "x"'), r"'name' comes from"),
        (("key = 1\n", 'key = 1\nvariable = "x"\n'), r"stats\.1: .*exactly one"),
        (("min_cpus = 2", 'min_cpus = "2"'), r"profile\.min_cpus: Input should be"),
        (("[modes.gaming]", "[modes.Gaming]"), r"modes\.Gaming"),
        (("armed = true", "armed = 1979-05-27"), r"after_load\.armed: .*date"),
        (("[resize]\n", '[resize]\n".text" = 1\n'), r"resize: '\.text' is not"),
    ],
)
def test_errors_name_file_and_key(edit: tuple[str, str], match: str) -> None:
    old, new = edit
    assert old in FULL
    with pytest.raises(ProfileError, match=match):
        parse_profile(FULL.replace(old, new, 1), "/p/x.toml")


def test_syntax_error_and_stem(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"x\.toml: \(syntax\)"):
        parse_profile("[profile\n", "x.toml")
    with pytest.raises(ProfileError, match="not the file stem"):
        parse_profile(FULL, str(tmp_path / "other.toml"))


def test_expression_failure_names_key(smt: Path) -> None:
    prof = parse_profile(FULL.replace("topo.nr_llcs", "topo.llcs[9].id"), "/p/demo.toml")
    with pytest.raises(
        ProfileError, match=r"demo\.toml: variables\.nested\.b\[1\]: .*out of range"
    ):
        resolve_profile(prof, read_topology(smt))


def test_find_profile(tmp_path: Path) -> None:
    d1, d2 = tmp_path / "etc", tmp_path / "shipped"
    d1.mkdir()
    d2.mkdir()
    (d2 / "demo.toml").write_text(FULL)
    assert find_profile("demo", search=[d1, d2]) == (d2 / "demo.toml").resolve()
    (d1 / "demo.toml").write_text(FULL)
    assert find_profile("demo", search=[d1, d2]) == (d1 / "demo.toml").resolve()
    assert find_profile("shipped/demo.toml", base=tmp_path) == (d2 / "demo.toml").resolve()
    with pytest.raises(ProfileError, match="no profile named 'nope'"):
        find_profile("nope", search=[d1, d2])
    with pytest.raises(ProfileError, match="does not exist"):
        find_profile("nope.toml", base=tmp_path)
    assert load_profile(d1 / "demo.toml").name == "demo"
    assert list(shipped_profiles([d1, d2])) == ["demo"]


def test_shipped_profiles_validate() -> None:
    """Every profile in config/profiles/ parses (their content is tested elsewhere)."""
    for name, path in shipped_profiles().items():
        assert load_profile(path).name == name
