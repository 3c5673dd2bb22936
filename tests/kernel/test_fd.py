"""OwnedFd closes exactly once and never touches a number it gave up."""

from __future__ import annotations

import gc
import os

import pytest

from schedswitchd.kernel.fd import MapFd, OwnedFd


def _open_fd() -> int:
    return os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_close_twice_closes_once() -> None:
    raw = _open_fd()
    owner = OwnedFd(raw)
    owner.close()
    assert owner.closed and not _is_open(raw)
    reused = _open_fd()  # likely the same number: a second close must not hit it
    try:
        owner.close()
        assert _is_open(reused)
    finally:
        os.close(reused)
    with pytest.raises(ValueError, match="closed"):
        _ = owner.fd


def test_context_manager_and_detach() -> None:
    with MapFd(_open_fd()) as m:
        raw = m.fd
        assert _is_open(raw)
    assert not _is_open(raw)
    owner = OwnedFd(_open_fd())
    raw = owner.detach()
    del owner
    gc.collect()
    assert _is_open(raw)
    os.close(raw)


def test_del_is_a_safety_net() -> None:
    raw = _open_fd()
    owner = OwnedFd(raw)
    del owner
    gc.collect()
    assert not _is_open(raw)


def test_dup_is_independent() -> None:
    with MapFd(_open_fd()) as a, a.dup() as b:
        assert isinstance(b, MapFd)
        assert b.fd != a.fd
        a.close()
        assert _is_open(b.fd)


def test_negative_fd_rejected() -> None:
    with pytest.raises(ValueError):
        OwnedFd(-1)
