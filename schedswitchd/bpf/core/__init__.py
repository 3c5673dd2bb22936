"""The CO-RE engine: a program's CO-RE relocations resolved against target BTFs.

What it is for: a BPF object compiled once against one kernel's types runs on another
because each field offset, type size, enum value or existence check it records in
``.BTF.ext`` is recomputed here against the running kernel's BTF (vmlinux, then module BTFs)
and patched into the instruction before load. Pure: target BTFs arrive as arguments.

- :mod:`.relocate`: the entry point (:func:`~schedswitchd.bpf.core.relocate.relocate`);
- :mod:`.relo`: the relocation records (``struct bpf_core_relo``, ``enum bpf_core_relo_kind``);
- :mod:`.access`: access strings parsed into specs;
- :mod:`.candidates`: candidate target types by essential name, and their cache;
- :mod:`.compat`: the compatibility and match rules between local and target types;
- :mod:`.match`: one local spec matched against one candidate;
- :mod:`.calc`: local and target values of a relocation;
- :mod:`.patch`: one instruction patched (or poisoned) with the result.

Semantics follow libbpf's ``src/relo_core.c`` and kernel doc
``Documentation/bpf/llvm_reloc.rst``.
"""
