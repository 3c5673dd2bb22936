"""Kernel uevents (``NETLINK_KOBJECT_UEVENT``) through one pyroute2 socket, with subscriptions.

The kernel broadcasts a datagram on multicast group 1 whenever a kobject is added, removed or
changed (``lib/kobject_uevent.c``). Its payload is ``ACTION@DEVPATH\\0`` followed by
``KEY=VALUE\\0`` pairs, always including ``ACTION``, ``DEVPATH``, ``SUBSYSTEM`` and ``SEQNUM``.
Two families matter here:

* modules: ``add@/module/NAME`` after a module finished loading and ``remove@/module/NAME``
  when it is unloaded (``SUBSYSTEM=module``, ``kernel/module/main.c``);
* sched_ext: ``add@/kernel/sched_ext/root`` when a BPF scheduler is enabled and
  ``remove@/kernel/sched_ext/root`` when it is disabled, with ``SUBSYSTEM=sched_ext`` and
  ``SCXOPS=<ops name>`` (``kernel/sched/ext.c``, ``scx_uevent()``).

:class:`UeventListener` owns one pyroute2 ``AsyncUeventSocket`` and runs its reader in a
dedicated thread (:meth:`UeventListener.start`) with an asyncio loop of its own. The socket
is created and read by that thread: pyroute2 keeps per-thread state, and reading one socket
from a second thread returned nothing when this was tried in the sched_ext VM.

If the kernel drops events because the socket buffer overflowed (``ENOBUFS``), the listener
reopens the socket and calls its ``on_overflow`` subscribers, who must re-read whatever state
they derive from events.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import functools
import logging
import select
import selectors
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from schedswitchd.cpython_internals import loop_epoll
from schedswitchd.errors import KernelError
from schedswitchd.kernel.narrow_import import import_submodule

log = logging.getLogger(__name__)

#: Multicast group of uevents sent by the kernel itself (udevd re-broadcasts on group 2).
KERNEL_GROUP: Final = 1
#: Largest uevent the kernel builds (``UEVENT_BUFFER_SIZE`` in ``include/linux/kobject.h``).
UEVENT_BUFFER_SIZE: Final = 2048
#: Longest a :meth:`UeventListener.pause` holds the reader (s): a bound, should the
#: window that paused it never end; the daemon's windows last well under a second.
PAUSE_MAX_S: Final = 30.0

MODULE_SUBSYSTEM: Final = "module"
SCHED_EXT_SUBSYSTEM: Final = "sched_ext"


class UeventParseError(KernelError):
    """A datagram on the uevent socket that is not a kernel uevent."""

    code = "uevent"


class Action(enum.StrEnum):
    """``kobject_action`` names (``lib/kobject_uevent.c``, ``kobject_actions[]``)."""

    ADD = "add"
    REMOVE = "remove"
    CHANGE = "change"
    MOVE = "move"
    ONLINE = "online"
    OFFLINE = "offline"
    BIND = "bind"
    UNBIND = "unbind"


@dataclass(frozen=True, slots=True)
class Uevent:
    """One kernel uevent.

    ``action`` is an :class:`Action` for the eight kernel actions, else the raw string;
    ``devpath`` is relative to ``/sys`` (``/module/nf_tables``); ``subsystem`` is ``""`` when
    the kernel sent none; ``seqnum`` is the kernel's ``SEQNUM`` (``None`` when absent, e.g.
    in synthetic test events); ``env`` holds every ``KEY=VALUE`` pair, in arrival order.
    """

    action: Action | str
    devpath: str
    subsystem: str
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    seqnum: int | None = None

    @property
    def module_name(self) -> str | None:
        """The module name for ``SUBSYSTEM=module`` events (``/module/NAME``), else ``None``."""
        if self.subsystem != MODULE_SUBSYSTEM or not self.devpath.startswith("/module/"):
            return None
        name = self.devpath[len("/module/") :]
        return name if name and "/" not in name else None

    @property
    def scx_ops(self) -> str | None:
        """The scheduler's ops name for ``SUBSYSTEM=sched_ext`` events (``SCXOPS``)."""
        if self.subsystem != SCHED_EXT_SUBSYSTEM:
            return None
        return self.env.get("SCXOPS")


