// SPDX-License-Identifier: GPL-2.0
/* Enum variables, the way scx declares them (include/scx/enums.autogen.bpf.h):
 * `const volatile u64 __NAME __weak;` in .rodata, filled by the loader from the kernel
 * BTF's enumerator NAME. scx's names are __SCX_*; the host kernel has no sched_ext, so this
 * object also carries names of other real vmlinux enumerators for a loader run with extra
 * prefixes (__BPF_, __CPUHP_, __PERF_, __Opt_), and cases the fill must refuse. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* scx's own: absent on a kernel without sched_ext (reported as missing there). */
const volatile u64 __SCX_DSQ_LOCAL __weak;
const volatile u64 __SCX_SLICE_DFL __weak;

/* enum bpf_map_type: BPF_MAP_TYPE_ARRAY = 2 */
const volatile u64 __BPF_MAP_TYPE_ARRAY __weak;
/* an anonymous enum of uapi/linux/bpf.h: BPF_F_MMAPABLE = 1 << 10, into a u32 */
const volatile u32 __BPF_F_MMAPABLE __weak;
/* enum cpuhp_state: CPUHP_INVALID = -1, into a u64 (all ones) */
const volatile u64 __CPUHP_INVALID __weak;
/* an ENUM64 value above 32 bits into a u64 and into a u32 (refused: does not fit) */
const volatile u64 __PERF_CONTEXT_KERNEL __weak;
const volatile u32 __PERF_TXN_ABORT_MASK __weak;
/* several vmlinux enums have Opt_mode, with different values: ambiguous, refused */
const volatile u64 __Opt_mode __weak = 77;
/* not an integer: refused */
const volatile bool __BPF_MAP_TYPE_HASH __weak;
/* no such enumerator anywhere */
const volatile u64 __BPF_NO_SUCH_ENUMERATOR_ZZ __weak = 5;
/* compiled-in value a test assigns explicitly (set_variable wins over the fill) */
const volatile u64 __BPF_PROG_TYPE_KPROBE __weak = 99;
/* static: never touched by user space, so not by the fill either */
static const volatile u64 __BPF_PROG_TYPE_XDP = 7;
/* not an enum variable: no __ prefix */
const volatile u64 BPF_MAP_TYPE_QUEUE_copy = 3;

/* What the program saw, for the test to compare with .rodata. */
u64 seen[12];

SEC("syscall")
int read_enums(void *ctx)
{
	seen[0] = __SCX_DSQ_LOCAL;
	seen[1] = __SCX_SLICE_DFL;
	seen[2] = __BPF_MAP_TYPE_ARRAY;
	seen[3] = __BPF_F_MMAPABLE;
	seen[4] = __CPUHP_INVALID;
	seen[5] = __PERF_CONTEXT_KERNEL;
	seen[6] = __PERF_TXN_ABORT_MASK;
	seen[7] = __Opt_mode;
	seen[8] = __BPF_MAP_TYPE_HASH;
	seen[9] = __BPF_NO_SUCH_ENUMERATOR_ZZ;
	seen[10] = __BPF_PROG_TYPE_KPROBE;
	seen[11] = __BPF_PROG_TYPE_XDP + BPF_MAP_TYPE_QUEUE_copy;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
