// SPDX-License-Identifier: GPL-2.0
/* A struct_ops object shaped like a sample scheduler but for the host kernel (no sched_ext
 * there): a tcp_congestion_ops in .struct_ops.link, a .rodata tunable, and an exit record
 * `uei` in .data laid out like bpf/scx_common.bpf.h's struct scx_user_exit_info, which the
 * backend's exit-info reader decodes by BTF member name. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct scx_user_exit_info {
	s32 recorded;
	s32 kind;
	s64 exit_code;
	char reason[128];
	char msg[1024];
};

struct scx_user_exit_info uei SEC(".data");

const volatile u32 ssthresh_value = 2;

SEC("struct_ops/ssd_uei_ssthresh")
u32 BPF_PROG(ssd_uei_ssthresh, struct sock *sk)
{
	return ssthresh_value;
}

SEC("struct_ops/ssd_uei_cong_avoid")
void BPF_PROG(ssd_uei_cong_avoid, struct sock *sk, u32 ack, u32 acked)
{
}

SEC("struct_ops/ssd_uei_undo_cwnd")
u32 BPF_PROG(ssd_uei_undo_cwnd, struct sock *sk)
{
	return 10;
}

SEC("struct_ops/ssd_uei_release")
void BPF_PROG(ssd_uei_release, struct sock *sk)
{
	uei.kind = 64;
	uei.exit_code = -1;
	uei.recorded = 1;
}

SEC(".struct_ops.link")
struct tcp_congestion_ops ssd_uei = {
	.ssthresh = (void *)ssd_uei_ssthresh,
	.cong_avoid = (void *)ssd_uei_cong_avoid,
	.undo_cwnd = (void *)ssd_uei_undo_cwnd,
	.release = (void *)ssd_uei_release,
	.name = "ssd_uei",
};

char LICENSE[] SEC("license") = "GPL";
