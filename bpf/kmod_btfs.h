/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * kmod_btfs.h - declare which kernel modules' BTF a BPF object needs.
 *
 * A loader that cannot find a CO-RE relocation target, a kfunc or a ksym in vmlinux BTF
 * normally reads the BTF of every loaded module (libbpf does; 35 ms with 1 module, 65 ms
 * with 300).  An object that lists its modules here lets schedswitchd read only those:
 *
 *     #include "kmod_btfs.h"
 *     DEFINE_KMOD_BTFS(_needed_kmods) = { "uinput", "tcp_bbr" };
 *
 * Layout of the ELF section ".kmod_btfs" (what the loader parses):
 *   - a sequence of fixed-width entries of KMOD_BTF_NAME_LEN (56) bytes each, one per
 *     module, in declaration order; the section size is a multiple of 56;
 *   - each entry is a module name as the kernel spells it (dashes as underscores, the name
 *     of /sys/kernel/btf/<name>), NUL-terminated and NUL-padded to 56 bytes;
 *   - an all-NUL entry is ignored; duplicates and names of modules that are not loaded are
 *     tolerated by the loader; several DEFINE_KMOD_BTFS() in one object concatenate.
 * 56 is the kernel's MODULE_NAME_LEN on 64-bit (64 - sizeof(unsigned long),
 * include/linux/module.h), so every module name fits with its NUL.
 * The section is allocated and read-only but carries no map: loaders that do not know it
 * (libbpf 1.1 included) skip it, so such objects still load everywhere.
 *
 * Loaders may also meet the pointer layout (const char *name[] in ".kmod_btfs" with
 * relocations into a string section); schedswitchd reads both, this header emits the first.
 */
#ifndef SCHEDSWITCHD_KMOD_BTFS_H
#define SCHEDSWITCHD_KMOD_BTFS_H

#define KMOD_BTF_NAME_LEN 56

/*
 * Building with -DKMOD_BTFS_DISABLE drops the section (the array becomes an unused static,
 * which the compiler discards): the same object without the declaration, for benchmarks that
 * compare both.
 */
#ifdef KMOD_BTFS_DISABLE
#define DEFINE_KMOD_BTFS(name) \
	static const char name[][KMOD_BTF_NAME_LEN] __attribute__((unused))
#else
#define DEFINE_KMOD_BTFS(name) \
	const char name[][KMOD_BTF_NAME_LEN] __attribute__((section(".kmod_btfs"), used))
#endif

#endif /* SCHEDSWITCHD_KMOD_BTFS_H */
