// SPDX-License-Identifier: GPL-2.0
/* What scheduler profiles drive, on the host kernel (no sched_ext needed): .rodata
 * tunables, a resizable .data.NAME array, .bss written after load, a hash map and a
 * per-CPU array updated before attach, SEC("syscall") programs with a context struct (one
 * records the CPU it ran on), a perf event array a profile's perf_events fill, and a
 * tcp_congestion_ops in .struct_ops.link to attach. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

const volatile u32 nr_cpu_ids = 1;
const volatile u64 slice_ns = 1;
const volatile bool smt_enabled;
const volatile u8 llc_mask[16];

struct cpu_ctx {
	u32 llc_id;
	u32 capacity;
};
struct cpu_ctx cpu_ctxs[1] SEC(".data.cpu_ctxs");

u32 armed;
u64 nr_runs;
s64 last_arg;
u32 ran_on[64];
u32 pairs[64];

struct info {
	u32 llc;
	u64 cap;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, u32);
	__type(value, struct info);
} cpu_info SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, u64);
} pcpu_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(max_entries, 128);
	__type(key, u32);
	__type(value, u32);
} pmu_counters SEC(".maps");

struct pair_args {
	s32 cpu_id;
	s32 sibling_cpu_id;
};

SEC("syscall")
int enable_sibling_cpu(struct pair_args *ctx)
{
	u32 c = ctx->cpu_id;

	if (c >= 64)
		return -22;
	pairs[c] = ctx->sibling_cpu_id + 1;
	__sync_fetch_and_add(&nr_runs, 1);
	return 0;
}

struct where_args {
	u32 slot;
	s64 value;
};

SEC("syscall")
int record_cpu(struct where_args *ctx)
{
	u32 s = ctx->slot;

	if (s >= 64)
		return -22;
	ran_on[s] = bpf_get_smp_processor_id() + 1;
	last_arg = ctx->value + armed + nr_cpu_ids;
	__sync_fetch_and_add(&nr_runs, 1);
	return 0;
}

SEC("syscall")
int returns_seven(void *ctx)
{
	return 7;
}

SEC("struct_ops/ssd_prof_ssthresh")
u32 BPF_PROG(ssd_prof_ssthresh, struct sock *sk)
{
	return cpu_ctxs[0].llc_id + 2;
}

SEC("struct_ops/ssd_prof_cong_avoid")
void BPF_PROG(ssd_prof_cong_avoid, struct sock *sk, u32 ack, u32 acked)
{
}

SEC("struct_ops/ssd_prof_undo_cwnd")
u32 BPF_PROG(ssd_prof_undo_cwnd, struct sock *sk)
{
	return 10;
}

SEC(".struct_ops.link")
struct tcp_congestion_ops ssd_prof = {
	.ssthresh = (void *)ssd_prof_ssthresh,
	.cong_avoid = (void *)ssd_prof_cong_avoid,
	.undo_cwnd = (void *)ssd_prof_undo_cwnd,
	.name = "ssd_prof",
};

char LICENSE[] SEC("license") = "GPL";
