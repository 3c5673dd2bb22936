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
  *before* they are computed, bools count as the ints they are), sequences below
  :data:`MAX_SEQ_LEN` elements (``[0] * n``, ``range(n)``, ``+`` checked before), all that
  one evaluation builds below :data:`MAX_BUILT` words, the source below :data:`MAX_SOURCE`
  characters and its nesting below :data:`MAX_DEPTH`;
- every evaluation takes at most :data:`MAX_STEPS` steps: a node visit is one, and work
  done inside a built-in (``sum``, ``sorted``, ``max``, ``cpumask``, ``in``, ``==``, a
  slice, building a list) costs one step per :data:`ELEMENTS_PER_STEP` elements it
  touches, nested lists counted in full (so ``max([r] * n)`` pays for every comparison of
  ``r``).

Values that are not plain data (:func:`check_plain`: a function, a topology record, a
complex number, a non-finite float) are refused where a profile takes a value.

Every refusal raises :class:`ExprError` quoting the expression.
"""

from __future__ import annotations

import ast
import math
import operator
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from schedswitchd.errors import ProfileError
from schedswitchd.profile.topology import Cpu, CpuGroup, SmtPair, Topology, cpumask

__all__ = [
    "FUNCTIONS",
    "MAX_BUILT",
    "MAX_INT_BITS",
    "MAX_SEQ_LEN",
    "MAX_STEPS",
    "CompiledExpr",
    "ExprError",
    "check_plain",
    "compile_expr",
    "evaluate",
    "show",
]

MAX_SOURCE = 4000
MAX_DEPTH = 40
MAX_INT_BITS = 4096
MAX_SEQ_LEN = 1 << 16
MAX_STEPS = 1_000_000
#: Elements a built-in may touch for one step: about what one node visit costs.
ELEMENTS_PER_STEP = 16
#: What one evaluation may build in all, in 8-byte words: a list element or 8 bytes of a
#: str/bytes is one, an int above 64 bits one per 64 bits (16 sequences of the longest).
MAX_BUILT = 1 << 20
#: How deeply a profile value may nest lists and tables (``[let]`` entries can each wrap
#: the one before; JSON and the BTF encoder walk values recursively).
MAX_VALUE_DEPTH = 64


class ExprError(ProfileError):
    """An expression that does not parse, uses what the language lacks, or fails."""

    code = "profile"


class _ShortRepr(reprlib.Repr):
    """``reprlib`` with ints too long to print (``int`` refuses over 4300 digits) named by
    their size."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:
            return f"<int of {x.bit_length()} bits>"
        return repr(x)


_SHORT = _ShortRepr()
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = 8
_SHORT.maxstring = _SHORT.maxother = 60


def show(value: object) -> str:
    """A short ``repr`` of ``value`` for messages: long sequences and strings cut, an int
    over 128 bits as ``<int of N bits>``; never raises."""
    try:
        return _SHORT.repr(value)
    except Exception:  # a repr that fails must not replace the error being reported
        return f"<{type(value).__name__}>"


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
        raise ExprError(f"ilog2: expected a positive int, got {show(n)}")
    return n.bit_length() - 1


def _roundup_pow2(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ExprError(f"roundup_pow2: expected a non-negative int, got {show(n)}")
    if n.bit_length() >= MAX_INT_BITS:
        raise ExprError("roundup_pow2: result too large")
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _int_list(v: object, what: str) -> list[int]:
    if not isinstance(v, list | tuple) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in v
    ):
        raise ExprError(f"{what}: expected a list of CPU numbers, got {show(v)}")
    return list(v)


