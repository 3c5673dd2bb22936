"""The least a standby hit can cost with this loader: a bare lane, no daemon around it.

A reference for bench/switch_latency.py's standby hit (e), measured in the same boot and
in the same rotation of samples (its column ``f``): the emulated machine's speed drifts
over a boot, and a lane measured minutes after (e) compared the two at different speeds.
Each side runs alone: the lane's server is stopped (``SIGSTOP``) outside its own hits,
and the daemon during them. A server process with nothing but what any standby
hit must do, written as directly as Python allows, around the real kernel backend
(:class:`~schedswitchd.daemon.kernel_backend.KernelBackend`, made as the daemon makes it,
with its watch running, so the module-set check is the daemon's and the switch window
expedites RCU and hushes the watch as the daemon's does):

- its reader on the listening socket, ``accept`` as the daemon's accept makes it (the
  descriptor from :func:`~schedswitchd.cpython_internals.accept_fd`, one socket object made
  of it), a non-blocking ``recv`` of the line the client already sent, compared with the one
  line it answers (no parse);
- ``SO_PEERCRED``, the uid compared with root's (no policy, no lease);
- the take's quick freshness check of the held ``ss_latency`` (``fresh(quick=True)``);
- the switch window, ``BPF_LINK_DETACH`` of the running ``ss_fifo``, ``BPF_LINK_CREATE``
  of the held scheduler with its first attach's confirmation (the backend's ``attach``);
- a reply line of a real hint reply's size, its numbers filled in with ``%``, ``send``;
  then, once the client took it, the window's end.

Untimed around each hint: before it, ``ss_fifo`` attached and a new ``ss_latency``
prepared and held (so each hit is a handle's first attach, as a daemon's standby is), then
half a second of rest, for the kernel's deferred work of the last switch (a struct_ops
map is freed after an RCU-tasks grace period) to be done: sent at once, a third of the
hits had their detach slowed by it (gaps of 36-52 ms against 25). (e)'s hint, too, comes
after as long a rest (``switch_latency.REST_S``): a server woken from rest takes longer to
come to the line than one that has just answered a request. After the hint, ``ss_latency``
is detached and freed and sched_ext left disabled for the daemon's samples. Each exchange
is timed as (e) is, by the same client (``launcher_wire.LauncherConnection.exchange_line``,
what ``schedswitch-run`` sends): a fresh connection per hint, the clock started after the
connect, stopped with the reply's envelope checked. What (e) costs over this is what the
daemon adds to a hit (its request handling, policy, lease, records, reply model); what
this costs over its own gap is what no implementation of the hit in this language, on this
emulated machine, avoids.

Used in the VM by ``switch_latency.py _vm`` (:class:`Lane`); by hand in the VM, with
sched_ext disabled and ``uinput`` loaded: ``python bench/hit_floor.py SCHED_DIR N`` prints
the medians of ``N`` hits in a row (:func:`measure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: The one line the lane answers: what ``schedswitch-run gaming`` sends.
LINE = b'{"v":1,"op":"hint","workload":"gaming"}\n'
#: A standby hit's reply as the daemon sends it, its numbers left to fill.
REPLY = (
    b'{"v":1,"id":null,"ok":true,"op":"hint","lease":"1-0123abcd","scheduler":"lat",'
    b'"desired":"lat","active":"lat","switch":{"seq":%d,"time":%r,'
    b'"previous":"fifo","target":"lat","result":"ok","reason":"lease 1-0123abcd gaming",'
    b'"phases_ns":{"standby":%d,"detach":%d,"attach":%d,"until_enabled":%d},"gap_ns":%d,'
    b'"expedited":%s,"standby":true,"error":null,"exit":null,"finished":false},'
    b'"pending":false,"passed_over":null}\n'
)
CONFIG = """
[switch]
runtime_dir = "{run}"
[schedulers.fifo]
object = "{sched}/fifo.bpf.o"
[schedulers.lat]
object = "{sched}/latency.bpf.o"
"""
_CRED = struct.Struct("3i")
_OUTQ = 0x5411  # TIOCOUTQ, SIOCOUTQ for a socket: bytes not yet read by the peer
#: How long the lane waits for its client to take the reply before the window ends, s.
TAKEN_WAIT_S = 0.05
#: How many times the server prepares its standby for one hit at most (:func:`_serve`).
STANDBY_TRIES = 20


def _serve(path: str, sched_dir: str, ctl_fd: int, ready_fd: int, out: str, pause_s: float) -> None:
    """The server process. For each ``g`` read on ``ctl_fd``: ``ss_fifo`` attached, a new
    ``ss_latency`` prepared and held (``fresh_standby``), ``r`` written on
    ``ready_fd``; then the one hit its client sends, after which nothing of the lane runs
    (``ss_latency`` detached and freed) and ``d`` is written. At ``q`` (or the pipe's end)
    the hits' times are written to ``out`` as JSON and it returns."""
    import fcntl

    from schedswitchd.cpython_internals import accept_fd
    from schedswitchd.daemon.config import parse_config
    from schedswitchd.daemon.kernel_backend import create_backend

    run = tempfile.mkdtemp(prefix="hit-floor-")
    config = parse_config(CONFIG.format(run=run, sched=sched_dir), os.path.join(run, "c.toml"))
    backend = create_backend(config)
    stop_watch = backend.watch(lambda: None)
    fifo_cfg, lat_cfg = config.schedulers["fifo"], config.schedulers["lat"]
    fifo = backend.prepare("fifo", fifo_cfg)
    held: list[Any] = []
    hits: list[dict[str, int]] = []

    def fresh_standby() -> Any:
        """A fresh ``ss_latency``: prepared again while, ``pause_s`` after its prepare, the
        take's quick check finds it stale, which it does when the watch read module events
        it had missed while stopped (a step's inserts) after the prepare."""
        for _ in range(STANDBY_TRIES):
            lat = backend.prepare("lat", lat_cfg)
            time.sleep(pause_s)
            if backend.fresh(lat, lat_cfg, quick=True):
                return lat
            backend.discard(lat)
        raise RuntimeError(f"no fresh standby in {STANDBY_TRIES} tries")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind(path)
        lsock.listen(64)
        lsock.setblocking(False)
        done = loop.create_future()

        def hit(conn: socket.socket, at_accept: bool) -> bool:
            """The hit, or False when the client's line is not there yet (``at_accept``:
            this is the accept's own read)."""
            start = time.monotonic_ns()
            try:
                data = conn.recv(4096)
            except BlockingIOError:
                return False
            if data != LINE:
                raise RuntimeError(f"unexpected line {data!r}")
            lat = held.pop()
            _, uid, _ = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != 0 or not backend.fresh(lat, lat_cfg, quick=True):
                raise RuntimeError(f"uid {uid} or a stale standby")
            taken = time.monotonic_ns()
            with backend.switch_window() as expedited:
                gap_start = time.monotonic_ns()
                backend.detach(fifo, 30)
                detached = time.monotonic_ns()
                enabled = backend.attach(lat, 30)
                attached = time.monotonic_ns()
                conn.send(
                    REPLY
                    % (
                        len(hits) + 1,
                        time.time(),
                        taken - start,
                        detached - gap_start,
                        attached - detached,
                        attached - start,
                        enabled - gap_start,
                        b"true" if expedited else b"false",
                    )
                )
                sent = time.monotonic_ns()
                deadline = time.monotonic() + TAKEN_WAIT_S
                outq = bytearray(4)
                while time.monotonic() < deadline:
                    fcntl.ioctl(conn.fileno(), _OUTQ, outq)
                    if not int.from_bytes(outq, sys.byteorder):
                        break
                    time.sleep(0.0002)
            hits.append(
                {
                    "start": start,
                    "taken": taken,
                    "gap_start": gap_start,
                    "detached": detached,
                    "enabled": enabled,
                    "attached": attached,
                    "sent": sent,
                    "expedited": int(expedited),
                    "at_accept": int(at_accept),
                }
            )
            # Untimed: sched_ext left free for the daemon's samples.
            backend.detach(lat, 30)
            backend.discard(lat)
            os.write(ready_fd, b"d")
            return True

        def serve(conn: socket.socket, at_accept: bool = False) -> None:
            """The hit on ``conn`` once its line is there (the daemon's accept step reads
            it at once when it is, and waits for it otherwise, as this does). The
            accept's own call has no reader of ``conn`` to remove: asking would cost the
            hit a selector lookup that fails with a ``KeyError`` inside it."""
            if not at_accept:
                loop.remove_reader(conn.fileno())
            try:
                if not hit(conn, at_accept):
                    loop.add_reader(conn.fileno(), serve, conn)
                    return
            except Exception as exc:  # the run fails with it
                if not done.done():
                    done.set_exception(exc)
            conn.close()

        def on_accept() -> None:
            try:
                fd, _ = accept_fd(lsock)
            except BlockingIOError:
                return
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fd)
            conn.setblocking(False)
            serve(conn, at_accept=True)

        def on_control() -> None:
            """``g``: hold a standby for the next hit; ``q`` or the pipe's end: stop."""
            try:
                word = os.read(ctl_fd, 1)
                if word == b"g":
                    backend.attach(fifo, 30)
                    held.append(fresh_standby())
                    os.write(ready_fd, b"r")
                    return
            except Exception as exc:
                if not done.done():
                    done.set_exception(exc)
                return
            if not done.done():
                done.set_result(None)

        loop.add_reader(lsock.fileno(), on_accept)
        loop.add_reader(ctl_fd, on_control)
        os.write(ready_fd, b"s")  # started: the backend is made
        await done

    try:
        asyncio.run(main())
    finally:
        Path(out).write_text(json.dumps(hits))
        for lat in held:
            backend.discard(lat)
        backend.discard(fifo)
        stop_watch()


