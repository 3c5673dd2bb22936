// SPDX-License-Identifier: GPL-2.0
/* BTF-defined maps of several kinds: hash, array, per-CPU hash, ring buffer, bloom filter
 * (map_extra), LRU with NUMA node, pinning, and an array-of-maps with a .values initialiser. */
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

SEC("tp_btf/sched_switch")
int on_switch(u64 *ctx)
{
	__u32 key = 1;
	__u64 *v = bpf_map_lookup_elem(&counts, &key);
	struct pair *p;
	void *m;

	if (v)
		__sync_fetch_and_add(v, 1);
	p = bpf_map_lookup_elem(&pinned_array, &key);
	if (p)
		p->b++;
	m = bpf_map_lookup_elem(&outer, &key);
	if (m)
		bpf_map_lookup_elem(m, &key);
	bpf_ringbuf_output(&events, &key, sizeof(key), 0);
	bpf_map_push_elem(&bloom, &key, 0);
	bpf_map_update_elem(&lru, &key, &key, BPF_ANY);
	bpf_map_lookup_elem(&percpu, &key);
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
