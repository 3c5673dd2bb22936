// SPDX-License-Identifier: GPL-2.0
/* A tc program whose kfunc and CO-RE relocation live in a module's BTF, not vmlinux:
 * bpf_skb_get_fou_encap() and struct bpf_fou_encap come from the fou module
 * (net/ipv4/fou_bpf.c). Compiled against Debian sid's vmlinux.h (fou is a module there).
 * With -DNO_KMOD_BTFS the object carries no .kmod_btfs section (the fallback case). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "kmod_btfs.h"

struct bpf_fou_encap {
	__be16 sport;
	__be16 dport;
} __attribute__((preserve_access_index));

extern int bpf_skb_get_fou_encap(struct __sk_buff *skb_ctx, struct bpf_fou_encap *encap) __ksym;

#ifndef NO_KMOD_BTFS
DEFINE_KMOD_BTFS(_needed_kmods) = { "fou" };
#endif

SEC("tc")
int get_encap(struct __sk_buff *skb)
{
	struct bpf_fou_encap e = {};

	/* Not a tunnel packet: the kfunc fails; the point is that it links and loads. */
	bpf_skb_get_fou_encap(skb, &e);
	/* CO-RE: the byte offset of dport in the module's struct (2). */
	return bpf_core_field_offset(struct bpf_fou_encap, dport);
}

char _license[] SEC("license") = "GPL";
