"""The least a standby hit can cost with this loader: a bare lane, no daemon around it.

A reference for bench/switch_latency.py's standby hit (e), measured in the same boot after
its steps, as bench/socket_floor.py is. A server process with nothing but what any standby
hit must do, written as directly as Python allows, around the real kernel backend
(:class:`~schedswitchd.daemon.kernel_backend.KernelBackend`, made as the daemon makes it,
with its watch running, so the module-set check is the daemon's and the switch window
expedites RCU and hushes the watch as the daemon's does):

- its reader on the listening socket, ``accept``, a non-blocking ``recv`` of the line the
  client already sent, compared with the one line it answers (no parse);
- ``SO_PEERCRED``, the uid compared with root's (no policy, no lease);
- the take's quick freshness check of the held ``ss_latency`` (``fresh(quick=True)``);
- the switch window, ``BPF_LINK_DETACH`` of the running ``ss_fifo``, ``BPF_LINK_CREATE``
  of the held scheduler with its first attach's confirmation (the backend's ``attach``);
- a reply line of a real hint reply's size, its numbers filled in with ``%``, ``send``;
  then, once the client took it, the window's end.

Untimed between hints: back to ``ss_fifo``, and a new ``ss_latency`` prepared and held (so
each hit is a handle's first attach, as a daemon's standby is); the next hint waits half a
second more, for the kernel's deferred work after that (the old handle's struct_ops map is
freed after an RCU-tasks grace period) to be done: sent at once, a third of the hits had
their detach slowed by it (gaps of 36-52 ms against 25). Each exchange is timed as
(e) is, by the same client (``launcher_wire.LauncherConnection.exchange_line``, what
``schedswitch-run`` sends): a fresh connection per hint, the clock started after the
connect, stopped with the reply's envelope checked. What (e) costs over this is what the
daemon adds to a hit (its request handling, policy, lease, records, reply model); what
this costs over its own gap is what no implementation of the hit in this language, on this
emulated machine, avoids.

Used in the VM by ``switch_latency.py _vm`` (sched_ext disabled, ``uinput`` loaded); by
hand in the VM: ``python bench/hit_floor.py SCHED_DIR N`` prints the medians.
"""

from __future__ import annotations

import asyncio
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
    b'"pending":false}\n'
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


def _serve(path: str, sched_dir: str, ready_fd: int, out: str, n: int) -> None:
    """The server process: ``n`` hits, then their gaps (ns) written to ``out`` as JSON;
    a byte on ``ready_fd`` each time it holds a standby for the next one."""
    import fcntl

    from schedswitchd.daemon.config import parse_config
    from schedswitchd.daemon.kernel_backend import create_backend

    run = tempfile.mkdtemp(prefix="hit-floor-")
    config = parse_config(CONFIG.format(run=run, sched=sched_dir), os.path.join(run, "c.toml"))
    backend = create_backend(config)
    stop_watch = backend.watch(lambda: None)
    fifo_cfg, lat_cfg = config.schedulers["fifo"], config.schedulers["lat"]
    fifo = backend.prepare("fifo", fifo_cfg)
    backend.attach(fifo, 30)
    held = [backend.prepare("lat", lat_cfg)]
    hits: list[dict[str, int]] = []

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
            lat = held[0]
            if data != LINE:
                raise RuntimeError(f"unexpected line {data!r}")
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
            # Untimed: back to ss_fifo, a new ss_latency held.
            backend.detach(lat, 30)
            backend.attach(fifo, 30)
            backend.discard(lat)
            if len(hits) < n:
                held[0] = backend.prepare("lat", lat_cfg)
                os.write(ready_fd, b"r")  # the next hit may come
            elif not done.done():
                done.set_result(None)
            return True

        def serve(conn: socket.socket, at_accept: bool = False) -> None:
            """The hit on ``conn`` once its line is there (the daemon's accept step reads
            it at once when it is, and waits for it otherwise, as this does)."""
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
                conn, _ = lsock.accept()
            except BlockingIOError:
                return
            conn.setblocking(False)
            serve(conn, at_accept=True)

        loop.add_reader(lsock.fileno(), on_accept)
        os.write(ready_fd, b"r")
        await done

    try:
        asyncio.run(main())
    finally:
        Path(out).write_text(json.dumps(hits))
        backend.detach(fifo, 30)
        backend.discard(fifo)
        stop_watch()


def measure(sched_dir: str | Path, n: int, pause_s: float = 0.5) -> list[dict[str, int]]:
    """``n`` hits through a fresh server process (sched_ext must be disabled, ``uinput``'s
    BTF present), each on a fresh connection after ``pause_s`` seconds of rest and once the
    server holds its next standby: per hit its times (:func:`_phases`). Raises
    RuntimeError if the server holds no standby within 300 s or ends early."""
    from schedswitchd.daemon.launcher_wire import LauncherConnection

    with tempfile.TemporaryDirectory(prefix="hit-floor-") as tmp:
        path, out = os.path.join(tmp, "lane.sock"), os.path.join(tmp, "gaps.json")
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            code = 0
            try:
                _serve(path, str(sched_dir), write_fd, out, n)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        clients: list[tuple[int, int]] = []
        try:
            for _ in range(n):
                # Once the server holds its standby (the first after its start, then after
                # each hit's untimed preparing, ~1 s under TCG), as (e) waits for the
                # daemon's idle.
                ready, _, _ = select.select([read_fd], [], [], 300)
                if not ready or os.read(read_fd, 1) != b"r":
                    raise RuntimeError("the hit-floor server holds no standby")
                time.sleep(pause_s)
                client = LauncherConnection(path, timeout_s=60)
                try:
                    t0 = time.monotonic_ns()
                    client.exchange_line({"op": "hint", "workload": "gaming"})
                    clients.append((t0, time.monotonic_ns()))
                finally:
                    client.close()
        except BaseException:
            os.kill(pid, signal.SIGKILL)  # its links close with it: sched_ext disables
            raise
        finally:
            os.close(read_fd)
            _, status = os.waitpid(pid, 0)
        hits: list[dict[str, int]] = (
            json.loads(Path(out).read_text()) if os.path.exists(out) else []
        )
        if status != 0 or len(hits) != n:
            raise RuntimeError(f"the hit-floor server ended with {status}, {len(hits)} hits")
        return [_phases(c, h) for c, h in zip(clients, hits, strict=True)]


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
