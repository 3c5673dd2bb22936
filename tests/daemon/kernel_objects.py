"""Plain helpers of the real kernel backend's tests (tests/daemon/test_kernel_backend.py,
test_pin_checks.py); their fixtures ``bpf_object`` and ``scx_root`` are in conftest.py."""

from __future__ import annotations

from pathlib import Path

from schedswitchd.daemon.config import SchedulerConfig

#: The struct_ops type the test objects register: a congestion control, which a host
#: without sched_ext still has.
TCP = "tcp_congestion_ops"


def object_config(obj: Path, **kw: object) -> SchedulerConfig:
    """A scheduler's configuration for the BPF object ``obj``, with ``kw`` as further keys."""
    return SchedulerConfig.model_validate({"object": str(obj), **kw})
