"""BTF sanitising: with features forced off, every newer kind is rewritten in place (ids
unchanged) and the host kernel accepts the result; with nothing missing, bytes unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import FUNC_GLOBAL, VAR_GLOBAL_ALLOCATED, Composite, Kind
from schedswitchd.errors import BtfError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.features import BtfFeatures
from schedswitchd.kernel.btf.sanitize import sanitize_btf

ALL = BtfFeatures(True, True, True, True, True, True, True, True)
NONE = BtfFeatures(False, False, False, False, False, False, False, False)


def _every_kind() -> tuple[Btf, dict[str, int]]:
    b = BtfBuilder()
    i32 = b.add_int("int", 4, signed=True)
    ids = {"int": i32}
    ids["var"] = b.add_var("counter", i32, VAR_GLOBAL_ALLOCATED)
    ids["var2"] = b.add_var("other", i32, VAR_GLOBAL_ALLOCATED)
    ids["datasec"] = b.add_datasec(".data.x", 8, [(ids["var"], 0, 4), (ids["var2"], 4, 4)])
    ids["qdatasec"] = b.add_datasec("?.struct_ops", 0, [])
    ids["proto"] = b.add_func_proto(i32, [("a", i32), ("b", i32)])
    ids["func"] = b.add_func("f", ids["proto"], FUNC_GLOBAL)
    ids["float"] = b.add_float("float", 4)
    ids["decl_tag"] = b.add_decl_tag("tag", ids["var"])
    ids["type_tag"] = b.add_type_tag("user", i32)
    ids["ptr"] = b.add_ptr(ids["type_tag"])
    ids["enum"] = b.add_enum("e", 4, [("A", -1)], signed=True)
    ids["enum64"] = b.add_enum64("e64", 8, [("BIG", 1 << 40), ("SMALL", 1)])
    return Btf.from_bytes(b.build()), ids


def test_nothing_missing_keeps_bytes() -> None:
    btf, _ = _every_kind()
    assert sanitize_btf(btf, ALL) == bytes(btf.raw)


def test_everything_missing_rewrites_every_kind_and_keeps_ids() -> None:
    btf, ids = _every_kind()
    out = Btf.from_bytes(sanitize_btf(btf, NONE))
    assert out.end_id == btf.end_id + 1  # only the enum64 placeholder INT was appended
    expect = {
        "var": Kind.INT,
        "datasec": Kind.STRUCT,
        "proto": Kind.ENUM,
        "func": Kind.TYPEDEF,
        "float": Kind.STRUCT,
        "decl_tag": Kind.INT,
        "type_tag": Kind.CONST,
        "enum": Kind.ENUM,
        "enum64": Kind.UNION,
        "int": Kind.INT,
        "ptr": Kind.PTR,
    }
    for key, kind in expect.items():
        assert out.kind(ids[key]) == kind, key
    ds = out.type(ids["datasec"])
    assert isinstance(ds, Composite)
    assert ds.name == "_data_x"
    assert [(m.name, m.type, m.bit_offset) for m in ds.members] == [
        ("counter", ids["var"], 0),
        ("other", ids["var2"], 32),
    ]
    assert out.type_name(ids["qdatasec"]) == "__struct_ops"  # as STRUCT: every '.'/'?'
    only_qmark = Btf.from_bytes(sanitize_btf(btf, dataclasses.replace(ALL, qmark_datasec=False)))
    assert only_qmark.type_name(ids["qdatasec"]) == "_.struct_ops"
    assert only_qmark.kind(ids["qdatasec"]) == Kind.DATASEC
    assert out.size_of(ids["float"]) == 4 and out.type_name(ids["float"]) == ""
    union = out.type(ids["enum64"])
    assert isinstance(union, Composite) and {m.type for m in union.members} == {btf.end_id}
    assert out.size_of(btf.end_id) == 8


@pytest.mark.parametrize("missing", [f.name for f in dataclasses.fields(BtfFeatures)])
def test_single_missing_feature(missing: str) -> None:
    btf, ids = _every_kind()
    feats = dataclasses.replace(ALL, **{missing: False})
    out = Btf.from_bytes(sanitize_btf(btf, feats))
    assert out.kind(ids["int"]) == Kind.INT
    if missing != "datasec":
        assert out.kind(ids["var"]) == Kind.VAR
    if missing not in ("func", "func_global"):
        assert out.kind(ids["func"]) == Kind.FUNC


@pytest.mark.root
def test_kernel_accepts_fully_sanitized_btf() -> None:
    btf, _ = _every_kind()
    with syscall.btf_load(sanitize_btf(btf, NONE)) as fd:
        assert syscall.btf_info(fd).id > 0


def test_datasec_offset_whose_bit_offset_overflows_is_a_btf_error() -> None:
    # A DATASEC becomes a STRUCT for kernels without DATASEC: byte offsets become bit
    # offsets, which overflow 32 bits from 512 MiB on (struct.error before the check).
    b = BtfBuilder()
    i = b.add_int("int", 4, signed=True)
    v = b.add_var("far", i, VAR_GLOBAL_ALLOCATED)
    b.add_datasec(".bss", (1 << 29) + 8, [(v, 1 << 29, 4)])
    btf = Btf.from_bytes(b.build())
    with pytest.raises(BtfError, match="bit offset overflows 32 bits"):
        sanitize_btf(btf, dataclasses.replace(ALL, datasec=False))
    sanitize_btf(btf, ALL)  # a kernel with DATASEC takes it as it is
