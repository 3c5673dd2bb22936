// SPDX-License-Identifier: GPL-2.0
/* .kmod_btfs, fixed-width layout, with a duplicate and a module that does not exist. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "kmod_btfs.h"

DEFINE_KMOD_BTFS(_needed_kmods) = { "nf_tables", "xfs", "nf_tables", "no_such_module_xyz" };

SEC("syscall")
int kmod_fixed(void *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
