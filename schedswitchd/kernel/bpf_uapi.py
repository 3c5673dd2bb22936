"""``union bpf_attr`` layouts, ``bpf_*_info`` records and constants of the ``bpf(2)`` UAPI.

Source: ``include/uapi/linux/bpf.h`` (read from the libbpf/libbpf mirror of the header,
commit f7081a6, which is a superset of kernel 6.18's). Each command gets its own
``ctypes.Structure`` holding exactly the members the kernel reads for that command, in the
header's order; the syscall passes ``sizeof`` of that structure, and the kernel treats the
rest of its ``union bpf_attr`` as zero (``bpf_check_uarg_tail_zero``/``CHECK_ATTR``). Members
newer than the running kernel must therefore stay zero.

``__aligned_u64`` members are ``c_uint64``, which ctypes aligns to 8 bytes on the 64-bit
ABIs this daemon runs on, so offsets match the C layout. Anonymous unions of the header are
flattened to the member we use; the alternative name is given in the comment.
``tests/kernel/test_bpf_uapi_layout.py`` checks every member's offset, size and signedness
against ``union bpf_attr`` and the ``bpf_*_info`` structs in the running kernel's BTF.
"""

from __future__ import annotations

import ctypes
import enum
from ctypes import c_char, c_int32, c_uint8, c_uint32, c_uint64

#: ``BPF_OBJ_NAME_LEN``: bytes of a map/program name including the terminating NUL.
OBJ_NAME_LEN = 16
#: ``BPF_TAG_SIZE``: bytes of a program tag (truncated SHA-1 of the instructions).
TAG_SIZE = 8


class Cmd(enum.IntEnum):
    """``enum bpf_cmd``: the first argument of ``bpf(2)``."""

    MAP_CREATE = 0
    MAP_LOOKUP_ELEM = 1
    MAP_UPDATE_ELEM = 2
    MAP_DELETE_ELEM = 3
    MAP_GET_NEXT_KEY = 4
    PROG_LOAD = 5
    OBJ_PIN = 6
    OBJ_GET = 7
    PROG_ATTACH = 8
    PROG_DETACH = 9
    PROG_TEST_RUN = 10
    PROG_GET_NEXT_ID = 11
    MAP_GET_NEXT_ID = 12
    PROG_GET_FD_BY_ID = 13
    MAP_GET_FD_BY_ID = 14
    OBJ_GET_INFO_BY_FD = 15
    PROG_QUERY = 16
    RAW_TRACEPOINT_OPEN = 17
    BTF_LOAD = 18
    BTF_GET_FD_BY_ID = 19
    TASK_FD_QUERY = 20
    MAP_LOOKUP_AND_DELETE_ELEM = 21
    MAP_FREEZE = 22
    BTF_GET_NEXT_ID = 23
    MAP_LOOKUP_BATCH = 24
    MAP_LOOKUP_AND_DELETE_BATCH = 25
    MAP_UPDATE_BATCH = 26
    MAP_DELETE_BATCH = 27
    LINK_CREATE = 28
    LINK_UPDATE = 29
    LINK_GET_FD_BY_ID = 30
    LINK_GET_NEXT_ID = 31
    ENABLE_STATS = 32
    ITER_CREATE = 33
    LINK_DETACH = 34
    PROG_BIND_MAP = 35

    @property
    def uapi_name(self) -> str:
        """The header's spelling, e.g. ``"BPF_PROG_LOAD"``."""
        return f"BPF_{self.name}"


