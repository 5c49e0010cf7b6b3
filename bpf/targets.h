/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * Who is traced, shared by requests.bpf.c (syscalls) and sockets.bpf.c
 * (socket tracepoints): the per-tgid settings, the port filter and the
 * exact tgid bitmap every program tests first. Userspace fills them the
 * same way for either object (sensors/src/ebpf/bpf.rs).
 */
#ifndef QOSD_TARGETS_H
#define QOSD_TARGETS_H

#include "requests.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32); /* tgid */
	__type(value, struct target_cfg);
} targets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct port_key);
	__type(value, __u8);
} ports SEC(".maps");

/* Traced tgids, one bit each: bit (tgid & 63) of word (tgid >> 6). Exact:
 * pid_max is at most PID_MAX_LIMIT (2^22 on 64-bit), so every tgid has its
 * bit. Set and cleared by userspace with the `targets` entry. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, QOSD_TGID_WORDS);
	__type(key, __u32);
	__type(value, __u64);
} traced SEC(".maps");

static __always_inline bool is_traced(__u32 tgid)
{
	__u32 word = tgid >> 6;
	__u64 *bits = bpf_map_lookup_elem(&traced, &word);
	return bits && (*bits >> (tgid & 63)) & 1;
}

#endif
