"""The community scheduler corpus (``../shared/corpus``, see tests/corpus.py) on the host: every
object opens, and its BTF after our fix-up passes the host kernel's ``BPF_BTF_LOAD`` (the
host has no sched_ext, so full loads run in the VM: tests/vm/). Skips when the corpus is
absent."""

from __future__ import annotations

import pytest

from schedswitchd.bpf.customize import resize_array_section
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import MapKind
from schedswitchd.kernel import syscall
from tests.corpus import OBJECTS, corpus_object


@pytest.mark.parametrize("name", OBJECTS)
def test_corpus_object_opens(name: str) -> None:
    spec = open_object(corpus_object(name))
    assert spec.btf is not None
    assert any(m.kind is MapKind.STRUCT_OPS for m in spec.maps)
    for m in spec.maps:
        if m.kind is MapKind.ARENA:  # lavd, p2dq: megabytes of zero globals, none kept
            assert m.map_extra and m.data_size > len(m.data or b"")


@pytest.mark.root
@pytest.mark.parametrize("name", OBJECTS)
def test_corpus_object_btf_loads(name: str) -> None:
    spec = open_object(corpus_object(name))
    assert spec.btf is not None
    syscall.btf_load(spec.btf.raw).close()


@pytest.mark.root
def test_corpus_central_resized_btf_loads() -> None:
    """scx_central resizes its per-CPU ``.data.*`` arrays before load (``RESIZE_ARRAY``); the
    resized object's BTF must still pass the kernel's checker."""
    spec = open_object(corpus_object("k_central"))
    # bool cpu_gimme_task[1], u64 cpu_started_at[1] -> 64 CPUs
    for section, elem in ((".data.cpu_gimme_task", 1), (".data.cpu_started_at", 8)):
        assert spec.map(section).value_size == elem
        spec = resize_array_section(spec, section, 64)
        assert spec.map(section).value_size == 64 * elem
    assert spec.btf is not None
    syscall.btf_load(spec.btf.raw).close()