class MapType(enum.IntEnum):
    """``enum bpf_map_type`` (the members a sched_ext/struct_ops loader meets)."""

    UNSPEC = 0
    HASH = 1
    ARRAY = 2
    PROG_ARRAY = 3
    PERF_EVENT_ARRAY = 4
    PERCPU_HASH = 5
    PERCPU_ARRAY = 6
    STACK_TRACE = 7
    CGROUP_ARRAY = 8
    LRU_HASH = 9
    LRU_PERCPU_HASH = 10
    LPM_TRIE = 11
    ARRAY_OF_MAPS = 12
    HASH_OF_MAPS = 13
    DEVMAP = 14
    SOCKMAP = 15
    CPUMAP = 16
    XSKMAP = 17
    SOCKHASH = 18
    CGROUP_STORAGE = 19
    REUSEPORT_SOCKARRAY = 20
    PERCPU_CGROUP_STORAGE = 21
    QUEUE = 22
    STACK = 23
    SK_STORAGE = 24
    DEVMAP_HASH = 25
    STRUCT_OPS = 26
    RINGBUF = 27
    INODE_STORAGE = 28
    TASK_STORAGE = 29
    BLOOM_FILTER = 30
    USER_RINGBUF = 31
    CGRP_STORAGE = 32
    ARENA = 33


#: Map types whose value is stored once per possible CPU (lookup/update buffers are
#: ``round_up(value_size, 8) * possible CPUs`` bytes).
PERCPU_MAP_TYPES = frozenset(
    {
        MapType.PERCPU_HASH,
        MapType.PERCPU_ARRAY,
        MapType.LRU_PERCPU_HASH,
        MapType.PERCPU_CGROUP_STORAGE,
    }
)


class ProgType(enum.IntEnum):
    """``enum bpf_prog_type``."""

    UNSPEC = 0
    SOCKET_FILTER = 1
    KPROBE = 2
    SCHED_CLS = 3
    SCHED_ACT = 4
    TRACEPOINT = 5
    XDP = 6
    PERF_EVENT = 7
    CGROUP_SKB = 8
    CGROUP_SOCK = 9
    LWT_IN = 10
    LWT_OUT = 11
    LWT_XMIT = 12
    SOCK_OPS = 13
    SK_SKB = 14
    CGROUP_DEVICE = 15
    SK_MSG = 16
    RAW_TRACEPOINT = 17
    CGROUP_SOCK_ADDR = 18
    LWT_SEG6LOCAL = 19
    LIRC_MODE2 = 20
    SK_REUSEPORT = 21
    FLOW_DISSECTOR = 22
    CGROUP_SYSCTL = 23
    RAW_TRACEPOINT_WRITABLE = 24
    CGROUP_SOCKOPT = 25
    TRACING = 26
    STRUCT_OPS = 27
    EXT = 28
    LSM = 29
    SK_LOOKUP = 30
    SYSCALL = 31
    NETFILTER = 32


class AttachType(enum.IntEnum):
    """``enum bpf_attach_type`` (prefix ``BPF_`` dropped)."""

    CGROUP_INET_INGRESS = 0
    CGROUP_INET_EGRESS = 1
    CGROUP_INET_SOCK_CREATE = 2
    CGROUP_SOCK_OPS = 3
    SK_SKB_STREAM_PARSER = 4
    SK_SKB_STREAM_VERDICT = 5
    CGROUP_DEVICE = 6
    SK_MSG_VERDICT = 7
    CGROUP_INET4_BIND = 8
    CGROUP_INET6_BIND = 9
    CGROUP_INET4_CONNECT = 10
    CGROUP_INET6_CONNECT = 11
    CGROUP_INET4_POST_BIND = 12
    CGROUP_INET6_POST_BIND = 13
    CGROUP_UDP4_SENDMSG = 14
    CGROUP_UDP6_SENDMSG = 15
    LIRC_MODE2 = 16
    FLOW_DISSECTOR = 17
    CGROUP_SYSCTL = 18
    CGROUP_UDP4_RECVMSG = 19
    CGROUP_UDP6_RECVMSG = 20
    CGROUP_GETSOCKOPT = 21
    CGROUP_SETSOCKOPT = 22
    TRACE_RAW_TP = 23
    TRACE_FENTRY = 24
    TRACE_FEXIT = 25
    MODIFY_RETURN = 26
    LSM_MAC = 27
    TRACE_ITER = 28
    CGROUP_INET4_GETPEERNAME = 29
    CGROUP_INET6_GETPEERNAME = 30
    CGROUP_INET4_GETSOCKNAME = 31
    CGROUP_INET6_GETSOCKNAME = 32
    XDP_DEVMAP = 33
    CGROUP_INET_SOCK_RELEASE = 34
    XDP_CPUMAP = 35
    SK_LOOKUP = 36
    XDP = 37
    SK_SKB_VERDICT = 38
    SK_REUSEPORT_SELECT = 39
    SK_REUSEPORT_SELECT_OR_MIGRATE = 40
    PERF_EVENT = 41
    TRACE_KPROBE_MULTI = 42
    LSM_CGROUP = 43
    STRUCT_OPS = 44
    NETFILTER = 45


