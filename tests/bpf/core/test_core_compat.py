"""libbpf's CO-RE compatibility relations, case by case (``src/relo_core.c``):
``bpf_core_fields_are_compat``, ``__bpf_core_types_are_compat``, ``__bpf_core_types_match``.
"""

from __future__ import annotations

import pytest

from schedswitchd.bpf.core.compat import fields_are_compat, types_are_compat, types_match
from tests.bpf.core.core_btf import SpyBtf, TypeBuilder


class Side:
    """The same vocabulary of types, built once as "local" and once as "target"."""

    def __init__(self, name: str, nelems: int = 4, signed_x: bool = True) -> None:
        b = TypeBuilder()
        ids: dict[str, int] = {}
        ids["int"] = b.add_int("int", 4, signed=True)
        ids["uint"] = b.add_int("unsigned int", 4)
        ids["long"] = b.add_int("long", 8, signed=True)
        ids["x"] = b.add_int("int" if signed_x else "unsigned int", 4, signed=signed_x)
        ids["float"] = b.add_float("float", 4)
        ids["fwd_s"] = b.add_fwd("foo")
        ids["fwd_u"] = b.add_fwd("foo", is_union=True)
        ids["foo"] = b.add_struct("foo", 4, [("a", ids["x"], 0, 0)])
        ids["ufoo"] = b.add_union("foo", 4, [("a", ids["x"], 0, 0)])
        ids["p_fwd_s"] = b.add_ptr(ids["fwd_s"])
        ids["p_fwd_u"] = b.add_ptr(ids["fwd_u"])
        ids["p_foo"] = b.add_ptr(ids["foo"])
        ids["p_ufoo"] = b.add_ptr(ids["ufoo"])
        ids["arr"] = b.add_array(ids["int"], ids["int"], nelems)
        ids["arr_long"] = b.add_array(ids["long"], ids["int"], nelems)
        ids["e"] = b.add_enum("e", 4, [("A", 0), ("B", 1)])
        ids["e64"] = b.add_enum64("e", 8, [("A", 0), ("B", 1), ("C", 1 << 40)])
        ids["e_anon"] = b.add_enum("", 4, [("Z", 0)])
        ids["e_other"] = b.add_enum("other", 4, [("A", 0)])
        ids["td_int"] = b.add_typedef("myint", ids["int"])
        ids["c_td_int"] = b.add_const(ids["td_int"])
        ids["proto2"] = b.add_func_proto(ids["int"], [("a", ids["int"]), ("b", ids["p_foo"])])
        ids["proto1"] = b.add_func_proto(ids["int"], [("a", ids["int"])])
        ids["s_ab"] = b.add_struct("s", 8, [("a", ids["int"], 0, 0), ("b", ids["x"], 32, 0)])
        ids["s_a"] = b.add_struct("s", 4, [("a", ids["int"], 0, 0)])
        ids["s_c"] = b.add_struct("s", 4, [("c", ids["int"], 0, 0)])
        self.btf: SpyBtf = b.finish(name)
        self.ids = ids


L = Side("obj")
T = Side("vmlinux")
T_UNSIGNED = Side("vmlinux", nelems=8, signed_x=False)


def fc(a: str, b: str, t: Side = T) -> bool:
    return fields_are_compat(L.btf, L.ids[a], t.btf, t.ids[b])


def tc(a: str, b: str, t: Side = T) -> bool:
    return types_are_compat(L.btf, L.ids[a], t.btf, t.ids[b])


