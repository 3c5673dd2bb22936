// A scheduler's program that fails at start, before it loads anything: exits 1, as an scx
// scheduler does when its options or the machine do not suit it. For
// tests/vm/test_executables_vm.py.
#include <stdio.h>

int main(void)
{
	fprintf(stderr, "scx_ssexit1: refusing to start\n");
	return 1;
}
