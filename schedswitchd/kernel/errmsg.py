"""Sentences a user can act on for ``bpf(2)`` failures.

The kernel reports one errno per failure; what it means depends on the command (man page
``bpf(2)`` ERRORS section, ``kernel/bpf/syscall.c``). :func:`explain` picks the most useful
reading for the pair, falling back to the errno's generic meaning.
"""

from __future__ import annotations

import os
from errno import (
    E2BIG,
    EACCES,
    EBADF,
    EBUSY,
    EEXIST,
    EFAULT,
    EINVAL,
    ENOENT,
    ENOMEM,
    ENOSPC,
    ENOTDIR,
    EOPNOTSUPP,
    EPERM,
    ESRCH,
)

from schedswitchd.kernel.bpf_uapi import Cmd

ENOTSUPP = 524  # kernel-internal "operation not supported", leaks to user space from bpf()

_GENERIC: dict[int, str] = {
    EPERM: (
        "operation not permitted: run as root or with CAP_BPF (plus CAP_PERFMON/"
        "CAP_NET_ADMIN for tracing/networking programs, CAP_SYS_ADMIN for some commands)"
    ),
    EACCES: "permission denied by the kernel (BPF LSM, lockdown, or a read-only object)",
    E2BIG: (
        "an argument is larger than the running kernel accepts (attribute fields newer than "
        "the kernel, or too many instructions, entries or bytes)"
    ),
    EINVAL: "the kernel rejected an argument as invalid",
    ENOENT: "no such object",
    EBADF: "a file descriptor passed to the kernel is not open or not of the right kind",
    ENOMEM: (
        "the kernel could not allocate memory (check RLIMIT_MEMLOCK on kernels before 5.11 "
        "and the memory cgroup limit)"
    ),
    ENOSPC: "the kernel ran out of room (a full map, or a too-small output buffer)",
    EEXIST: "the object already exists",
    EBUSY: "the target is busy (already attached, or in use by another program)",
    EFAULT: "the kernel could not read or write a user buffer (bad pointer or size)",
    EOPNOTSUPP: "the running kernel does not support this operation or flag",
    ENOTSUPP: "the running kernel does not support this operation or flag",
    ENOTDIR: "a path component is not a directory",
    ESRCH: "no such object (it was freed)",
}