class LinkType(enum.IntEnum):
    """``enum bpf_link_type``."""

    UNSPEC = 0
    RAW_TRACEPOINT = 1
    TRACING = 2
    CGROUP = 3
    ITER = 4
    NETNS = 5
    XDP = 6
    PERF_EVENT = 7
    KPROBE_MULTI = 8
    STRUCT_OPS = 9
    NETFILTER = 10
    TCX = 11
    UPROBE_MULTI = 12
    NETKIT = 13
    SOCKMAP = 14


# --- flags (bpf.h) -------------------------------------------------------------------------
# BPF_MAP_UPDATE_ELEM flags
ANY = 0
NOEXIST = 1
EXIST = 2
F_LOCK = 4
# BPF_MAP_CREATE map_flags
F_NO_PREALLOC = 1 << 0
F_NO_COMMON_LRU = 1 << 1
F_NUMA_NODE = 1 << 2
F_RDONLY = 1 << 3
F_WRONLY = 1 << 4
F_ZERO_SEED = 1 << 6
F_RDONLY_PROG = 1 << 7
F_WRONLY_PROG = 1 << 8
F_MMAPABLE = 1 << 10
F_INNER_MAP = 1 << 12
F_LINK = 1 << 13
F_PATH_FD = 1 << 14
F_VTYPE_BTF_OBJ_FD = 1 << 15
F_TOKEN_FD = 1 << 16
# BPF_PROG_LOAD prog_flags
F_STRICT_ALIGNMENT = 1 << 0
F_ANY_ALIGNMENT = 1 << 1
F_SLEEPABLE = 1 << 4
# BPF_PROG_TEST_RUN flags
F_TEST_RUN_ON_CPU = 1 << 0


# --- per-command attr layouts ----------------------------------------------------------------


class MapCreateAttr(ctypes.Structure):
    """``union bpf_attr`` for ``BPF_MAP_CREATE`` (bpf.h: "anonymous struct used by
    BPF_MAP_CREATE command"), up to ``map_token_fd``."""

    _fields_ = (
        ("map_type", c_uint32),
        ("key_size", c_uint32),  # bytes
        ("value_size", c_uint32),  # bytes
        ("max_entries", c_uint32),
        ("map_flags", c_uint32),
        ("inner_map_fd", c_uint32),
        ("numa_node", c_uint32),
        ("map_name", c_char * OBJ_NAME_LEN),
        ("map_ifindex", c_uint32),
        ("btf_fd", c_uint32),
        ("btf_key_type_id", c_uint32),
        ("btf_value_type_id", c_uint32),
        ("btf_vmlinux_value_type_id", c_uint32),
        ("map_extra", c_uint64),
        ("value_type_btf_obj_fd", c_int32),
        ("map_token_fd", c_int32),
    )


class MapElemAttr(ctypes.Structure):
    """``union bpf_attr`` for ``BPF_MAP_{LOOKUP,UPDATE,DELETE}_ELEM``,
    ``BPF_MAP_GET_NEXT_KEY`` and ``BPF_MAP_FREEZE`` (bpf.h: "anonymous struct used by
    BPF_MAP_*_ELEM and BPF_MAP_FREEZE commands"). ``value`` is also ``next_key``."""

    _fields_ = (
        ("map_fd", c_uint32),
        ("key", c_uint64),  # user pointer
        ("value", c_uint64),  # user pointer; union with next_key
        ("flags", c_uint64),
    )


