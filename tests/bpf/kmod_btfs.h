/* SPDX-License-Identifier: GPL-2.0 */
/* Declaring the kernel modules whose BTF an object needs (schedswitchd's `.kmod_btfs`).
 * Two layouts are accepted: fixed-width NUL-padded names, or pointers to string literals. */
#ifndef SCHEDSWITCHD_KMOD_BTFS_H
#define SCHEDSWITCHD_KMOD_BTFS_H

/* 56 = MODULE_NAME_LEN on 64-bit kernels (64 - sizeof(unsigned long)), NUL included. */
#define KMOD_NAME_LEN 56

#define DEFINE_KMOD_BTFS(var) \
	char var[][KMOD_NAME_LEN] __attribute__((section(".kmod_btfs"), used))

#define DEFINE_KMOD_BTFS_PTRS(var) \
	const char *var[] __attribute__((section(".kmod_btfs"), used))

#endif