def _size_arg(v: object, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= MAX_SEQ_LEN:
        raise ExprError(f"{what}: size must be an int in 1..{MAX_SEQ_LEN}, got {show(v)}")
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
        raise ExprError(f"{name}: expected a list, got {show(v)}")
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


_NUMBERS = frozenset({int, bool, float, complex})


def _sum(v: object) -> Any:
    seq = _seq("sum", v)
    # numbers only (0 + a list or str fails anyway); the types are checked and the sum
    # taken at C speed: a sum of n ints of at most MAX_INT_BITS bits grows by log2(n) bits
    if not set(map(type, seq)) <= _NUMBERS:
        raise ExprError("sum: expected a list of numbers")
    total = sum(seq)
    if isinstance(total, int) and total.bit_length() > MAX_INT_BITS:
        raise ExprError(f"sum exceeds {MAX_INT_BITS} bits")
    return total


def _sorted(v: object, key: object = None, reverse: object = False) -> list[Any]:
    """``sorted(seq, key="field", reverse=False)``: ``key`` names a field of the elements
    (a record's attribute, or a struct table's member), not a function."""
    seq = _seq("sorted", v)
    if not isinstance(reverse, bool):
        raise ExprError(f"sorted: reverse must be True or False, got {show(reverse)}")
    keyfn = None
    if key is not None:
        if not isinstance(key, str):
            raise ExprError(f"sorted: key must name a field, got {show(key)}")

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
            raise ExprError(f"int: {show(v)} is not finite")
        return int(v)
    raise ExprError(f"int: expected a number, got {show(v)}")


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
    raise ExprError(f"{name}: unsupported argument {show(v)}")


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
        raise ExprError(f"an expression must be a string, got {show(source)}")
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
        raise ExprError(f"expression {src!r}: constant {show(node.value)} is not allowed")
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


def check_plain(value: object) -> None:
    """Raise :class:`ExprError` unless ``value`` is plain data, what a profile value is and
    JSON can carry: None, bool, int (at most :data:`MAX_INT_BITS` bits), finite float, str,
    bytes, and lists and tables (str keys) of them, nested at most :data:`MAX_VALUE_DEPTH`
    deep and at most :data:`MAX_BUILT` elements in all once nested lists are counted in
    full. Refused with what it is: a function (``len``),
    a topology record (``topo``, a ``Cpu``), a complex number (``(-1.0) ** 0.5``), ``inf``
    or ``nan``. A list is looked at again only when met deeper than before (so at most
    :data:`MAX_VALUE_DEPTH` times)."""
    seen: dict[int, int] = {}  # id of a list -> the deepest it was looked at
    todo: list[tuple[object, int]] = [(value, 0)]
    while todo:
        v, depth = todo.pop()
        if v is None or isinstance(v, bool | str | bytes):
            continue
        if isinstance(v, int):
            if v.bit_length() > MAX_INT_BITS:
                raise ExprError(f"its value is an int of {v.bit_length()} bits")
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ExprError(f"its value holds {v!r}, which JSON cannot carry")
            continue
        if isinstance(v, list | tuple | dict):
            if depth >= MAX_VALUE_DEPTH:
                raise ExprError(f"its value nests lists deeper than {MAX_VALUE_DEPTH}")
            if seen.get(id(v), -1) < depth:
                seen[id(v)] = depth
                todo.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
            continue
        what = (
            "a function"
            if callable(v)
            else f"a topology record ({type(v).__name__})"
            if type(v) in ATTRIBUTES
            else f"a {type(v).__name__} ({show(v)})"
        )
        raise ExprError(f"its value is {what}, not plain data (a number, string, bytes, list)")
    if _weight(value, {}) > MAX_BUILT:
        raise ExprError(f"its value holds more than {MAX_BUILT} elements once expanded")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _intlike(v: object) -> bool:
    """An int or a bool (``True << n`` is ``1 << n``): what the size checks apply to."""
    return isinstance(v, int)


def _seqlen(v: object) -> int | None:
    return len(v) if isinstance(v, list | tuple | str | bytes) else None


def _binop(op: ast.operator, a: Any, b: Any) -> Any:
    """``a op b`` with the size checks of the module docstring done first."""
    t = type(op)
    la, lb = _seqlen(a), _seqlen(b)
    if t is ast.Mult:
        if (la is not None and _intlike(b)) or (lb is not None and _intlike(a)):
            n = (la or 0) * b if la is not None else (lb or 0) * a
            if n > MAX_SEQ_LEN:
                raise ExprError(f"repeating a sequence exceeds {MAX_SEQ_LEN} elements")
        elif _intlike(a) and _intlike(b) and a.bit_length() + b.bit_length() > MAX_INT_BITS:
            raise ExprError(f"product exceeds {MAX_INT_BITS} bits")
    elif t is ast.Add and la is not None and lb is not None and la + lb > MAX_SEQ_LEN:
        raise ExprError(f"concatenation exceeds {MAX_SEQ_LEN} elements")
    elif t is ast.Pow and _intlike(a) and _intlike(b):
        if b < 0 and a == 0:
            raise ExprError("0 cannot be raised to a negative power")
        if b > 0 and abs(a) > 1 and b * a.bit_length() > MAX_INT_BITS:
            raise ExprError(f"power exceeds {MAX_INT_BITS} bits")
    elif t is ast.Pow and isinstance(b, int | float) and abs(b) > MAX_INT_BITS:
        raise ExprError(f"exponent {show(b)} is too large")
    elif t in (ast.LShift, ast.RShift) and _intlike(a) and _intlike(b):
        if b < 0:
            raise ExprError("negative shift count")
        if t is ast.LShift and a and a.bit_length() + b > MAX_INT_BITS:
            raise ExprError(f"shift exceeds {MAX_INT_BITS} bits")
    if la is not None and t is not ast.Mult and t is not ast.Add:
        raise ExprError(f"operator {t.__name__} does not apply to a sequence")
    try:
        out = _BINOPS[t](a, b)
    except ZeroDivisionError:
        raise ExprError("division by zero") from None
    except (TypeError, OverflowError, ValueError) as exc:
        raise ExprError(f"{t.__name__}: {exc}") from None
    if isinstance(out, int) and out.bit_length() > MAX_INT_BITS:  # sums grow a bit a time
        raise ExprError(f"{t.__name__}: result exceeds {MAX_INT_BITS} bits")
    return out


_FLAT = (int, float, complex, type(None))


def _weight(v: object, memo: dict[int, tuple[object, int]]) -> int:
    """How many elements walking all of ``v`` touches: a sequence's length plus the weights
    of its nested sequences and strings (a str/bytes: its length; anything else: 1). Each
    distinct list is walked once (``memo``: id -> (the list, kept alive; its weight)): the
    language never changes a list once built, and ``[r] * n`` holds ``r`` n times."""
    if isinstance(v, str | bytes):
        return len(v)
    if not isinstance(v, list | tuple | dict):
        return 1
    hit = memo.get(id(v))
    if hit is not None and hit[0] is v:
        return hit[1]
    items = v.values() if isinstance(v, dict) else v
    w = len(v) + sum(_weight(x, memo) for x in items if not isinstance(x, _FLAT))
    memo[id(v)] = (v, w)
    return w


def _words(v: object) -> int:
    """What building ``v`` cost in 8-byte words (see :data:`MAX_BUILT`)."""
    if isinstance(v, list | tuple | dict):
        return len(v)
    if isinstance(v, str | bytes):
        return len(v) // 8 + 1
    if isinstance(v, int) and v.bit_length() > 64:
        return v.bit_length() // 64
    return 0


#: Built-ins whose work does not grow with their arguments' size (``range``'s result is
#: paid as built).
_CONSTANT_WORK = frozenset({"len", "int", "bool", "abs", "ilog2", "roundup_pow2", "range"})
#: Built-ins that handle each element in Python (a step each), not at C speed.
_PYTHON_WORK = frozenset({"cpumask", "cpumask_u64"})


class _Evaluator:
    def __init__(self, source: str, names: Mapping[str, object]) -> None:
        self.source = source
        self.names = names
        self.steps = 0
        self.built = 0
        self.weights: dict[int, tuple[object, int]] = {}
        self.fields: dict[tuple[int, str], tuple[object, list[Any]]] = {}

    def _step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_STEPS:
            raise ExprError(f"expression {self.source!r} takes more than {MAX_STEPS} steps")

    def _touch(self, elements: int) -> None:
        """Charge a built-in's walk over ``elements`` elements."""
        self._step(elements // ELEMENTS_PER_STEP)

    def _touch_all(self, *values: object, per_step: int = ELEMENTS_PER_STEP) -> None:
        """Charge walking each of ``values`` in full (scalars cost nothing more),
        ``per_step`` elements a step."""
        n = sum(_weight(v, self.weights) for v in values if not isinstance(v, _FLAT))
        self._step(n // per_step)

    def _built(self, v: Any) -> Any:
        """Count ``v``, just built, against :data:`MAX_BUILT` and charge building it."""
        n = _words(v)
        if n:
            self.built += n
            if self.built > MAX_BUILT:
                raise ExprError(f"builds more than {MAX_BUILT} words of values")
            self._touch(n)
        return v

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
            if not isinstance(value, tuple):
                return value
            # records hold tuples, the language lists: one list per record field and
            # evaluation (never changed once built), not a copy per visit of `topo.cpus[c]`
            hit = self.fields.get((id(obj), node.attr))
            if hit is None or hit[0] is not obj:
                hit = (obj, self._built(list(value)))
                self.fields[(id(obj), node.attr)] = hit
            return hit[1]
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
                if parts[2] == 0:
                    raise ExprError("slice step cannot be zero")
                return self._built(obj[slice(*parts)])
            idx = self.eval(node.slice, local)
            if not _is_int(idx):
                raise ExprError(f"index must be an int, got {show(idx)}")
            try:
                return obj[idx]
            except IndexError:
                raise ExprError(f"index {idx} out of range (length {len(obj)})") from None
        if isinstance(node, ast.List | ast.Tuple):
            return self._built([self.eval(e, local) for e in node.elts])
        if isinstance(node, ast.Dict):  # struct members by name (keys checked by _check)
            return self._built(
                {
                    k.value: self.eval(v, local)
                    for k, v in zip(node.keys, node.values, strict=True)
                    if isinstance(k, ast.Constant)
                }
            )
        if isinstance(node, ast.BinOp):
            left, right = self.eval(node.left, local), self.eval(node.right, local)
            return self._built(_binop(node.op, left, right))
        if isinstance(node, ast.UnaryOp):
            v = self.eval(node.operand, local)
            if isinstance(node.op, ast.Not):
                return not v
            if not isinstance(v, int | float):
                raise ExprError(f"unary {type(node.op).__name__} needs a number, got {show(v)}")
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
                self._touch_all(left, right)  # == and in walk sequences element by element
                try:
                    ok = _CMPOPS[type(op)](left, right)
                except (TypeError, ValueError) as exc:  # ValueError: ``256 in b"..."``
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
            return self._built(out)
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
            raise ExprError(f"cannot unpack {show(item)} into {len(target.elts)} names")
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
        if name not in _CONSTANT_WORK:
            python = name in _PYTHON_WORK or (name == "sorted" and "key" in kwargs)
            self._touch_all(*args, *kwargs.values(), per_step=1 if python else ELEMENTS_PER_STEP)
        try:
            out = fn(*args, **kwargs)
        except ExprError:
            raise
        except ProfileError as exc:
            raise ExprError(f"{name}: {exc}") from None
        except (TypeError, ValueError, OverflowError) as exc:
            raise ExprError(f"{name}: {exc}") from None
        if any(out is a for a in args):  # min(a, b), max(a, b): an argument, not new
            return out
        return self._built(out)
