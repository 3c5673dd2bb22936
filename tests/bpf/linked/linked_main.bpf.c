// SPDX-License-Identifier: GPL-2.0
/* Half of build/tests/bpf/linked.bpf.o, linked with linked_lib.bpf.c by `bpftool gen object`
 * (as every multi-file scx scheduler is). Both halves define static variables of the same
 * names, `hits` and `scale`, and call bpf_printk, whose format strings are static `____fmt`
 * arrays in .rodata: the linker places each at its own offset, and the object's BTF is only
 * valid if the loader keeps those offsets.
 *
 * run_linked (raw tracepoint, run with BPF_PROG_TEST_RUN) adds ctx[0] to this file's `hits`,
 * calls lib_step() (the other file's `hits`) and returns
 *   1000 * this file's hits + lib_step(ctx[0])
 * so a test can tell the two `hits` and the two `scale`s apart. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

static volatile __u32 hits = 7;
static volatile const __u32 scale = 1000;

__u32 lib_step(__u32 add);

SEC("raw_tp/sched_switch")
int run_linked(__u64 *ctx)
{
	__u32 add = ctx[0];

	hits += add;
	bpf_printk("main hits %u", hits);
	return scale * hits + lib_step(add);
}

char LICENSE[] SEC("license") = "GPL";
