// SPDX-License-Identifier: GPL-2.0
/* Entry programs sharing .text subprograms, each reaching them in another order and at
 * another depth, with a map, global data and a callback used inside the shared code. Each
 * shared function lands at a different offset in every linked program, so a wrong call
 * offset, a fixup left at another copy's index or a callback pointing into another
 * program's layout gives a wrong result (or a verifier refusal) when the programs run
 * (tests/kernel/test_shared_subprogs.py). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, u32);
	__type(value, u64);
} weights SEC(".maps");

u64 calls;			/* .bss */
u64 scale = 3;			/* .data */
const volatile u64 base = 100;	/* .rodata */

static __noinline u64 weight(u32 i)
{
	u64 *w = bpf_map_lookup_elem(&weights, &i);

	return w ? *w : 0;
}

static __noinline u64 bump(u64 x)
{
	calls++;
	return x * scale;
}

static __noinline u64 mix(u64 x, u32 i)
{
	return bump(x) + weight(i) + base;
}

static int loop_cb(u32 idx, void *ctx)
{
	u64 *acc = ctx;

	*acc += mix(idx, idx & 3);
	return 0;
}

/* layout: first_mix, mix, bump, weight */
SEC("syscall")
int first_mix(void *ctx)
{
	return mix(1, 0);
}

/* layout: first_weight, weight, bump, mix (mix's calls go back to earlier copies) */
SEC("syscall")
int first_weight(void *ctx)
{
	u64 w = weight(1);
	u64 b = bump(2);

	return w + b + mix(3, 2);
}

/* layout: looped, loop_cb, mix, bump, weight */
SEC("syscall")
int looped(void *ctx)
{
	u64 acc = 0;

	bpf_loop(4, loop_cb, &acc, 0);
	return acc + bump(5);
}

char LICENSE[] SEC("license") = "GPL";
