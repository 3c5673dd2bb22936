// SPDX-License-Identifier: GPL-2.0
/* A `.struct_ops.link` TCP congestion control next to a tracing program that is no
 * struct_ops member: attaching the struct_ops attaches the tracing program first. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

u64 enters;

SEC("struct_ops/ssd_hk_ssthresh")
u32 BPF_PROG(ssd_hk_ssthresh, struct sock *sk)
{
	return 2;
}

SEC("struct_ops/ssd_hk_cong_avoid")
void BPF_PROG(ssd_hk_cong_avoid, struct sock *sk, u32 ack, u32 acked)
{
}

SEC("struct_ops/ssd_hk_undo_cwnd")
u32 BPF_PROG(ssd_hk_undo_cwnd, struct sock *sk)
{
	return 10;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(hk_sys_enter, struct pt_regs *regs, long id)
{
	__sync_fetch_and_add(&enters, 1);
	return 0;
}

SEC(".struct_ops.link")
struct tcp_congestion_ops ssd_hooks = {
	.ssthresh = (void *)ssd_hk_ssthresh,
	.cong_avoid = (void *)ssd_hk_cong_avoid,
	.undo_cwnd = (void *)ssd_hk_undo_cwnd,
	.name = "ssd_hooks",
};

char LICENSE[] SEC("license") = "GPL";
