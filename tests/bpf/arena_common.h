/* SPDX-License-Identifier: GPL-2.0 */
/* Arena helpers for the test objects built with clang >= 18 (the Makefile's ARENA_CLANG):
 * what the kernel's selftests keep in bpf_arena_common.h, written for these tests.
 *
 * `__arena` marks a pointer into the arena (LLVM address space 1: clang emits
 * addr_space_cast instructions where such a pointer meets a plain one, and the verifier turns
 * them into the arena's user/kernel address translation); a global with `__arena` goes to the
 * `.addr_space.1` section, the arena's globals. The kfunc prototypes follow kernel/bpf/arena.c. */
#ifndef ARENA_COMMON_H
#define ARENA_COMMON_H

#define __arena __attribute__((address_space(1)))

#ifndef NUMA_NO_NODE
#define NUMA_NO_NODE (-1)
#endif

void __arena *bpf_arena_alloc_pages(void *map, void __arena *addr, __u32 page_cnt, int node_id,
				    __u64 flags) __ksym __weak;
void bpf_arena_free_pages(void *map, void __arena *ptr, __u32 page_cnt) __ksym __weak;

#endif
