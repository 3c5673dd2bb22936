/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * ss_latency - short slices and strict priority for interactive work and games.
 *
 * Three FIFO DSQs, served in order:
 *   level 0  threads of processes whose tgid the daemon put in `boost_tgids` (the game),
 *            with the shorter boost_slice_ns;
 *   level 1  other tasks that were just woken up (interactive: input, audio, compositor);
 *   level 2  everything else.
 * Every starve_every-th dispatch on a CPU serves the levels from the bottom up instead, so
 * background work always makes progress (sched_ext's watchdog ejects a scheduler that leaves
 * a runnable task waiting too long).
 *
 * Module BTF: on a gaming machine virtual controllers (Steam Input and the like) go through
 * the `uinput` module.  ops.init reads two facts from uinput's BTF through CO-RE relocations
 * (the size of struct uinput_device and the value of UIST_CREATED) into .bss; they are not
 * needed for scheduling: they make this object depend on a module's BTF, the case that
 * `.kmod_btfs` speeds up, and loading fails (a poisoned CO-RE relocation that the verifier
 * rejects in ops.init) when uinput is not loaded.
 *
 * Legacy flavour (no custom DSQs, see scx_common.bpf.h): level 0 goes to the head of the
 * built-in global DSQ, the rest to its tail; woken tasks still go straight to an idle CPU.
 *
 * Tunables (.rodata): slice_ns (default 3 ms), boost_slice_ns (default 1 ms), starve_every
 * (default 8).  Map: boost_tgids (hash, u32 tgid -> u32 unused, 1024 entries).
 * Counters (.bss): nr_enqueued[3] per level, nr_dispatched.
 */
#include "scx_common.bpf.h"

char _license[] SEC("license") = "GPL";

DEFINE_KMOD_BTFS(_needed_kmods) = { "uinput" };

#define NR_LEVELS 3
#define LAT_DSQ_BASE 0x200

const volatile u64 slice_ns = 3000000;
const volatile u64 boost_slice_ns = 1000000;
const volatile u32 starve_every = 8;

u64 nr_enqueued[NR_LEVELS];
u64 nr_dispatched;
u64 uinput_device_size;
u64 uinput_created_state;

UEI_DEFINE(uei);

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, u32);
	__type(value, u32);
} boost_tgids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u32);
} dispatch_count SEC(".maps");

/* Local shadows of uinput's types (drivers/input/misc/uinput.c); CO-RE matches them by
 * essential name (the part before "___") against the module's BTF. */
struct uinput_device___ss {
	int state;
};

enum uinput_state___ss {
	UIST_CREATED___ss = 2,
};

SCX_PROG(ss_latency_select_cpu)
s32 BPF_PROG(ss_latency_select_cpu, struct task_struct *p, s32 prev_cpu, u64 wake_flags)
{
	bool is_idle = false;
	s32 cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &is_idle);
	u32 tgid = p->tgid;

	if (is_idle)
		scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL,
				   bpf_map_lookup_elem(&boost_tgids, &tgid) ? boost_slice_ns :
									     slice_ns,
				   0);
	return cpu;
}

SCX_PROG(ss_latency_enqueue)
void BPF_PROG(ss_latency_enqueue, struct task_struct *p, u64 enq_flags)
{
	u32 tgid = p->tgid;
	u32 level = 2;
	u64 slice = slice_ns;

	if (bpf_map_lookup_elem(&boost_tgids, &tgid)) {
		level = 0;
		slice = boost_slice_ns;
	} else if (enq_flags & SCX_ENQ_WAKEUP) {
		level = 1;
	}
	__sync_fetch_and_add(&nr_enqueued[level], 1);
#if SCX_HAVE_CUSTOM_DSQS
	scx_bpf_dsq_insert(p, LAT_DSQ_BASE + level, slice, enq_flags);
#else
	scx_bpf_dsq_insert(p, SCX_DSQ_GLOBAL, slice, level ? enq_flags : enq_flags | SCX_ENQ_HEAD);
#endif
}

#if SCX_HAVE_CUSTOM_DSQS
SCX_PROG(ss_latency_dispatch)
void BPF_PROG(ss_latency_dispatch, s32 cpu, struct task_struct *prev)
{
	u32 zero = 0, *count = bpf_map_lookup_elem(&dispatch_count, &zero);
	bool from_bottom = false;
	int i;

	if (count) {
		*count += 1;
		from_bottom = starve_every && *count % starve_every == 0;
	}
	bpf_for(i, 0, NR_LEVELS) {
		int level = from_bottom ? NR_LEVELS - 1 - i : i;

		if (scx_bpf_dsq_move_to_local(LAT_DSQ_BASE + level)) {
			__sync_fetch_and_add(&nr_dispatched, 1);
			return;
		}
	}
}
#endif

SCX_PROG_SLEEPABLE(ss_latency_init)
s32 BPF_PROG(ss_latency_init)
{
	s32 err __attribute__((unused));
	int i __attribute__((unused));

	uinput_device_size = bpf_core_type_size(struct uinput_device___ss);
	uinput_created_state = bpf_core_enum_value(enum uinput_state___ss, UIST_CREATED___ss);
#if SCX_HAVE_CUSTOM_DSQS
	bpf_for(i, 0, NR_LEVELS) {
		err = scx_bpf_create_dsq(LAT_DSQ_BASE + i, -1);
		if (err)
			return err;
	}
#endif
	return 0;
}

SCX_PROG(ss_latency_exit)
void BPF_PROG(ss_latency_exit, struct scx_exit_info *ei)
{
	UEI_RECORD(uei, ei);
}

SEC(SCX_OPS_SEC)
struct sched_ext_ops ss_latency = {
	.select_cpu = (void *)ss_latency_select_cpu,
	.enqueue = (void *)ss_latency_enqueue,
#if SCX_HAVE_CUSTOM_DSQS
	.dispatch = (void *)ss_latency_dispatch,
#endif
	.init = (void *)ss_latency_init,
	.exit = (void *)ss_latency_exit,
	.name = "ss_latency",
};
