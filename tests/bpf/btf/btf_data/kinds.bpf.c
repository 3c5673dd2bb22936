/* Every BTF kind clang 14 emits for BPF, for comparing our BTF reader with bpftool.
 * Compiled by tests/bpf/btf/test_btf_bpftool.py into a temporary directory. */
typedef unsigned long long u64;
#define __tag(x) __attribute__((btf_decl_tag(x)))
#define __ttag(x) __attribute__((btf_type_tag(x)))
enum sgn { NEG = -1, POS = 1 };
enum big { BIG = 0xffffffffffULL };
enum ubig { UB = 0xffffffffU };
struct bits {
	unsigned a:3;
	unsigned b:5;
	int c;
	union {
		long x;
		struct {
			char y;
		} in;
	};
	float f;
	double d;
	u64 arr[3][2];
} __tag("s_tag");
struct fwd_only;
union ufwd;
int __ttag("user") *tp;
struct bits g_bits __tag("var_tag");
struct fwd_only *g_fwd;
union ufwd *g_ufwd;
enum sgn g_sgn;
enum big g_big;
enum ubig g_ub;
const volatile int cv = 1;
int *restrict rp;
int counter;

__attribute__((noinline)) int helper(int a __tag("param_tag"), struct bits *b)
{
	return a + b->c;
}

__attribute__((section("tp/x"))) int prog(void *ctx)
{
	return helper(1, &g_bits) + counter;
}

char _license[] __attribute__((section("license"))) = "GPL";