_SPECIFIC: dict[tuple[Cmd, int], str] = {
    (Cmd.MAP_CREATE, EINVAL): (
        "the map definition is invalid for this map type (key/value size, max_entries, "
        "flags), a BTF key/value type id does not match the sizes, or the name uses "
        "characters other than letters, digits, '_' and '.' (struct_ops maps need a BTF "
        "fd, key size 4, one entry and the kernel value type's size)"
    ),
    (Cmd.MAP_CREATE, ENOTSUPP): (
        "the kernel lacks this map type or the struct_ops type (check btf_vmlinux_value_type_id)"
    ),
    (Cmd.MAP_UPDATE_ELEM, EPERM): (
        "the map is frozen or read-only for user space (BPF_MAP_FREEZE, BPF_F_RDONLY), "
        "or the caller lacks CAP_BPF"
    ),
    (Cmd.MAP_UPDATE_ELEM, E2BIG): "the map is full (max_entries reached)",
    (Cmd.MAP_UPDATE_ELEM, EEXIST): "an element with this key exists (BPF_NOEXIST given)",
    (Cmd.MAP_UPDATE_ELEM, ENOENT): "no element with this key (BPF_EXIST given)",
    (Cmd.MAP_UPDATE_ELEM, EINVAL): (
        "bad key, value or flags for this map (for struct_ops: the value does not match "
        "the kernel's bpf_struct_ops_<name> layout or a program does not fit its member)"
    ),
    (Cmd.MAP_UPDATE_ELEM, EBUSY): "the struct_ops map is already registered",
    (Cmd.MAP_DELETE_ELEM, EPERM): "the map is frozen or read-only for user space",
    (Cmd.MAP_DELETE_ELEM, EINVAL): "this map type does not support deleting elements",
    (Cmd.MAP_LOOKUP_ELEM, EPERM): "the map is write-only for user space (BPF_F_WRONLY)",
    (Cmd.MAP_FREEZE, EBUSY): (
        "the map is already frozen or mapped writable into user space (mmap)"
    ),
    (Cmd.MAP_FREEZE, EINVAL): "this map type cannot be frozen",
    (Cmd.PROG_LOAD, EACCES): "the verifier rejected the program; read the verifier log",
    (Cmd.PROG_LOAD, EINVAL): (
        "the verifier or the loader rejected the program (bad instructions, BTF func/line "
        "info, attach type or attach BTF id); read the verifier log"
    ),
    (Cmd.PROG_LOAD, E2BIG): "the program has too many instructions or the log is too big",
    (Cmd.PROG_LOAD, ENOSPC): "the verifier log did not fit the largest buffer tried",
    (Cmd.PROG_LOAD, ESRCH): "the attach target or a kfunc's BTF id was not found",
    (Cmd.BTF_LOAD, EINVAL): "the kernel's BTF checker rejected the BTF; read its log",
    (Cmd.BTF_LOAD, EPERM): "loading BTF needs CAP_BPF (run as root)",
    (Cmd.BTF_LOAD, ENOSPC): "the BTF log did not fit the largest buffer tried",
    (Cmd.OBJ_GET, ENOENT): "nothing is pinned at this path",
    (Cmd.OBJ_GET, EACCES): "the pinned object's permissions forbid opening it",
    (Cmd.OBJ_PIN, EEXIST): "the pin path already exists; unlink it first",
    (Cmd.OBJ_PIN, ENOENT): "the pin path's directory does not exist",
    (Cmd.OBJ_PIN, EPERM): (
        "the pin path is not on a bpf filesystem (mount -t bpf bpf /sys/fs/bpf) or the "
        "caller lacks CAP_BPF"
    ),
    (Cmd.OBJ_PIN, EINVAL): "the pin path is not on a bpf filesystem",
    (Cmd.PROG_GET_FD_BY_ID, ENOENT): "no program with this id (it was unloaded)",
    (Cmd.MAP_GET_FD_BY_ID, ENOENT): "no map with this id (it was freed)",
    (Cmd.BTF_GET_FD_BY_ID, ENOENT): "no BTF object with this id (it was freed)",
    (Cmd.LINK_GET_FD_BY_ID, ENOENT): "no link with this id (it was detached and freed)",
    (Cmd.LINK_CREATE, EINVAL): (
        "the program's type or expected attach type does not fit this attach type, or the "
        "target is wrong"
    ),
    (Cmd.LINK_CREATE, EBUSY): (
        "the target already has an attachment of this kind (for sched_ext: another "
        "scheduler is enabled)"
    ),
    (Cmd.LINK_CREATE, EEXIST): "the target already has an attachment of this kind",
    (Cmd.LINK_DETACH, EOPNOTSUPP): "this link type cannot be detached explicitly",
    (Cmd.PROG_TEST_RUN, ENOTSUPP): "this program type does not support BPF_PROG_TEST_RUN",
    (Cmd.PROG_TEST_RUN, EINVAL): (
        "bad test-run input for this program type (data/ctx sizes, flags, repeat)"
    ),
    (Cmd.PROG_TEST_RUN, ENOSPC): "the output buffer is too small for the program's output",
    (Cmd.PROG_BIND_MAP, EINVAL): "bad flags or descriptors",
}


def explain(cmd: Cmd, err: int, detail: str | None = None) -> str:
    """One sentence for ``cmd`` failing with ``err``, with ``detail`` (an object name, a
    path, the last verifier line...) appended when given."""
    text = _SPECIFIC.get((cmd, err)) or _GENERIC.get(err) or os.strerror(err)
    return f"{text} ({detail})" if detail else text
