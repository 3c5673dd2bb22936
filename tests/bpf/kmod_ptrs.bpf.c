// SPDX-License-Identifier: GPL-2.0
/* .kmod_btfs, array of string pointers (relocated into a string section), with a
 * duplicate and a module that does not exist. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "kmod_btfs.h"

DEFINE_KMOD_BTFS_PTRS(_needed_kmods) = { "btrfs", "no_such_module_xyz", "btrfs", "ext4" };

SEC("syscall")
int kmod_ptrs(void *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
