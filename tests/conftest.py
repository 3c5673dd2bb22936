"""Hooks of the whole suite: tests marked ``root`` need root and the host kernel's BTF.

Here, not in a subdirectory's conftest, so that ``pytest tests/daemon/test_x.py`` run as a
normal user skips them as ``pytest`` of the whole tree does. Under ``make test``
(:func:`tests.build_outputs.full_suite`) they fail instead, with the same reason: the suite
must not pass without having run them.
"""

from __future__ import annotations

import os

import pytest

from tests.build_outputs import full_suite

#: Why a ``root`` test cannot run here.
ROOT_REASON = "needs root and a kernel with BTF (/sys/kernel/btf/vmlinux)"


def root_available() -> bool:
    """Whether ``root`` tests can run: effective uid 0 and the running kernel's BTF."""
    return os.geteuid() == 0 and os.path.exists("/sys/kernel/btf/vmlinux")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (or, under the full suite, fail) a ``root`` test that cannot run here."""
    if item.get_closest_marker("root") is None or root_available():
        return
    if full_suite():
        pytest.fail(ROOT_REASON, pytrace=False)
    pytest.skip(ROOT_REASON)