def tm(a: str, b: str, t: Side = T) -> bool:
    return types_match(L.btf, L.ids[a], t.btf, t.ids[b])


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ("foo", "ufoo", True),  # any two composites
        ("int", "long", True),  # ints: size and signedness ignored
        ("int", "float", False),
        ("float", "float", True),
        ("p_foo", "p_fwd_u", True),  # any two pointers
        ("fwd_s", "fwd_u", True),  # FWDs by name only
        ("e", "e64", True),  # ENUM ~ ENUM64 with the same name
        ("e", "e_other", False),
        ("e_anon", "e_other", True),  # an anonymous enum matches any enum
        ("arr", "arr_long", True),  # arrays: element compat, length ignored
        ("arr", "p_foo", False),
        ("c_td_int", "int", True),  # modifiers and typedefs skipped
        ("int", "foo", False),
    ],
)
def test_fields_are_compat(a: str, b: str, want: bool) -> None:
    assert fc(a, b) is want


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ("foo", "foo", True),
        ("foo", "ufoo", False),  # kinds must agree for types
        ("e", "e64", True),
        ("e", "e_other", True),  # names below the root are the caller's business
        ("p_foo", "p_ufoo", False),  # pointee kinds checked
        ("p_foo", "p_foo", True),
        ("arr", "arr_long", True),  # element ints compatible
        ("proto2", "proto2", True),
        ("proto2", "proto1", False),  # parameter counts differ
        ("td_int", "int", False),  # root kinds differ (TYPEDEF vs INT)
    ],
)
def test_types_are_compat(a: str, b: str, want: bool) -> None:
    assert tc(a, b) is want


@pytest.mark.parametrize(
    ("a", "b", "t", "want"),
    [
        ("int", "int", T, True),
        ("int", "uint", T, False),  # names differ
        ("x", "x", T_UNSIGNED, False),  # int vs unsigned int
        ("s_ab", "s_ab", T, True),
        ("s_a", "s_ab", T, True),  # local members are a subset
        ("s_ab", "s_a", T, False),  # more local members than target ones
        ("s_c", "s_ab", T, False),  # member name missing
        ("s_ab", "s_ab", T_UNSIGNED, False),  # member b's type differs
        ("foo", "ufoo", T, False),
        ("p_foo", "p_fwd_s", T, True),  # behind a pointer a struct matches its FWD
        ("p_foo", "p_fwd_u", T, False),  # ...but not a union FWD
        ("p_ufoo", "p_fwd_u", T, True),
        ("p_fwd_s", "p_foo", T, True),
        ("p_fwd_u", "p_foo", T, False),
        ("fwd_s", "foo", T, False),  # not behind a pointer: FWD only matches FWD
        ("fwd_s", "fwd_s", T, True),
        ("fwd_s", "fwd_u", T, False),
        ("e", "e64", T, False),  # sizes differ
        ("e", "e", T, True),
        ("arr", "arr", T, True),
        ("arr", "arr", T_UNSIGNED, False),  # lengths differ
        ("proto2", "proto2", T, True),
        ("proto2", "proto1", T, False),
        ("td_int", "int", T, True),  # typedefs skipped before the name check
    ],
)
def test_types_match(a: str, b: str, t: Side, want: bool) -> None:
    assert tm(a, b, t) is want


def test_types_match_enum_needs_local_names_in_target() -> None:
    b = TypeBuilder()
    lid = b.add_enum("e___mine", 4, [("A___x", 7), ("B", 9)])
    local = b.finish("obj")
    t = TypeBuilder()
    ok = t.add_enum("e", 4, [("B", 0), ("A", 1), ("C", 2)])
    bad = t.add_enum("e", 4, [("B", 0), ("C", 2)])
    target = t.finish("vmlinux")
    assert types_match(local, lid, target, ok)  # values differ, names present: match
    assert not types_match(local, lid, target, bad)


def test_types_match_int_signedness() -> None:
    b = TypeBuilder()
    lid = b.add_int("int", 4, signed=True)
    local = b.finish("obj")
    t = TypeBuilder()
    signed_id = t.add_int("int", 4, signed=True)
    unsigned_id = t.add_int("int", 4, signed=False)
    wide_id = t.add_int("int", 8, signed=True)
    target = t.finish("vmlinux")
    assert types_match(local, lid, target, signed_id)
    assert not types_match(local, lid, target, unsigned_id)
    assert not types_match(local, lid, target, wide_id)
