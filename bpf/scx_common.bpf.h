/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * scx_common.bpf.h - what schedswitchd's sample sched_ext schedulers share.
 *
 * Built with clang -O2 -g -target bpf against a vmlinux.h dumped from the sched_ext
 * kernel's BTF (see the Makefile).  Kernel interface: Documentation/scheduler/sched-ext.rst
 * and the kfunc prototypes in that kernel's BTF.
 *
 * Two flavours from one source:
 *   default                  the struct_ops map lives in ".struct_ops.link" (a BPF link owns
 *                            the registration; it ends when the link fd is closed); ops.init
 *                            is sleepable ("struct_ops.s/").
 *   -DSCX_LEGACY_STRUCT_OPS  ".struct_ops" + "struct_ops/" only, which libbpf 1.1 (Debian
 *                            12's bpftool: `bpftool struct_ops register`) understands; the
 *                            registration then lives until `bpftool struct_ops unregister`.
 *                            libbpf 1.1 cannot load sleepable struct_ops programs, and
 *                            scx_bpf_create_dsq() is a sleepable kfunc (the verifier says
 *                            "program must be sleepable"), so this flavour has no custom
 *                            DSQs (SCX_HAVE_CUSTOM_DSQS is 0) and each scheduler falls back
 *                            to the built-in global DSQ, as its comment describes.
 */
#ifndef SCHEDSWITCHD_SCX_COMMON_BPF_H
#define SCHEDSWITCHD_SCX_COMMON_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "kmod_btfs.h"

#ifdef SCX_LEGACY_STRUCT_OPS
#define SCX_OPS_SEC ".struct_ops"
#define SCX_PROG_SLEEPABLE(name) SEC("struct_ops/" #name)
#define SCX_HAVE_CUSTOM_DSQS 0
#else
#define SCX_OPS_SEC ".struct_ops.link"
#define SCX_PROG_SLEEPABLE(name) SEC("struct_ops.s/" #name)
#define SCX_HAVE_CUSTOM_DSQS 1
#endif
#define SCX_PROG(name) SEC("struct_ops/" #name)

/* kfuncs (kernel/sched/ext.c), declared by hand: clang 14's vmlinux.h has no prototypes. */
extern s32 scx_bpf_create_dsq(u64 dsq_id, s32 node) __ksym;
extern void scx_bpf_dsq_insert(struct task_struct *p, u64 dsq_id, u64 slice,
			       u64 enq_flags) __ksym;
extern void scx_bpf_dsq_insert_vtime(struct task_struct *p, u64 dsq_id, u64 slice, u64 vtime,
				     u64 enq_flags) __ksym;
extern bool scx_bpf_dsq_move_to_local(u64 dsq_id) __ksym;
extern s32 scx_bpf_dsq_nr_queued(u64 dsq_id) __ksym;
extern s32 scx_bpf_select_cpu_dfl(struct task_struct *p, s32 prev_cpu, u64 wake_flags,
				  bool *is_idle) __ksym;
extern void scx_bpf_kick_cpu(s32 cpu, u64 flags) __ksym;
extern bool scx_bpf_task_set_dsq_vtime(struct task_struct *p, u64 vtime) __ksym;
extern void scx_bpf_error_bstr(char *fmt, unsigned long long *data, u32 data__sz) __ksym;

/* Open-coded numeric iterator (kernel/bpf/bpf_iter.c; Documentation/bpf/bpf_iterators.rst). */
extern int bpf_iter_num_new(struct bpf_iter_num *it, int start, int end) __ksym;
extern int *bpf_iter_num_next(struct bpf_iter_num *it) __ksym;
extern void bpf_iter_num_destroy(struct bpf_iter_num *it) __ksym;

/*
 * bpf_for(i, start, end): for i in [start, end).  The verifier only accepts an iterator
 * that is destroyed on every path; the cleanup attribute makes a `return` or `break` inside
 * the loop body do that too.  Naming bpf_iter_num_destroy once in plain code makes clang 14
 * emit its BTF declaration, which a call made only through `cleanup` does not, and without
 * which a loader cannot resolve the kfunc.
 */
#ifndef bpf_for
#define bpf_for(i, start, end)                                                          \
	for (struct bpf_iter_num __ss_it __attribute__((aligned(8),                      \
						       cleanup(bpf_iter_num_destroy))), \
	     *__ss_once = (bpf_iter_num_new(&__ss_it, (start), (end)),                      \
			   (void)bpf_iter_num_destroy, (void *)0);                             \
	     __ss_once == (void *)0 && ({                                               \
		     int *__ss_v = bpf_iter_num_next(&__ss_it);                          \
		     __ss_v && ((i) = *__ss_v, 1);                                       \
	     });)
#endif

/*
 * scx_error(fmt, args...): make the kernel eject this scheduler with SCX_EXIT_ERROR_BPF and
 * the formatted message (at most 12 u64 arguments, as bpf_seq_printf()). The kernel logs
 * it after the scheduler's name ("sched_ext: ss_fifo: MESSAGE", the disable path of
 * kernel/sched/ext.c), so a message need not name the scheduler.
 */
#define scx_error(fmt, args...)                                                        \
	({                                                                              \
		static char ___fmt[] = fmt;                                             \
		unsigned long long ___param[___bpf_narg(args) ?: 1] = {};               \
		___bpf_fill(___param, args);                                            \
		scx_bpf_error_bstr(___fmt, ___param, sizeof(___param));                 \
	})

/*
 * Exit information, recorded the scx way (a `uei` variable in .data written by ops.exit)
 * so that whoever loaded the scheduler reads why it ended from the data map:
 * kind (enum scx_exit_kind: 64 = unregistered, 1025 = scx_bpf_error()), exit_code, and the
 * kernel's reason and message strings.  `recorded` is 1 once ops.exit ran.
 */
#define SCX_EXIT_REASON_LEN 128
#define SCX_EXIT_MSG_LEN 1024

struct scx_user_exit_info {
	s32 recorded;
	s32 kind;
	s64 exit_code;
	char reason[SCX_EXIT_REASON_LEN];
	char msg[SCX_EXIT_MSG_LEN];
};

#define UEI_DEFINE(name) struct scx_user_exit_info name SEC(".data")

#define UEI_RECORD(uei, ei)                                                            \
	({                                                                              \
		bpf_probe_read_kernel_str((uei).reason, sizeof((uei).reason),          \
					  BPF_CORE_READ((ei), reason));                \
		bpf_probe_read_kernel_str((uei).msg, sizeof((uei).msg),                \
					  BPF_CORE_READ((ei), msg));                   \
		(uei).exit_code = BPF_CORE_READ((ei), exit_code);                      \
		(uei).kind = BPF_CORE_READ((ei), kind);                                \
		(uei).recorded = 1;                             \
	})

#endif /* SCHEDSWITCHD_SCX_COMMON_BPF_H */
