/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * ss_hooked - a FIFO sched_ext scheduler with programs beside its struct_ops, as the scx
 * schedulers have, for the VM tests of attaching them:
 *   fentry/bpf_scx_reg, fexit/bpf_scx_reg  count the registration (attached before the
 *                                          struct_ops link, they see it: reg_calls 1)
 *   tp_btf/sched_switch                    counts context switches while it runs
 *   syscall setup                          run with BPF_PROG_RUN before and after attach
 *   ?fentry/ssd_no_such_kernel_function    optional, skipped (the kernel lacks it)
 */
#include "scx_common.bpf.h"

char _license[] SEC("license") = "GPL";

DEFINE_KMOD_BTFS(_needed_kmods) = { "" };

u64 nr_enqueued;
u64 reg_calls;
u64 reg_exits;
s64 reg_ret = -1;
u64 enq_at_reg = ~0ULL;
u64 switches;
u64 seed;

UEI_DEFINE(uei);

struct setup_args {
	u64 seed;
	u64 enqueued; /* out: nr_enqueued when it ran */
};

SEC("fentry/bpf_scx_reg")
int BPF_PROG(on_scx_reg, void *kdata, struct bpf_link *link)
{
	__sync_fetch_and_add(&reg_calls, 1);
	enq_at_reg = nr_enqueued;
	return 0;
}

SEC("fexit/bpf_scx_reg")
int BPF_PROG(on_scx_reg_exit, void *kdata, struct bpf_link *link, int ret)
{
	__sync_fetch_and_add(&reg_exits, 1);
	reg_ret = ret;
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__sync_fetch_and_add(&switches, 1);
	return 0;
}

SEC("syscall")
int setup(struct setup_args *args)
{
	seed = args->seed;
	args->enqueued = nr_enqueued;
	return nr_enqueued ? 1 : 0;
}

SEC("?fentry/ssd_no_such_kernel_function")
int BPF_PROG(opt_missing)
{
	return 0;
}

SCX_PROG(ss_hooked_enqueue)
void BPF_PROG(ss_hooked_enqueue, struct task_struct *p, u64 enq_flags)
{
	__sync_fetch_and_add(&nr_enqueued, 1);
	scx_bpf_dsq_insert(p, SCX_DSQ_GLOBAL, 20000000, enq_flags);
}

SCX_PROG(ss_hooked_exit)
void BPF_PROG(ss_hooked_exit, struct scx_exit_info *ei)
{
	UEI_RECORD(uei, ei);
}

SEC(SCX_OPS_SEC)
struct sched_ext_ops ss_hooked = {
	.enqueue = (void *)ss_hooked_enqueue,
	.exit = (void *)ss_hooked_exit,
	.name = "ss_hooked",
};
