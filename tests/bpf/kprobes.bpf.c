// SPDX-License-Identifier: GPL-2.0
/* kprobe and kretprobe on getpgid(2)'s syscall function, counting the calls of the tgid in
 * `target_tgid` (set before load); the kretprobe keeps the last return value. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

const volatile u32 target_tgid;

u64 kprobe_hits;
u64 kretprobe_hits;
s64 kretprobe_last_ret;

SEC("kprobe/__x64_sys_getpgid")
int on_getpgid_kprobe(struct pt_regs *ctx)
{
	if ((bpf_get_current_pid_tgid() >> 32) == target_tgid)
		__sync_fetch_and_add(&kprobe_hits, 1);
	return 0;
}

SEC("kretprobe/__x64_sys_getpgid")
int BPF_KRETPROBE(on_getpgid_kretprobe, long ret)
{
	if ((bpf_get_current_pid_tgid() >> 32) == target_tgid) {
		__sync_fetch_and_add(&kretprobe_hits, 1);
		kretprobe_last_ret = ret;
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
