// SPDX-License-Identifier: GPL-2.0
/* The other half of build/tests/bpf/linked.bpf.o (see linked_main.bpf.c): statics named like
 * the main file's, with other values. lib_step(add) adds 2 * add to this file's `hits` and
 * returns scale * hits with this file's scale (1). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

static volatile __u32 hits = 3;
static volatile const __u32 scale = 1;

__noinline __u32 lib_step(__u32 add)
{
	hits += 2 * add;
	bpf_printk("lib hits %u", hits);
	return scale * hits;
}
