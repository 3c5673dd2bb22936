"""struct_ops: an object's struct_ops variable as the kernel's value type, and the link that
registers it.

Generic BPF (``tcp_congestion_ops`` works the same way); sched_ext's ``sched_ext_ops`` is
the user here. The loader writes the value (:mod:`.value`), the backend creates and detaches
the link (:mod:`.link`).

Source: libbpf ``src/libbpf.c`` (``bpf_map__init_kern_struct_ops``,
``bpf_map__attach_struct_ops``) and ``kernel/bpf/bpf_struct_ops.c``.
"""
