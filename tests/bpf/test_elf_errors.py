"""Truncated or malformed ELF files: the error names the file and says what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.cli.ctl import main
from schedswitchd.errors import ObjectError

OBJ = Path(__file__).resolve().parents[2] / "build" / "tests" / "bpf" / "struct_ops.bpf.o"


def _cut(tmp_path: Path, size: int) -> Path:
    if not OBJ.is_file():
        pytest.fail(f"{OBJ} is missing: run `make test-objects`")
    out = tmp_path / f"cut{size}.bpf.o"
    out.write_bytes(OBJ.read_bytes()[:size])
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
