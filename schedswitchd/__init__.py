"""schedswitchd: switch Linux sched_ext BPF schedulers on demand.

Floors (see ``docs/architecture.md``): ``schedswitchd.bpf`` is pure (ELF, BTF, CO-RE; never a
syscall), ``schedswitchd.kernel`` talks to the running kernel, ``schedswitchd.daemon``
is the service. Every error raised on purpose derives from
:class:`schedswitchd.errors.SchedSwitchError`.
"""

__version__ = "0.1.0"
