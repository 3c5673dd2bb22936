"""Everything that talks to the running kernel: bpf() syscalls, the kernel BTF registry,
the loader, links and pins, sched_ext sysfs and uevents."""
