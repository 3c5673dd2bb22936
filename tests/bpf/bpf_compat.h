/* SPDX-License-Identifier: GPL-2.0 */
/* What libbpf's bpf_helpers.h gained after Debian 12's libbpf-dev (1.1), with the same BTF
 * encoding, so test objects build against the old headers and still look like objects built
 * against new ones.
 *
 * __ulong(name, value) (libbpf 1.4+): a 64-bit map attribute (an arena's map_extra) cannot be
 * __uint()'s `int (*name)[value]`, so it is a member of an anonymous enum type whose only
 * enumerator is the value; clang emits ENUM64 when the value needs 64 bits (clang 15+). */
#ifndef BPF_COMPAT_H
#define BPF_COMPAT_H

#ifndef __ulong
#define __ss_cat2(a, b) a##b
#define __ss_cat(a, b) __ss_cat2(a, b)
#define __ulong(name, val) enum { __ss_cat(__unique_value, __COUNTER__) = val } name
#endif

#endif
