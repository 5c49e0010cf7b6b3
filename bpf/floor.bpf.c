// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * The floor of the request sensor's socket path: a program on each of its
 * hooks (the same tp_btf attach points as sockets.bpf.c) that returns at
 * once. Nothing runs in the kernel but the dispatch of each hook; nothing
 * is left to userspace. A bench (manager/examples/trace_overhead, FLOOR=1)
 * attaches it instead of the tracer to price what the attach points alone
 * cost: the part of the tracing overhead no program body can win back.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(floor_set_state, const struct sock *sk, const int oldstate,
	     const int newstate)
{
	return 0;
}

SEC("tp_btf/sk_data_ready")
int BPF_PROG(floor_ready, const struct sock *sk)
{
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(floor_recv, struct sock *sk, int ret, int flags)
{
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(floor_send, struct sock *sk, int ret, int flags)
{
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(floor_fork, struct task_struct *parent, struct task_struct *child)
{
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(floor_exit, struct task_struct *p)
{
	return 0;
}

/*
 * The floor of a design scoped to the server: cgroup_skb programs on the
 * server's cgroup (v2) run only for packets of sockets in that cgroup, so
 * a client elsewhere (a loopback load generator, other services) pays a
 * static-key test and no program run. Only attached by the scoped floor
 * (the skeleton's auto-attach skips cgroup programs). 1: let the packet
 * through.
 */
SEC("cgroup_skb/ingress")
int floor_ingress(struct __sk_buff *skb)
{
	return 1;
}

SEC("cgroup_skb/egress")
int floor_egress(struct __sk_buff *skb)
{
	return 1;
}
