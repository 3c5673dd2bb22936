"""Uevent parsing (real-format payloads) and the listener on the host kernel's netlink socket."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedswitchd.kernel.uevents import (
    Action,
    Uevent,
    UeventListener,
    UeventParseError,
    make_uevent,
    parse_uevent,
)

# Captured from the host kernel after `echo change > /sys/class/net/lo/uevent`.
LO_CHANGE = (
    b"change@/devices/virtual/net/lo\x00ACTION=change\x00DEVPATH=/devices/virtual/net/lo\x00"
    b"SUBSYSTEM=net\x00SYNTH_UUID=0\x00INTERFACE=lo\x00IFINDEX=1\x00SEQNUM=820\x00"
)
# Shapes the sched_ext VM showed for `modprobe` and a scheduler enabling (docs/vm.md).
MODULE_ADD = (
    b"add@/module/nf_tables\x00ACTION=add\x00DEVPATH=/module/nf_tables\x00"
    b"SUBSYSTEM=module\x00SEQNUM=2071\x00"
)
MODULE_REMOVE = (
    b"remove@/module/nf_tables\x00ACTION=remove\x00DEVPATH=/module/nf_tables\x00"
    b"SUBSYSTEM=module\x00SEQNUM=2090\x00"
)
SCX_ADD = (
    b"add@/kernel/sched_ext/root\x00ACTION=add\x00DEVPATH=/kernel/sched_ext/root\x00"
    b"SUBSYSTEM=sched_ext\x00SCXOPS=simple\x00SEQNUM=3001\x00"
)

LO_UEVENT = Path("/sys/class/net/lo/uevent")


def test_parse_net_change() -> None:
    ev = parse_uevent(LO_CHANGE)
    assert ev.action is Action.CHANGE
    assert ev.devpath == "/devices/virtual/net/lo"
    assert ev.subsystem == "net"
    assert ev.seqnum == 820
    assert ev.env["INTERFACE"] == "lo"
    assert list(ev.env)[:3] == ["ACTION", "DEVPATH", "SUBSYSTEM"]
    assert ev.module_name is None and ev.scx_ops is None


def test_parse_module_events() -> None:
    add, rem = parse_uevent(MODULE_ADD), parse_uevent(MODULE_REMOVE)
    assert (add.action, add.module_name) == (Action.ADD, "nf_tables")
    assert (rem.action, rem.module_name) == (Action.REMOVE, "nf_tables")


def test_parse_sched_ext_event() -> None:
    ev = parse_uevent(SCX_ADD)
    assert ev.subsystem == "sched_ext" and ev.scx_ops == "simple" and ev.action is Action.ADD


def test_parse_unknown_action_kept_as_text() -> None:
    ev = parse_uevent(b"frob@/x\x00ACTION=frob\x00DEVPATH=/x\x00SUBSYSTEM=y\x00")
    assert ev.action == "frob" and not isinstance(ev.action, Action)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"libudev\x00\xfe\xed\xca\xfe" + b"\x00" * 40,
        b"no-at-sign\x00A=b\x00",
        b"add@relative\x00",
        b"add@/x\x00novalue\x00",
        b"add@/x\x00=v\x00",
        b"add@/x\x00ACTION=remove\x00",
        b"add@/x\x00DEVPATH=/y\x00",
        b"add@/x\x00SEQNUM=12a\x00",
        b"add@/\xff\x00",
        b"add@/x\x00" + b"K=" + b"v" * 20000,
    ],
)
def test_parse_rejects_malformed(data: bytes) -> None:
    with pytest.raises(UeventParseError):
        parse_uevent(data)


@settings(deadline=None)  # a loaded host's scheduling delay is not a parser defect
@given(st.binary(max_size=600))
def test_parse_arbitrary_bytes_only_raises_parse_error(data: bytes) -> None:
    try:
        ev = parse_uevent(data)
    except UeventParseError:
        return
    assert ev.devpath.startswith("/")


_TEXT = st.characters(codec="utf-8", blacklist_characters="\x00")
_PATH = st.characters(codec="utf-8", blacklist_characters="\x00@")


@given(
    st.sampled_from(["add", "remove", "change", "bind"]),
    st.text(_PATH, max_size=40),
    st.dictionaries(st.text("ABCDEFGHIJ_", min_size=1, max_size=8), st.text(_TEXT, max_size=20)),
)
def test_parse_round_trips_kernel_format(action: str, path: str, env: dict[str, str]) -> None:
    devpath = "/" + path
    fields = {**env, "ACTION": action, "DEVPATH": devpath, "SUBSYSTEM": "x"}
    raw = f"{action}@{devpath}\0".encode() + b"".join(
        f"{k}={v}\0".encode() for k, v in fields.items()
    )
    ev = parse_uevent(raw)
    assert (ev.action, ev.devpath, ev.subsystem, dict(ev.env)) == (action, devpath, "x", fields)


def test_make_uevent_matches_parse() -> None:
    ev = make_uevent("remove", "/module/nf_tables", "module", seqnum=2090)
    assert ev == parse_uevent(MODULE_REMOVE)


def test_dispatch_filters_and_cancel() -> None:
    ev = UeventListener()
    mods: list[Uevent] = []
    scx: list[Uevent] = []
    allev: list[Uevent] = []
    sub = ev.subscribe_modules(mods.append)
    ev.subscribe_sched_ext(scx.append)
    ev.subscribe(None, allev.append)
    for data in (MODULE_ADD, SCX_ADD, LO_CHANGE):
        ev.dispatch(parse_uevent(data))
    # a module "change" is not an add/remove
    ev.dispatch(make_uevent("change", "/module/x", "module"))
    assert [e.module_name for e in mods] == ["nf_tables"]
    assert [e.scx_ops for e in scx] == ["simple"]
    assert len(allev) == 4
    sub.cancel()
    sub.cancel()
    ev.dispatch(parse_uevent(MODULE_REMOVE))
    assert len(mods) == 1 and not sub.active


def test_failing_subscriber_does_not_stop_others() -> None:
    ev = UeventListener()
    got: list[Uevent] = []

    def bad(_: Uevent) -> None:
        raise RuntimeError("boom")

    ev.subscribe(None, bad)
    ev.subscribe(None, got.append)
    ev.dispatch(parse_uevent(MODULE_ADD))
    assert len(got) == 1 and ev.stats.callback_errors == 1


needs_root_uevent = pytest.mark.skipif(
    os.geteuid() != 0 or not LO_UEVENT.exists(), reason="needs root and /sys/class/net/lo"
)


def _trigger_lo(tag: str | None = None) -> None:
    # A synthetic uevent (kobject_synth_uevent): the kernel re-announces lo with ACTION=change;
    # with ``tag`` (a UUID) the event carries SYNTH_UUID=tag, which no other process's event has.
    LO_UEVENT.write_text("change" if tag is None else f"change {tag}")


def _wait(pred: object, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(pred) and pred():
            return True
        time.sleep(0.01)
    return False


@needs_root_uevent
def test_thread_listener_receives_kernel_uevent() -> None:
    got: list[Uevent] = []
    threads: set[int] = set()

    def on_net(e: Uevent) -> None:
        threads.add(threading.get_ident())
        got.append(e)

    with UeventListener() as ev:
        was_running = ev.running
        ev.subscribe(lambda e: e.devpath.endswith("/net/lo"), on_net)
        _trigger_lo()
        assert _wait(lambda: bool(got))
    assert was_running and not ev.running
    assert got[0].action is Action.CHANGE and got[0].env["INTERFACE"] == "lo"
    assert got[0].seqnum is not None and got[0].seqnum > 0
    assert threading.get_ident() not in threads  # delivered in the reader thread


@needs_root_uevent
def test_thread_listener_restarts_and_stops_cleanly() -> None:
    ev = UeventListener()
    for _ in range(2):
        ev.start()
        with pytest.raises(RuntimeError):
            ev.start()
        ev.stop()
    assert not any(t.name == "uevents" for t in threading.enumerate())


@needs_root_uevent
def test_overflow_reopens_socket_and_notifies() -> None:
    # A tiny receive buffer and a subscriber that stalls the reader make the kernel drop
    # events (ENOBUFS); the listener must reopen its socket, tell on_overflow subscribers,
    # and keep delivering.
    got: list[Uevent] = []
    overflows: list[int] = []
    release = threading.Event()

    def slow(e: Uevent) -> None:
        got.append(e)
        if len(got) == 1:
            release.wait(5)

    with UeventListener(rcvbuf=4096) as ev:
        ev.subscribe("net", slow)
        ev.on_overflow(lambda: overflows.append(1))
        _trigger_lo()
        assert _wait(lambda: bool(got))
        for _ in range(300):
            _trigger_lo()
        release.set()
        assert _wait(lambda: bool(overflows))
        n = len(got)
        _trigger_lo()
        assert _wait(lambda: len(got) > n)
    assert ev.stats.overflows >= 1


@needs_root_uevent
def test_a_paused_listener_reads_nothing_until_resumed() -> None:
    # While paused the reader is held (it reads no datagram, so it takes no CPU); what the
    # kernel sent meanwhile waits in the socket and is dispatched, in order, on resume.
    # Another process's lo events (a test in another pytest worker) count too: the test
    # counts from what it has seen, never expects an exact total.
    got: list[Uevent] = []
    with UeventListener() as ev:
        ev.subscribe(lambda e: e.devpath.endswith("/net/lo"), got.append)
        _trigger_lo()
        assert _wait(lambda: len(got) >= 1)
        ev.pause()
        ev.pause()  # idempotent
        assert _wait(lambda: ev.held)
        events, seen = ev.stats.events, len(got)
        _trigger_lo()  # the kernel queues its datagram before the write returns
        _trigger_lo()
        assert ev.held and ev.stats.events == events and len(got) == seen
        ev.resume()
        assert _wait(lambda: len(got) >= seen + 2)
        assert _wait(lambda: not ev.held)
        seqnums = [e.seqnum or 0 for e in got]
        assert seqnums == sorted(set(seqnums)) and seqnums[0] > 0
        ev.pause()  # stopping a paused listener ends the hold
        assert _wait(lambda: ev.held)
    assert not ev.running and not any(t.name == "uevents" for t in threading.enumerate())


@needs_root_uevent
def test_a_pause_does_not_wake_the_reader() -> None:
    """Pausing takes the socket out of the reader loop's epoll from the pausing thread: no
    callback is handed to the reader's loop (its thread stays asleep), the listener counts
    as held at once, and what came meanwhile is dispatched once resumed."""
    got: list[Uevent] = []
    # Only this test's own events: another process's lo events (a network namespace made
    # meanwhile) may come at any time, paused or not.
    tag = str(uuid.uuid4())
    with UeventListener() as ev:
        ev.subscribe(lambda e: e.env.get("SYNTH_UUID") == tag, got.append)
        _trigger_lo(tag)
        assert _wait(lambda: len(got) >= 1)
        loop = ev._thread_loop
        assert loop is not None
        handed: list[object] = []
        real = loop.call_soon_threadsafe

        def counted(*args: Any, **kwargs: Any) -> Any:
            handed.append(args[0])
            return real(*args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]
        try:
            ev.pause()
            assert ev.held  # at once: nothing to wait for
            seen = len(got)
            _trigger_lo(tag)
            time.sleep(0.2)
            assert len(got) == seen and handed == []
            ev.resume()
            assert (lambda: ev.held)() is False  # cleared at once, not by the reader
            assert _wait(lambda: len(got) > seen)
            for _ in range(2):  # again, through the registration found the first time
                ev.pause()
                assert ev.held
                seen = len(got)
                _trigger_lo(tag)
                time.sleep(0.1)
                assert len(got) == seen and handed == []
                ev.resume()
                assert _wait(lambda n=seen: len(got) > n)
        finally:
            del loop.call_soon_threadsafe
