"""The small, safe expression language of profile values (``{ expr = "..." }``).

An expression is parsed with :mod:`ast` (``mode="eval"``) and then *interpreted* here, node
by node; nothing is ever handed to :func:`eval`. Only these nodes exist: literals (int,
float, bool, str, bytes, None), names, attribute access, subscripts and slices, list and
tuple displays, dict displays with quoted member names (struct values), arithmetic and
bit operations, comparisons (also ``in``), ``and``/``or``/``not``, conditional
expressions, list comprehensions (with ``if`` clauses) and calls of the functions in
:data:`FUNCTIONS` (plus those the caller adds, e.g. ``kernel_enum``).

Why it cannot escape or blow up:

- names resolve only in the mapping the caller gives (``topo``, loop variables, functions);
  there are no builtins;
- attribute access works only on the topology records (:class:`~schedswitchd.profile.
  topology.Topology`, ``Cpu``, ``CpuGroup``, ``SmtPair``) and only for their public
  fields, listed per type: ``x.__class__``, ``(1).real``, ``"".join`` are refused;
- integers are kept below :data:`MAX_INT_BITS` bits (``**``, ``<<`` and ``*`` are checked
  *before* they are computed), sequences below :data:`MAX_SEQ_LEN` elements (``[0] * n``,
  ``range(n)``, ``+`` checked before), the source below :data:`MAX_SOURCE` characters and
  its nesting below :data:`MAX_DEPTH`, and every evaluation below :data:`MAX_STEPS` node
  visits (so nested comprehensions over large ranges stop).

Every refusal raises :class:`ExprError` quoting the expression.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from schedswitchd.errors import ProfileError
from schedswitchd.profile.topology import Cpu, CpuGroup, SmtPair, Topology, cpumask

__all__ = [
    "FUNCTIONS",
    "MAX_INT_BITS",
    "MAX_SEQ_LEN",
    "MAX_STEPS",
    "CompiledExpr",
    "ExprError",
    "compile_expr",
    "evaluate",
]

MAX_SOURCE = 4000
MAX_DEPTH = 40
MAX_INT_BITS = 4096
MAX_SEQ_LEN = 1 << 16
MAX_STEPS = 1_000_000


class ExprError(ProfileError):
    """An expression that does not parse, uses what the language lacks, or fails."""

    code = "profile"


def _public(cls: type, extra: tuple[str, ...] = ()) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls)) | frozenset(extra)


#: Attribute names readable per record type; nothing else has attributes.
ATTRIBUTES: dict[type, frozenset[str]] = {
    Topology: _public(
        Topology,
        (
            "nr_cpus",
            "nr_llcs",
            "nr_nodes",
            "nr_cores",
            "mask_bytes",
            "max_capacity",
            "has_big_little",
            "big_cpus",
            "little_cpus",
            "turbo_cpus",
        ),
    ),
    Cpu: _public(Cpu),
    CpuGroup: _public(CpuGroup),
    SmtPair: _public(SmtPair),
}


def _ilog2(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ExprError(f"ilog2: expected a positive int, got {n!r}")
    return n.bit_length() - 1


def _roundup_pow2(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ExprError(f"roundup_pow2: expected a non-negative int, got {n!r}")
    if n.bit_length() >= MAX_INT_BITS:
        raise ExprError("roundup_pow2: result too large")
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _int_list(v: object, what: str) -> list[int]:
    if not isinstance(v, list | tuple) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in v
    ):
        raise ExprError(f"{what}: expected a list of CPU numbers, got {v!r}")
    return list(v)


def _size_arg(v: object, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= MAX_SEQ_LEN:
        raise ExprError(f"{what}: size must be an int in 1..{MAX_SEQ_LEN}, got {v!r}")
    return v


def _range(*args: object) -> list[int]:
    if not 1 <= len(args) <= 3 or not all(
        isinstance(a, int) and not isinstance(a, bool) for a in args
    ):
        raise ExprError("range: takes 1 to 3 ints")
    r = range(*(int(a) for a in args))  # type: ignore[call-overload]
    if len(r) > MAX_SEQ_LEN:
        raise ExprError(f"range: {len(r)} elements exceed {MAX_SEQ_LEN}")
    return list(r)


def _seq(name: str, v: object) -> Sequence[Any]:
    if not isinstance(v, list | tuple | str | bytes):
        raise ExprError(f"{name}: expected a list, got {v!r}")
    return v


def _minmax(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def call(*args: object) -> Any:
        seq = _seq(name, args[0]) if len(args) == 1 else args
        if not seq:
            raise ExprError(f"{name}: empty sequence")
        try:
            return fn(seq)
        except TypeError as exc:
            raise ExprError(f"{name}: {exc}") from None

    return call


def _sum(v: object) -> Any:
    seq = _seq("sum", v)
    total: Any = 0
    for x in seq:
        total = _binop(ast.Add(), total, x)
    return total


def _sorted(v: object, key: object = None, reverse: object = False) -> list[Any]:
    """``sorted(seq, key="field", reverse=False)``: ``key`` names a field of the elements
    (a record's attribute, or a struct table's member), not a function."""
    seq = _seq("sorted", v)
    if not isinstance(reverse, bool):
        raise ExprError(f"sorted: reverse must be True or False, got {reverse!r}")
    keyfn = None
    if key is not None:
        if not isinstance(key, str):
            raise ExprError(f"sorted: key must name a field, got {key!r}")

        def keyfn(item: Any) -> Any:
            if isinstance(item, dict):
                if key not in item:
                    raise ExprError(f"sorted: an element has no member {key!r}")
                return item[key]
            if key not in ATTRIBUTES.get(type(item), frozenset()):
                raise ExprError(f"sorted: {type(item).__name__} has no field {key!r}")
            return getattr(item, key)

    try:
        return sorted(seq, key=keyfn, reverse=reverse)
    except TypeError as exc:
        raise ExprError(f"sorted: {exc}") from None


def _to_int(v: object) -> int:
    if isinstance(v, bool | int):
        return int(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ExprError(f"int: {v!r} is not finite")
        return int(v)
    raise ExprError(f"int: expected a number, got {v!r}")


def _cpumask(cpus: object, nbytes: object = None) -> bytes:
    lst = _int_list(cpus, "cpumask")
    if nbytes is None:
        nbytes = max(1, (max(lst, default=0) + 8) // 8)
    return cpumask(lst, _size_arg(nbytes, "cpumask"))


def _cpumask_u64(cpus: object, nwords: object = None) -> list[int]:
    lst = _int_list(cpus, "cpumask_u64")
    if nwords is None:
        nwords = max(1, (max(lst, default=0) + 64) // 64)
    n = _size_arg(nwords, "cpumask_u64")
    raw = cpumask(lst, 8 * n)
    return [int.from_bytes(raw[8 * i : 8 * i + 8], "little") for i in range(n)]


#: Functions every expression may call. ``cpumask(cpus, nbytes=None)`` -> bytes (bit i for
#: CPU i; default size: enough for the largest CPU, use ``topo.mask_bytes`` for a
#: ``nr_cpu_ids`` mask); ``cpumask_u64(cpus, nwords=None)`` -> list of u64 words.
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "len": lambda v: len(_seq("len", v)),
    "min": _minmax(min, "min"),
    "max": _minmax(max, "max"),
    "sum": _sum,
    "abs": lambda v: abs(v) if isinstance(v, int | float) else _bad("abs", v),
    "any": lambda v: any(_seq("any", v)),
    "all": lambda v: all(_seq("all", v)),
    "sorted": _sorted,
    "range": _range,
    "int": _to_int,
    "bool": bool,
    "ilog2": _ilog2,
    "roundup_pow2": _roundup_pow2,
    "cpumask": _cpumask,
    "cpumask_u64": _cpumask_u64,
}
_KEYWORDS = {"cpumask": {"nbytes"}, "cpumask_u64": {"nwords"}, "sorted": {"key", "reverse"}}


def _bad(name: str, v: object) -> Any:
    raise ExprError(f"{name}: unsupported argument {v!r}")


_ALLOWED = (
    ast.Expression,
    ast.Constant,
    ast.Name,
    ast.Load,
    ast.Attribute,
    ast.Subscript,
    ast.Slice,
    ast.List,
    ast.Tuple,
    ast.Dict,
    ast.BinOp,
    ast.UnaryOp,
    ast.BoolOp,
    ast.Compare,
    ast.IfExp,
    ast.ListComp,
    ast.comprehension,
    ast.Call,
    ast.keyword,
    ast.Store,
    ast.operator,
    ast.unaryop,
    ast.boolop,
    ast.cmpop,
)
_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitOr: operator.or_,
    ast.BitAnd: operator.and_,
    ast.BitXor: operator.xor,
}
_CMPOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


@dataclass(frozen=True, slots=True)
class CompiledExpr:
    """A parsed and checked expression: ``source`` and its tree."""

    source: str
    tree: ast.Expression


def compile_expr(source: str) -> CompiledExpr:
    """Parse and check ``source``. Raises :class:`ExprError` for a syntax error, a node
    outside the language, a dunder or private name, or a source too long or deep."""
    if not isinstance(source, str):
        raise ExprError(f"an expression must be a string, got {source!r}")
    if len(source) > MAX_SOURCE:
        raise ExprError(f"expression longer than {MAX_SOURCE} characters")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        msg = getattr(exc, "msg", None) or str(exc)
        raise ExprError(f"expression {source!r} does not parse: {msg}") from None
    _check(tree, source, 0)
    return CompiledExpr(source, tree)


def _check(node: ast.AST, src: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ExprError(f"expression {src!r} is nested too deeply")
    if not isinstance(node, _ALLOWED):
        raise ExprError(f"expression {src!r}: {type(node).__name__} is not allowed")
    if isinstance(node, ast.BinOp) and type(node.op) not in _BINOPS:
        raise ExprError(f"expression {src!r}: operator {type(node.op).__name__} is not allowed")
    if isinstance(node, ast.Constant) and not isinstance(
        node.value, int | float | str | bytes | type(None)
    ):
        raise ExprError(f"expression {src!r}: constant {node.value!r} is not allowed")
    if isinstance(node, ast.Name | ast.Attribute):
        ident = node.id if isinstance(node, ast.Name) else node.attr
        if ident.startswith("_"):
            raise ExprError(f"expression {src!r}: name {ident!r} is not allowed")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name):
            raise ExprError(f"expression {src!r}: only named functions can be called")
        if any(k.arg is None for k in node.keywords) or any(
            isinstance(a, ast.Starred) for a in node.args
        ):
            raise ExprError(f"expression {src!r}: * and ** arguments are not allowed")
    if isinstance(node, ast.Dict) and not all(
        isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys
    ):
        raise ExprError(f"expression {src!r}: dict keys must be member names in quotes")
    if isinstance(node, ast.comprehension) and node.is_async:
        raise ExprError(f"expression {src!r}: async comprehensions are not allowed")
    if isinstance(node, ast.comprehension) and not isinstance(node.target, ast.Name | ast.Tuple):
        raise ExprError(f"expression {src!r}: comprehension targets must be names")
    for child in ast.iter_child_nodes(node):
        _check(child, src, depth + 1)


def evaluate(expr: CompiledExpr | str, names: Mapping[str, object]) -> Any:
    """Evaluate ``expr`` with ``names`` (values and extra functions, e.g. ``topo``,
    ``cpu``, ``kernel_enum``) on top of :data:`FUNCTIONS`. Raises :class:`ExprError`."""
    compiled = compile_expr(expr) if isinstance(expr, str) else expr
    ev = _Evaluator(compiled.source, {**FUNCTIONS, **names})
    try:
        return ev.eval(compiled.tree.body, {})
    except ExprError as exc:
        if compiled.source in str(exc):
            raise
        raise ExprError(f"expression {compiled.source!r}: {exc}") from None
    except RecursionError:
        raise ExprError(f"expression {compiled.source!r} recursed too deeply") from None


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _seqlen(v: object) -> int | None:
    return len(v) if isinstance(v, list | tuple | str | bytes) else None


def _binop(op: ast.operator, a: Any, b: Any) -> Any:
    """``a op b`` with the size checks of the module docstring done first."""
    t = type(op)
    la, lb = _seqlen(a), _seqlen(b)
    if t is ast.Mult:
        if (la is not None and _is_int(b)) or (lb is not None and _is_int(a)):
            n = (la or 0) * b if la is not None else (lb or 0) * a
            if n > MAX_SEQ_LEN:
                raise ExprError(f"repeating a sequence to {n} elements exceeds {MAX_SEQ_LEN}")
        elif _is_int(a) and _is_int(b) and a.bit_length() + b.bit_length() > MAX_INT_BITS:
            raise ExprError(f"product exceeds {MAX_INT_BITS} bits")
    elif t is ast.Add and la is not None and lb is not None and la + lb > MAX_SEQ_LEN:
        raise ExprError(f"concatenation exceeds {MAX_SEQ_LEN} elements")
    elif t is ast.Pow and _is_int(a) and _is_int(b):
        if b < 0 and a == 0:
            raise ExprError("0 cannot be raised to a negative power")
        if b > 0 and abs(a) > 1 and b * a.bit_length() > MAX_INT_BITS:
            raise ExprError(f"power exceeds {MAX_INT_BITS} bits")
    elif t is ast.Pow and isinstance(b, int | float) and abs(b) > MAX_INT_BITS:
        raise ExprError(f"exponent {b!r} is too large")
    elif t in (ast.LShift, ast.RShift) and _is_int(a) and _is_int(b):
        if b < 0:
            raise ExprError("negative shift count")
        if t is ast.LShift and a and a.bit_length() + b > MAX_INT_BITS:
            raise ExprError(f"shift exceeds {MAX_INT_BITS} bits")
    if la is not None and t is not ast.Mult and t is not ast.Add:
        raise ExprError(f"operator {t.__name__} does not apply to a sequence")
    try:
        return _BINOPS[t](a, b)
    except ZeroDivisionError:
        raise ExprError("division by zero") from None
    except (TypeError, OverflowError, ValueError) as exc:
        raise ExprError(f"{t.__name__}: {exc}") from None


class _Evaluator:
    def __init__(self, source: str, names: Mapping[str, object]) -> None:
        self.source = source
        self.names = names
        self.steps = 0

    def _step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise ExprError(f"expression {self.source!r} takes more than {MAX_STEPS} steps")

    def eval(self, node: ast.expr, local: dict[str, object]) -> Any:
        self._step()
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in local:
                return local[node.id]
            if node.id in self.names:
                return self.names[node.id]
            raise ExprError(f"unknown name {node.id!r}")
        if isinstance(node, ast.Attribute):
            obj = self.eval(node.value, local)
            allowed = ATTRIBUTES.get(type(obj))
            if allowed is None or node.attr not in allowed:
                raise ExprError(f"{type(obj).__name__} has no attribute {node.attr!r}")
            value = getattr(obj, node.attr)
            return list(value) if isinstance(value, tuple) else value
        if isinstance(node, ast.Subscript):
            obj = self.eval(node.value, local)
            if not isinstance(obj, list | tuple | str | bytes):
                raise ExprError(f"{type(obj).__name__} cannot be indexed")
            if isinstance(node.slice, ast.Slice):
                parts = [
                    self.eval(p, local) if p is not None else None
                    for p in (node.slice.lower, node.slice.upper, node.slice.step)
                ]
                if not all(p is None or _is_int(p) for p in parts):
                    raise ExprError("slice bounds must be ints")
                return obj[slice(*parts)]
            idx = self.eval(node.slice, local)
            if not _is_int(idx):
                raise ExprError(f"index must be an int, got {idx!r}")
            try:
                return obj[idx]
            except IndexError:
                raise ExprError(f"index {idx} out of range (length {len(obj)})") from None
        if isinstance(node, ast.List | ast.Tuple):
            return [self.eval(e, local) for e in node.elts]
        if isinstance(node, ast.Dict):  # struct members by name (keys checked by _check)
            return {
                k.value: self.eval(v, local)
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant)
            }
        if isinstance(node, ast.BinOp):
            return _binop(node.op, self.eval(node.left, local), self.eval(node.right, local))
        if isinstance(node, ast.UnaryOp):
            v = self.eval(node.operand, local)
            if isinstance(node.op, ast.Not):
                return not v
            if not isinstance(v, int | float):
                raise ExprError(f"unary {type(node.op).__name__} needs a number, got {v!r}")
            if isinstance(node.op, ast.USub):
                return -v
            if isinstance(node.op, ast.UAdd):
                return +v
            if isinstance(v, float):
                raise ExprError("~ needs an int")
            return ~v
        if isinstance(node, ast.BoolOp):
            is_and = isinstance(node.op, ast.And)
            result: Any = is_and
            for e in node.values:
                result = self.eval(e, local)
                if bool(result) != is_and:
                    return result
            return result
        if isinstance(node, ast.Compare):
            left = self.eval(node.left, local)
            for op, comp in zip(node.ops, node.comparators, strict=True):
                right = self.eval(comp, local)
                try:
                    ok = _CMPOPS[type(op)](left, right)
                except TypeError as exc:
                    raise ExprError(f"comparison: {exc}") from None
                if not ok:
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            branch = node.body if self.eval(node.test, local) else node.orelse
            return self.eval(branch, local)
        if isinstance(node, ast.ListComp):
            out: list[Any] = []
            self._comp(node, node.generators, dict(local), out)
            return out
        if isinstance(node, ast.Call):
            return self._call(node, local)
        raise ExprError(f"{type(node).__name__} is not allowed")  # _check keeps us from here

    def _comp(
        self,
        node: ast.ListComp,
        gens: list[ast.comprehension],
        local: dict[str, object],
        out: list[Any],
    ) -> None:
        gen = gens[0]
        seq = self.eval(gen.iter, local)
        if not isinstance(seq, list | tuple | bytes | str):
            raise ExprError(f"cannot iterate over {type(seq).__name__}")
        for item in seq:
            self._step()
            self._bind(gen.target, item, local)
            if not all(self.eval(cond, local) for cond in gen.ifs):
                continue
            if len(gens) > 1:
                self._comp(node, gens[1:], local, out)
            else:
                if len(out) >= MAX_SEQ_LEN:
                    raise ExprError(f"comprehension exceeds {MAX_SEQ_LEN} elements")
                out.append(self.eval(node.elt, local))

    def _bind(self, target: ast.expr, item: object, local: dict[str, object]) -> None:
        if isinstance(target, ast.Name):
            local[target.id] = item
            return
        assert isinstance(target, ast.Tuple)
        if not isinstance(item, list | tuple) or len(item) != len(target.elts):
            raise ExprError(f"cannot unpack {item!r} into {len(target.elts)} names")
        for t, v in zip(target.elts, item, strict=True):
            self._bind(t, v, local)

    def _call(self, node: ast.Call, local: dict[str, object]) -> Any:
        assert isinstance(node.func, ast.Name)
        name = node.func.id
        fn = self.names.get(name) if name not in local else None
        if not callable(fn) or (isinstance(fn, type) and fn is not bool):
            raise ExprError(f"{name!r} is not a function")
        args = [self.eval(a, local) for a in node.args]
        allowed = _KEYWORDS.get(name, set())
        kwargs: dict[str, Any] = {}
        for k in node.keywords:
            if k.arg not in allowed:
                raise ExprError(f"{name}() takes no keyword {k.arg!r}")
            kwargs[k.arg] = self.eval(k.value, local)
        try:
            return fn(*args, **kwargs)
        except ExprError:
            raise
        except ProfileError as exc:
            raise ExprError(f"{name}: {exc}") from None
        except (TypeError, ValueError, OverflowError) as exc:
            raise ExprError(f"{name}: {exc}") from None
