// SPDX-License-Identifier: GPL-2.0
/* BTF-defined maps of several kinds: hash, array, per-CPU hash, ring buffer, bloom filter
 * (map_extra), LRU with NUMA node, pinning, and an array-of-maps with a .values initialiser.
 * on_switch (a raw tracepoint program, which BPF_PROG_TEST_RUN runs with the context a test
 * passes) uses each of them, so a test can count its runs in every map. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 128);
	__type(key, __u32);
	__type(value, __u64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} counts SEC(".maps");

struct pair {
	__u64 a;
	__u32 b;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, struct pair);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pinned_array SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 16);
	__uint(key_size, 8);
	__uint(value_size, 16);
} percpu SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_BLOOM_FILTER);
	__uint(max_entries, 64);
	__type(value, __u32);
	__uint(map_extra, 3);
} bloom SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32);
	__type(key, __u32);
	__type(value, __u32);
	__uint(numa_node, 0);
	__uint(map_flags, BPF_F_NUMA_NODE);
} lru SEC(".maps");

struct inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} inner_a SEC(".maps"), inner_b SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 3);
	__type(key, __u32);
	__array(values, struct inner);
} outer SEC(".maps") = {
	.values = { [0] = &inner_b, [2] = &inner_a },
};

/* Keys of the counts map. */
enum { K_CALLS = 1, K_RINGBUF_OK = 2, K_BLOOM_HIT = 3 };

static void count(__u32 key, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&counts, &key);

	if (v)
		__sync_fetch_and_add(v, n);
	else
		bpf_map_update_elem(&counts, &key, &n, BPF_NOEXIST);
}

static void bump_inner(__u32 slot, __u32 n)
{
	__u32 zero = 0;
	__u32 *val;
	void *m;

	m = bpf_map_lookup_elem(&outer, &slot);
	if (!m)
		return;
	val = bpf_map_lookup_elem(m, &zero);
	if (val)
		*val += n;
}

SEC("raw_tp/sched_switch")
int on_switch(__u64 *ctx)
{
	__u32 a = (__u32)ctx[0]; /* sched_switch's preempt; a test run passes its own */
	__u32 key = 1;
	__u64 pkey = 7;
	__u64 init[2];
	__u64 *pv;
	struct pair *p;
	count(K_CALLS, a);
	p = bpf_map_lookup_elem(&pinned_array, &key);
	if (p) {
		p->a += 10;
		p->b++;
	}
	bump_inner(0, 1);   /* slot 0 holds inner_b */
	bump_inner(2, 100); /* slot 2 holds inner_a */
	bump_inner(1, 1000); /* slot 1 is empty: no effect */
	if (bpf_ringbuf_output(&events, &key, sizeof(key), 0) == 0)
		count(K_RINGBUF_OK, 1);
	bpf_map_push_elem(&bloom, &key, 0);
	if (bpf_map_peek_elem(&bloom, &key) == 0)
		count(K_BLOOM_HIT, 1);
	bpf_map_update_elem(&lru, &key, &a, BPF_ANY);
	pv = bpf_map_lookup_elem(&percpu, &pkey);
	if (pv)
		pv[0]++;
	else {
		/* Filled at run time (a constant initialiser would go to .rodata.cst16). */
		init[0] = 1;
		init[1] = a;
		bpf_map_update_elem(&percpu, &pkey, init, BPF_NOEXIST);
	}
	return 0;
}

SEC("?kprobe/do_nanosleep")
int probe_sleep(void *ctx)
{
	__u32 key = 2;
	bpf_map_delete_elem(&counts, &key);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
