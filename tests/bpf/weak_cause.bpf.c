// SPDX-License-Identifier: GPL-2.0
/* A verifier rejection behind a weak kfunc the kernel lacks, compiled as a scheduler's BPF
 * part is (tests/kernel/test_load_error_cause.py): weak_then_null calls ssd_no_such_kfunc_zz
 * only when it exists (the loader poisons the call, the verifier prunes that branch: no
 * error), then reads a map lookup's result without the NULL check, which the verifier
 * refuses ("invalid mem access 'map_value_or_null'"). The error must lead with that. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

extern int ssd_no_such_kfunc_zz(int) __ksym __weak;

struct {
	/* a hash: an array's lookup of a constant in-range key is known non-NULL (6.14+) */
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} vals SEC(".maps");

SEC("syscall")
int weak_then_null(void *ctx)
{
	u32 key = 0;
	u64 *v;
	int r = 0;

	if (ssd_no_such_kfunc_zz)
		r = ssd_no_such_kfunc_zz(1);
	v = bpf_map_lookup_elem(&vals, &key);
	return *v + r; /* no NULL check: the real cause */
}

char LICENSE[] SEC("license") = "GPL";
