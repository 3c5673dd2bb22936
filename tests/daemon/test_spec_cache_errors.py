"""The spec cache's errors name the object's file once: it opens from a file object, so
before, a malformed object's error did not say which file (the daemon opens many), and the
daemon's pre-open warning added the path to an error that already held it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from schedswitchd.daemon.config import SchedulerConfig
from schedswitchd.daemon.kernel_backend import KernelBackend
from schedswitchd.errors import ObjectError
from schedswitchd.kernel.spec_cache import SpecCache


def test_missing_and_malformed_objects_name_their_file_once(tmp_path: Path) -> None:
    cache = SpecCache()
    missing = tmp_path / "missing.bpf.o"
    with pytest.raises(ObjectError) as info:
        cache.open(missing)
    assert str(info.value) == (
        f"cannot read BPF object '{missing}': No such file or directory "
        "(expected a .bpf.o BPF ELF object, or an executable embedding one)"
    )
    bad = tmp_path / "bad.bpf.o"
    bad.write_bytes(b"not an ELF file")
    with pytest.raises(ObjectError) as info:
        cache.open(bad)
    assert str(info.value).startswith(f"{bad}: not an ELF file")
    assert str(info.value).count(str(bad)) == 1


def test_preopen_warning_names_the_file_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = KernelBackend(pin_dir=tmp_path / "pins", sched_ext_root=tmp_path / "scx")
    missing, bad = tmp_path / "missing.bpf.o", tmp_path / "bad.bpf.o"
    bad.write_bytes(b"\x7fELF")
    with caplog.at_level(logging.WARNING, logger="schedswitchd"):
        backend.preopen(
            {
                "one": SchedulerConfig(object=str(missing)),
                "two": SchedulerConfig(object=str(bad)),
            }
        )
    lines = [r.getMessage() for r in caplog.records if "cannot pre-open" in r.getMessage()]
    assert len(lines) == 2
    assert lines[0].startswith("cannot pre-open one: cannot read BPF object")
    assert lines[0].count(str(missing)) == 1
    assert lines[1].startswith(f"cannot pre-open two: {bad}: ") and lines[1].count(str(bad)) == 1
