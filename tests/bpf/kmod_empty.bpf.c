// SPDX-License-Identifier: GPL-2.0
/* An empty .kmod_btfs section: the object needs no module BTF at all. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

char _no_kmods[0] __attribute__((section(".kmod_btfs"), used));

SEC("syscall")
int kmod_empty(void *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
