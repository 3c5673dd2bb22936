// SPDX-License-Identifier: GPL-2.0
/* A malformed __ulong()-style attribute: an enum of two enumerators, which names no single
 * value (libbpf refuses it: "invalid __ulong"). Only opened, never loaded. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_BLOOM_FILTER);
	__uint(max_entries, 64);
	__type(value, __u32);
	enum { EXTRA_A = 1, EXTRA_B = 2 } map_extra;
} two_values SEC(".maps");

char LICENSE[] SEC("license") = "GPL";
