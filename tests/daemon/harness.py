"""Run a real Server (asyncio, real Unix socket) on a thread, and talk to it as clients do."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from schedswitchd.daemon.config import Config, parse_config
from schedswitchd.daemon.reconcile import Reconciler
from schedswitchd.daemon.server import Server
from schedswitchd.daemon.timer import Cancellable

from .fakes import FakeBackend

T = TypeVar("T")

#: The reconciler's safety-net poll interval in these tests, s (the daemon's is 1 s).
POLL_S = 0.2

BASE_CONFIG = """
default = "{default}"
[auth]
hint_uids = [0, 65534]
admin_uids = [0]
[limits]
read_timeout_s = {read_timeout}
idle_timeout_s = {idle_timeout}
max_connections_per_uid = {per_uid}
max_connections = {max_conn}
admin_reserve = {reserve}
max_leases_per_uid = {max_leases}
max_message_bytes = 1024
switch_timeout_s = 1.0
[backoff]
base_s = 30.0
max_s = 60.0
[daemon]
adopt_grace_s = {grace}
[schedulers.fifo]
object = "fifo.bpf.o"
[schedulers.vtime]
object = "vtime.bpf.o"
[schedulers.gaming]
object = "gaming.bpf.o"
[schedulers.broken]
object = "broken.bpf.o"
[hints.gaming]
scheduler = "gaming"
priority = 50
[hints.video-call]
scheduler = "vtime"
priority = 30
[hints.battery]
scheduler = "fifo"
priority = 10
[hints.broken]
scheduler = "broken"
priority = 90
"""


def make_config(directory: Path, **overrides: Any) -> Config:
    values: dict[str, Any] = dict(
        default="kernel",
        read_timeout=2.0,
        idle_timeout=30.0,
        per_uid=64,
        max_conn=512,
        reserve=4,
        max_leases=8,
        grace=30.0,
    )
    values.update(overrides)
    text = BASE_CONFIG.format(**values)
    path = directory / "schedswitchd.toml"
    path.write_text(text)
    return parse_config(text, str(path))


#: The checkout, the working directory of a serving process (:func:`start_serve_fake`).
ROOT = Path(__file__).resolve().parents[2]


def start_serve_fake(
    config: Config, path: str, wrapper: Sequence[str] = (), start_s: float = 60.0
) -> subprocess.Popen[bytes]:
    """The daemon's serving path over the fake backend in a process of its own
    (:mod:`tests.daemon.serve_fake`), serving ``config`` (parsed from a file: its
    ``source``) on the socket ``path``, started under ``wrapper`` (a command and its
    arguments, e.g. ``strace``'s) if given; returned once the socket exists. Its stderr is
    dropped. Raises ``AssertionError`` when it exits or ``start_s`` passes first (it is
    killed then)."""
    assert config.source is not None, "the configuration must come from a file"
    proc = subprocess.Popen(
        [*wrapper, sys.executable, "-m", "tests.daemon.serve_fake", config.source, path],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + start_s
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError("the daemon did not start")
        time.sleep(0.05)
    return proc


class FakeClock:
    """A monotonic ns clock that moves only when the test says (:meth:`advance`)."""

    def __init__(self, start_ns: int = 10**12) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        self.now_ns += int(seconds * 1e9)


class _FakeCall:
    """One call :class:`FakeTimer` holds: ordered by when it is due, then by arming order."""

    __slots__ = ("args", "callback", "cancelled", "key")

    def __init__(self, key: tuple[float, int], callback: Callable[..., object], args: Any) -> None:
        self.key, self.callback, self.args, self.cancelled = key, callback, args, False

    def __lt__(self, other: _FakeCall) -> bool:
        return self.key < other.key

    def cancel(self) -> None:
        self.cancelled = True


class FakeTimer:
    """The server's :class:`~schedswitchd.daemon.timer.Timer` (connection timeouts,
    lease TTLs), standing still until the test moves it with :meth:`Running.advance`; the
    calls that fall due then run, in order, on the server's loop."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now = start_s
        self._calls: list[_FakeCall] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> Cancellable:
        call = _FakeCall((when, next(self._seq)), callback, args)
        heapq.heappush(self._calls, call)
        return call

    def pending(self) -> list[float]:
        """When the calls armed and not cancelled are due, soonest first (s)."""
        return sorted(call.key[0] for call in self._calls if not call.cancelled)

    def advance(self, seconds: float) -> None:
        """Move ``seconds`` forward, running each call due by then at its own time. Call it
        on the server's loop (:meth:`Running.advance` does)."""
        until = self.now + seconds
        while self._calls and self._calls[0].key[0] <= until:
            call = heapq.heappop(self._calls)
            if not call.cancelled:
                self.now = max(self.now, call.key[0])
                call.callback(*call.args)
        self.now = until


