"""When the kernel refuses struct_ops for a reason it only logs, the error says it.

On the host kernel a ``tcp_congestion_ops`` with only ``.name`` set
(``tests/bpf/tcp_ca_name_only.bpf.c``) fails ``BPF_MAP_UPDATE_ELEM`` with a bare
``EINVAL``; ``tcp_validate_congestion_control`` logs ``TCP: ssd_nameonly does not
implement required ops``. The loader reads ``/dev/kmsg`` during the call (root only).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schedswitchd.bpf.btf.reader import Btf
from schedswitchd.bpf.object import open_object
from schedswitchd.errors import BpfSyscallError
from schedswitchd.kernel import kmsg
from schedswitchd.kernel.loader import StaticKernelBtfs, load_object
from tests.bpf.conftest import BPF_BUILD_DIR

SYS_VMLINUX = Path("/sys/kernel/btf/vmlinux")


def test_parse_records() -> None:
    rec = kmsg.parse_record(
        b"3,1234,5678901,-;TCP: ssd_x does not implement required ops\n SUBSYSTEM=net\n"
    )
    assert rec == kmsg.KmsgRecord(3, 0, 1234, 5678901, "TCP: ssd_x does not implement required ops")
    user = kmsg.parse_record(b"14,7,1,-;a \\x41 from user space\n")
    assert user is not None and user.facility == 1 and user.level == 6
    assert user.text == "a A from user space"
    assert kmsg.parse_record(b"no separator") is None
    assert kmsg.parse_record(b"x,y,z;text") is None
    assert kmsg.mentioning([rec], ("", "ssd_x")) == [rec.text]
    assert kmsg.mentioning([rec], ("ssd_y",)) == []


def test_unreadable_log_is_an_empty_watch(tmp_path: Path) -> None:
    with kmsg.KernelLogWatch(str(tmp_path / "absent")) as watch:
        assert not watch.available and watch.new_records() == []


def _readable_kmsg() -> bool:
    try:
        os.close(os.open(kmsg.KMSG, os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


@pytest.mark.root
def test_struct_ops_missing_required_ops_says_what_the_kernel_logged() -> None:
    if not _readable_kmsg():
        pytest.skip("/dev/kmsg is not readable here (needs root or CAP_SYSLOG)")
    path = BPF_BUILD_DIR / "tcp_ca_name_only.bpf.o"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make test-objects`")
    spec = open_object(path)
    kernel = StaticKernelBtfs(Btf.from_file(SYS_VMLINUX, name="vmlinux"))
    with load_object(spec, kernel) as obj, pytest.raises(BpfSyscallError) as info:
        obj.attach_struct_ops()
    err = info.value
    assert err.errno_name == "EINVAL"
    assert err.kernel_log and "ssd_nameonly does not implement required ops" in err.kernel_log[0]
    assert "the kernel log says: TCP: ssd_nameonly does not implement required ops" in str(err)
    # the generic guess about value layouts is not what the user reads any more
    assert "layout" not in str(err)
