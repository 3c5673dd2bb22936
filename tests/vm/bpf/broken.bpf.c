/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * ss_broken - a sched_ext scheduler the verifier must reject, for the daemon's VM tests:
 * ss_broken_enqueue dereferences the result of a hash map lookup without checking it for
 * NULL ("R0 invalid mem access 'map_value_or_null'"; a hash map, because recent verifiers
 * drop the NULL check for array lookups with a constant in-range key). Everything else is
 * valid, so the object opens, its BTF loads and CO-RE succeeds: the failure is the
 * verifier's.
 */
#include "scx_common.bpf.h"

char _license[] SEC("license") = "GPL";

DEFINE_KMOD_BTFS(_needed_kmods) = { "" };

UEI_DEFINE(uei);

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} counts SEC(".maps");

SCX_PROG(ss_broken_enqueue)
void BPF_PROG(ss_broken_enqueue, struct task_struct *p, u64 enq_flags)
{
	u32 zero = 0;
	u64 *count = bpf_map_lookup_elem(&counts, &zero);

	*count += 1; /* no NULL check: rejected */
	scx_bpf_dsq_insert(p, SCX_DSQ_GLOBAL, 5000000, enq_flags);
}

SCX_PROG(ss_broken_exit)
void BPF_PROG(ss_broken_exit, struct scx_exit_info *ei)
{
	UEI_RECORD(uei, ei);
}

SEC(SCX_OPS_SEC)
struct sched_ext_ops ss_broken = {
	.enqueue = (void *)ss_broken_enqueue,
	.exit = (void *)ss_broken_exit,
	.name = "ss_broken",
};
