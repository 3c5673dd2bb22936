"""The profile expression language: what it computes and what it refuses."""

from __future__ import annotations

import pytest

from schedswitchd.profile.expr import MAX_SEQ_LEN, ExprError, compile_expr, evaluate
from schedswitchd.profile.topology import Topology, read_topology
from tests.profile.fakesys import fake_sysfs


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Topology:
    """One fake sysfs tree read once per module: the records are frozen, so no test can
    change what the next one sees."""
    root = fake_sysfs(
        tmp_path_factory.mktemp("sysfs"),
        possible=range(4),
        siblings=[[0, 2], [1, 3]],
        llcs=[[0, 1, 2, 3]],
    )
    return read_topology(root)


@pytest.fixture
def names(topology: Topology) -> dict[str, object]:
    return {"topo": topology}


@pytest.mark.parametrize(
    ("src", "want"),
    [
        ("topo.nr_cpu_ids", 4),
        ("[c.id for c in topo.cpus if c.siblings]", [0, 1, 2, 3]),
        ("[p.sibling for p in topo.smt_pairs if p.cpu == 0]", [2]),
        ("len(topo.cores) * 2 + 1", 5),
        ("1 << 10 | 3", 1027),
        ("cpumask(topo.online_cpus, topo.mask_bytes)", b"\x0f"),
        ("cpumask_u64([0, 65])", [1, 2]),
        ("max([c.capacity for c in topo.cpus])", 1024),
        ("ilog2(4096) + roundup_pow2(5)", 20),
        ("20_000_000 if topo.smt_active else 1", 20000000),
        ("topo.online_cpus[-1]", 3),
        ("topo.llcs[0].cpus[1:3]", [1, 2]),
        ("not topo.has_big_little and 2 in topo.online_cpus", True),
        ("sum([g.index for g in topo.cores])", 1),
        ("[a * b for a, b in [[1, 2], [3, 4]]]", [2, 12]),
        ("min(3, 1, 2)", 1),
        ("7 // 2 + 7 % 2 - 2 ** 3", -4),
        ("[c.id for c in sorted(topo.cpus, key='core_id', reverse=True)]", [1, 3, 0, 2]),
        ("sorted([{'a': 2}, {'a': 1}], key='a')", [{"a": 1}, {"a": 2}]),
        ("[{'id': c.id, 'n': len(c.siblings)} for c in topo.cpus][1]", {"id": 1, "n": 1}),
    ],
)
def test_values(names: dict[str, object], src: str, want: object) -> None:
    assert evaluate(src, names) == want


@pytest.mark.parametrize(
    "src",
    [
        "topo.__class__",
        "topo.cpus.__len__",
        "(1).real",
        "''.join",
        "topo._fields",
        "__import__('os')",
        "open('/etc/passwd')",
        "eval('1')",
        "getattr(topo, 'cpus')",
        "type(topo)",
        "lambda: 1",
        "[x for x in ().__class__.__bases__]",
        "topo.describe()",
        "topo.cpu(0)",
        "(x := 1)",
        "{1: 2}",
        "{**{}}",
        "{'a' + 'b': 1}",
        "{1, 2}",
        "f'{topo}'",
        "print(1)",
        "len(*[[1]])",
        "cpumask(**{})",
        "sorted([1], key=len)",
        "sorted(topo.cpus, key='__class__')",
        "sorted(topo.cpus, key='id', reverse=1)",
        "1 if 1 else (yield)",
    ],
)
def test_hostile_expressions_are_refused(names: dict[str, object], src: str) -> None:
    with pytest.raises(ExprError):
        evaluate(src, names)


@pytest.mark.parametrize(
    "src",
    [
        "9 ** 9 ** 9",
        "10 ** 100000",
        "2 ** 5000",
        "1 << 100000",
        "[0] * 10 ** 9",
        "'x' * (1 << 30)",
        "b'x' * 100000",
        "range(10 ** 9)",
        "[[i, j] for i in range(60000) for j in range(60000)]",
        "[0] * 60000 + [0] * 60000",
        "(10 ** 1000) * (10 ** 1000) * (10 ** 1000) * (10 ** 1000) * (10 ** 1000)",
        "2.0 ** 100000",
        "1 / 0",
        "'%s' % 1",
        "[1][5]",
        "cpumask([1], 10 ** 9)",
        "-" * 100 + "1",
        "x" * 5000,
        # A membership test of an int no byte can hold (found by make fuzz: ValueError).
        "4096 in b''",
        "-1 not in b'ab'",
        "256 in cpumask([0], 1)",
    ],
)
def test_huge_or_failing_values_are_bounded(names: dict[str, object], src: str) -> None:
    # Each of these would take minutes or gigabytes if it were computed: refused first.
    with pytest.raises(ExprError):
        evaluate(src, names)


def test_sequence_limit_is_exact(names: dict[str, object]) -> None:
    assert len(evaluate(f"[0] * {MAX_SEQ_LEN}", names)) == MAX_SEQ_LEN
    with pytest.raises(ExprError, match="exceeds"):
        evaluate(f"[0] * {MAX_SEQ_LEN + 1}", names)


def test_error_quotes_the_expression(names: dict[str, object]) -> None:
    with pytest.raises(ExprError, match=r"topo\.nope"):
        evaluate("topo.nope", names)
    with pytest.raises(ExprError, match="unknown name 'cpu'"):
        evaluate("cpu.id", names)


def test_extra_functions_and_names() -> None:
    assert evaluate("kernel_enum('X') + i", {"kernel_enum": lambda n: 40, "i": 2}) == 42
    compiled = compile_expr("a + 1")
    assert evaluate(compiled, {"a": 1}) == 2
