// A scheduler run as its own program, in the shape of scx's user space: open and load a
// sched_ext BPF object with libbpf, attach its struct_ops map through a link, serve until
// SIGINT or SIGTERM, then detach and exit 0. Built by `make test-objects` against the
// system's libbpf (Debian 12: 1.1), for tests/vm/test_executables_vm.py.
//
//     scx_ssfifo OBJECT [--ignore-sigint]
//
// OBJECT: a `.struct_ops` (legacy section) object such as build/bpf/fifo.legacy.bpf.o.
// libbpf 1.1 predates `.struct_ops.link`, so the map is created with BPF_F_LINK by hand and
// the link made with BPF_LINK_CREATE: the kernel then detaches the scheduler when the last
// descriptor of the link closes, as it does for scx's schedulers when their process dies.
// --ignore-sigint: ignore SIGINT (a scheduler that does not stop when asked).
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

// include/uapi/linux/bpf.h of Linux 6.4 and later; the build host's headers may be older.
#ifndef BPF_F_LINK
#define BPF_F_LINK (1U << 13)
#endif
#define ATTACH_STRUCT_OPS 44 /* enum bpf_attach_type: BPF_STRUCT_OPS */

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

int main(int argc, char **argv)
{
	struct bpf_object *obj;
	struct bpf_map *map, *ops = NULL;
	int link_fd, err;

	if (argc < 2) {
		fprintf(stderr, "usage: %s OBJECT [--ignore-sigint]\n", argv[0]);
		return 2;
	}
	signal(SIGINT, argc > 2 && !strcmp(argv[2], "--ignore-sigint") ? SIG_IGN : on_signal);
	signal(SIGTERM, on_signal);

	obj = bpf_object__open_file(argv[1], NULL);
	if (!obj) {
		fprintf(stderr, "scx_ssfifo: cannot open %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	bpf_object__for_each_map(map, obj) {
		if (bpf_map__type(map) == BPF_MAP_TYPE_STRUCT_OPS) {
			ops = map;
			break;
		}
	}
	if (!ops) {
		fprintf(stderr, "scx_ssfifo: %s has no struct_ops map\n", argv[1]);
		return 1;
	}
	bpf_map__set_map_flags(ops, bpf_map__map_flags(ops) | BPF_F_LINK);
	err = bpf_object__load(obj);
	if (err) {
		fprintf(stderr, "scx_ssfifo: load failed: %s\n", strerror(-err));
		return 1;
	}
	// With BPF_F_LINK the update only stores the value; the link below registers it.
	if (!bpf_map__attach_struct_ops(ops)) {
		fprintf(stderr, "scx_ssfifo: cannot write the struct_ops value: %s\n", strerror(errno));
		return 1;
	}
	link_fd = bpf_link_create(bpf_map__fd(ops), 0, ATTACH_STRUCT_OPS, NULL);
	if (link_fd < 0) {
		fprintf(stderr, "scx_ssfifo: BPF_LINK_CREATE failed: %s\n", strerror(-link_fd));
		return 1;
	}
	printf("scx_ssfifo: attached %s (pid %d)\n", bpf_map__name(ops), getpid());
	fflush(stdout);
	while (!stop)
		pause();
	err = bpf_link_detach(link_fd);
	close(link_fd);
	printf("scx_ssfifo: detached (%s)\n", err ? strerror(-err) : "ok");
	fflush(stdout);
	bpf_object__close(obj);
	return 0;
}
