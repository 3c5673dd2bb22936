"""Pure BPF object handling: BTF reader, ELF object spec, relocations, CO-RE engine.

Nothing in this package makes a syscall; kernel facts (target BTFs, config values) arrive as
arguments.
"""
