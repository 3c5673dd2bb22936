"""``verifier_log`` is an attribute of the error root: every error of the tree has it (``None``
unless a program load's verifier text came with it), so callers read ``exc.verifier_log``
without asking the error's class."""

from __future__ import annotations

import errno
import importlib
import json
import pkgutil

import pytest

import schedswitchd
from schedswitchd import errors
from schedswitchd.cli import ctl
from schedswitchd.daemon.protocol import ErrorBody
from schedswitchd.kernel.loader import ProgramLoadError

LOG = "0: (b7) r0 = 0\nR0 !read_ok\n"


def _tree(cls: type[errors.SchedSwitchError]) -> list[type[errors.SchedSwitchError]]:
    return [cls, *(c for sub in cls.__subclasses__() for c in _tree(sub))]


def test_every_error_of_the_tree_has_a_verifier_log() -> None:
    """Each class under the root, in every module of the package that imports here (the
    D-Bus faces need sdbus), answers ``verifier_log``; the root's is ``None``."""
    for info in pkgutil.walk_packages(schedswitchd.__path__, "schedswitchd."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue
    assert errors.SchedSwitchError("x").verifier_log is None
    classes = _tree(errors.SchedSwitchError)
    assert len(classes) > 15
    for cls in classes:
        assert hasattr(cls, "verifier_log"), cls
    assert errors.ConfigError("bad key").verifier_log is None
    assert errors.BtfError("bad", where="offset 0").verifier_log is None


def test_a_refused_programs_log_is_carried() -> None:
    cause = errors.BpfSyscallError("BPF_PROG_LOAD", errno.EACCES, "refused", verifier_log=LOG)
    assert cause.verifier_log == LOG
    assert ProgramLoadError("enqueue", cause).verifier_log == LOG
    assert ErrorBody.of(ProgramLoadError("enqueue", cause)).verifier_log == LOG
    assert ErrorBody.of(errors.ProfileError("p")).verifier_log is None


@pytest.mark.parametrize(
    ("exc", "log"),
    [
        (errors.ConfigError("no such key"), None),
        (
            ProgramLoadError(
                "enqueue", errors.BpfSyscallError("BPF_PROG_LOAD", 13, "x", verifier_log=LOG)
            ),
            LOG,
        ),
    ],
)
def test_schedswitchctls_json_error_carries_it(
    exc: errors.SchedSwitchError, log: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``schedswitchctl --json``'s error document has the error's ``verifier_log`` (``null``
    for an error without one)."""

    def handler(args: object) -> int:
        raise exc

    assert ctl._run(handler, None, as_json=True) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["error"]["verifier_log"] == log
    assert document["error"]["code"] == exc.code
