/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * ss_profiled - a FIFO sched_ext scheduler whose set-up a profile does, for the daemon's
 * profile VM tests (tests/vm/test_profiles_vm.py, profile tests/vm/profiles/profiled.toml):
 *
 *   .rodata  nr_online_seen, online_mask   what the profile computed from the topology
 *   .bss     armed                         written after load
 *   map      cpu_seen (hash, cpu -> llc)   one element per online CPU, before attach
 *   syscall  note_cpu(struct note_args)    run once per online CPU before attach
 *
 * It has no ops.cpu_online/cpu_offline, so the kernel ejects it on CPU hotplug with
 * SCX_EXIT_UNREG_KERN and SCX_ECODE_ACT_RESTART | SCX_ECODE_RSN_HOTPLUG.
 */
#include "scx_common.bpf.h"

char _license[] SEC("license") = "GPL";

DEFINE_KMOD_BTFS(_needed_kmods) = { "" };

const volatile u32 nr_online_seen = 0;
const volatile u64 online_mask = 0;
const volatile u64 slice_ns = 20000000;

u32 armed;
u64 nr_noted;
u64 noted_mask;
u64 nr_enqueued;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, u32);
	__type(value, u32);
} cpu_seen SEC(".maps");

struct note_args {
	s32 cpu_id;
};

UEI_DEFINE(uei);

SEC("syscall")
int note_cpu(struct note_args *ctx)
{
	s32 c = ctx->cpu_id;

	if (c < 0 || c >= 64)
		return -22;
	__sync_fetch_and_or(&noted_mask, 1ULL << c);
	__sync_fetch_and_add(&nr_noted, 1);
	return 0;
}

SCX_PROG(ss_profiled_enqueue)
void BPF_PROG(ss_profiled_enqueue, struct task_struct *p, u64 enq_flags)
{
	__sync_fetch_and_add(&nr_enqueued, 1);
	scx_bpf_dsq_insert(p, SCX_DSQ_GLOBAL, slice_ns, enq_flags);
}

SCX_PROG(ss_profiled_exit)
void BPF_PROG(ss_profiled_exit, struct scx_exit_info *ei)
{
	UEI_RECORD(uei, ei);
}

SEC(SCX_OPS_SEC)
struct sched_ext_ops ss_profiled = {
	.enqueue = (void *)ss_profiled_enqueue,
	.exit = (void *)ss_profiled_exit,
	.name = "ss_profiled",
};
