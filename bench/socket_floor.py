"""The least a hint's exchange can cost beside its switch: a bare event-loop server's reply.

A reference for bench/switch_latency.py's standby hit (e), measured in the same boot: a
server process that does nothing but what any asyncio server on a Unix stream socket must
(its own reader on the listening socket, ``accept`` as the daemon's accept makes it -- the
descriptor from :func:`~schedswitchd.cpython_internals.accept_fd`, one socket object made of
it --, a non-blocking ``recv`` of the line the client already sent, as the daemon's first
step reads it, a canned reply line of a real hint reply's size and shape, ``send``) and the
very client the bench times (``launcher_wire.LauncherConnection.exchange_line``, what
``schedswitch-run`` sends, reply envelope checked). Each exchange is timed as (e) is: a
fresh connection per hint, the clock started after the connect, stopped with the reply
checked. No parse, no policy, no lease, no switch: what (e) costs over its gap, minus this,
is the daemon's own.

Used in the VM by ``switch_latency.py _vm``; by hand: ``python bench/socket_floor.py N``
prints the median in ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: A standby hit's reply as the daemon sends it (the wire form of a HintReply with its
#: live switch record), so the kernel copies, and the client reads and parses, as much.
REPLY = (
    b'{"v":1,"id":null,"ok":true,"op":"hint","lease":"1-0123abcd","scheduler":"lat",'
    b'"desired":"lat","active":"lat","switch":{"seq":3,"time":1796310945.1328385,'
    b'"previous":"fifo","target":"lat","result":"ok","reason":"lease 1-0123abcd gaming",'
    b'"phases_ns":{"standby":512345,"detach":10823456,"attach":11734567,'
    b'"until_enabled":23123456},"gap_ns":22558123,"expedited":true,"standby":true,'
    b'"error":null,"exit":null,"finished":false},"pending":false,"passed_over":null}\n'
)


def _serve(path: str, ready_fd: int) -> None:
    """The server process: answers every line with :data:`REPLY` until killed; writes a
    byte to ``ready_fd`` once it listens."""

    from schedswitchd.cpython_internals import accept_fd

    async def main() -> None:
        loop = asyncio.get_running_loop()
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind(path)
        lsock.listen(64)
        lsock.setblocking(False)

        def on_line(conn: socket.socket) -> None:
            try:
                data = conn.recv(4096)
            except BlockingIOError:
                return
            if data:
                conn.send(REPLY)
            else:
                loop.remove_reader(conn.fileno())
                conn.close()

        def on_accept() -> None:
            with contextlib.suppress(BlockingIOError):
                fd, _ = accept_fd(lsock)
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fd)
                conn.setblocking(False)
                on_line(conn)  # the line is usually there already, as at the daemon's accept
                loop.add_reader(conn.fileno(), on_line, conn)

        loop.add_reader(lsock.fileno(), on_accept)
        os.write(ready_fd, b"r")
        os.close(ready_fd)
        await asyncio.Event().wait()

    asyncio.run(main())


def measure(n: int, pause_s: float = 0.05) -> list[int]:
    """``n`` exchanges with a fresh server process, each on a fresh connection after
    ``pause_s`` seconds of rest (the bench's hints meet an idle daemon): their times, ns.
    Raises RuntimeError if the server does not start within 30 s."""
    from schedswitchd.daemon.launcher_wire import LauncherConnection

    with tempfile.TemporaryDirectory(prefix="socket-floor-") as tmp:
        path = os.path.join(tmp, "floor.sock")
        # A plain fork and a pipe: the VM's tmpfs root has no /dev/shm for
        # multiprocessing's semaphores.
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                _serve(path, write_fd)
            finally:
                os._exit(0)
        os.close(write_fd)
        try:
            ready, _, _ = select.select([read_fd], [], [], 30)
            if not ready or os.read(read_fd, 1) != b"r":
                raise RuntimeError("the floor server did not start")
            times = []
            for _ in range(n):
                time.sleep(pause_s)
                client = LauncherConnection(path, timeout_s=30)
                try:
                    t0 = time.monotonic_ns()
                    client.exchange_line({"op": "hint", "workload": "gaming"})
                    times.append(time.monotonic_ns() - t0)
                finally:
                    client.close()
            return times
        finally:
            os.close(read_fd)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


if __name__ == "__main__":
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    print(f"{statistics.median(measure(runs)) / 1e6:.3f} ms (median of {runs})")
