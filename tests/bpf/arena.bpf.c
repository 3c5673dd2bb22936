// SPDX-License-Identifier: GPL-2.0
/* An arena map and arena globals in .addr_space.1 (clang 14 has no __arena address-space
 * casts, so the globals are plain variables placed in the section: this exercises the
 * object model's arena data relocations, not arena loads in the verifier). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARENA);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 2); /* pages */
} arena SEC(".maps");

u64 arena_counter SEC(".addr_space.1") = 3;
u64 arena_table[4] SEC(".addr_space.1");

SEC("syscall")
int touch_arena(void *ctx)
{
	arena_counter++;
	arena_table[1] = arena_counter;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
