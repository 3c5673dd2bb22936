"""sched_ext's answers to struct_ops links, for host tests: the host kernel runs
``tcp_congestion_ops`` struct_ops links for real but has no sched_ext.

:class:`FakeSchedExt` is what a :class:`~schedswitchd.daemon.kernel_backend.KernelBackend`
is built with as its ``links`` (the ``BPF_LINK_CREATE``/``BPF_LINK_DETACH`` seam of
:mod:`schedswitchd.kernel.struct_ops.link`). Every link is a real one made by the host
kernel; around the real calls it keeps a directory shaped like ``/sys/kernel/sched_ext``
(the backend's injected sysfs root) as sched_ext keeps its own:

- ``BPF_LINK_CREATE`` is refused with ``EBUSY`` unless ``state`` reads ``disabled``
  (``scx_root_enable_workfn()``), before anything registers; after the real call,
  ``state`` reads ``enabled`` and ``root/ops`` the name of the congestion control the
  kernel registered in that call (read back from the kernel's list, not from the object);
- the scheduler ends when the kernel unregisters that congestion control, whatever
  unregistered it: ``BPF_LINK_DETACH`` (checked when the call returns, as sched_ext
  disables before it returns), or the link's last reference closing -- a pin removed, an
  fd closed -- which the kernel finishes in a work item, so a thread follows the kernel's
  list and the state reads ``disabled`` within a few ms of it.

What the host cannot produce is set by the test: :meth:`FakeSchedExt.others_run` (another
scheduler is enabled), ``busy_next`` (``EBUSY`` while disabled: a teardown in flight) and
``link_detach_supported`` (kernels before 6.10 answer ``EOPNOTSUPP``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path

from schedswitchd.errors import BpfSyscallError
from schedswitchd.kernel import bpf_uapi, syscall
from schedswitchd.kernel.errmsg import explain
from schedswitchd.kernel.fd import LinkFd, MapFd
from schedswitchd.kernel.struct_ops.link import StructOpsLinkCalls

TCP_LIST = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


def registered_names() -> set[str]:
    """The congestion controls the host kernel has registered now."""
    return set(TCP_LIST.read_text().split())


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


class FakeSchedExt(StructOpsLinkCalls):
    """See the module docstring. ``root``: the sysfs directory it keeps (``state``,
    ``root/ops``; the other files are the test's); ``poll_s``: how often the follower
    thread reads the kernel's list while one of its schedulers is enabled. Use as a
    context manager (starts and stops the thread)."""

    def __init__(self, root: Path, *, poll_s: float = 0.002) -> None:
        self.root = root
        self.poll_s = poll_s
        #: Answer the next ``BPF_LINK_CREATE`` with ``EBUSY`` although disabled.
        self.busy_next = False
        #: False: ``BPF_LINK_DETACH`` answers ``EOPNOTSUPP`` (kernels before 6.10).
        self.link_detach_supported = True
        #: ``BPF_LINK_DETACH`` calls made, answered or not.
        self.detach_calls = 0
        #: ``BPF_LINK_CREATE`` calls that reached the kernel.
        self.creates = 0
        self._lock = threading.RLock()
        self._ours: str | None = None  # the congestion control whose link enabled "us"
        # kept here, so the fake reads no file of the root (tests count the backend's reads)
        self._state = (root / "state").read_text().strip()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="fake-scx", daemon=True)

    def __enter__(self) -> FakeSchedExt:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2.0)

    # --- sysfs -------------------------------------------------------------------------------

    def state(self) -> str:
        """What ``state`` reads now."""
        return self._state

    def _write(self, state: str, ops: str | None) -> None:
        # "enabled" never reads without its ops (root/ops goes after state, comes before
        # it), and each file is replaced whole: the backend reads them from other threads,
        # and a sysfs read never sees half a value
        self._state = state
        if ops is None:
            _replace(self.root / "state", state)
            with contextlib.suppress(FileNotFoundError):  # (rmtree would read the directory)
                os.remove(self.root / "root" / "ops")
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(self.root / "root")
        else:
            (self.root / "root").mkdir(exist_ok=True)
            _replace(self.root / "root" / "ops", ops)
            _replace(self.root / "state", state)

    def others_run(self, ops: str) -> None:
        """Another scheduler (``ops``), not made through this object, is enabled."""
        with self._lock:
            self._ours = None
            self._write("enabled", ops)

    def disable(self) -> None:
        """Whatever ran is gone: ``disabled``."""
        with self._lock:
            self._ours = None
            self._write("disabled", None)

    def _sync(self) -> None:
        """``disabled`` once the kernel no longer lists the scheduler we enabled."""
        with self._lock:
            if self._ours is not None and self._ours not in registered_names():
                self._ours = None
                self._write("disabled", None)

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._sync()

    # --- the seam ----------------------------------------------------------------------------

    def create(self, map_fd: MapFd) -> LinkFd:
        with self._lock:
            self._sync()  # a scheduler the kernel dropped since the last poll is gone
            if self.busy_next or self.state() != "disabled":
                self.busy_next = False
                cmd = bpf_uapi.Cmd.LINK_CREATE
                raise BpfSyscallError(cmd.uapi_name, errno.EBUSY, explain(cmd, errno.EBUSY, None))
            before = registered_names()
            link = super().create(map_fd)
            self.creates += 1
            new = registered_names() - before
            if len(new) > 1:
                # another process registered one at the same time: ours is the name in
                # the kernel's value of this map (struct bpf_struct_ops_tcp_congestion_ops)
                value = syscall.map_lookup_elem(
                    map_fd, b"\0\0\0\0", syscall.map_info(map_fd).value_size
                )
                new = {n for n in new if value is not None and n.encode() + b"\0" in value}
            if len(new) != 1:
                link.close()
                raise AssertionError(f"cannot tell what BPF_LINK_CREATE registered: {new}")
            self._ours = new.pop()
            self._write("enabled", self._ours)
            return link

    def detach(self, link: LinkFd) -> None:
        self.detach_calls += 1
        if not self.link_detach_supported:
            cmd = bpf_uapi.Cmd.LINK_DETACH
            raise BpfSyscallError(
                cmd.uapi_name, errno.EOPNOTSUPP, explain(cmd, errno.EOPNOTSUPP, None)
            )
        with self._lock:
            super().detach(link)
            self._sync()
