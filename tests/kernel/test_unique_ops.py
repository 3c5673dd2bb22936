"""The host tests that register congestion controls do so under this process's names
(tests/kernel/unique_ops.py), so a host suite beside another does not meet the other's
``ssd_uei``: with the compiled names registered by another process, those tests pass."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.scheduler import ops_name_of
from schedswitchd.errors import SchedSwitchError
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.loader import LoadedObject, load_object
from tests.build_outputs import built_object
from tests.kernel.fake_sched_ext import registered_names
from tests.kernel.unique_ops import TOKEN, ca_name, unique_object, unique_spec

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
#: The objects (and their compiled names) the converted tests register.
COMPILED = {"uei": ["ssd_uei"], "struct_ops": ["ssd_plain", "ssd_link"], "ca_hooks": ["ssd_hooks"]}


def test_names_are_this_process_s_and_fit_the_kernel() -> None:
    assert ca_name("ssd_uei") == f"s{TOKEN}_uei"
    assert all(len(ca_name(n)) <= 15 for n in ("ssd_nameonly", "ssd_plain", "ssd_hooks"))
    assert int(TOKEN, 36) == os.getpid()


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_the_copy_differs_only_in_the_names(name: str) -> None:
    path = built_object(name)
    copy = unique_object(path)
    assert unique_object(path) == copy  # one copy per process
    before, after = open_object(path), open_object(copy)
    assert copy.stat().st_size == path.stat().st_size
    assert [m.name for m in after.maps] == [m.name for m in before.maps]
    assert after.programs == before.programs
    ops = {m.name: ops_name_of(after, m.name) for m in after.struct_ops_maps}
    assert sorted(ops.values()) == sorted(ca_name(n) for n in COMPILED[name])
    # the same bytes as the spec-level rename (set_struct_ops_member) gives
    assert [m.struct_ops for m in after.struct_ops_maps] == [
        m.struct_ops for m in unique_spec(before).struct_ops_maps
    ]


@contextlib.contextmanager
def _compiled_names_registered() -> Iterator[None]:
    """The compiled names registered, as a suite running the test objects beside this one
    has them (by this process; a name another process holds already is as good)."""
    registry = KernelBtfRegistry()
    with contextlib.ExitStack() as stack:
        for name in COMPILED:
            spec = open_object(built_object(name))
            obj: LoadedObject = stack.enter_context(
                load_object(
                    spec,
                    registry.targets(spec.kmod_btfs),
                    open_btf_object=registry.open_btf_object,
                )
            )
            for m in spec.struct_ops_maps:
                with contextlib.suppress(SchedSwitchError):  # held elsewhere: "registered"
                    obj.attach_struct_ops(m.name, programs=False)
        assert {n for names in COMPILED.values() for n in names} <= registered_names()
        yield


def test_the_registering_tests_pass_beside_another_suite() -> None:
    """Run the tests that register these objects while their compiled names are held: they
    register their own names and look only for those. (With the compiled names they met
    ``EEXIST`` at the attach, or found the other suite's still listed after their own.)"""
    selection = [
        "tests/daemon/test_kernel_backend.py::test_attach_detach_pins_and_reattach",
        "tests/daemon/test_kernel_backend.py::test_attach_when_someone_else_runs_is_undone",
        "tests/kernel/test_loader_objects.py::test_struct_ops_object_attaches_both_forms",
        "tests/kernel/test_pins.py::test_pinned_struct_ops_outlive_fds_and_unpin",
        "tests/kernel/test_object_cli.py::test_load_pin_then_unload",
        "tests/kernel/test_object_cli.py::test_load_without_pin_leaves_nothing",
    ]
    with _compiled_names_registered():
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{len(selection)} passed" in proc.stdout
