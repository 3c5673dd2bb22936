"""Object BTF fix-up of kfunc prototypes: the kernel refuses a FUNC whose FUNC_PROTO has
an unnamed parameter, so each unnamed one (but a trailing ``void``, the varargs marker)
gets the dummy ksym VAR's name (libbpf's ``bpf_object__collect_externs``). The fix-up reads
the prototypes from the object's records, which kfuncs may share."""

from __future__ import annotations

import struct

import pytest

from schedswitchd.bpf.btf.builder import BtfBuilder
from schedswitchd.bpf.btf.fixup import DUMMY_KSYM_NAME, fixup_object_btf
from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.btf.types import FUNC_EXTERN, Func, FuncProto
from schedswitchd.bpf.elf import ElfObject
from schedswitchd.errors import BtfError


def _params(btf: Btf, func_id: int) -> list[tuple[str, int]]:
    fn = btf.type(func_id)
    assert isinstance(fn, Func)
    proto = btf.type(fn.type)
    assert isinstance(proto, FuncProto)
    return [(p.name, p.type) for p in proto.params]


def test_unnamed_params_of_shared_prototypes_get_the_dummy_name() -> None:
    b = BtfBuilder()
    i32 = b.add_int("int", 4)
    shared = b.add_func_proto(i32, [("", i32), ("flags", i32)])
    varargs = b.add_func_proto(i32, [("fmt", i32), ("", 0)])
    f1 = b.add_func("kf_one", shared, FUNC_EXTERN)
    f2 = b.add_func("kf_two", shared, FUNC_EXTERN)
    f3 = b.add_func("kf_printf", varargs, FUNC_EXTERN)
    b.add_datasec(".ksyms", 0, [(f1, 0, 0), (f2, 0, 0), (f3, 0, 0)])
    btf = Btf.from_bytes(b.build())
    fixed = Btf.from_bytes(fixup_object_btf(btf, ElfObject((), (), {}), {}, 0))
    for f in (f1, f2):
        assert _params(fixed, f) == [(DUMMY_KSYM_NAME, i32), ("flags", i32)]
    assert _params(fixed, f3) == [("fmt", i32), ("", 0)]  # varargs stay unnamed
    # the object's own BTF is left as it was
    assert _params(btf, f1) == [("", i32), ("flags", i32)]


def test_param_name_past_the_strings_is_a_btf_error() -> None:
    b = BtfBuilder()
    i32 = b.add_int("int", 4)
    proto = b.add_func_proto(i32, [("x", i32)])
    f1 = b.add_func("kf_one", proto, FUNC_EXTERN)
    b.add_datasec(".ksyms", 0, [(f1, 0, 0)])
    raw = bytearray(b.build())
    btf = Btf.from_bytes(bytes(raw))
    at = btf.type_offset(proto) + 12  # the first btf_param's name_off
    struct.pack_into("<I", raw, at, 1 << 20)
    with pytest.raises(BtfError, match="past the string section"):
        fixup_object_btf(Btf.from_bytes(bytes(raw)), ElfObject((), (), {}), {}, 0)
