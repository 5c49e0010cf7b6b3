/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Process trees, shared by both request tracers (sockets.bpf.c and the
 * syscall fallback, requests.bpf.c): a traced process that forks has its
 * child traced under the same root (nginx master -> workers, respawned
 * workers), and a followed child that exits is forgotten. Both programs
 * leave after one tgid bitmap load for untraced processes.
 *
 * Hooks: tp_btf/sched_process_fork, tp_btf/sched_process_exit.
 */
#ifndef QOSD_FOLLOW_H
#define QOSD_FOLLOW_H

#include "targets.h"

SEC("tp_btf/sched_process_fork")
int BPF_PROG(qosd_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid;
	if (!is_traced(ptgid))
		return 0;
	__u32 ctgid = child->tgid;
	if (ctgid == ptgid) /* a new thread */
		return 0;
	struct target_cfg *pcfg = bpf_map_lookup_elem(&targets, &ptgid);
	if (!pcfg || !pcfg->follow)
		return 0;
	struct target_cfg cfg = *pcfg;
	if (bpf_map_update_elem(&targets, &ctgid, &cfg, BPF_NOEXIST))
		return 0; /* full, or already a target of its own */
	__u32 word = ctgid >> 6;
	__u64 *bits = bpf_map_lookup_elem(&traced, &word);
	if (bits)
		__sync_fetch_and_or(bits, 1ULL << (ctgid & 63));
	return 0;
}

/*
 * The tracepoint's `group_dead` argument is recent (6.18 has it; 6.1 and
 * 6.12, the kernels users run, refuse a program that reads it: found by
 * make test-kernels). do_exit() has counted the thread out of
 * signal->live before this tracepoint on every kernel, so the group is
 * dead when that count is 0.
 */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(qosd_exit, struct task_struct *task)
{
	__u32 tgid = task->tgid;
	if (!is_traced(tgid) || task->signal->live.counter != 0)
		return 0;
	struct target_cfg *cfg = bpf_map_lookup_elem(&targets, &tgid);
	/* A root is userspace's to forget (it reports the exit). */
	if (!cfg || cfg->root == tgid)
		return 0;
	__u32 word = tgid >> 6;
	__u64 *bits = bpf_map_lookup_elem(&traced, &word);
	if (bits)
		__sync_fetch_and_and(bits, ~(1ULL << (tgid & 63)));
	bpf_map_delete_elem(&targets, &tgid);
	return 0;
}

#endif
