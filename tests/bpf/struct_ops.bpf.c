// SPDX-License-Identifier: GPL-2.0
/* tcp_congestion_ops in both struct_ops section forms: `.struct_ops` (attach by map
 * update) and `.struct_ops.link` (attach with BPF_LINK_CREATE), sharing programs. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

SEC("struct_ops/ssd_init")
void BPF_PROG(ssd_init, struct sock *sk)
{
}

SEC("struct_ops/ssd_ssthresh")
u32 BPF_PROG(ssd_ssthresh, struct sock *sk)
{
	return 2;
}

SEC("struct_ops/ssd_cong_avoid")
void BPF_PROG(ssd_cong_avoid, struct sock *sk, u32 ack, u32 acked)
{
}

SEC("struct_ops/ssd_undo_cwnd")
u32 BPF_PROG(ssd_undo_cwnd, struct sock *sk)
{
	return 10;
}

SEC("?struct_ops.s/ssd_release")
void BPF_PROG(ssd_release, struct sock *sk)
{
}

SEC(".struct_ops")
struct tcp_congestion_ops ssd_plain = {
	.init = (void *)ssd_init,
	.ssthresh = (void *)ssd_ssthresh,
	.cong_avoid = (void *)ssd_cong_avoid,
	.undo_cwnd = (void *)ssd_undo_cwnd,
	.flags = 1,
	.name = "ssd_plain",
};

SEC(".struct_ops.link")
struct tcp_congestion_ops ssd_link = {
	.ssthresh = (void *)ssd_ssthresh,
	.cong_avoid = (void *)ssd_cong_avoid,
	.undo_cwnd = (void *)ssd_undo_cwnd,
	.release = (void *)ssd_release,
	.name = "ssd_link",
};

char LICENSE[] SEC("license") = "GPL";
