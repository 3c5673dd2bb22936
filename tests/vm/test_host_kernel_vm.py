"""Host kernel tests that this host's kernel cannot answer, run in the sched_ext VM.

Some host kernels refuse a feature even to root where Debian sid's kernel in the VM
allows it: arena maps (``BPF_MAP_CREATE`` ``EPERM``; tests/kernel/test_arena.py then skips
on the host). Here that module runs, as root, under the VM's kernel, with the repository's
own pytest, and every one of its tests must pass: a skip there is a failure here, so the
feature is tested against a real kernel on every machine.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.build_outputs import built_object
from tools import vm

pytestmark = pytest.mark.vm

#: Modules run in the VM, each with the number of tests it has (so a collection that
#: silently finds fewer fails too).
MODULES = {"tests/kernel/test_arena.py": 4}
#: The test objects (``make test-objects``) each module reads: without one it would skip in
#: the VM, which counts as a failure here, so this test skips first and says why (and fails
#: under ``make test``, tests/build_outputs.py).
NEEDS = {"tests/kernel/test_arena.py": ("arena_rw",)}


@pytest.fixture(scope="module")
def junit(vm_run: Callable[..., vm.VmResult], sched_objects: Path) -> ET.Element:
    for names in NEEDS.values():
        for name in names:
            built_object(name)
    script = (
        'cd "$REPO" && "$PY" -m pytest -q -p no:cacheprovider --basetemp /tmp/pytest '
        f'--junitxml "$RESULTS/host_kernel.xml" {" ".join(MODULES)}\n'
    )
    res = vm_run(script, timeout=420)
    return ET.fromstring(res.text("host_kernel.xml"))


def test_the_host_kernel_tests_pass_in_the_vm(junit: ET.Element) -> None:
    cases = junit.findall(".//testcase")
    by_module: dict[str, int] = {}
    bad = []
    for case in cases:
        path = case.get("classname", "").replace(".", "/") + ".py"
        by_module[path] = by_module.get(path, 0) + 1
        outcome = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        if outcome:
            text = next(c for c in case if c.tag in outcome)
            bad.append(f"{case.get('name')}: {outcome[0]}: {text.get('message', '')[:300]}")
    assert not bad, "\n".join(bad)
    assert by_module == MODULES
