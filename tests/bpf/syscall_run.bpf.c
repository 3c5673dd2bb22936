// SPDX-License-Identifier: GPL-2.0
/* SEC("syscall") programs run with BPF_PROG_RUN: one computes from a context struct,
 * writes the result back into the context and into globals; one reports the CPU it ran
 * on; one takes no context. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct run_args {
	u32 a;
	u32 b;
	s16 bias;
	u8 op; /* 0: a * b + bias, 1: a - b + bias */
	char tag[8];
	u64 out; /* written by the program */
};

u64 last_result;
char last_tag[8];
u32 runs;

SEC("syscall")
int compute(struct run_args *args)
{
	s64 r;

	if (args->op == 0)
		r = (s64)args->a * args->b + args->bias;
	else
		r = (s64)args->a - args->b + args->bias;
	args->out = r;
	last_result = r;
	__builtin_memcpy(last_tag, args->tag, sizeof(last_tag));
	runs++;
	return (int)(args->a + args->b);
}

SEC("syscall")
int which_cpu(void *ctx)
{
	return bpf_get_smp_processor_id();
}

char LICENSE[] SEC("license") = "GPL";
