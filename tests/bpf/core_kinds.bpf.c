// SPDX-License-Identifier: GPL-2.0
/* CO-RE with every relocation kind (include/uapi/linux/bpf.h enum bpf_core_relo_kind):
 * field offset/size/existence/signedness and bitfield shifts on a ___flavour of task_struct
 * that has a field the kernel lacks, local and target type ids, type existence/size/match,
 * enum value existence and value (a flavoured enum with a missing enumerator), and a read of
 * the missing field guarded by bpf_core_field_exists (its instruction gets poisoned).
 * TYPE_MATCHES needs clang >= 15. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

struct task_struct___kinds {
	int pid;
	int tgid;
	unsigned int flags;
	char comm[16];
	int no_such_field;
	unsigned int sched_reset_on_fork:1;
	unsigned int init_private_fork_class:4;
} __attribute__((preserve_access_index));

struct no_such_struct___kinds {
	int x;
} __attribute__((preserve_access_index));

enum pid_type___kinds {
	PIDTYPE_SID___kinds = 30,
	PIDTYPE_NOPE___kinds = 31,
};

__u64 out[16];

SEC("tp_btf/sched_switch")
int BPF_PROG(core_kinds, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	struct task_struct___kinds *t = (void *)next;

	out[0] = t->pid;
	out[1] = bpf_core_field_exists(t->pid);
	out[2] = bpf_core_field_exists(t->no_such_field);
	out[3] = bpf_core_field_size(t->comm);
	out[4] = BPF_CORE_READ_BITFIELD(t, sched_reset_on_fork);
	out[5] = BPF_CORE_READ_BITFIELD(t, init_private_fork_class);
	out[6] = bpf_core_type_id_local(struct task_struct___kinds);
	out[7] = bpf_core_type_id_kernel(struct task_struct);
	out[8] = bpf_core_type_exists(struct task_struct);
	out[9] = bpf_core_type_exists(struct no_such_struct___kinds);
	out[10] = bpf_core_type_size(struct task_struct);
	out[11] = bpf_core_enum_value_exists(enum pid_type, PIDTYPE_TGID);
	out[12] = bpf_core_enum_value_exists(enum pid_type___kinds, PIDTYPE_NOPE___kinds);
	out[13] = bpf_core_enum_value(enum pid_type___kinds, PIDTYPE_SID___kinds);
#if __clang_major__ >= 15
	out[14] = bpf_core_type_matches(struct list_head);
#else
	/* clang 14 cannot emit TYPE_MATCHES (LLVM 15 added it): tests cover that kind with
	 * relocations built by hand. */
	out[14] = 1;
#endif
	if (bpf_core_field_exists(t->no_such_field))
		out[15] = BPF_CORE_READ(t, no_such_field);
	return 0;
}
