/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The contract between net.bpf.c and qosd-sensors (sensors/src/net/bpf.rs):
 * map keys, the per-CPU window record and the counter indices. Sizes are
 * pinned here with _Static_assert and on the Rust side with const asserts.
 */
#ifndef QOSD_NET_H
#define QOSD_NET_H

/* Counter indices of the per-CPU `counters` array. */
#define QN_PEER_INSERTS 0 /* new (peer, proto, dir) entries made */
#define QN_PORT_INSERTS 1 /* new (local port, proto, dir) entries made */
#define QN_NOT_IP 2       /* frames that are neither IPv4 nor IPv6 (ARP, ...) */
#define QN_MAP_FULL 3     /* an update failed: the packet is not counted by key */
#define QN_NR_COUNTERS 4

#define QN_INGRESS 0
#define QN_EGRESS 1

/* A peer: its address (IPv4 in the first 4 bytes, network order), the IP
 * version (4 or 6), the IP protocol and the direction. */
struct qn_key {
	__u8 addr[16];
	__u8 family;
	__u8 proto;
	__u8 dir;
	__u8 pad;
};

/* A local port (host order) of TCP or UDP traffic: an app's listening
 * port in its received and sent traffic. */
struct qn_port_key {
	__u16 port;
	__u8 proto;
	__u8 dir;
};

/* One CPU's figures for one 1 s window (window = ktime_ns / 1e9). */
struct qn_win {
	__u64 window;
	__u64 packets;
	__u64 bytes;
	__u64 peak_bytes;   /* the largest bin's bytes */
	__u32 peak_packets; /* the largest bin's packets */
	__u32 bins_over;    /* bins with more than over_packets packets */
};

/* The per-CPU value: the window being filled, the one before it (so a
 * reader just after a window boundary still finds it) and the open bin. */
struct qn_val {
	struct qn_win cur;
	struct qn_win prev;
	__u64 bin; /* ktime_ns / bin_ns of the open bin */
	__u64 bin_bytes;
	__u32 bin_packets;
	__u32 pad;
};

_Static_assert(sizeof(struct qn_key) == 20, "qn_key layout");
_Static_assert(sizeof(struct qn_port_key) == 4, "qn_port_key layout");
_Static_assert(sizeof(struct qn_win) == 40, "qn_win layout");
_Static_assert(sizeof(struct qn_val) == 104, "qn_val layout");

#endif
