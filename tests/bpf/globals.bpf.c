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

SEC("tp_btf/sched_switch")
int read_globals(u64 *ctx)
{
	u32 i = bpf_get_smp_processor_id() & 3;

	if (verbose)
		counter += nr_cpus + slice_ns + tag[0] + weights[i % 3] + small_u8;
	zeroed++;
	stats.enq++;
	stats.disp += static_data;
	signed_data += hidden_var;
	cpu_loads[0] += i;
	cpu_ids[i] = i;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
