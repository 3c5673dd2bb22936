// SPDX-License-Identifier: GPL-2.0
/* `?`-prefixed (optional) sections: one program the verifier rejects (a map value used
 * without its NULL check), one it accepts, one whose fentry target the kernel lacks, and
 * one ordinary program. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4);
	__type(key, u32);
	__type(value, u64);
} vals SEC(".maps");

SEC("?syscall")
int opt_rejected(void *ctx)
{
	u32 key = 1;
	u64 *v = bpf_map_lookup_elem(&vals, &key);

	return (int)*v; /* no NULL check: the verifier refuses */
}

SEC("?syscall")
int opt_accepted(void *ctx)
{
	return 7;
}

SEC("?fentry/ssd_no_such_kernel_function")
int BPF_PROG(opt_no_target)
{
	return 0;
}

SEC("syscall")
int plain(void *ctx)
{
	return 1;
}

char LICENSE[] SEC("license") = "GPL";