class Running:
    """A Server on its own thread and loop, listening in a world-traversable temp dir."""

    def __init__(
        self,
        backend: FakeBackend | None = None,
        *,
        clock: Callable[[], int] | None = None,
        timer: FakeTimer | None = None,
        poll_timer: FakeTimer | None = None,
        poll_s: float = POLL_S,
        reply_wait_s: float | None = None,
        reply_taken_wait_s: float | None = None,
        trim: Callable[[], object] | None = None,
        directory: Path | None = None,
        **overrides: Any,
    ) -> None:
        """``clock``: the reconciler's monotonic ns clock (default: the real one), e.g. a
        :class:`FakeClock` the test moves; ``timer``: the server's timeouts and lease TTLs
        (default: the event loop's real time), e.g. a :class:`FakeTimer` the test moves
        (:meth:`advance`); ``poll_timer``: the reconciler's timer: its safety-net poll, every
        ``poll_s`` (s, default :data:`POLL_S`), and its deadlines (a TTL, a backoff hold's
        end, ...) are armed there (default: the event loop's real time), e.g. a
        :class:`FakeTimer` that stands still, so that only the test's requests and kicks
        start passes, or that the test moves (:meth:`advance_poll`; a large ``poll_s``
        leaves only the deadlines to fire); ``reply_wait_s``, ``reply_taken_wait_s``,
        ``trim``: the reconciler's and the server's (default: theirs);
        ``directory``: where its config and socket go (default: a new temp dir), e.g. a
        stopped one's, for a daemon restarted on the same socket path; ``overrides``:
        :func:`make_config` keywords."""
        self.clock = clock
        self.timer = timer
        self.poll_timer = poll_timer
        self.poll_s = poll_s
        self._reconciler_options: dict[str, Any] = {}
        if clock is not None:
            self._reconciler_options["clock"] = clock
        if poll_timer is not None:
            self._reconciler_options["timer"] = poll_timer
        if reply_wait_s is not None:
            self._reconciler_options["reply_wait_s"] = reply_wait_s
        if trim is not None:
            self._reconciler_options["trim"] = trim
        self._server_options: dict[str, Any] = {}
        if reply_taken_wait_s is not None:
            self._server_options["reply_taken_wait_s"] = reply_taken_wait_s
        self.dir = directory or Path(tempfile.mkdtemp(prefix="ssd-"))
        self.dir.mkdir(exist_ok=True)
        os.chmod(self.dir, 0o755)  # so that a client setuid to nobody can reach the socket
        self.config = make_config(self.dir, **overrides)
        self.backend = backend or FakeBackend()
        self.path = str(self.dir / "s.sock")
        self.statuses: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.server: Server | None = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("server did not start")

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        os.chmod(self.path, 0o666)
        listener.listen(128)
        reconciler = Reconciler(
            self.config,
            self.backend,
            on_change=self.statuses.append,
            poll_s=self.poll_s,
            **self._reconciler_options,
        )
        self.server = Server(reconciler, timer=self.timer, **self._server_options)
        self.loop.run_until_complete(self.server.start(listener))
        ready.set()
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def read(self, fn: Callable[[Server], T]) -> T:
        """Evaluate ``fn(server)`` on the server's loop (consistent view of its state)."""
        assert self.server is not None
        server = self.server

        async def call() -> T:
            return fn(server)

        return self.run(call())

    def passes(self, n: int = 1) -> None:
        """Run ``n`` reconcile passes now, one after the other: each kicks the reconciler and
        waits until a pass that decided after the kick has settled. What the safety-net
        poll does every ``poll_s``, without sleeping for it (tests that say "nothing happens
        on later passes"). Returns once no pass is under way or kicked: a pass already under
        way can settle a kick (it decided after it), and the pass the kick started follows."""
        assert self.server is not None
        reconciler = self.server.reconciler

        async def one() -> bool:
            reconciler.kick()
            _, settled = await reconciler.settle()
            return settled

        for _ in range(n):
            assert self.run(one(), timeout=30), "a reconcile pass did not settle"
        # The reconciler's own kick flag, read (a pass begins as soon as it is set).
        self.wait_for(lambda s: not s.reconciler.busy and not s.reconciler._wake.is_set())

    def advance(self, seconds: float) -> None:
        """Move the :class:`FakeTimer` given at the start ``seconds`` forward, on the
        server's loop, after one round trip through the loop, so that what clients sent
        before (to connections the server has accepted) has been read first."""
        timer = self.timer
        assert timer is not None, "Running(timer=FakeTimer()) to move time"
        self.read(lambda s: None)
        self.read(lambda s: timer.advance(seconds))

    def advance_poll(self, seconds: float) -> None:
        """Move the :class:`FakeTimer` given as ``poll_timer`` ``seconds`` forward on the
        server's loop: the safety-net poll kicks a pass for every ``poll_s`` passed, and
        each deadline passed kicks one."""
        timer = self.poll_timer
        assert timer is not None, "Running(poll_timer=FakeTimer()) to move the poll"
        self.read(lambda s: timer.advance(seconds))

    def advance_reconciler(self, seconds: float) -> None:
        """Move the reconciler's :class:`FakeClock` (``clock``) and then its
        :class:`FakeTimer` (``poll_timer``) ``seconds`` forward, as real time moves both: a
        deadline that falls due kicks a pass that reads the moved clock."""
        clock = self.clock
        assert isinstance(clock, FakeClock), "Running(clock=FakeClock()) to move the clock"
        clock.advance(seconds)
        self.advance_poll(seconds)

    def wait_for(self, fn: Callable[[Server], bool], timeout: float = 10.0) -> None:
        """Poll ``fn`` on the server's loop until it is true; AssertionError after
        ``timeout`` s. Generous: only a failing test waits it out, and a loaded CI host
        (VMs beside the suite) has stretched 3 s waits past their end."""
        deadline = time.monotonic() + timeout
        while not self.read(fn):
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached in time")
            time.sleep(0.02)

    def stop(self) -> None:
        assert self.server is not None
        self.run(self.server.close(), timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def client(self) -> Client:
        return Client(self.path)


class Client:
    """A blocking JSON-lines client (no use of the package's client, on purpose)."""

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_line(self) -> dict[str, Any] | None:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        value: dict[str, Any] = json.loads(line)
        return value

    def request(self, **fields: Any) -> dict[str, Any]:
        self.send_raw(json.dumps({"v": 1, **fields}).encode() + b"\n")
        reply = self.recv_line()
        assert reply is not None, "connection closed without a reply"
        return reply

    def closed(self) -> bool:
        """True once the server has closed its end (EOF after any pending data)."""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except (TimeoutError, BlockingIOError):
            return False
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def run_as(uid: int, action: Callable[[], Any], groups: tuple[int, ...] = ()) -> Any:
    """Run ``action()`` in a forked child after setgroups(groups), setgid(uid) and
    setuid(uid); returns its JSON result (``{"child_error": ...}`` if it raised)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 0
        try:
            os.close(read_fd)
            os.setgroups(list(groups))
            os.setgid(uid)
            os.setuid(uid)
            os.write(write_fd, json.dumps(action()).encode())
        except BaseException as exc:
            os.write(write_fd, json.dumps({"child_error": repr(exc)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def as_user(
    r: Running, uid: int, action: Callable[[Client], Any], groups: tuple[int, ...] = ()
) -> Any:
    """Run ``action(client)`` in a forked child as ``uid`` (:func:`run_as`); returns its
    JSON result."""
    return run_as(uid, lambda: action(r.client()), groups)
