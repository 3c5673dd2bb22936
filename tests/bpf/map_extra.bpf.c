// SPDX-License-Identifier: GPL-2.0
/* A map attribute given with __ulong() (libbpf 1.4+'s encoding, see bpf_compat.h): a bloom
 * filter whose map_extra (the number of hash functions, low 4 bits) is 5, next to one that
 * uses the older __uint() form. add_and_check (a raw tracepoint program, which
 * BPF_PROG_TEST_RUN runs with the u64 arguments a test passes) pushes ctx[0] into both and
 * returns 1 when the __ulong() one then reports it present. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "bpf_compat.h"

struct {
	__uint(type, BPF_MAP_TYPE_BLOOM_FILTER);
	__uint(max_entries, 64);
	__type(value, __u32);
	__ulong(map_extra, 5);
} bloom_ulong SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_BLOOM_FILTER);
	__uint(max_entries, 64);
	__type(value, __u32);
	__uint(map_extra, 2);
} bloom_uint SEC(".maps");

SEC("raw_tp/sched_switch")
int add_and_check(__u64 *ctx)
{
	__u32 v = ctx[0];

	if (bpf_map_push_elem(&bloom_ulong, &v, BPF_ANY) || bpf_map_push_elem(&bloom_uint, &v, BPF_ANY))
		return -1;
	return bpf_map_peek_elem(&bloom_ulong, &v) == 0;
}

char LICENSE[] SEC("license") = "GPL";
