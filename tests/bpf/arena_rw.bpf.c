// SPDX-License-Identifier: GPL-2.0
/* An arena as scx schedulers use it (built with clang >= 18, see arena_common.h): an ARENA map
 * at a fixed user address given with __ulong(map_extra, ...) (a 64-bit value: ENUM64 in the
 * BTF), initialised and zero globals in .addr_space.1, and an allocation with the
 * bpf_arena_alloc_pages kfunc.
 *
 * arena_run (a syscall program, run with BPF_PROG_TEST_RUN) reads `seed` (initialised to
 * 0x5eed), writes seed + 1 to `result` and seed * 2 to the last element of `zeros` (a
 * zero-initialised array that spans several pages, so only pages the loader made present
 * keep the store), allocates one arena page, stores 0xabcd in it and records the page's
 * offset in the arena (the low 32 bits of its address) in `alloc_off`. It returns 0, or 1
 * when the allocation failed. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "bpf_compat.h"
#include "arena_common.h"

#define ARENA_PAGES 16
#define ARENA_BASE (1ull << 45) /* 32 TiB: free in a test process, 4 GiB aligned */

struct {
	__uint(type, BPF_MAP_TYPE_ARENA);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, ARENA_PAGES);
	__ulong(map_extra, ARENA_BASE);
} arena SEC(".maps");

__u64 __arena seed = 0x5eed;
__u64 __arena result;
__u64 __arena zeros[1536]; /* 12 KiB: pages 0-3 of the globals */
__u64 __arena alloc_off;

SEC("syscall")
int arena_run(void *ctx)
{
	__u64 __arena *page;

	result = seed + 1;
	zeros[1535] = seed * 2;
	page = bpf_arena_alloc_pages(&arena, NULL, 1, NUMA_NO_NODE, 0);
	if (!page)
		return 1;
	*page = 0xabcd;
	alloc_off = (__u32)(__u64)page;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