class Lane:
    """The lane's server process, made once per run and stopped (``SIGSTOP``) outside its
    hits, so that it takes no CPU while the daemon's samples run; the caller holds the
    daemon stopped (or has none) while :meth:`hit` runs, likewise, and sched_ext disabled.
    A context manager: ``with Lane(sched_dir) as lane: lane.hit(); ...; lane.results()``.
    Raises RuntimeError when the server fails, holds no standby within 300 s or ends
    early."""

    def __init__(self, sched_dir: str | Path, pause_s: float = 0.5) -> None:
        self.sched_dir = str(sched_dir)
        self.pause_s = pause_s
        self._tmp = tempfile.TemporaryDirectory(prefix="hit-floor-")
        self.path = os.path.join(self._tmp.name, "lane.sock")
        self._out = os.path.join(self._tmp.name, "gaps.json")
        self._clients: list[tuple[int, int]] = []
        self._pid = 0
        self._ctl = self._ready = -1
        self._hits: list[dict[str, int]] | None = None

    def __enter__(self) -> Lane:
        ctl_read, self._ctl = os.pipe()
        self._ready, ready_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(self._ctl)
            os.close(self._ready)
            code = 0
            try:
                _serve(self.path, self.sched_dir, ctl_read, ready_write, self._out, self.pause_s)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        self._pid = pid
        os.close(ctl_read)
        os.close(ready_write)
        try:
            self._expect(b"s")
        except BaseException:
            self._kill()
            raise
        os.kill(pid, signal.SIGSTOP)
        return self

    def _expect(self, word: bytes) -> None:
        ready, _, _ = select.select([self._ready], [], [], 300)
        got = os.read(self._ready, 1) if ready else b""
        if got != word:
            raise RuntimeError(f"the hit-floor server said {got!r}, not {word!r}")

    def hit(self) -> None:
        """One hit: the server continued, its standby held, ``pause_s`` of rest, the hint
        timed on a fresh connection; once its scheduler is detached again the server is
        stopped. sched_ext must be disabled, and stays so."""
        from schedswitchd.daemon.launcher_wire import LauncherConnection

        os.kill(self._pid, signal.SIGCONT)
        try:
            os.write(self._ctl, b"g")
            # Once the server holds its standby (~1 s under TCG), as (e) waits for the
            # daemon's idle; then the rest (see the module docstring).
            self._expect(b"r")
            time.sleep(self.pause_s)
            client = LauncherConnection(self.path, timeout_s=60)
            try:
                t0 = time.monotonic_ns()
                client.exchange_line({"op": "hint", "workload": "gaming"})
                self._clients.append((t0, time.monotonic_ns()))
            finally:
                client.close()
            self._expect(b"d")
        except BaseException:
            self._kill()
            raise
        os.kill(self._pid, signal.SIGSTOP)

    def _kill(self) -> None:
        if self._pid:
            os.kill(self._pid, signal.SIGKILL)  # its links close with it: sched_ext disables
            os.waitpid(self._pid, 0)
            self._pid = 0

    def results(self) -> list[dict[str, int]]:
        """Per hit so far, its times (:func:`_phases`); the server ends with the first
        call."""
        if self._hits is None:
            os.kill(self._pid, signal.SIGCONT)
            os.write(self._ctl, b"q")
            _, status = os.waitpid(self._pid, 0)
            self._pid = 0
            hits = json.loads(Path(self._out).read_text()) if os.path.exists(self._out) else []
            if status != 0 or len(hits) != len(self._clients):
                raise RuntimeError(
                    f"the hit-floor server ended with {status}, {len(hits)} hits of "
                    f"{len(self._clients)}"
                )
            self._hits = [_phases(c, h) for c, h in zip(self._clients, hits, strict=True)]
        return self._hits

    def __exit__(self, *exc: object) -> None:
        try:
            if self._pid and exc[0] is None:
                self.results()
        finally:
            self._kill()
            for fd in (self._ctl, self._ready):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._tmp.cleanup()


