// SPDX-License-Identifier: GPL-2.0
/* A stand-in for an installed sched_ext scheduler: a native executable carrying BPF ELF
 * objects as data, the way a libbpf-rs skeleton embeds its object (include_bytes!).
 * OBJ1 / OBJ2 (string literals, set by the Makefile) name the .bpf.o files to embed; with
 * neither the program embeds nothing. */
#include <stdio.h>

#define EMBED(sym, path)                                                         \
	__asm__(".section .rodata.embedded,\"a\"\n"                              \
		".balign 8\n"                                                    \
		".globl " #sym "\n" #sym ":\n"                                   \
		".incbin \"" path "\"\n"                                         \
		#sym "_end:\n"                                                   \
		".previous\n")

#ifdef OBJ1
EMBED(obj1, OBJ1);
extern const char obj1[];
#endif
#ifdef OBJ2
EMBED(obj2, OBJ2);
extern const char obj2[];
#endif

int main(void)
{
	int n = 0;
#ifdef OBJ1
	n += obj1[0] == 0x7f;
#endif
#ifdef OBJ2
	n += obj2[0] == 0x7f;
#endif
	printf("%d embedded objects\n", n);
	return 0;
}
