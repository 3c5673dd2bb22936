"""The running kernel's BTF: object ids, the registry of vmlinux and module BTFs, and what an
object's BTF needs before the kernel takes it.

What it is for: the loader resolves CO-RE relocations, kfuncs, typed ksyms and struct_ops
types against the kernel's own BTF, and loads the object's BTF into a kernel that may lack
some of its kinds. Parsing is :mod:`schedswitchd.bpf.btf`'s; this package is the kernel side.

- :mod:`.ids`: kernel BTF object ids and fds by name (``BPF_BTF_GET_NEXT_ID``);
- :mod:`.registry`: vmlinux once, declared module BTFs by name, a bounded cache, uevents;
- :mod:`.module_needs`: the names an object looks up that vmlinux lacks;
- :mod:`.module_memo`: which module BTFs hold such a name, per set of loaded modules;
- :mod:`.features`: which BTF kinds the running kernel accepts (probed);
- :mod:`.sanitize`: an object's BTF rewritten for a kernel that lacks some kinds.

Rules follow libbpf (``src/libbpf.c``: ``load_module_btfs``, ``bpf_object__sanitize_btf``).
"""