class ProgLoadAttr(ctypes.Structure):
    """``union bpf_attr`` for ``BPF_PROG_LOAD`` (bpf.h: "anonymous struct used by
    BPF_PROG_LOAD command"), up to ``fd_array_cnt``. ``attach_btf_obj_fd`` shares its
    slot with ``attach_prog_fd``."""

    _fields_ = (
        ("prog_type", c_uint32),
        ("insn_cnt", c_uint32),
        ("insns", c_uint64),
        ("license", c_uint64),
        ("log_level", c_uint32),
        ("log_size", c_uint32),
        ("log_buf", c_uint64),
        ("kern_version", c_uint32),
        ("prog_flags", c_uint32),
        ("prog_name", c_char * OBJ_NAME_LEN),
        ("prog_ifindex", c_uint32),
        ("expected_attach_type", c_uint32),
        ("prog_btf_fd", c_uint32),
        ("func_info_rec_size", c_uint32),
        ("func_info", c_uint64),
        ("func_info_cnt", c_uint32),
        ("line_info_rec_size", c_uint32),
        ("line_info", c_uint64),
        ("line_info_cnt", c_uint32),
        ("attach_btf_id", c_uint32),
        ("attach_btf_obj_fd", c_uint32),  # union with attach_prog_fd
        ("core_relo_cnt", c_uint32),
        ("fd_array", c_uint64),
        ("core_relos", c_uint64),
        ("core_relo_rec_size", c_uint32),
        ("log_true_size", c_uint32),  # output: bytes the full log needs, NUL included
        ("prog_token_fd", c_int32),
        ("fd_array_cnt", c_uint32),
    )


class ObjAttr(ctypes.Structure):
    """``union bpf_attr`` for ``BPF_OBJ_PIN`` / ``BPF_OBJ_GET`` (bpf.h: "anonymous struct
    used by BPF_OBJ_* commands")."""

    _fields_ = (
        ("pathname", c_uint64),  # user pointer to a NUL-terminated path
        ("bpf_fd", c_uint32),
        ("file_flags", c_uint32),
        ("path_fd", c_int32),
    )


class TestRunAttr(ctypes.Structure):
    """``union bpf_attr`` member ``test`` for ``BPF_PROG_TEST_RUN`` (``BPF_PROG_RUN``)."""

    __test__ = False  # not a pytest class, despite the name

    _fields_ = (
        ("prog_fd", c_uint32),
        ("retval", c_uint32),  # output
        ("data_size_in", c_uint32),
        ("data_size_out", c_uint32),  # in/out; ENOSPC when data_out is too small
        ("data_in", c_uint64),
        ("data_out", c_uint64),
        ("repeat", c_uint32),
        ("duration", c_uint32),  # output: mean ns per run
        ("ctx_size_in", c_uint32),
        ("ctx_size_out", c_uint32),  # in/out
        ("ctx_in", c_uint64),
        ("ctx_out", c_uint64),
        ("flags", c_uint32),
        ("cpu", c_uint32),
        ("batch_size", c_uint32),
    )


class GetIdAttr(ctypes.Structure):
    """``union bpf_attr`` for ``BPF_*_GET_NEXT_ID`` and ``BPF_*_GET_FD_BY_ID`` (bpf.h:
    "anonymous struct used by BPF_*_GET_*_ID"). ``start_id`` is also
    ``prog_id``/``map_id``/``btf_id``/``link_id``."""

    _fields_ = (
        ("start_id", c_uint32),
        ("next_id", c_uint32),  # output of GET_NEXT_ID
        ("open_flags", c_uint32),
    )


class InfoAttr(ctypes.Structure):
    """``union bpf_attr`` member ``info`` for ``BPF_OBJ_GET_INFO_BY_FD``."""

    _fields_ = (
        ("bpf_fd", c_uint32),
        ("info_len", c_uint32),  # in: bytes of the buffer; out: bytes the kernel wrote
        ("info", c_uint64),  # user pointer to a bpf_*_info record
    )


