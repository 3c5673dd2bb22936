// SPDX-License-Identifier: GPL-2.0
/* A minimal BPF TCP congestion control in the legacy `.struct_ops` form only, which
 * libbpf 1.1 (Debian 12) can load too: the xlated comparison and bench/load_attach.py
 * use it as the common ground between our loader and libbpf. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

u64 acks;

SEC("struct_ops/ssd_bench_ssthresh")
u32 BPF_PROG(ssd_bench_ssthresh, struct sock *sk)
{
	return 2;
}

SEC("struct_ops/ssd_bench_cong_avoid")
void BPF_PROG(ssd_bench_cong_avoid, struct sock *sk, u32 ack, u32 acked)
{
	acks += acked;
}

SEC("struct_ops/ssd_bench_undo_cwnd")
u32 BPF_PROG(ssd_bench_undo_cwnd, struct sock *sk)
{
	return 10;
}

SEC(".struct_ops")
struct tcp_congestion_ops ssd_bench = {
	.ssthresh = (void *)ssd_bench_ssthresh,
	.cong_avoid = (void *)ssd_bench_cong_avoid,
	.undo_cwnd = (void *)ssd_bench_undo_cwnd,
	.name = "ssd_bench",
};

char LICENSE[] SEC("license") = "GPL";
