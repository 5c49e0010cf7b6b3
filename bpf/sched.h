/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The contract between sched.bpf.c and the Rust power sensor
 * (sensors/src/power/sched.rs). Every struct here is mirrored in Rust
 * through the generated skeleton and checked there by size/offset
 * assertions; the _Static_asserts below pin the layout on the C side.
 */
#ifndef QOSD_SCHED_H
#define QOSD_SCHED_H

/* cpu_state.sibling when the CPU has no SMT sibling. */
#define QOSD_NO_SIBLING 0xffffffffu

/* thread_stats.flags */
#define QOSD_THR_DEAD 1 /* the thread made its final switch (TASK_DEAD) */

/* Indexes of the per-CPU counters array. */
#define QOSD_SCNT_SWITCHES 0   /* sched_switch events seen */
#define QOSD_SCNT_TABLE_FULL 1 /* switches not accounted: threads map full */
#define QOSD_SCNT_CYCLES_ERR 2 /* cycle counter reads that failed */
#define QOSD_SCNT_UNMATCHED 3  /* outgoing thread was not the one recorded
				* as running: a switch was never traced */
#define QOSD_SCNT_NO_CLOCK 4   /* no rq clock reachable: switch not accounted */
#define QOSD_SCNT_MAX 8

/*
 * Cumulative figures of one thread on one CPU (the value of a per-CPU array
 * indexed by the thread's slot: each CPU's copy is written only by that
 * CPU).
 */
struct thread_stats {
	__u64 on_ns;       /* time on this CPU */
	__u64 sib_busy_ns; /* part of on_ns while the SMT sibling was busy */
	__u64 cycles;      /* unhalted cycles on this CPU (0 without a PMU) */
	__u64 nr_switches; /* times switched out on this CPU */
	__u32 tgid;        /* process of the thread */
	__u32 flags;       /* QOSD_THR_* */
};

/*
 * What runs on one CPU now (an array indexed by CPU, so that the SMT
 * sibling can read it).
 */
struct cpu_state {
	__u64 start_ns;          /* rq clock when `tid` was switched in; 0 = unknown */
	__u64 start_cycles;      /* cycle counter at start_ns */
	__u64 busy_acc_ns;       /* non-idle time accounted on this CPU */
	__u64 sib_busy_at_start; /* the sibling's cumulative busy time at start_ns */
	__u32 tid;               /* running thread; 0 = the idle task */
	__u32 tgid;
	__u32 sibling;           /* SMT sibling CPU, or QOSD_NO_SIBLING (set by userspace) */
	__u32 pad;
	__u64 rq;                /* this CPU's struct rq (kernel address), read
				  * by the clock snapshot */
};

/* Task-local storage of a thread: its slot in `threads`. */
struct task_slot {
	__u32 slot;
	__u32 pad;
};

_Static_assert(sizeof(struct task_slot) == 8, "task_slot layout");
_Static_assert(sizeof(struct thread_stats) == 40, "thread_stats layout");
_Static_assert(sizeof(struct cpu_state) == 56, "cpu_state layout");

#endif
