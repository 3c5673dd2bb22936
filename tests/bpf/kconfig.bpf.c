// SPDX-License-Identifier: GPL-2.0
/* .kconfig externs of every storage class, strong and weak. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

extern unsigned int LINUX_KERNEL_VERSION __kconfig;
extern bool CONFIG_BPF_SYSCALL __kconfig;
extern enum libbpf_tristate CONFIG_BPF_JIT __kconfig;
extern int CONFIG_HZ __kconfig;
extern char CONFIG_NO_SUCH_CHAR __kconfig __weak;
extern char CONFIG_DEFAULT_HOSTNAME[16] __kconfig __weak;
extern unsigned long long CONFIG_NO_SUCH_U64 __kconfig __weak;

u64 out;

SEC("syscall")
int read_kconfig(void *ctx)
{
	out = LINUX_KERNEL_VERSION + CONFIG_BPF_SYSCALL + CONFIG_BPF_JIT + CONFIG_HZ +
	      CONFIG_NO_SUCH_CHAR + CONFIG_DEFAULT_HOSTNAME[0] + CONFIG_NO_SUCH_U64;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
