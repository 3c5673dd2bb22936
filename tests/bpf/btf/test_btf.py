"""BTF reader and builder: every kind round-trips, lookups, split BTF, bad input."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import (
    FUNC_STATIC,
    INT_SIGNED,
    VAR_GLOBAL_EXTERN,
    Array,
    Composite,
    Datasec,
    DeclTag,
    Enum,
    EnumValue,
    Float,
    Func,
    FuncProto,
    Fwd,
    Int,
    Kind,
    Member,
    Param,
    Ref,
    Var,
    VarSecinfo,
    Void,
)
from schedswitchd.errors import BtfError


def _sample() -> tuple[Btf, dict[str, int]]:
    b = BtfBuilder()
    ids: dict[str, int] = {}
    ids["int"] = b.add_int("int", 4, signed=True)
    ids["uint"] = b.add_int("unsigned int", 4)
    ids["long"] = b.add_int("long int", 8, signed=True)
    ids["char"] = b.add_int("char", 1, encoding=0)
    ids["ptr"] = b.add_ptr(ids["int"])
    ids["arr"] = b.add_array(ids["char"], ids["int"], 16)
    ids["inner"] = b.add_struct("", 8, [("x", ids["int"], 0, 0), ("y", ids["int"], 32, 0)])
    ids["s"] = b.add_struct(
        "s",
        32,
        [
            ("a", ids["uint"], 0, 3),
            ("b", ids["uint"], 3, 5),
            ("", ids["inner"], 64, 0),
            ("p", ids["ptr"], 128, 0),
            ("name", ids["arr"], 192, 0),
        ],
    )
    ids["u"] = b.add_union("u", 8, [("l", ids["long"], 0, 0), ("i", ids["int"], 0, 0)])
    ids["e"] = b.add_enum("e", 4, [("NEG", -1), ("ONE", 1)], signed=True)
    ids["eu"] = b.add_enum("eu", 4, [("BIGU", 0xFFFFFFFF)])
    ids["e64"] = b.add_enum64("e64", 8, [("M", -(1 << 40))], signed=True)
    ids["e64u"] = b.add_enum64("e64u", 8, [("HUGE", (1 << 64) - 1)])
    ids["fwd_s"] = b.add_fwd("fs")
    ids["fwd_u"] = b.add_fwd("fu", is_union=True)
    ids["td"] = b.add_typedef("s_t", ids["s"])
    ids["const"] = b.add_const(ids["td"])
    ids["vol"] = b.add_volatile(ids["const"])
    ids["restrict"] = b.add_restrict(ids["ptr"])
    ids["ttag"] = b.add_type_tag("user", ids["vol"])
    ids["proto"] = b.add_func_proto(ids["int"], [("x", ids["int"]), ("", 0)])
    ids["func"] = b.add_func("f", ids["proto"], FUNC_STATIC)
    ids["var"] = b.add_var("v", ids["s"], VAR_GLOBAL_EXTERN)
    ids["sec"] = b.add_datasec(".data", 32, [(ids["var"], 0, 32)])
    ids["float"] = b.add_float("double", 8)
    ids["tag"] = b.add_decl_tag("t", ids["func"], 0)
    ids["flav"] = b.add_struct("s___v2", 4, [("a", ids["int"], 0, 0)])
    return Btf.from_bytes(b.build(), name="sample"), ids


def test_every_kind_decodes() -> None:
    btf, ids = _sample()
    assert btf.start_id == 1 and btf.end_id == len(ids) + 1 and len(btf) == len(ids)
    assert btf.type(0) == Void()
    assert btf.type(ids["int"]) == Int(ids["int"], "int", 4, INT_SIGNED, 0, 32)
    assert btf.type(ids["ptr"]) == Ref(ids["ptr"], Kind.PTR, "", ids["int"])
    assert btf.type(ids["arr"]) == Array(ids["arr"], ids["char"], ids["int"], 16)
    s = btf.type(ids["s"])
    assert isinstance(s, Composite) and s.kind == Kind.STRUCT and s.size == 32
    assert s.members[0] == Member("a", ids["uint"], 0, 3)
    assert s.members[1] == Member("b", ids["uint"], 3, 5)
    assert s.members[2] == Member("", ids["inner"], 64, 0)
    u = btf.type(ids["u"])
    assert isinstance(u, Composite) and u.kind == Kind.UNION
    assert u.members == (Member("l", ids["long"], 0, 0), Member("i", ids["int"], 0, 0))
    assert btf.type(ids["e"]) == Enum(
        ids["e"], Kind.ENUM, "e", 4, True, (EnumValue("NEG", -1), EnumValue("ONE", 1))
    )
    eu = btf.type(ids["eu"])
    assert isinstance(eu, Enum) and not eu.signed and eu.values[0].value == 0xFFFFFFFF
    e64 = btf.type(ids["e64"])
    assert isinstance(e64, Enum) and e64.kind == Kind.ENUM64 and e64.values[0].value == -(1 << 40)
    e64u = btf.type(ids["e64u"])
    assert isinstance(e64u, Enum) and e64u.values[0].value == (1 << 64) - 1
    assert btf.type(ids["fwd_s"]) == Fwd(ids["fwd_s"], "fs", False)
    assert btf.type(ids["fwd_u"]) == Fwd(ids["fwd_u"], "fu", True)
    assert btf.type(ids["td"]) == Ref(ids["td"], Kind.TYPEDEF, "s_t", ids["s"])
    assert btf.type(ids["const"]) == Ref(ids["const"], Kind.CONST, "", ids["td"])
    assert btf.type(ids["vol"]) == Ref(ids["vol"], Kind.VOLATILE, "", ids["const"])
    assert btf.type(ids["restrict"]) == Ref(ids["restrict"], Kind.RESTRICT, "", ids["ptr"])
    assert btf.type(ids["ttag"]) == Ref(ids["ttag"], Kind.TYPE_TAG, "user", ids["vol"])
    assert btf.type(ids["proto"]) == FuncProto(
        ids["proto"], ids["int"], (Param("x", ids["int"]), Param("", 0))
    )
    assert btf.type(ids["func"]) == Func(ids["func"], "f", ids["proto"], FUNC_STATIC)
    assert btf.type(ids["var"]) == Var(ids["var"], "v", ids["s"], VAR_GLOBAL_EXTERN)
    assert btf.type(ids["sec"]) == Datasec(
        ids["sec"], ".data", 32, (VarSecinfo(ids["var"], 0, 32),)
    )
    assert btf.type(ids["float"]) == Float(ids["float"], "double", 8)
    assert btf.type(ids["tag"]) == DeclTag(ids["tag"], "t", ids["func"], 0)
    for name, tid in ids.items():
        assert btf.kind(tid) == btf.type(tid).kind, name
        assert btf.type_name(tid) == btf.type(tid).name, name


def test_lookups_and_type_algebra() -> None:
    btf, ids = _sample()
    assert btf.find("s", Kind.STRUCT) == ids["s"]
    assert btf.find("s", Kind.UNION) is None
    assert btf.find_ids("int", Kind.INT) == [ids["int"]]
    assert btf.find_by_essential_name("s", Kind.STRUCT) == [ids["s"], ids["flav"]]
    assert btf.skip_modifiers(ids["ttag"]) == ids["td"]
    assert btf.skip_mods_and_typedefs(ids["ttag"]) == ids["s"]
    assert btf.size_of(ids["ttag"]) == 32
    assert btf.size_of(ids["arr"]) == 16
    assert btf.size_of(ids["ptr"]) == 8
    assert btf.size_of(ids["var"]) == 32
    assert btf.align_of(ids["s"]) == 8
    assert btf.align_of(ids["arr"]) == 1
    for bad in ("func", "proto", "fwd_s"):
        with pytest.raises(BtfError):
            btf.size_of(ids[bad])
    with pytest.raises(BtfError):
        btf.size_of(0)
    hit = btf.find_member(ids["td"], "y")
    assert hit == (96, Member("y", ids["int"], 32, 0))
    assert btf.find_member(ids["s"], "b") == (3, Member("b", ids["uint"], 3, 5))
    assert btf.find_member(ids["s"], "nope") is None
    with pytest.raises(BtfError):
        btf.find_member(ids["int"], "x")
    assert btf.type_offset(1) == 24
    with pytest.raises(BtfError):
        btf.type(btf.end_id)


def test_split_btf_continues_ids_and_strings() -> None:
    base, ids = _sample()
    b = BtfBuilder(base)
    s2 = b.add_struct("mod_s", 16, [("base_s", ids["s"], 0, 0), ("x", ids["int"], 64, 0)])
    p2 = b.add_ptr(s2)
    s_again = b.add_struct("s", 4, [("a", ids["int"], 0, 0)])
    split = Btf.from_bytes(b.build(), base=base, name="mod")
    assert split.start_id == base.end_id == s2
    assert split.start_str_off == base.start_str_off + base._str_len
    assert split.type(s2).name == "mod_s"
    assert split.type(ids["s"]) == base.type(ids["s"])
    assert split.kind(p2) == Kind.PTR
    assert split.type_name(ids["int"]) == "int"
    assert split.find_ids("s", Kind.STRUCT) == [s_again]
    assert split.find("s", Kind.STRUCT) == s_again
    assert split.find("u", Kind.UNION) == ids["u"]
    assert split.find_ids("u", Kind.UNION) == []
    assert split.find_member(s2, "x") == (64, Member("x", ids["int"], 64, 0))
    assert split.size_of(p2) == 8
    with pytest.raises(BtfError):
        split.type_offset(ids["s"])
    with pytest.raises(BtfError):
        split.string(split.start_str_off + 10_000)


def test_cycles_are_errors_not_hangs() -> None:
    b = BtfBuilder()
    # ids 1 and 2 refer to each other: typedef -> const -> typedef ...
    b.add_typedef("loop", 2)
    b.add_const(1)
    b.add_array(3, 0, 2)  # array of itself
    b.add_struct("self", 4, [("me", 4, 0, 0)])
    b.add_volatile(6)  # 5 -> 6 -> 5: a cycle through modifiers only
    b.add_const(5)
    btf = Btf.from_bytes(b.build())
    for call in (btf.skip_mods_and_typedefs, btf.size_of, btf.align_of):
        with pytest.raises(BtfError, match="cycle"):
            call(1)
    with pytest.raises(BtfError, match="cycle"):
        btf.skip_modifiers(5)
    with pytest.raises(BtfError, match="cycle"):
        btf.align_of(4)


def test_array_of_typedef_of_itself_is_a_cycle() -> None:
    b = BtfBuilder()
    i = b.add_int("int", 4)
    arr = b.add_array(arr_td := b.next_id + 1, i, 2)
    assert b.add_typedef("loop_t", arr) == arr_td
    btf = Btf.from_bytes(b.build())
    with pytest.raises(BtfError, match="cycle"):
        btf.align_of(arr)
    with pytest.raises(BtfError, match="cycle"):
        btf.size_of(arr_td)
    with pytest.raises(BtfError):
        btf.size_of(3)
    with pytest.raises(BtfError):
        btf.align_of(4)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "truncated"),
        (b"\x9f\xeb\x01\x00", "truncated"),
        (struct.pack("<HBBIIIII", 0x1234, 1, 0, 24, 0, 0, 0, 1) + b"\0", "magic"),
        (struct.pack("<HBBIIIII", 0xEB9F, 2, 0, 24, 0, 0, 0, 1) + b"\0", "version"),
        (struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, 12, 0, 1) + b"\0", "type section"),
        (struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, 0, 0, 9) + b"\0", "string section"),
        (struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, 0, 0, 2) + b"\0a", "NUL"),
        (struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, 0, 0, 2) + b"a\0", "empty string"),
        (struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 99, 0, 0, 0, 1) + b"\0", "header length"),
        (
            struct.pack("<HBBIIIIIIII", 0xEB9F, 1, 0, 24, 0, 12, 12, 1, 0, 20 << 24, 0) + b"\0",
            "unknown BTF kind 20",
        ),
        (
            struct.pack("<HBBIIIIIIII", 0xEB9F, 1, 0, 24, 0, 12, 12, 1, 0, 4 << 24 | 1, 0) + b"\0",
            "past the end of the type section",
        ),
        (
            struct.pack("<HBBIIIIIII", 0xEB9F, 1, 0, 24, 0, 8, 8, 1, 0, 2 << 24) + b"\0",
            "past the end of the type section",
        ),
    ],
)
def test_bad_input_is_a_named_btf_error(data: bytes, words: str) -> None:
    with pytest.raises(BtfError, match=words) as exc:
        Btf.from_bytes(data)
    assert exc.value.where


def test_out_of_range_string_and_dangling_ids() -> None:
    b = BtfBuilder()
    b.add_raw(Kind.INT, 5000, 0, False, 4, [32])  # name offset past the string section
    b.add_ptr(77)
    c = b.add_const(77)
    btf = Btf.from_bytes(b.build())
    with pytest.raises(BtfError, match="string offset 5000"):
        btf.type(1)
    with pytest.raises(BtfError, match="type id 77"):
        btf.kind(77)
    with pytest.raises(BtfError, match="type id 77"):
        btf.skip_modifiers(c)
    with pytest.raises(BtfError, match="type id 77"):
        btf.size_of(c)


def test_big_endian_btf_is_read() -> None:
    b = BtfBuilder()
    i = b.add_int("int", 4, signed=True)
    s = b.add_struct("s", 4, [("x", i, 0, 0)])
    le = b.build()
    hdr = struct.unpack_from("<HBBIIIII", le, 0)
    words = struct.unpack_from(f"<{hdr[5] // 4}I", le, 24)
    be = struct.pack(">HBBIIIII", *hdr) + struct.pack(f">{len(words)}I", *words) + le[24 + hdr[5] :]
    btf = Btf.from_bytes(be)
    assert btf.type(s) == Composite(s, Kind.STRUCT, "s", 4, (Member("x", i, 0, 0),))


def test_from_file_raw_and_name(tmp_path: Path) -> None:
    btf, _ = _sample()
    p = tmp_path / "mymod"
    p.write_bytes(bytes(btf.raw))
    loaded = Btf.from_file(p)
    assert loaded.name == "mymod"
    assert loaded.find("s", Kind.STRUCT) == btf.find("s", Kind.STRUCT)
    with pytest.raises(BtfError, match="cannot open"):
        Btf.from_file(tmp_path / "missing")
    elf = tmp_path / "x.o"
    elf.write_bytes(b"\x7fELF" + b"\0" * 60)
    with pytest.raises(BtfError):
        Btf.from_file(elf)


def test_elf_section_errors_name_the_file(tmp_path: Path) -> None:
    from schedswitchd.bpf.btf.source import elf_section

    btf, _ = _sample()
    raw = bytes(btf.raw)
    # A minimal ELF64 LE: header, one .BTF section, section-name table, section headers.
    names = b"\0.BTF\0.shstrtab\0"
    body_off = 64
    names_off = body_off + len(raw)
    shoff = (names_off + len(names) + 7) & ~7
    ehdr = (
        b"\x7fELF\x02\x01\x01"
        + b"\0" * 9
        + struct.pack("<HHIQQQIHHHHHH", 1, 247, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 2)
    )
    sh0 = b"\0" * 64
    sh_btf = struct.pack("<IIQQQQIIQQ", 1, 1, 0, 0, body_off, len(raw), 0, 0, 4, 0)
    sh_str = struct.pack("<IIQQQQIIQQ", 6, 3, 0, 0, names_off, len(names), 0, 0, 1, 0)
    elf = ehdr + raw + names
    elf += b"\0" * (shoff - len(elf)) + sh0 + sh_btf + sh_str
    assert elf_section(elf, ".BTF") == raw
    path = tmp_path / "obj.bpf.o"
    path.write_bytes(elf)
    loaded = Btf.from_file(path)
    assert loaded.name == "obj" and loaded.find("s", Kind.STRUCT) == btf.find("s", Kind.STRUCT)
    with pytest.raises(BtfError, match=r"no \.maps section"):
        elf_section(elf, ".maps", where="obj.bpf.o")
    with pytest.raises(BtfError, match="section headers past the file end"):
        elf_section(elf[: shoff + 100], ".BTF")
    with pytest.raises(BtfError, match="not an ELF"):
        elf_section(b"\x7fELX" + elf[4:], ".BTF")
    import lzma

    xz = tmp_path / "m.ko.xz"
    xz.write_bytes(lzma.compress(elf))
    assert Btf.from_file(xz).name == "m"
    xz.write_bytes(b"\xfd7zXZ\x00garbage")
    with pytest.raises(BtfError, match="xz"):
        Btf.from_file(xz)
