// SPDX-License-Identifier: GPL-2.0
/* Auto-attached programs: fentry/fexit on getpgid(2)'s syscall function, tp_btf and
 * raw_tp on sys_enter, the syscalls/sys_enter_getpid tracepoint, and a task iterator.
 * Every hook counts only the calls of the tgid in `target_tgid` (set before load), so the
 * counters in .bss say what the test's own syscalls triggered. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define NR_getppid 110 /* x86_64 */

const volatile u32 target_tgid;

u64 fentry_hits;
u64 fexit_hits;
s64 fexit_last_ret;
u64 tp_btf_hits;
u64 raw_tp_hits;
u64 tracepoint_hits;

static __always_inline bool mine(void)
{
	return (bpf_get_current_pid_tgid() >> 32) == target_tgid;
}

SEC("fentry/__x64_sys_getpgid")
int BPF_PROG(on_getpgid_entry, const struct pt_regs *regs)
{
	if (mine())
		__sync_fetch_and_add(&fentry_hits, 1);
	return 0;
}

SEC("fexit/__x64_sys_getpgid")
int BPF_PROG(on_getpgid_exit, const struct pt_regs *regs, long ret)
{
	if (mine()) {
		__sync_fetch_and_add(&fexit_hits, 1);
		fexit_last_ret = ret;
	}
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(on_sys_enter_btf, struct pt_regs *regs, long id)
{
	if (id == NR_getppid && mine())
		__sync_fetch_and_add(&tp_btf_hits, 1);
	return 0;
}

SEC("raw_tp/sys_enter")
int on_sys_enter_raw(struct bpf_raw_tracepoint_args *ctx)
{
	if (ctx->args[1] == NR_getppid && mine())
		__sync_fetch_and_add(&raw_tp_hits, 1);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_getpid")
int on_getpid(void *ctx)
{
	if (mine())
		__sync_fetch_and_add(&tracepoint_hits, 1);
	return 0;
}

SEC("iter/task")
int dump_task(struct bpf_iter__task *ctx)
{
	struct seq_file *seq = ctx->meta->seq;
	struct task_struct *task = ctx->task;

	if (!task || task->tgid != target_tgid || task->pid != task->tgid)
		return 0;
	BPF_SEQ_PRINTF(seq, "tgid=%d comm=%s\n", task->tgid, task->comm);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
