"""What one expression may cost, and what it may yield: the integer cap holds for bools,
work inside built-ins is charged by the size it touches, the total an evaluation builds is
capped, a zero slice step is the language's error, and a value JSON cannot carry (a
complex, a function, a topology record) is refused naming the key -- each refused quickly
(the timing is left to ``make fuzz``; here the limits' messages are what is checked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedswitchd.cli import ctl
from schedswitchd.errors import ProfileError
from schedswitchd.profile.expr import (
    MAX_BUILT,
    MAX_INT_BITS,
    MAX_STEPS,
    MAX_VALUE_DEPTH,
    ExprError,
    check_plain,
    compile_expr,
    evaluate,
    show,
)
from schedswitchd.profile.model import Expr
from schedswitchd.profile.resolve import resolve_value
from schedswitchd.profile.topology import Topology, read_topology
from tests.profile.fakesys import fake_sysfs

R = "for r in [range(65536)]"  # binds r, a list of 65536 ints


@pytest.fixture(scope="module")
def sysfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_sysfs(tmp_path_factory.mktemp("sysfs"), possible=range(2), llcs=[[0, 1]])


@pytest.fixture(scope="module")
def topo(sysfs: Path) -> Topology:
    return read_topology(sysfs)


@pytest.mark.parametrize(
    "src",
    [
        "True << 100000",
        "(True << 4000) * (True << 4000)",
        "[0] * (True << 100)",
        "True ** 1 << 5000",
    ],
)
def test_bools_are_held_to_the_integer_cap(src: str) -> None:
    with pytest.raises(ExprError, match=f"exceeds {MAX_INT_BITS} bits|exceeds 65536 elements"):
        evaluate(src, {})


def test_sums_do_not_grow_past_the_cap() -> None:
    with pytest.raises(ExprError, match=f"exceeds {MAX_INT_BITS} bits"):
        evaluate("(1 << 4095) + (1 << 4095)", {})
    with pytest.raises(ExprError, match=f"sum exceeds {MAX_INT_BITS} bits"):
        evaluate("sum([1 << 4095] * 2)", {})
    assert evaluate("sum([1, 2.5, True])", {}) == 4.5


@pytest.mark.parametrize(
    "src",
    [
        # each step of the comprehension makes a built-in walk 65536 elements: on the
        # code that counted node visits only, each ran for minutes
        f"[sum(r) {R} for i in range(65536)]",
        f"[max(r) {R} for i in range(65536)]",
        f"[sorted(r, reverse=True) {R} for i in range(65536)]",
        f"[cpumask(r) {R} for i in range(65536)]",
        f"[i in r {R} for i in range(65536)]",
        f"[r == s {R} for s in [range(65536)] for i in range(65536)]",
        # the list holds r 65536 times: each comparison of max walks r
        f"[max([r] * 65536) {R} for i in range(65536)]",
    ],
)
def test_work_inside_built_ins_is_charged(src: str) -> None:
    with pytest.raises(ExprError, match=f"takes more than {MAX_STEPS} steps|builds more than"):
        evaluate(src, {})


def test_node_visits_alone_fit_as_before() -> None:
    # 65536 iterations of a few node visits each: well inside the step budget
    assert len(evaluate("[i * 2 for i in range(65536)]", {})) == 65536


@pytest.mark.parametrize(
    "src",
    [
        "[[0] * 65536 for i in range(65536)]",
        "[range(65536) for i in range(65536)]",
        "[b'x' * 65536 for i in range(65536)]",
        "[(1 << 4000) + i for i in range(65536)]",
    ],
)
def test_the_total_an_evaluation_builds_is_capped(src: str) -> None:
    with pytest.raises(ExprError, match=f"builds more than {MAX_BUILT} words"):
        evaluate(src, {})


def test_one_long_sequence_still_fits() -> None:
    assert len(evaluate("[0] * 65536 + []", {})) == 65536


@pytest.mark.parametrize("src", ["[1, 2][::0]", "'ab'[1:2:0]", "b'ab'[::False]"])
def test_zero_slice_step_is_the_languages_error(src: str) -> None:
    with pytest.raises(ExprError, match=r"slice step cannot be zero|slice bounds must be ints"):
        evaluate(src, {})


@pytest.mark.parametrize(
    ("src", "what"),
    [
        ("(-1.0) ** 0.5", "a complex"),
        ("len", "a function"),
        ("topo", r"a topology record \(Topology\)"),
        ("[topo.cpus[0]]", r"a topology record \(Cpu\)"),
        ("{'a': [1, sorted]}", "a function"),
        ("1e308 * 10", "inf"),
        ("[[r] * 65536 for r in [range(65536)]]", "more than .* elements once expanded"),
    ],
)
def test_values_json_cannot_hold_are_refused_naming_the_key(
    topo: Topology, src: str, what: str
) -> None:
    with pytest.raises(ProfileError, match=f"^variables\\.x: .*{what}"):
        resolve_value(Expr(compile_expr(src)), {"topo": topo}, "variables.x")


def test_plain_values_pass() -> None:
    check_plain({"a": [1, 2.5, True, None, "s", b"\x01"], "b": (1 << MAX_INT_BITS) - 1})


def test_a_huge_int_in_a_message_is_named_by_its_size() -> None:
    # str() of an int over 4300 digits raises ValueError: a message must not
    assert show(1 << 20000) == "<int of 20001 bits>"
    assert show([1 << 20000, 2]) == "[<int of 20001 bits>, 2]"
    with pytest.raises(ExprError, match="int of 20001 bits"):
        check_plain([1 << 20000])


@pytest.mark.parametrize("src", ["(-1.0) ** 0.5", "len", "topo.cpus"])
def test_profile_show_json_refuses_them(
    tmp_path: Path, sysfs: Path, capsys: pytest.CaptureFixture[str], src: str
) -> None:
    prof = tmp_path / "x.toml"
    prof.write_text(
        '[profile]\nname = "x"\nops_name = "x"\nsummary = "s"\nsource = "s"\n'
        f'userspace = "none"\n\n[variables]\nbad = {{ expr = {json.dumps(src)} }}\n'
    )
    assert ctl.main(["profile", "show", str(prof), "--sysfs", str(sysfs), "--json"]) == 1
    err = capsys.readouterr().err
    assert "variables.bad:" in err, err
    assert "Traceback" not in err


def test_values_nested_past_the_depth_limit_are_refused(
    tmp_path: Path, sysfs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # each [let] entry wraps the one before: 1500 levels made the value's walk (and the
    # JSON of profile show --json) raise RecursionError
    lets = "\n".join(f'a{i} = {{ expr = "[a{i - 1}]" }}' for i in range(1, 1500))
    prof = tmp_path / "x.toml"
    prof.write_text(
        '[profile]\nname = "x"\nops_name = "x"\nsummary = "s"\nsource = "s"\n'
        f'userspace = "none"\n\n[let]\na0 = {{ expr = "[1]" }}\n{lets}\n\n'
        '[variables]\nv = { expr = "a1499" }\n'
    )
    assert ctl.main(["profile", "show", str(prof), "--sysfs", str(sysfs), "--json"]) == 1
    err = capsys.readouterr().err
    assert f"let.a{MAX_VALUE_DEPTH}: its value nests lists deeper than {MAX_VALUE_DEPTH}" in err
    deep: list[object] = [1]
    for _ in range(MAX_VALUE_DEPTH - 1):
        deep = [deep]
    check_plain(deep)
    with pytest.raises(ExprError, match="deeper than"):
        check_plain([deep])
    # a list met shallow first and deeper later is judged at its deepest
    with pytest.raises(ExprError, match="deeper than"):
        check_plain([[deep], deep[0]])
