"""BPF objects embedded in executables (build/tests/embed/*: tests/embed/embed.c with zero,
one or two .bpf.o files .incbin'd, as a libbpf-rs skeleton embeds its object)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from schedswitchd.bpf.embedded import find_embedded, select_object
from schedswitchd.bpf.object import open_object, open_object_noted
from schedswitchd.cli import ctl
from schedswitchd.errors import ObjectError
from schedswitchd.kernel.spec_cache import SpecCache
from tests.build_outputs import missing_build_output

BUILD = Path(__file__).resolve().parents[2] / "build" / "tests"
EMBED = BUILD / "embed"


def _file(path: Path) -> Path:
    if not path.is_file():
        missing_build_output(path)
    return path


def test_one_object_is_found_whole() -> None:
    data = _file(EMBED / "one_obj").read_bytes()
    obj = _file(BUILD / "bpf" / "profile.bpf.o").read_bytes()
    found = find_embedded(data)
    assert len(found) == 1 and found[0].size == len(obj) and found[0].struct_ops
    assert data[found[0].offset : found[0].offset + found[0].size] == obj
    chosen, note = select_object(data, "one_obj")
    assert chosen == obj and note is not None and f"{found[0].offset:#x}" in note


def test_two_objects_prefer_the_scheduler() -> None:
    data = _file(EMBED / "two_obj").read_bytes()
    globals_o = _file(BUILD / "bpf" / "globals.bpf.o").read_bytes()
    prof_o = _file(BUILD / "bpf" / "profile.bpf.o").read_bytes()
    found = find_embedded(data)
    assert [f.size for f in found] == [len(globals_o), len(prof_o)]
    assert [f.struct_ops for f in found] == [False, True]
    chosen, note = select_object(data, "two_obj")
    assert chosen == prof_o
    assert note is not None and "2 embedded, chose the first with struct_ops" in note
    assert f"others at {found[0].offset:#x} ({len(globals_o)} bytes)" in note
    spec, note2 = open_object_noted(EMBED / "two_obj")
    assert note2 == note.replace("two_obj", str(EMBED / "two_obj"))
    ref = open_object(BUILD / "bpf" / "profile.bpf.o")
    assert [p.name for p in spec.programs] == [p.name for p in ref.programs]
    assert [m.name for m in spec.maps] == [m.name for m in ref.maps]
    assert spec.name == "two_obj"  # named after the executable, as libbpf-rs would not be


def test_plain_object_has_no_note() -> None:
    data = _file(BUILD / "bpf" / "profile.bpf.o").read_bytes()
    assert select_object(data, "x") == (data, None)


def test_no_object_is_refused_clearly(tmp_path: Path) -> None:
    refused = r"machine EM_X86_64 \(not EM_BPF 247\) that embeds no BPF"
    with pytest.raises(ObjectError, match=refused):
        open_object(_file(EMBED / "no_obj"))
    # not ELF at all: passed on for the ELF reader's own error
    assert select_object(b"#!/bin/sh\necho hi\n", "script") == (b"#!/bin/sh\necho hi\n", None)
    script = tmp_path / "sched.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(ObjectError, match=str(script)):
        open_object(script)


def test_spec_cache_opens_executables() -> None:
    cache = SpecCache()
    first = cache.open(_file(EMBED / "two_obj"))
    again = cache.open(EMBED / "two_obj")
    assert first.note is not None and again.cached and again.note == first.note
    assert any(m.name == "ssd_prof" for m in first.spec.maps)


def test_bogus_headers_are_skipped() -> None:
    obj = _file(BUILD / "bpf" / "profile.bpf.o").read_bytes()
    bad = bytearray(obj)
    struct.pack_into("<Q", bad, 0x28, len(obj) * 4)  # e_shoff beyond the data
    assert find_embedded(b"junk" + bytes(bad)) == []
    cut = obj[: len(obj) - 100]  # a truncated image is not an object
    assert find_embedded(b"\0" * 8 + cut) == []
    # an image after garbage that merely looks like an ELF header start
    blob = b"\x7fELF\x02\x01\x01" + b"\0" * 100 + obj
    assert [f.offset for f in find_embedded(blob)] == [107]


def test_inspect_and_json_say_which(capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["object", "inspect", str(_file(EMBED / "two_obj")), "--no-core"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"{EMBED / 'two_obj'}: using the BPF object")
    assert ctl.main(["object", "inspect", str(EMBED / "two_obj"), "--json", "--no-core"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "chose the first with struct_ops" in d["embedded"]
    assert ctl.main(["object", "inspect", str(_file(EMBED / "no_obj"))]) == 1
    assert "embeds no BPF object" in capsys.readouterr().err
