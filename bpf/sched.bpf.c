// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * qosd sched accounting: per-thread on-CPU time (and cycles) per CPU, split
 * by whether the SMT sibling was busy, for the power attribution of
 * paper 001 eq. (1)-(2).
 *
 * In the kernel, at every context switch on a CPU:
 *   - close the slice of the outgoing thread: add its on-CPU time, the part
 *     of it during which the SMT sibling CPU ran a non-idle task, its cycles
 *     (where a PMU exists) and one switch to its slot in `threads`, a
 *     per-CPU array (the thread finds its slot in its task-local storage,
 *     see below), so each CPU only ever writes its own copy and no atomics
 *     are needed;
 *   - open the slice of the incoming thread in `cpus[cpu]` (start time,
 *     cycle counter, and the sibling's cumulative busy time at that moment).
 * The overlap with the sibling is the growth of the sibling's cumulative
 * busy time over the slice, so no event is needed when the sibling changes
 * state. It is read from another CPU without a lock: a torn read can be off
 * by one of the sibling's slices, and it is clamped to [0, slice].
 *
 * Left to userspace: the slices still open when it reads (from `cpus`),
 * splitting cycles by the sibling-busy fraction of time (a CPU's counter can
 * only be read on that CPU, so the sibling's transitions cannot be cut
 * exactly), the weighting of eq. (1), RAPL and the attribution of eq. (2).
 *
 * Untraced switches: on this machine (a Firecracker guest) some context
 * switches are never reported by the tracepoint (ftrace misses them too:
 * a thread that was switched out shows up switching out again). When the
 * outgoing thread is not the one recorded as running, its slice is what
 * the kernel accounted to it since it was last picked
 * (se.sum_exec_runtime - se.prev_sum_exec_runtime), bounded by the time
 * since the last traced switch, and the thread recorded as running gets the
 * rest of that time. Such switches are counted (QOSD_SCNT_UNMATCHED).
 *
 * Thread exit: the thread's final switch (prev_state TASK_DEAD) still adds
 * its last slice and marks the slot QOSD_THR_DEAD; userspace frees the slot
 * right after reading it. sched_process_exit is not used: it fires before
 * that final switch, so freeing there would lose the last slice.
 *
 * Time is the scheduler's own rq clock (sched_clock, ns), read for free at
 * the switch; userspace gets every CPU's rq clock from qosd_clock_snapshot
 * to close open slices in the same clock.
 *
 * Hooks: tp_btf/sched_switch (BTF-typed task pointers, cheapest tracepoint
 * form; this kernel has no fentry/kprobes). Cycles: bpf_perf_event_read_value
 * on a perf event array that userspace fills with one hardware cycles
 * counter per CPU, only when every CPU has one (`use_cycles`).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "sched.h"
#include "counters.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* include/linux/sched.h; a #define, so not in BTF. Stable since 4.14. */
#define TASK_DEAD 0x00000080

/* Set by userspace before load: 1 when `cycles` holds a counter per CPU. */
const volatile __u32 use_cycles = 0;
/* Set by userspace before load: number of possible CPUs. */
const volatile __u32 nr_cpus = 1;

/* Globals so that the skeleton emits the Rust types of the contract. */
struct thread_stats _thread_type = {};
struct cpu_state _cpu_type = {};

/*
 * Per-thread figures live in slots of a per-CPU array (`threads`, indexed
 * by slot), and each thread finds its slot in its own task-local storage
 * (`task_slots`): ~10 ns at every switch, where a per-CPU hash keyed by
 * tid cost ~40. Task storage goes away with the task, so a tid reused by a
 * new thread can never land in the slot of the dead one: the new task has
 * no storage and gets a slot of its own. `thread_slots` (tid -> slot) is
 * written only when a thread gets its slot: userspace lists threads from
 * it, and the rare switch that knows a thread by tid only uses it.
 * Userspace frees the slot of an exited thread after its last read
 * (zeroes it and pushes it back on `free_slots`).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 16384); /* resized by userspace before load */
	__type(key, __u32);         /* slot */
	__type(value, struct thread_stats);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); /* resized with `threads` */
	__type(key, __u32);         /* tid */
	__type(value, __u32);       /* slot */
} thread_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct task_slot);
} task_slots SEC(".maps");

/*
 * In front of the task storage, a per-CPU direct-mapped cache of the
 * threads that ran here lately: (tid, task start time) -> slot, an inlined
 * array load instead of a helper call. The start time makes the key name
 * one task for good, so an entry of a dead thread never matches a new
 * thread that reuses its tid (and, dead, its own task never asks again).
 */
#define SLOT_CACHE 64
struct slot_cache_entry {
	__u64 born; /* task->start_time */
	__u32 tid;
	__u32 slot;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLOT_CACHE);
	__type(key, __u32);
	__type(value, struct slot_cache_entry);
} slot_cache SEC(".maps");

