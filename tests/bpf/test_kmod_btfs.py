"""``.kmod_btfs`` parsing: both layouts, merging, empty sections, invalid names."""

from __future__ import annotations

import struct

import pytest

from schedswitchd.bpf.kmod_btfs import parse_fixed, parse_pointers
from schedswitchd.errors import ObjectError


def _fixed(*names: bytes, width: int = 56) -> bytes:
    return b"".join(n.ljust(width, b"\0") for n in names)


def test_fixed_layout_with_and_without_width() -> None:
    data = _fixed(b"nf_tables", b"xfs", b"nf_tables", b"", b"kvm-intel", b"kvm_intel")
    for width in (56, None):
        assert parse_fixed(data, width) == ("nf_tables", "xfs", "kvm_intel")


def test_empty_section_means_no_modules() -> None:
    assert parse_fixed(b"") == ()
    assert parse_fixed(bytes(112), 56) == ()
    assert parse_pointers(b"", {}, lambda s, o: b"") == ()


def test_name_of_55_bytes_is_accepted_56_is_not() -> None:
    ok = b"a" * 55
    assert parse_fixed(_fixed(ok), 56) == (ok.decode(),)
    with pytest.raises(ObjectError, match="offset 56 is not NUL-terminated"):
        parse_fixed(_fixed(b"x") + b"b" * 56, 56)
    with pytest.raises(ObjectError, match="offset 4 is 56 bytes, longer than 55"):
        parse_fixed(b"xfs\0" + b"b" * 56 + b"\0")


@pytest.mark.parametrize(
    ("name", "offset"),
    [(b"bad name", 56), (b"bad/name", 56), (b"\xff\xfe", 56), (b"a.b", 56)],
)
def test_invalid_characters_name_the_offset(name: bytes, offset: int) -> None:
    with pytest.raises(ObjectError, match=f"name at offset {offset}"):
        parse_fixed(_fixed(b"ok", name), 56)


def test_unterminated_stream_and_trailing_garbage() -> None:
    with pytest.raises(ObjectError, match="offset 4 is not NUL-terminated"):
        parse_fixed(b"xfs\0kvm")
    with pytest.raises(ObjectError, match="bytes after its terminating NUL"):
        parse_fixed(b"xfs\0z".ljust(56, b"\0"), 56)


def test_pointer_layout() -> None:
    strings = b"btrfs\0ext4\0bad name\0unterminated"
    data = struct.pack("<4Q", 0, 6, 0, 0)
    targets = {0: (7, 0), 8: (7, 0), 16: (7, 0)}

    def read(sec: int, off: int) -> bytes:
        assert sec == 7
        return strings[off:]

    assert parse_pointers(data, targets, read) == ("btrfs", "ext4")
    with pytest.raises(ObjectError, match="offset 8"):
        parse_pointers(struct.pack("<2Q", 0, 11), {0: (7, 0), 8: (7, 0)}, read)
    with pytest.raises(ObjectError, match="offset 0 is not NUL-terminated"):
        parse_pointers(struct.pack("<Q", 20), {0: (7, 0)}, read)
    with pytest.raises(ObjectError, match="offset 8 is not relocated but non-zero"):
        parse_pointers(struct.pack("<2Q", 0, 5), {0: (7, 0)}, read)
    with pytest.raises(ObjectError, match="whole number of pointers"):
        parse_pointers(b"\0" * 12, {}, read)