def make_uevent(
    action: Action | str,
    devpath: str,
    subsystem: str,
    env: Mapping[str, str] | None = None,
    *,
    seqnum: int | None = None,
) -> Uevent:
    """Build a :class:`Uevent` as the kernel would send it (``ACTION``/``DEVPATH``/... filled).

    Used for synthetic events (tests, or the daemon replaying state after an overflow).
    """
    full = {"ACTION": str(action), "DEVPATH": devpath, "SUBSYSTEM": subsystem}
    if env:
        full.update(env)
    if seqnum is not None:
        full["SEQNUM"] = str(seqnum)
    return Uevent(_action(str(action)), devpath, subsystem, MappingProxyType(full), seqnum)


def _action(text: str) -> Action | str:
    try:
        return Action(text)
    except ValueError:
        return text


def parse_uevent(data: bytes | bytearray | memoryview) -> Uevent:
    """Parse one kernel uevent datagram (format in ``lib/kobject_uevent.c``).

    Raises :class:`UeventParseError` for udevd's ``libudev`` messages, empty or oversized
    datagrams, a header without ``@``, non-UTF-8 text, or a header that disagrees with the
    ``ACTION``/``DEVPATH`` keys.
    """
    raw = bytes(data)
    if not raw:
        raise UeventParseError("empty uevent datagram")
    if len(raw) > 8 * UEVENT_BUFFER_SIZE:
        raise UeventParseError(f"uevent datagram of {len(raw)} bytes is too large")
    if raw.startswith(b"libudev\x00"):
        raise UeventParseError("udevd (libudev) message, not a kernel uevent")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UeventParseError(f"uevent is not UTF-8 at byte {exc.start}") from None
    parts = text.split("\x00")
    header = parts[0]
    action_text, sep, devpath = header.partition("@")
    if not sep or not action_text or not devpath.startswith("/"):
        raise UeventParseError(f"uevent header {header[:80]!r} is not ACTION@DEVPATH")
    env: dict[str, str] = {}
    for item in parts[1:]:
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UeventParseError(f"uevent field {item[:80]!r} is not KEY=VALUE")
        env[key] = value
    if env.get("ACTION", action_text) != action_text:
        raise UeventParseError(f"uevent ACTION={env['ACTION']!r} disagrees with {header!r}")
    if env.get("DEVPATH", devpath) != devpath:
        raise UeventParseError(f"uevent DEVPATH={env['DEVPATH']!r} disagrees with {header!r}")
    seq_text = env.get("SEQNUM")
    seqnum: int | None = None
    if seq_text is not None:
        if not seq_text.isdigit():
            raise UeventParseError(f"uevent SEQNUM={seq_text!r} is not a number")
        seqnum = int(seq_text)
    return Uevent(
        _action(action_text),
        devpath,
        env.get("SUBSYSTEM", ""),
        MappingProxyType(env),
        seqnum,
    )


Match = str | Callable[[Uevent], bool] | None
"""A subscription filter: a subsystem name, a predicate, or ``None`` for every event."""


class Subscription:
    """Handle returned by the ``subscribe`` methods; :meth:`cancel` (or ``with``) ends it."""

    __slots__ = ("_cancel", "_done")

    def __init__(self, cancel: Callable[[], None]) -> None:
        self._cancel = cancel
        self._done = False

    @property
    def active(self) -> bool:
        """Whether the subscription still delivers (not cancelled)."""
        return not self._done

    def cancel(self) -> None:
        """Stop delivering to this subscriber; idempotent."""
        if not self._done:
            self._done = True
            self._cancel()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


@dataclass(slots=True)
class ListenerStats:
    """Counters of one listener: events delivered to the dispatcher, datagrams that did not
    parse, overflows (``ENOBUFS``: events lost, socket reopened), callback exceptions."""

    events: int = 0
    malformed: int = 0
    overflows: int = 0
    callback_errors: int = 0


class _RawMarshal:
    """pyroute2 marshal that hands each datagram through untouched.

    pyroute2's own uevent marshal flattens the payload into an ``nlmsg``; we keep the bytes so
    that one parser (:func:`parse_uevent`) serves both the socket and the tests.
    """

    def is_enough(self, msg: Any) -> bool:
        return False

    def parse(
        self,
        data: bytes,
        seq: int | None = None,
        callback: Any = None,
        skip_alien_seq: bool = False,
    ) -> Iterator[dict[str, Any]]:
        yield {"header": {"error": None}, "raw": bytes(data)}