/* Free slots (zeroed): userspace fills it with every slot before attaching
 * and gives back the slots of exited threads. */
struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, 16384); /* resized with `threads` */
	__type(value, __u32);
} free_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* set to the number of possible CPUs */
	__type(key, __u32);     /* cpu */
	__type(value, struct cpu_state);
} cpus SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	/* max_entries 0: libbpf sizes it to the number of possible CPUs */
} cycles SEC(".maps");

/* Each CPU's rq clock at the last qosd_clock_snapshot run. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* set to the number of possible CPUs */
	__type(key, __u32);
	__type(value, __u64);
} clocks SEC(".maps");

QOSD_COUNTERS(QOSD_SCNT_MAX)

/* Cumulative non-idle time of a CPU up to `now`, its open slice included. */
static __always_inline __u64 busy_until(struct cpu_state *s, __u64 now)
{
	__u64 acc = s->busy_acc_ns;
	__u64 start = s->start_ns;
	if (s->tid && start && now > start)
		acc += now - start;
	return acc;
}

/* x * num / den for num <= den, without overflowing 64 bits. */
static __always_inline __u64 pro_rata(__u64 x, __u64 num, __u64 den)
{
	if (!den)
		return 0;
	if (x <= 0xffffffffULL && num <= 0xffffffffULL)
		return x * num / den;
	/* Beyond 2^32 (4.3 s in ns): 16 bits less precision, no overflow
	 * below 2^48 (78 hours). */
	return (x >> 16) * (num >> 16) / ((den >> 16) ?: 1) << 16;
}

/*
 * A slot for thread tid, registered under its tid; -1: none free. A tid
 * that still names another slot is taken over: either the old thread's
 * final switch was never traced (the slot would be kept forever anyway, as
 * an entry of a tid-keyed table was) or it exited so recently that
 * userspace has not read it yet (its last figures are lost; a tid-keyed
 * table lost the new thread's first slices instead).
 */
static __always_inline int new_slot(__u32 tid, __u32 *slot)
{
	__u32 s;
	if (bpf_map_pop_elem(&free_slots, &s))
		return -1;
	if (bpf_map_update_elem(&thread_slots, &tid, &s, BPF_ANY)) {
		bpf_map_push_elem(&free_slots, &s, 0);
		return -1;
	}
	*slot = s;
	return 0;
}