class BtfLoadAttr(ctypes.Structure):
    """``union bpf_attr`` for ``BPF_BTF_LOAD`` (bpf.h: "anonymous struct for
    BPF_BTF_LOAD"), up to ``btf_flags``."""

    _fields_ = (
        ("btf", c_uint64),
        ("btf_log_buf", c_uint64),
        ("btf_size", c_uint32),
        ("btf_log_size", c_uint32),
        ("btf_log_level", c_uint32),
        ("btf_log_true_size", c_uint32),  # output
        ("btf_flags", c_uint32),
        ("btf_token_fd", c_int32),
    )


class _LinkCreateTracing(ctypes.Structure):
    _fields_ = (("target_btf_id", c_uint32), ("cookie", c_uint64))


class _LinkCreateIter(ctypes.Structure):
    _fields_ = (("iter_info", c_uint64), ("iter_info_len", c_uint32))


class _LinkCreateTail(ctypes.Union):
    _fields_ = (
        ("tracing", _LinkCreateTracing),  # target_btf_id overlays tracing.target_btf_id
        ("iter", _LinkCreateIter),
        ("perf_event_cookie", c_uint64),
        ("_size", c_uint64 * 6),  # the header's largest member (uprobe_multi) is 48 bytes
    )


class LinkCreateAttr(ctypes.Structure):
    """``union bpf_attr`` member ``link_create`` for ``BPF_LINK_CREATE``. ``prog_fd`` is
    also ``map_fd`` (struct_ops), ``target_fd`` also ``target_ifindex``; ``tail`` holds the
    per-link-type union (tracing target id + cookie, iterator info, perf_event cookie)."""

    _fields_ = (
        ("prog_fd", c_uint32),
        ("target_fd", c_uint32),
        ("attach_type", c_uint32),
        ("flags", c_uint32),
        ("tail", _LinkCreateTail),
    )


class RawTracepointOpenAttr(ctypes.Structure):
    """``union bpf_attr`` member ``raw_tracepoint`` for ``BPF_RAW_TRACEPOINT_OPEN``."""

    _fields_ = (
        ("name", c_uint64),  # user pointer to the NUL-terminated tracepoint name
        ("prog_fd", c_uint32),
        ("_pad", c_uint32),
        ("cookie", c_uint64),
    )


class IterCreateAttr(ctypes.Structure):
    """``union bpf_attr`` member ``iter_create`` for ``BPF_ITER_CREATE``."""

    _fields_ = (("link_fd", c_uint32), ("flags", c_uint32))


class LinkDetachAttr(ctypes.Structure):
    """``union bpf_attr`` member ``link_detach`` for ``BPF_LINK_DETACH``."""

    _fields_ = (("link_fd", c_uint32),)


class ProgBindMapAttr(ctypes.Structure):
    """``union bpf_attr`` member ``prog_bind_map`` for ``BPF_PROG_BIND_MAP``."""

    _fields_ = (("prog_fd", c_uint32), ("map_fd", c_uint32), ("flags", c_uint32))


# --- info records (OBJ_GET_INFO_BY_FD) ---------------------------------------------------------


class BpfProgInfo(ctypes.Structure):
    """``struct bpf_prog_info`` (bpf.h). Pointer members are user buffers the kernel fills
    when the matching length/count is non-zero."""

    _fields_ = (
        ("type", c_uint32),
        ("id", c_uint32),
        ("tag", c_uint8 * TAG_SIZE),
        ("jited_prog_len", c_uint32),
        ("xlated_prog_len", c_uint32),  # bytes
        ("jited_prog_insns", c_uint64),
        ("xlated_prog_insns", c_uint64),
        ("load_time", c_uint64),  # ns since boot
        ("created_by_uid", c_uint32),
        ("nr_map_ids", c_uint32),
        ("map_ids", c_uint64),
        ("name", c_char * OBJ_NAME_LEN),
        ("ifindex", c_uint32),
        ("gpl_compatible", c_uint32),  # bit 0; 31 bits of padding
        ("netns_dev", c_uint64),
        ("netns_ino", c_uint64),
        ("nr_jited_ksyms", c_uint32),
        ("nr_jited_func_lens", c_uint32),
        ("jited_ksyms", c_uint64),
        ("jited_func_lens", c_uint64),
        ("btf_id", c_uint32),
        ("func_info_rec_size", c_uint32),
        ("func_info", c_uint64),
        ("nr_func_info", c_uint32),
        ("nr_line_info", c_uint32),
        ("line_info", c_uint64),
        ("jited_line_info", c_uint64),
        ("nr_jited_line_info", c_uint32),
        ("line_info_rec_size", c_uint32),
        ("jited_line_info_rec_size", c_uint32),
        ("nr_prog_tags", c_uint32),
        ("prog_tags", c_uint64),
        ("run_time_ns", c_uint64),
        ("run_cnt", c_uint64),
        ("recursion_misses", c_uint64),
        ("verified_insns", c_uint32),
        ("attach_btf_obj_id", c_uint32),
        ("attach_btf_id", c_uint32),
        ("_pad", c_uint32),
    )


