// SPDX-License-Identifier: GPL-2.0
/* A tcp_congestion_ops with only .name set: the kernel refuses to register it (its
 * validate callback wants ssthresh, undo_cwnd and cong_avoid or cong_control) with EINVAL
 * and says why only in the kernel log ("... does not implement required ops"). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

SEC(".struct_ops.link")
struct tcp_congestion_ops ssd_nameonly = {
	.name = "ssd_nameonly",
};

char LICENSE[] SEC("license") = "GPL";