/* This CPU's figures of the thread `task`, its slot made on first use. */
static __always_inline struct thread_stats *stats_of(struct task_struct *task,
						     __u32 tid)
{
	__u32 ci = tid & (SLOT_CACHE - 1);
	struct slot_cache_entry *ce = bpf_map_lookup_elem(&slot_cache, &ci);
	__u64 born = task->start_time;
	if (ce && ce->tid == tid && ce->born == born) {
		__u32 cached = ce->slot;
		return bpf_map_lookup_elem(&threads, &cached);
	}
	struct task_slot *ts = bpf_task_storage_get(&task_slots, task, NULL, 0);
	if (!ts) {
		struct task_slot init = {};
		if (new_slot(tid, &init.slot)) {
			count(QOSD_SCNT_TABLE_FULL);
			return NULL;
		}
		ts = bpf_task_storage_get(&task_slots, task, &init,
					  BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (!ts) {
			bpf_map_delete_elem(&thread_slots, &tid);
			bpf_map_push_elem(&free_slots, &init.slot, 0);
			count(QOSD_SCNT_TABLE_FULL);
			return NULL;
		}
	}
	__u32 slot = ts->slot;
	if (ce) {
		ce->born = born;
		ce->tid = tid;
		ce->slot = slot;
	}
	return bpf_map_lookup_elem(&threads, &slot);
}

/* This CPU's figures of a thread known by tid only (no slot: none). */
static __always_inline struct thread_stats *stats_of_tid(__u32 tid)
{
	__u32 *slot = bpf_map_lookup_elem(&thread_slots, &tid);
	return slot ? bpf_map_lookup_elem(&threads, slot) : NULL;
}

static __always_inline void add(struct thread_stats *t, __u32 tgid, __u64 slice,
				__u64 overlap, __u64 cyc, bool dead)
{
	if (!t)
		return;
	t->on_ns += slice;
	t->sib_busy_ns += overlap;
	t->cycles += cyc;
	t->nr_switches += 1;
	t->tgid = tgid;
	if (dead)
		t->flags |= QOSD_THR_DEAD;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(qosd_sched_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct cpu_state *st = bpf_map_lookup_elem(&cpus, &cpu);
	if (!st)
		return 0;
	count(QOSD_SCNT_SWITCHES);
	/* __schedule() has just updated this CPU's rq clock: reading it is
	 * free, where bpf_ktime_get_ns() cost ~70 ns per switch here. The rq is
	 * reached through the task (the `runqueues` per-CPU symbol is not in
	 * kallsyms without CONFIG_KALLSYMS_ALL). */
	struct rq *rq = prev->se.cfs_rq ? prev->se.cfs_rq->rq : NULL;
	if (!rq || rq->cpu != cpu) {
		count(QOSD_SCNT_NO_CLOCK);
		st->start_ns = 0; /* the next slice's start is unknown */
		st->tid = next->pid;
		return 0;
	}
	__u64 now = rq->clock;
	st->rq = (__u64)rq;

	__u64 cyc = 0;
	if (use_cycles) {
		struct bpf_perf_event_value v = {};
		if (bpf_perf_event_read_value(&cycles, BPF_F_CURRENT_CPU, &v,
					      sizeof(v)) == 0)
			cyc = v.counter;
		else
			count(QOSD_SCNT_CYCLES_ERR);
	}

	struct cpu_state *sib = NULL;
	__u64 sib_busy = 0;
	__u32 sib_cpu = st->sibling;
	if (sib_cpu != QOSD_NO_SIBLING) {
		sib = bpf_map_lookup_elem(&cpus, &sib_cpu);
		if (sib)
			sib_busy = busy_until(sib, now);
	}

	__u32 ptid = prev->pid;
	bool dead = prev_state & TASK_DEAD;
	__u64 start = st->start_ns;
	if (ptid && start && now > start) {
		__u64 gap = now - start;
		__u64 overlap = 0;
		if (sib && sib_busy > st->sib_busy_at_start) {
			overlap = sib_busy - st->sib_busy_at_start;
			if (overlap > gap)
				overlap = gap;
		}
		__u64 dcyc = 0;
		if (use_cycles && cyc > st->start_cycles)
			dcyc = cyc - st->start_cycles;
		if (st->tid == ptid) {
			add(stats_of(prev, ptid), prev->tgid, gap, overlap, dcyc,
			    dead);
		} else {
			/* A switch to prev was never traced (seen on this
			 * machine: ftrace misses it too). prev ran for what the
			 * kernel accounted to it since it was last picked; the
			 * thread recorded as running gets the rest of the gap. */
			count(QOSD_SCNT_UNMATCHED);
			__u64 sum = prev->se.sum_exec_runtime;
			__u64 picked = prev->se.prev_sum_exec_runtime;
			__u64 slice = sum > picked ? sum - picked : 0;
			if (slice > gap)
				slice = gap;
			__u64 o = pro_rata(overlap, slice, gap);
			__u64 c = pro_rata(dcyc, slice, gap);
			add(stats_of(prev, ptid), prev->tgid, slice, o, c, dead);
			if (st->tid && gap > slice)
				add(stats_of_tid(st->tid), st->tgid, gap - slice,
				    overlap - o, dcyc - c, false);
			else if (!st->tid)
				gap = slice; /* the rest of the gap was idle */
		}
		st->busy_acc_ns += gap;
	} else if (ptid && dead) {
		/* Slice start unknown (attached mid-slice): still mark the exit
		 * so that userspace drops an entry made by earlier slices. */
		struct task_slot *ts =
			bpf_task_storage_get(&task_slots, prev, NULL, 0);
		__u32 slot = ts ? ts->slot : 0;
		struct thread_stats *t =
			ts ? bpf_map_lookup_elem(&threads, &slot) : NULL;
		if (t)
			t->flags |= QOSD_THR_DEAD;
	}

	st->tid = next->pid;
	st->tgid = next->tgid;
	st->start_ns = now;
	st->start_cycles = cyc;
	st->sib_busy_at_start = sib_busy;
	return 0;
}

/*
 * Run by userspace (BPF_PROG_TEST_RUN) before it reads: every CPU's rq
 * clock, so that it can close the slices still open in the clock domain of
 * start_ns. A busy CPU's rq clock is at most a scheduler tick old; the part
 * of a slice it misses is counted by the next read.
 */
static long snapshot_cpu(__u64 i, void *ctx)
{
	__u32 cpu = i;
	struct cpu_state *st = bpf_map_lookup_elem(&cpus, &cpu);
	__u64 *slot = bpf_map_lookup_elem(&clocks, &cpu);
	if (!st || !slot || !st->rq)
		return 0;
	__u64 clock = 0;
	bpf_probe_read_kernel(&clock, sizeof(clock),
			      (void *)st->rq + bpf_core_field_offset(struct rq, clock));
	*slot = clock;
	return 0;
}

SEC("syscall")
int qosd_clock_snapshot(void *ctx)
{
	bpf_loop(nr_cpus, snapshot_cpu, NULL, 0);
	return 0;
}
