"""The kernel log records that appear while a syscall runs, from ``/dev/kmsg``.

Some refusals are explained only in the kernel log: ``bpf(BPF_MAP_UPDATE_ELEM)`` of a
``tcp_congestion_ops`` struct_ops value without its required members fails with a bare
``EINVAL`` while ``tcp_validate_congestion_control`` logs ``TCP: NAME does not implement
required ops``. :class:`KernelLogWatch` is opened before such a call; after a failure,
:meth:`KernelLogWatch.new_records` returns the kernel's records logged since, so the error
can say what the kernel said.

Format (kernel doc ``Documentation/ABI/testing/dev-kmsg``): each ``read`` returns one
record, ``PRIO,SEQ,TS_USEC,FLAGS[,...];TEXT\\n`` followed by optional continuation lines
``" KEY=VALUE"``; ``PRIO`` is ``facility << 3 | level`` (facility 0 = kernel, the others
were written by user space); non-printable bytes of TEXT are escaped as ``\\xNN``. A file
opened and then ``lseek(SEEK_END)``-ed reads only records logged after that point;
``EAGAIN`` (non-blocking) means none is left; ``EPIPE`` means records were overwritten
before being read (reading resumes at the oldest kept one). Reading needs root (or
``CAP_SYSLOG`` with ``kernel.dmesg_restrict``); without it the watch is simply empty.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from types import TracebackType

KMSG = "/dev/kmsg"
_MAX_RECORDS = 256  # a failing call logs a few lines; never read an unbounded flood
_RECORD_BYTES = 8192  # larger than the kernel's record size (1 KiB of text + dict)


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One kernel log record: ``level`` 0 (emerg) .. 7 (debug), ``facility`` (0 = kernel),
    ``seq`` its sequence number, ``ts_us`` microseconds since boot, ``text`` unescaped."""

    level: int
    facility: int
    seq: int
    ts_us: int
    text: str


def parse_record(raw: bytes) -> KmsgRecord | None:
    """A ``/dev/kmsg`` record, or ``None`` for bytes that are not one."""
    head, sep, rest = raw.partition(b";")
    if not sep:
        return None
    fields = head.split(b",")
    if len(fields) < 3:
        return None
    try:
        prio, seq, ts = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    text = rest.split(b"\n", 1)[0].decode("utf-8", "replace")
    return KmsgRecord(prio & 7, prio >> 3, seq, ts, _unescape(text))


def _unescape(text: str) -> str:
    if "\\x" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("\\x", i) and i + 4 <= len(text):
            try:
                out.append(chr(int(text[i + 2 : i + 4], 16)))
                i += 4
                continue
            except ValueError:
                pass
        out.append(text[i])
        i += 1
    return "".join(out)


class KernelLogWatch:
    """Records the kernel logs from construction on; a context manager that closes its fd.

    ``path`` is for tests (a FIFO or file in the same format). When the log cannot be
    opened (not root, no ``/dev/kmsg``) :attr:`available` is false and
    :meth:`new_records` returns nothing.
    """

    def __init__(self, path: str = KMSG) -> None:
        self._fd = -1
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.lseek(fd, 0, os.SEEK_END)
        except OSError:
            os.close(fd)
            return
        self._fd = fd

    @property
    def available(self) -> bool:
        """Whether the kernel log could be opened."""
        return self._fd >= 0

    def new_records(self, *, kernel_only: bool = True) -> list[KmsgRecord]:
        """Records logged since the watch started (or since the last call), oldest first;
        only the kernel's own (facility 0) unless ``kernel_only`` is false. Never blocks."""
        out: list[KmsgRecord] = []
        if self._fd < 0:
            return out
        for _ in range(_MAX_RECORDS):
            try:
                raw = os.read(self._fd, _RECORD_BYTES)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten before we read it: go on
                    continue
                break
            if not raw:
                break
            rec = parse_record(raw)
            if rec is not None and (rec.facility == 0 or not kernel_only):
                out.append(rec)
        return out

    def close(self) -> None:
        """Close the log (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> KernelLogWatch:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def mentioning(records: list[KmsgRecord], names: tuple[str, ...]) -> list[str]:
    """The texts of ``records`` that mention any of ``names`` (empty names ignored)."""
    keys = [n for n in names if n]
    return [r.text for r in records if any(k in r.text for k in keys)]
