// SPDX-License-Identifier: GPL-2.0
/* Global data: .rodata tunables, .data, .bss, hidden and static variables, and
 * .data.NAME / .bss.NAME array sections (scx RESIZE_ARRAY pattern). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

const volatile u32 nr_cpus = 8;
const volatile s64 slice_ns = -5000000;
const volatile bool verbose = true;
const volatile char tag[8] = "fifo";
const volatile u16 weights[3] = { 1, 2, 3 };
const volatile u8 small_u8;

u64 counter = 42;
s32 signed_data = -7;
__hidden u64 hidden_var = 5;
static volatile u32 static_data = 9;

u64 zeroed;
struct stats {
	u64 enq;
	u32 disp;
	u8 kind;
} stats;

u64 cpu_loads[1] SEC(".data.cpu_loads");
u32 cpu_ids[4] SEC(".bss.cpu_ids");

/* The context a test passes with BPF_PROG_TEST_RUN (ctx_in). */
struct args {
	u32 idx;
};

/* A syscall program, so that a test can run it deterministically and check every global
 * it touches. Returns the slot index it used. */
SEC("syscall")
int read_globals(struct args *ctx)
{
	u32 i = ctx->idx & 3;
	u32 w = 0;

	/* An explicit bound the verifier can follow (a modulo loses the bounds). */
	if (i < 3)
		w = weights[i];
	if (verbose)
		counter += nr_cpus + slice_ns + tag[0] + w + small_u8;
	zeroed++;
	stats.enq++;
	stats.disp += static_data;
	stats.kind = i;
	signed_data += hidden_var;
	cpu_loads[0] += i;
	cpu_ids[i] = i + 1;
	return i;
}

char LICENSE[] SEC("license") = "GPL";
