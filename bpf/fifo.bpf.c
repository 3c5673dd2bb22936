/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * ss_fifo - one global first-in-first-out queue, for throughput.
 *
 * Pick it for batch work (builds, encoding): every runnable task goes to the kernel's
 * global DSQ in arrival order and runs for a long slice, so there are few context switches
 * and no per-task bookkeeping.  A waking task whose previous CPU is idle goes straight to
 * that CPU's local DSQ.
 *
 * Tunables (.rodata, set before load):
 *   slice_ns     time slice in ns (default 20 ms)
 *   error_after  if non-zero, call scx_bpf_error() at the error_after-th enqueue; the kernel
 *                then ejects the scheduler (exit kind SCX_EXIT_ERROR_BPF) - for tests of
 *                the ejection path.
 * Counters (.bss): nr_enqueued, nr_direct.
 */
#include "scx_common.bpf.h"

char _license[] SEC("license") = "GPL";

/* Needs nothing outside vmlinux: one all-NUL entry, i.e. no module BTF to read (an empty
 * section would make libbpf 1.1 fail on its DATASEC). */
DEFINE_KMOD_BTFS(_needed_kmods) = { "" };

const volatile u64 slice_ns = 20000000;
const volatile u64 error_after = 0;

u64 nr_enqueued;
u64 nr_direct;

UEI_DEFINE(uei);

SCX_PROG(ss_fifo_select_cpu)
s32 BPF_PROG(ss_fifo_select_cpu, struct task_struct *p, s32 prev_cpu, u64 wake_flags)
{
	bool is_idle = false;
	s32 cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &is_idle);

	if (is_idle) {
		__sync_fetch_and_add(&nr_direct, 1);
		scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, slice_ns, 0);
	}
	return cpu;
}

SCX_PROG(ss_fifo_enqueue)
void BPF_PROG(ss_fifo_enqueue, struct task_struct *p, u64 enq_flags)
{
	u64 n = __sync_fetch_and_add(&nr_enqueued, 1) + 1;

	if (error_after && n == error_after)
		scx_error("injected error after %llu enqueues", n);
	scx_bpf_dsq_insert(p, SCX_DSQ_GLOBAL, slice_ns, enq_flags);
}

SCX_PROG(ss_fifo_exit)
void BPF_PROG(ss_fifo_exit, struct scx_exit_info *ei)
{
	UEI_RECORD(uei, ei);
}

SEC(SCX_OPS_SEC)
struct sched_ext_ops ss_fifo = {
	.select_cpu = (void *)ss_fifo_select_cpu,
	.enqueue = (void *)ss_fifo_enqueue,
	.exit = (void *)ss_fifo_exit,
	.name = "ss_fifo",
};