class UeventListener:
    """One kernel-uevent reader with subscriptions; runs in a thread of its own.

    Use::

        with UeventListener() as ev:                  # start() ... stop()
            sub = ev.subscribe("module", callback)    # callback(Uevent) in the reader thread

    ``rcvbuf`` is the socket receive buffer in bytes (the kernel doubles it). Callback
    exceptions are logged and counted, never propagated into the reader.
    """

    def __init__(self, *, rcvbuf: int = 1 << 20) -> None:
        self._rcvbuf = rcvbuf
        self._lock = threading.Lock()
        self._subs: dict[int, tuple[Callable[[Uevent], bool], Callable[[Uevent], None]]] = {}
        self._overflow_subs: dict[int, Callable[[], None]] = {}
        self._next_key = 0
        self.stats = ListenerStats()
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        #: Set while :meth:`pause` holds the reader: its gate, and whether the reader is
        #: inside the hold (tests and :attr:`held` read it).
        self._gate: threading.Event | None = None
        self._holding = threading.Event()
        #: The socket's fd while the reader has it open (thread mode), for :meth:`pause`.
        self._sock_fd: int | None = None
        #: What :meth:`pause` took out of the reader loop's epoll: (epoll, fd, events).
        self._disarmed: tuple[Any, int, int] | None = None
        #: The reader loop, and its epoll registration of the socket, as last found by
        #: :func:`_registration` (a pause then looks nothing up).
        self._registered: tuple[asyncio.AbstractEventLoop, tuple[Any, int, int]] | None = None

    # --- subscriptions ---------------------------------------------------------------------

    def subscribe(self, match: Match, callback: Callable[[Uevent], None]) -> Subscription:
        """Call ``callback(event)`` for events whose subsystem equals ``match`` (a str), for
        which ``match(event)`` is true (a callable), or for all events (``None``)."""
        pred: Callable[[Uevent], bool]
        if match is None:
            pred = _always
        elif isinstance(match, str):
            subsystem = match

            def pred(ev: Uevent) -> bool:
                return ev.subsystem == subsystem

        else:
            pred = match
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._subs[key] = (pred, callback)
        return Subscription(lambda: self._drop(self._subs, key))

    def subscribe_modules(self, callback: Callable[[Uevent], None]) -> Subscription:
        """Module ``add``/``remove`` events; ``event.module_name`` is the module's name."""

        def pred(ev: Uevent) -> bool:
            return ev.module_name is not None and ev.action in (Action.ADD, Action.REMOVE)

        return self.subscribe(pred, callback)

    def subscribe_sched_ext(self, callback: Callable[[Uevent], None]) -> Subscription:
        """sched_ext root kobject events: ``add`` = a scheduler enabled, ``remove`` = disabled;
        ``event.scx_ops`` is its ops name."""
        return self.subscribe(SCHED_EXT_SUBSYSTEM, callback)

    def on_overflow(self, callback: Callable[[], None]) -> Subscription:
        """Call ``callback()`` after events were lost (socket overflow) and the socket was
        reopened: state derived from events must be re-read."""
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._overflow_subs[key] = callback
        return Subscription(lambda: self._drop(self._overflow_subs, key))

    def _drop(self, table: dict[int, Any], key: int) -> None:
        with self._lock:
            table.pop(key, None)

    def dispatch(self, event: Uevent) -> None:
        """Deliver ``event`` to matching subscribers in the calling thread.

        The reader calls this for each kernel event; tests and the daemon may call it with
        synthetic events (:func:`make_uevent`).
        """
        with self._lock:
            subs = list(self._subs.values())
            self.stats.events += 1
        for pred, callback in subs:
            try:
                if pred(event):
                    callback(event)
            except Exception:
                self.stats.callback_errors += 1
                log.exception("uevent subscriber failed on %s@%s", event.action, event.devpath)

    def _overflowed(self) -> None:
        with self._lock:
            subs = list(self._overflow_subs.values())
            self.stats.overflows += 1
        for callback in subs:
            try:
                callback()
            except Exception:
                self.stats.callback_errors += 1
                log.exception("uevent overflow subscriber failed")

    # --- the reader ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while a reader (thread or task) is bound and reading."""
        if self._task is not None and self._task.done():
            return False
        return self._ready.is_set()

    async def run(self) -> None:
        """Read and dispatch kernel uevents until cancelled (in the running loop).

        Sets :attr:`running` once the socket is bound, so events emitted after that are seen.
        Raises ``OSError`` if the socket cannot be opened or bound.
        """
        try:
            overflowed = False
            while True:
                async with self._socket() as sock:
                    self._ready.set()
                    if overflowed:
                        # Tell subscribers only once the new socket is bound: a resync
                        # they do now misses no event (one before the bind would lose
                        # what changed between their re-read and the bind).
                        self._overflowed()
                    await self._read(sock)
                overflowed = True  # _read returned: the socket overflowed; reopen it
        finally:
            self._ready.clear()

    @contextlib.asynccontextmanager
    async def _socket(self) -> AsyncIterator[Any]:
        sock = _socket_class()()
        try:
            sock.set_marshal(_RawMarshal())
            sock.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._rcvbuf)
            await sock.bind(groups=KERNEL_GROUP)
            self._sock_fd = sock.socket.fileno()
            yield sock
        finally:
            self._sock_fd = None
            sock.close()

    async def _read(self, sock: Any) -> None:
        while True:
            async for msg in sock.get():
                raw: bytes = msg.get("raw", b"")
                err = _netlink_error(raw)
                if err is not None:
                    # pyroute2 queues a NLMSG_ERROR record when recv() fails (ENOBUFS after
                    # an overflow) and refuses further use of the socket.
                    log.warning("uevent socket error %s: events lost, reopening", err)
                    return
                try:
                    event = parse_uevent(raw)
                except UeventParseError as exc:
                    self.stats.malformed += 1
                    log.debug("ignored datagram on uevent socket: %s", exc)
                    continue
                self.dispatch(event)

    # thread mode

    def start(self, *, timeout_s: float = 5.0) -> None:
        """Start the reader in a daemon thread; return once the socket is bound.

        Raises ``RuntimeError`` if already running, ``OSError`` if the socket failed, and
        ``TimeoutError`` if it was not bound within ``timeout_s`` seconds.
        """
        if self._thread is not None or self._task is not None:
            raise RuntimeError("uevent listener already started")
        _socket_class()  # import pyroute2 here, at start, not when a socket is bound
        self._error = None
        self._ready.clear()
        self._thread = threading.Thread(target=self._thread_main, name="uevents", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.01):
            if not self._thread.is_alive() or self._error is not None:
                thread, self._thread = self._thread, None
                thread.join()
                err = self._error
                raise err if isinstance(err, Exception) else OSError("uevent reader died")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError("uevent socket not bound in time")

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._thread_loop = loop
        try:
            self._task = loop.create_task(self.run())
            loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:
            self._error = exc
            log.exception("uevent reader thread failed")
        finally:
            self._task = None
            loop.close()
            self._thread_loop = None

    def pause(self) -> None:
        """Stop reading the socket until :meth:`resume` (thread mode; idempotent): the
        kernel's datagrams wait in the socket's receive buffer, none is lost unless it
        overflows (then the usual reopen and ``on_overflow``), and they are dispatched in
        order once reading resumes. For a short window in which the reader must not take
        the CPU (the daemon's switch: see
        :meth:`~schedswitchd.daemon.kernel_backend.KernelBackend.switch_window`). The
        socket is taken out of the reader loop's epoll (:func:`_registration`: one
        ``epoll_ctl(2)``, and one to put it back), so the reader's thread is not woken
        for it at all: under the VM's one emulated CPU that wake-up, and the reader's
        turn at the GIL, came out of the switch's time. Where that cannot be done (no
        epoll selector, the socket being reopened) the reader's thread is woken once to
        enter a hold of at most :data:`PAUSE_MAX_S` s instead."""
        with self._lock:
            if self._gate is not None or self._disarmed is not None:
                return
            loop = self._thread_loop
            fd = self._sock_fd
            if loop is not None and fd is not None:
                known = self._registered
                if known is not None and known[0] is loop and known[1][1] == fd:
                    # (its events are EPOLLIN: the uevent socket is only ever read)
                    reg: tuple[Any, int, int] | None = known[1]
                else:
                    reg = _registration(loop, fd)
                if reg is not None:
                    try:
                        reg[0].modify(fd, 0)
                    except OSError:  # no longer registered (being reopened)
                        self._registered = None
                    else:
                        self._registered = (loop, reg)
                        self._disarmed = reg
                        return
            gate = self._gate = threading.Event()
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the reader's loop closed: nothing to hold
            loop.call_soon_threadsafe(self._hold, gate)

    def resume(self) -> None:
        """End :meth:`pause`: the reader reads (and dispatches) what arrived meanwhile."""
        with self._lock:
            gate, self._gate = self._gate, None
            disarmed, self._disarmed = self._disarmed, None
            if disarmed is not None:
                epoll, fd, events = disarmed
                # Level-triggered: datagrams that came meanwhile wake the reader now.
                with contextlib.suppress(OSError):  # its socket went (reopened after an overflow)
                    epoll.modify(fd, events)
        if gate is not None:
            gate.set()

    @property
    def held(self) -> bool:
        """True while the reader is inside a :meth:`pause` (reads nothing)."""
        return self._disarmed is not None or self._holding.is_set()

    def _hold(self, gate: threading.Event) -> None:
        # On the reader's own loop: blocks it (the only work of that loop is this socket).
        self._holding.set()
        try:
            if not gate.wait(PAUSE_MAX_S):
                log.warning("uevent reader held %.0f s; reading again", PAUSE_MAX_S)
        finally:
            self._holding.clear()

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Stop a reader started by :meth:`start`; idempotent."""
        thread = self._thread
        if thread is None:
            return
        self.resume()  # a held reader could not take the cancellation
        loop, task = self._thread_loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout_s)
        self._thread = None

    def __enter__(self) -> UeventListener:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _registration(loop: asyncio.AbstractEventLoop, fd: int) -> tuple[Any, int, int] | None:
    """``loop``'s epoll registration of ``fd``: (the ``select.epoll``, ``fd``, its events),
    or ``None`` where the loop's selector is not an epoll one or does not hold ``fd``.

    :meth:`UeventListener.pause` sets its events to 0 from another thread, without waking
    the loop: ``epoll_ctl(2)`` may be called while another thread waits in
    ``epoll_wait(2)``, which then simply reports nothing for it, and the loop's own
    registration (its selector's map) is left as it is, so restoring the events
    (:meth:`UeventListener.resume`) is all that undoing it takes."""
    found = loop_epoll(loop)
    if found is None:
        return None
    selector, epoll = found
    try:
        key = selector.get_map().get(fd)
    except (RuntimeError, KeyError, ValueError):
        return None
    if key is None:
        return None
    events = (select.EPOLLIN if key.events & selectors.EVENT_READ else 0) | (
        select.EPOLLOUT if key.events & selectors.EVENT_WRITE else 0
    )
    return epoll, fd, events


@functools.cache
def _socket_class() -> Any:
    """pyroute2's ``AsyncUeventSocket``, imported on first use.

    Narrowly (:func:`~schedswitchd.kernel.narrow_import.import_submodule`): the uevent socket's own
    modules without ``pyroute2/__init__.py``, which imports all of pyroute2
    (docs/performance.md, "Memory").
    """
    return import_submodule("pyroute2", "netlink.uevent").AsyncUeventSocket


def _always(_: Uevent) -> bool:
    return True


_NLMSG_ERROR: Final = 2


def _netlink_error(raw: bytes) -> str | None:
    """The errno name if ``raw`` is a netlink ``NLMSG_ERROR`` record, else ``None``.

    A kernel uevent starts with an ASCII action name, so it never matches.
    """
    if len(raw) < 20:
        return None
    length, msg_type = struct.unpack_from("=IH", raw)
    # pyroute2 packs its record with native alignment, so the bytes may exceed nlmsg_len.
    if length > len(raw) or msg_type != _NLMSG_ERROR:
        return None
    (code,) = struct.unpack_from("=i", raw, 16)
    code = abs(code)
    return errno.errorcode.get(code, str(code))