class BpfMapInfo(ctypes.Structure):
    """``struct bpf_map_info`` (bpf.h)."""

    _fields_ = (
        ("type", c_uint32),
        ("id", c_uint32),
        ("key_size", c_uint32),
        ("value_size", c_uint32),
        ("max_entries", c_uint32),
        ("map_flags", c_uint32),
        ("name", c_char * OBJ_NAME_LEN),
        ("ifindex", c_uint32),
        ("btf_vmlinux_value_type_id", c_uint32),
        ("netns_dev", c_uint64),
        ("netns_ino", c_uint64),
        ("btf_id", c_uint32),
        ("btf_key_type_id", c_uint32),
        ("btf_value_type_id", c_uint32),
        ("btf_vmlinux_id", c_uint32),
        ("map_extra", c_uint64),
    )


class BpfBtfInfo(ctypes.Structure):
    """``struct bpf_btf_info`` (bpf.h). ``name`` is a user buffer of ``name_len`` bytes the
    kernel fills with "vmlinux" or the module name (empty for user-loaded BTF)."""

    _fields_ = (
        ("btf", c_uint64),
        ("btf_size", c_uint32),  # bytes
        ("id", c_uint32),
        ("name", c_uint64),
        ("name_len", c_uint32),
        ("kernel_btf", c_uint32),
    )


class _LinkInfoTracing(ctypes.Structure):
    _fields_ = (
        ("attach_type", c_uint32),
        ("target_obj_id", c_uint32),
        ("target_btf_id", c_uint32),
        ("_pad", c_uint32),
        ("cookie", c_uint64),
    )


class _LinkInfoCgroup(ctypes.Structure):
    _fields_ = (("cgroup_id", c_uint64), ("attach_type", c_uint32))


class _LinkInfoStructOps(ctypes.Structure):
    _fields_ = (("map_id", c_uint32),)


class _LinkInfoTail(ctypes.Union):
    _fields_ = (
        ("tracing", _LinkInfoTracing),
        ("cgroup", _LinkInfoCgroup),
        ("struct_ops", _LinkInfoStructOps),
        ("_size", c_uint64 * 6),  # perf_event / uprobe_multi: 48 bytes
    )


class BpfLinkInfo(ctypes.Structure):
    """``struct bpf_link_info`` (bpf.h), with the per-type union reduced to the tracing,
    cgroup and struct_ops members (sized like the header's largest member)."""

    _fields_ = (
        ("type", c_uint32),
        ("id", c_uint32),
        ("prog_id", c_uint32),
        ("tail", _LinkInfoTail),
    )


class BpfFuncInfo(ctypes.Structure):
    """``struct bpf_func_info`` (bpf.h): one per (sub)program, 8 bytes."""

    _fields_ = (("insn_off", c_uint32), ("type_id", c_uint32))


class BpfLineInfo(ctypes.Structure):
    """``struct bpf_line_info`` (bpf.h): 16 bytes; ``line_col`` = line << 10 | column."""

    _fields_ = (
        ("insn_off", c_uint32),
        ("file_name_off", c_uint32),
        ("line_off", c_uint32),
        ("line_col", c_uint32),
    )
