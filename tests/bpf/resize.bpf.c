// SPDX-License-Identifier: GPL-2.0
/* A resizable global section, as scx's RESIZE_ARRAY uses them: `slots` is declared with one
 * element in its own section .data.slots (user space sets its real length before load, libbpf's
 * bpf_map__set_value_size), and `nr_slots` in .rodata says how many there are. bump (a raw
 * tracepoint program, run with BPF_PROG_TEST_RUN) adds 1 to slots[ctx[0]] when
 * ctx[0] < nr_slots and returns the new value (0 when out of range). With nr_slots > 1, the
 * verifier accepts it only when the section holds nr_slots elements: it knows nr_slots from the
 * frozen .rodata and checks every index below it against the map's value size. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

const volatile __u32 nr_slots = 1;
__u64 slots[1] SEC(".data.slots") = { 5 };

SEC("raw_tp/sched_switch")
int bump(__u64 *ctx)
{
	__u32 i = ctx[0];

	if (i >= nr_slots)
		return 0;
	slots[i] += 1;
	return slots[i];
}

char LICENSE[] SEC("license") = "GPL";
