"""Truncated or malformed ELF files: the error names the file and says what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.cli.ctl import main
from schedswitchd.errors import ObjectError
from tests.build_outputs import missing_build_output

OBJ = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf" / "struct_ops.bpf.o"


def _obj_bytes() -> bytes:
    if not OBJ.is_file():
        missing_build_output(OBJ, "test-objects")
    return OBJ.read_bytes()


def _cut(tmp_path: Path, size: int) -> Path:
    out = tmp_path / f"cut{size}.bpf.o"
    out.write_bytes(_obj_bytes()[:size])
    return out


def test_truncated_object_names_file_and_section_table(tmp_path: Path) -> None:
    path = _cut(tmp_path, 3000)
    with pytest.raises(ObjectError) as exc:
        open_object(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: truncated ELF file")
    assert "section header table" in msg and "only 3000 bytes" in msg


def test_object_shorter_than_the_header(tmp_path: Path) -> None:
    path = _cut(tmp_path, 40)
    with pytest.raises(ObjectError, match="40 bytes is shorter than the 64-byte ELF header"):
        open_object(path)


def test_inspect_of_a_truncated_object_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _cut(tmp_path, 100)
    assert main(["object", "inspect", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "truncated ELF file" in err


def test_file_cut_short_while_being_read_is_an_object_error(tmp_path: Path) -> None:
    """Objects are read from the open file by offset, never mapped: a file that shrinks while
    being read (an object rebuilt in place) gives an ObjectError, not a SIGBUS."""
    from schedswitchd.bpf.elf import _FileBytes, read_elf

    path = _cut(tmp_path, len(_obj_bytes()))
    with open(path, "rb") as f:
        assert read_elf(f).section_by_name(".BTF") is not None  # read from the open file
        view = _FileBytes(f)  # what read_elf slices sections from, sized at the start
        assert view[0:4] == b"\x7fELF" and len(view) > 4096
        with open(path, "r+b") as w:
            w.truncate(1000)
        with pytest.raises(ObjectError, match="shrank while being read"):
            view[0:4096]
