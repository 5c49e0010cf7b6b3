/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The contract between hedge.bpf.c and qosd-hedge (hedge/src/bpf.rs): the
 * configuration userspace writes before attaching, the scoreboard record
 * and the counter indices. Addresses and ports are in network byte order,
 * as they sit in the packet.
 */
#ifndef QOSD_HEDGE_H
#define QOSD_HEDGE_H

/* Counter indices of the per-CPU `counters` array. */
#define QH_REQUESTS 0       /* requests to the service seen on egress */
#define QH_NO_ID 1          /* requests too short to hold the id: not hedged */
#define QH_HEDGES_SENT 2    /* clones sent to the replica */
#define QH_HEDGES_WON 3     /* the replica's answer came first */
#define QH_DUPS_DROPPED 4   /* a second answer for an id: dropped */
#define QH_BUDGET_REFUSED 5 /* a hedge the budget did not allow */
#define QH_CSUM_FIXED 6     /* clones whose IP and UDP checksums were rewritten */
#define QH_ANSWERED_IN_TIME 7 /* clones back from the delay line, answer already in: dropped */
#define QH_CLONE_FAILED 8   /* bpf_clone_redirect failed */
#define QH_HEDGES_SETTLED 9 /* hedged ids whose second answer came (and was dropped) */
#define QH_NR_COUNTERS 10

/* skb->mark of a replica's answer handed in on the service's interface:
 * hedge_ingress runs again there and must let it pass. */
#define QH_HANDED_IN_MARK 0x48454447

/* Scoreboard states. */
#define QH_PENDING 1
#define QH_DONE 2
/* Both answers of a hedged id came: nothing of it is in flight any more
 * (hedges_sent - hedges_settled is what turning hedging off waits for). */
#define QH_SETTLED 3

struct qh_config {
	__u32 svc_addr;     /* the service's IPv4 address */
	__u32 replica_addr; /* the replica's IPv4 address */
	__u32 replica_src;  /* the client's address on the replica's route */
	__u32 delay_ifindex;   /* delay line entry (clones go out there) */
	__u32 replica_ifindex; /* where hedges leave */
	__u32 svc_ifindex;     /* where the service's answers arrive */
	__u16 svc_port;
	__u16 replica_port;
	__u16 id_offset; /* request id: payload bytes [id_offset, id_offset + id_len) */
	__u8 id_len;     /* 1..8, big-endian */
	__u8 enabled;
	__u8 svc_mac[6]; /* MAC of svc_ifindex: a replica's answer is handed in there */
	__u16 pad;
	__u32 budget_permille; /* hedges allowed per 1000 requests */
	__u32 burst;           /* hedges the budget may save up */
};

struct qh_key {
	__u64 id;
	__u32 client_port; /* network order, in the low 16 bits */
	__u32 pad;
};

struct qh_entry {
	__u64 sent_ns;    /* when the original left (bpf_ktime_get_ns) */
	__u32 state;      /* QH_PENDING or QH_DONE */
	__u32 client_addr; /* the original's source address */
	__u32 hedged;     /* a hedge went out for it */
	__u32 pad;
};

struct qh_budget {
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 tokens; /* thousandths of a hedge */
};

#endif
