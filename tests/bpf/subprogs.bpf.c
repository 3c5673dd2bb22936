// SPDX-License-Identifier: GPL-2.0
/* Subprograms in .text shared by two entry programs, a global (verified separately)
 * function, and callbacks passed to bpf_loop and bpf_for_each_map_elem. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, u32);
	__type(value, u64);
} vals SEC(".maps");

u64 total;

static __noinline u64 add_one(u64 x)
{
	return x + 1;
}

static __noinline u64 twice(u64 x)
{
	return add_one(x) + add_one(x);
}

__noinline int global_helper(int x)
{
	return x * 3;
}

static int loop_cb(u32 idx, void *ctx)
{
	u64 *sum = ctx;

	*sum += add_one(idx);
	return 0;
}

static long map_cb(void *map, u32 *key, u64 *val, void *ctx)
{
	total += *val;
	return 0;
}

SEC("tp_btf/sched_switch")
int prog_a(u64 *ctx)
{
	u64 sum = 0;

	bpf_loop(8, loop_cb, &sum, 0);
	bpf_for_each_map_elem(&vals, map_cb, NULL, 0);
	total += twice(sum);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int prog_b(u64 *ctx)
{
	total += global_helper((int)total);
	return 0;
}

SEC("syscall")
int prog_c(void *ctx)
{
	return add_one(total);
}

char LICENSE[] SEC("license") = "GPL";
