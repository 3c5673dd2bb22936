// SPDX-License-Identifier: GPL-2.0
/* Ring buffers whose max_entries are not a power-of-2 number of pages (the kernel refuses
 * those with EINVAL; libbpf rounds them up, and so must the loader), next to one that is.
 * produce (a raw tracepoint program, run with BPF_PROG_TEST_RUN) reserves a 6000-byte
 * record in `odd`, more than its declared 5000 bytes hold, and returns 1 when the ring buffer
 * had room for it (it has 8192 bytes once rounded up). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 5000); /* -> 2 pages */
} odd SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 3 * 4096); /* -> 4 pages */
} three_pages SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096); /* kept */
} one_page SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_USER_RINGBUF);
	__uint(max_entries, 10000); /* -> 4 pages */
} from_user SEC(".maps");

SEC("raw_tp/sched_switch")
int produce(__u64 *ctx)
{
	void *rec = bpf_ringbuf_reserve(&odd, 6000, 0);

	if (!rec)
		return 0;
	bpf_ringbuf_discard(rec, 0);
	return 1;
}

char LICENSE[] SEC("license") = "GPL";