def measure(sched_dir: str | Path, n: int, pause_s: float = 0.5) -> list[dict[str, int]]:
    """``n`` hits through a :class:`Lane` (sched_ext must be disabled, ``uinput``'s BTF
    present, and nothing else switching): per hit its times (:func:`_phases`)."""
    with Lane(sched_dir, pause_s) as lane:
        for _ in range(n):
            lane.hit()
        return lane.results()


def _phases(client: tuple[int, int], h: dict[str, int]) -> dict[str, int]:
    """One hit's times, ns: ``total_ns`` (the client's), ``gap_ns``, and its parts: the
    way in (send to the server's first read), the read and checks, the window's opening,
    the detach, ``BPF_LINK_CREATE``, the confirmation, the reply's send, the way out (to
    the client's checked reply); ``expedited``: 1 when the window expedited RCU;
    ``at_accept``: 1 when the line was there at the accept's read (else the server waited
    for it: a second wake-up, inside ``in_ns``)."""
    t0, t1 = client
    return {
        "total_ns": t1 - t0,
        "gap_ns": h["enabled"] - h["gap_start"],
        "in_ns": h["start"] - t0,
        "checks_ns": h["taken"] - h["start"],
        "window_ns": h["gap_start"] - h["taken"],
        "detach_ns": h["detached"] - h["gap_start"],
        "link_ns": h["enabled"] - h["detached"],
        "confirm_ns": h["attached"] - h["enabled"],
        "send_ns": h["sent"] - h["attached"],
        "out_ns": t1 - h["sent"],
        "expedited": h["expedited"],
        "at_accept": h["at_accept"],
    }


if __name__ == "__main__":
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 11
    got = measure(sys.argv[1], runs)
    total = statistics.median(x["total_ns"] for x in got) / 1e6
    gap = statistics.median(x["gap_ns"] for x in got) / 1e6
    ratio = statistics.median(x["total_ns"] / x["gap_ns"] for x in got)
    print(f"{total:.2f} ms, gap {gap:.2f} ms, {ratio:.3f}x its gap (medians of {runs})")
    for key in got[0]:
        print(f"  {key[:-3]}: {statistics.median(x[key] for x in got) / 1e6:.2f} ms")
