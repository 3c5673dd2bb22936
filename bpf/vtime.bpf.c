/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * ss_vtime - weighted fair sharing by virtual time, for general desktop and server use.
 *
 * Each task accumulates virtual time as it runs, scaled by 100/weight (a nice-0 task has
 * weight 100), and the task with the least virtual time runs next, from one shared DSQ
 * ordered by vtime.  A task that slept is not allowed to bank more than one slice of credit
 * (its vtime is raised to at least vtime_now - slice_ns), so sleepers get prompt service
 * without starving others.
 *
 * Legacy flavour (no custom DSQs, see scx_common.bpf.h): tasks go to the built-in global
 * FIFO DSQ, a task behind the virtual clock (owed CPU time) at its head, others at its tail;
 * an approximation of the same policy.
 *
 * Tunables (.rodata): slice_ns (default 5 ms).
 * Counters (.bss): nr_enqueued, nr_dispatched.
 */
#include "scx_common.bpf.h"

char _license[] SEC("license") = "GPL";

/* Needs no module BTF: one all-NUL entry (an empty section would trip libbpf 1.1). */
DEFINE_KMOD_BTFS(_needed_kmods) = { "" };

#define FAIR_DSQ 0x100

const volatile u64 slice_ns = 5000000;

u64 vtime_now;
u64 nr_enqueued;
u64 nr_dispatched;

UEI_DEFINE(uei);

static bool vtime_before(u64 a, u64 b)
{
	return (s64)(a - b) < 0;
}

SCX_PROG(ss_vtime_select_cpu)
s32 BPF_PROG(ss_vtime_select_cpu, struct task_struct *p, s32 prev_cpu, u64 wake_flags)
{
	bool is_idle = false;
	s32 cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &is_idle);

	if (is_idle)
		scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, slice_ns, 0);
	return cpu;
}

SCX_PROG(ss_vtime_enqueue)
void BPF_PROG(ss_vtime_enqueue, struct task_struct *p, u64 enq_flags)
{
	u64 vtime = p->scx.dsq_vtime;

	/* Idle time earns at most one slice of credit. */
	if (vtime_before(vtime, vtime_now - slice_ns))
		vtime = vtime_now - slice_ns;
	__sync_fetch_and_add(&nr_enqueued, 1);
#if SCX_HAVE_CUSTOM_DSQS
	scx_bpf_dsq_insert_vtime(p, FAIR_DSQ, slice_ns, vtime, enq_flags);
#else
	if (vtime_before(vtime, vtime_now))
		enq_flags |= SCX_ENQ_HEAD;
	scx_bpf_dsq_insert(p, SCX_DSQ_GLOBAL, slice_ns, enq_flags);
#endif
}

#if SCX_HAVE_CUSTOM_DSQS
SCX_PROG(ss_vtime_dispatch)
void BPF_PROG(ss_vtime_dispatch, s32 cpu, struct task_struct *prev)
{
	if (scx_bpf_dsq_move_to_local(FAIR_DSQ))
		__sync_fetch_and_add(&nr_dispatched, 1);
}

SCX_PROG_SLEEPABLE(ss_vtime_init)
s32 BPF_PROG(ss_vtime_init)
{
	return scx_bpf_create_dsq(FAIR_DSQ, -1);
}
#endif

SCX_PROG(ss_vtime_running)
void BPF_PROG(ss_vtime_running, struct task_struct *p)
{
	/* Global virtual clock: the vtime of the most advanced task that started running. */
	if (vtime_before(vtime_now, p->scx.dsq_vtime))
		vtime_now = p->scx.dsq_vtime;
}

SCX_PROG(ss_vtime_stopping)
void BPF_PROG(ss_vtime_stopping, struct task_struct *p, bool runnable)
{
	u32 weight = p->scx.weight ?: 1;

	/* Charge the part of the slice actually used, scaled by the inverse of the weight. */
	scx_bpf_task_set_dsq_vtime(p, p->scx.dsq_vtime + (slice_ns - p->scx.slice) * 100 / weight);
}

SCX_PROG(ss_vtime_enable)
void BPF_PROG(ss_vtime_enable, struct task_struct *p)
{
	scx_bpf_task_set_dsq_vtime(p, vtime_now);
}

SCX_PROG(ss_vtime_exit)
void BPF_PROG(ss_vtime_exit, struct scx_exit_info *ei)
{
	UEI_RECORD(uei, ei);
}

SEC(SCX_OPS_SEC)
struct sched_ext_ops ss_vtime = {
	.select_cpu = (void *)ss_vtime_select_cpu,
	.enqueue = (void *)ss_vtime_enqueue,
#if SCX_HAVE_CUSTOM_DSQS
	.dispatch = (void *)ss_vtime_dispatch,
	.init = (void *)ss_vtime_init,
#endif
	.running = (void *)ss_vtime_running,
	.stopping = (void *)ss_vtime_stopping,
	.enable = (void *)ss_vtime_enable,
	.exit = (void *)ss_vtime_exit,
	.name = "ss_vtime",
};
