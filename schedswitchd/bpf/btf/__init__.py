"""The BTF reader: BPF Type Format as the kernel and clang write it, read without libbpf.

What it is for: every other part of the loader asks BTF questions -- the object's own types
(maps, variables, struct_ops members), the running kernel's vmlinux and module BTF (CO-RE
targets, kfuncs, struct_ops value types) -- and this package answers them without a syscall.

- :mod:`.source`: raw BTF bytes out of a file (raw ``/sys/kernel/btf/*``, an ELF ``.BTF``
  section, an xz-compressed module);
- :mod:`.reader`: raw bytes -> :class:`~schedswitchd.bpf.btf.reader.Btf` (base or split BTF,
  lazy decoding, lazy name indexes);
- :mod:`.types`: the decoded type records, one class per kind family;
- :mod:`.ext`: ``.BTF.ext`` (func_info, line_info, CO-RE relocation records);
- :mod:`.fixup`: the fix-ups an object's BTF needs before ``BPF_BTF_LOAD``;
- :mod:`.builder`: raw BTF written from scratch (tests, fuzzing, sanitising);
- :mod:`.json_dump`: BTF in ``bpftool btf dump ... format raw -j``'s JSON shape.

Format: kernel doc ``Documentation/bpf/btf.rst`` and UAPI ``include/uapi/linux/btf.h``.
"""
