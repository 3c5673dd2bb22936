"""peer_of: the kernel's credentials of a Unix socket's peer; groups read when asked."""

from __future__ import annotations

import os
import socket

import pytest

from schedswitchd.daemon.peer import Peer, peer_of


def test_peer_of_reads_the_credentials_and_the_groups_when_asked() -> None:
    a, b = socket.socketpair()
    try:
        peer = peer_of(a)
        assert (peer.pid, peer.uid, peer.gid) == (os.getpid(), os.getuid(), os.getgid())
        assert "unread" in repr(peer)  # SO_PEERGROUPS not read yet
        assert peer.groups == frozenset((os.getgid(), *os.getgroups()))
        a.close()
        assert peer.groups == frozenset((os.getgid(), *os.getgroups()))  # kept
        assert peer == Peer(os.getpid(), os.getuid(), os.getgid(), peer.groups)
    finally:
        a.close()
        b.close()


def test_groups_of_a_socket_closed_before_they_were_asked_are_the_primary_gid() -> None:
    """Fewer rights, never more: no supplementary group can be read any more."""
    a, b = socket.socketpair()
    peer = peer_of(a)
    a.close()
    b.close()
    assert peer.groups == frozenset({os.getgid()})


def test_a_peer_is_immutable() -> None:
    peer = Peer(1, 2, 3, frozenset({3}))
    with pytest.raises(AttributeError):
        peer.uid = 0
    assert hash(peer) == hash(Peer(1, 2, 3, frozenset({3, 4})))
    assert peer != Peer(1, 2, 3, frozenset({3, 4}))


def test_the_server_reads_a_peers_groups_only_when_a_group_rule_could_grant() -> None:
    from schedswitchd.daemon.config import parse_config

    from .fakes import FakeBackend
    from .harness import Running

    srv = Running(FakeBackend())
    try:
        a, b = socket.socketpair()
        peer = peer_of(a)
        nobody = Peer(os.getpid(), 65533, 65533, None)  # groups unreadable: primary only
        # no [auth] group rules: rights by uid alone, the groups never read
        assert srv.read(lambda s: s.is_admin(peer)) is (os.getuid() == 0)
        assert srv.read(lambda s: s.may_hint(nobody)) is False
        assert "unread" in repr(peer) and "unread" in repr(nobody)
        text = (srv.dir / "schedswitchd.toml").read_text()
        text = text.replace("admin_uids = [0]", "admin_uids = [0]\nadmin_gids = [65533]")
        srv.read(lambda s: s.apply_config(parse_config(text, str(srv.dir / "g.toml"))))
        assert srv.read(lambda s: s.is_admin(nobody)) is True  # by its primary gid
        assert srv.read(lambda s: s.may_hint(Peer(1, 65532, 65532, frozenset({7})))) is False
        assert srv.read(lambda s: s.may_hint(Peer(1, 65532, 65532, frozenset({65533})))) is True
        a.close()
        b.close()
    finally:
        srv.stop()
