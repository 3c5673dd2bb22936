// SPDX-License-Identifier: GPL-2.0
/* Externs resolved against kernel BTF: strong and weak kfuncs (one that does not exist),
 * a typed per-CPU ksym, an untyped ksym, a weak typed ksym that does not exist, and a
 * ___flavour suffixed kfunc name. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

extern void bpf_rcu_read_lock(void) __ksym;
extern void bpf_rcu_read_unlock(void) __ksym;
extern struct task_struct *bpf_task_acquire(struct task_struct *p) __ksym;
extern void bpf_task_release___compat(struct task_struct *p) __ksym;
extern int bpf_no_such_kfunc(int) __ksym __weak;

extern const struct rq runqueues __ksym;
extern const void init_task __ksym;
extern const int no_such_ksym_var __ksym __weak;

int seen;

SEC("tp_btf/sched_switch")
int use_ksyms(u64 *ctx)
{
	struct rq *rq = bpf_this_cpu_ptr(&runqueues);
	struct task_struct *t;

	bpf_rcu_read_lock();
	seen = rq->nr_running;
	bpf_rcu_read_unlock();
	if (bpf_no_such_kfunc)
		seen += bpf_no_such_kfunc(1);
	if (&no_such_ksym_var)
		seen += 1;
	seen += ((u64)&init_task >> 3) & 1;
	t = bpf_get_current_task_btf();
	t = bpf_task_acquire(t);
	if (t)
		bpf_task_release___compat(t);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
