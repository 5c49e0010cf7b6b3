// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * qosd hedge: kernel-level hedged UDP requests (paper 003), three TC
 * programs around one scoreboard.
 *
 * In the kernel:
 *   - hedge_egress (TC egress of the interface that leads to the service):
 *     a UDP request to svc_addr:svc_port with an id (payload bytes
 *     [id_offset, id_offset + id_len), big-endian) gets a PENDING scoreboard
 *     entry keyed by (id, client port), adds budget_permille thousandths of
 *     a hedge to the budget, and is cloned into the delay line
 *     (bpf_clone_redirect to delay_ifindex); the original goes on untouched.
 *   - the delay line holds the clone for T_hedge: a veth pair whose entry
 *     has a netem qdisc (set up by userspace; the kernel's packet scheduler
 *     keeps the time, not a user thread);
 *   - hedge_delay (TC ingress of the delay line's exit): the clone is back
 *     after T_hedge. If its id is answered, it is dropped. Else, if the
 *     budget holds a whole hedge, the clone is readdressed to the replica
 *     (destination address and port, source address of the replica's
 *     route), its IP checksum and the UDP checksum's pseudo-header part are
 *     rewritten with the csum helpers (correct for CHECKSUM_PARTIAL clones
 *     of an offloading veth as well as for full checksums; a zero UDP
 *     checksum stays zero) and it leaves by bpf_redirect_neigh (the kernel
 *     fills in the MACs);
 *   - hedge_ingress (TC ingress of the service's and the replica's
 *     interfaces): the first answer for a PENDING id flips it to DONE
 *     (cmpxchg: two answers on two CPUs cannot both win) and passes; a
 *     replica's answer is readdressed to look like the service's (the
 *     client's socket may be connected to it) and handed in on the
 *     service's interface; any later answer for the id is dropped, and
 *     the second answer of a hedged id settles it (hedges_settled), so
 *     userspace turning hedging off can keep this program until every
 *     hedge sent has settled.
 *
 * Left to userspace: the delay line (veth + netem), attaching, counters
 * (per-CPU, summed when read), the budget and id rule.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "hedge.h"
#include "counters.h"

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define ETH_P_IP 0x0800
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff
#define ETH_HLEN_ 14

const volatile struct qh_config cfg = {};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct qh_key);
	__type(value, struct qh_entry);
} scoreboard SEC(".maps");

QOSD_COUNTERS(QH_NR_COUNTERS)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct qh_budget);
} budget SEC(".maps");

/* A UDP/IPv4 packet's headers (no IP options beyond what ihl says). */
struct parsed {
	__u32 saddr, daddr;
	__u16 sport, dport;
	__u32 l3; /* offset of the IP header */
	__u32 l4; /* offset of the UDP header */
	__u32 payload_len;
};

static __always_inline int parse(struct __sk_buff *skb, struct parsed *p)
{
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)))
		return -1;
	if (eth.h_proto != bpf_htons(ETH_P_IP))
		return -1;
	if (bpf_skb_load_bytes(skb, ETH_HLEN_, &ip, sizeof(ip)))
		return -1;
	if (ip.protocol != IPPROTO_UDP || ip.ihl < 5)
		return -1;
	/* A fragment carries no whole request. */
	if (ip.frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return -1;
	p->l3 = ETH_HLEN_;
	p->l4 = ETH_HLEN_ + ip.ihl * 4;
	if (bpf_skb_load_bytes(skb, p->l4, &udp, sizeof(udp)))
		return -1;
	p->saddr = ip.saddr;
	p->daddr = ip.daddr;
	p->sport = udp.source;
	p->dport = udp.dest;
	__u16 len = bpf_ntohs(udp.len);
	p->payload_len = len > sizeof(udp) ? len - sizeof(udp) : 0;
	return 0;
}

/* The request id under the configured rule; -1 if the payload is too short. */
static __always_inline int read_id(struct __sk_buff *skb, struct parsed *p, __u64 *id)
{
	__u8 b[8] = {};
	__u32 n = cfg.id_len;

	if (n < 1 || n > 8 || p->payload_len < (__u32)cfg.id_offset + n)
		return -1;
	if (bpf_skb_load_bytes(skb, p->l4 + 8 + cfg.id_offset, b, 8) < 0) {
		/* Fewer than 8 bytes left after the id's start: read byte by byte. */
		for (int i = 0; i < 8; i++) {
			if (i >= n)
				break;
			if (bpf_skb_load_bytes(skb, p->l4 + 8 + cfg.id_offset + i, &b[i], 1))
				return -1;
		}
	}
	__u64 v = 0;
	for (int i = 0; i < 8; i++) {
		if (i < n)
			v = (v << 8) | b[i];
	}
	*id = v;
	return 0;
}

SEC("tc")
int hedge_egress(struct __sk_buff *skb)
{
	struct parsed p = {};
	struct qh_key key = {};
	struct qh_entry e = {};
	__u32 zero = 0;

	if (!cfg.enabled || parse(skb, &p))
		return TC_ACT_OK;
	if (p.daddr != cfg.svc_addr || p.dport != cfg.svc_port)
		return TC_ACT_OK;
	if (read_id(skb, &p, &key.id)) {
		count(QH_NO_ID);
		return TC_ACT_OK;
	}
	key.client_port = p.sport;
	e.sent_ns = bpf_ktime_get_ns();
	e.state = QH_PENDING;
	e.client_addr = p.saddr;
	bpf_map_update_elem(&scoreboard, &key, &e, BPF_ANY);
	count(QH_REQUESTS);

	struct qh_budget *b = bpf_map_lookup_elem(&budget, &zero);
	if (b) {
		__u64 cap = (__u64)cfg.burst * 1000;
		bpf_spin_lock(&b->lock);
		b->tokens += cfg.budget_permille;
		if (b->tokens > cap)
			b->tokens = cap;
		bpf_spin_unlock(&b->lock);
	}
	if (bpf_clone_redirect(skb, cfg.delay_ifindex, 0))
		count(QH_CLONE_FAILED);
	return TC_ACT_OK;
}

static __always_inline int take_budget(void)
{
	__u32 zero = 0;
	int ok = 0;
	struct qh_budget *b = bpf_map_lookup_elem(&budget, &zero);

	if (!b)
		return 0;
	bpf_spin_lock(&b->lock);
	if (b->tokens >= 1000) {
		b->tokens -= 1000;
		ok = 1;
	}
	bpf_spin_unlock(&b->lock);
	return ok;
}

/* Rewrites a 4-byte address at `off` and fixes the IP checksum and the
 * pseudo-header part of the UDP checksum (zero stays zero). */
static __always_inline int set_addr(struct __sk_buff *skb, struct parsed *p, __u32 off,
				    __u32 from, __u32 to)
{
	if (from == to)
		return 0;
	if (bpf_l4_csum_replace(skb, p->l4 + offsetof(struct udphdr, check), from, to,
				BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | sizeof(to)))
		return -1;
	if (bpf_l3_csum_replace(skb, p->l3 + offsetof(struct iphdr, check), from, to, sizeof(to)))
		return -1;
	return bpf_skb_store_bytes(skb, off, &to, sizeof(to), 0);
}

static __always_inline int set_port(struct __sk_buff *skb, struct parsed *p, __u32 off,
				    __u16 from, __u16 to)
{
	if (from == to)
		return 0;
	if (bpf_l4_csum_replace(skb, p->l4 + offsetof(struct udphdr, check), from, to,
				BPF_F_MARK_MANGLED_0 | sizeof(to)))
		return -1;
	return bpf_skb_store_bytes(skb, off, &to, sizeof(to), 0);
}

SEC("tc")
int hedge_delay(struct __sk_buff *skb)
{
	struct parsed p = {};
	struct qh_key key = {};

	if (parse(skb, &p) || p.daddr != cfg.svc_addr || p.dport != cfg.svc_port)
		return TC_ACT_SHOT;
	if (read_id(skb, &p, &key.id))
		return TC_ACT_SHOT;
	key.client_port = p.sport;
	struct qh_entry *e = bpf_map_lookup_elem(&scoreboard, &key);
	if (!e || e->state != QH_PENDING) {
		count(QH_ANSWERED_IN_TIME);
		return TC_ACT_SHOT;
	}
	if (!take_budget()) {
		count(QH_BUDGET_REFUSED);
		return TC_ACT_SHOT;
	}
	__u32 ip = p.l3;
	if (set_addr(skb, &p, ip + offsetof(struct iphdr, daddr), p.daddr, cfg.replica_addr) ||
	    set_addr(skb, &p, ip + offsetof(struct iphdr, saddr), p.saddr, cfg.replica_src) ||
	    set_port(skb, &p, p.l4 + offsetof(struct udphdr, dest), p.dport, cfg.replica_port))
		return TC_ACT_SHOT;
	count(QH_CSUM_FIXED);
	e->hedged = 1;
	count(QH_HEDGES_SENT);
	return bpf_redirect_neigh(cfg.replica_ifindex, NULL, 0, 0);
}

SEC("tc")
int hedge_ingress(struct __sk_buff *skb)
{
	struct parsed p = {};
	struct qh_key key = {};
	int from_replica;

	if (skb->mark == QH_HANDED_IN_MARK) {
		skb->mark = 0;
		return TC_ACT_OK;
	}
	if (parse(skb, &p))
		return TC_ACT_OK;
	if (p.saddr == cfg.svc_addr && p.sport == cfg.svc_port)
		from_replica = 0;
	else if (p.saddr == cfg.replica_addr && p.sport == cfg.replica_port)
		from_replica = 1;
	else
		return TC_ACT_OK;
	if (read_id(skb, &p, &key.id))
		return TC_ACT_OK;
	key.client_port = p.dport;
	struct qh_entry *e = bpf_map_lookup_elem(&scoreboard, &key);
	if (!e)
		return TC_ACT_OK;
	if (__sync_val_compare_and_swap(&e->state, QH_PENDING, QH_DONE) != QH_PENDING) {
		/* The second answer of a hedged id: it settles (once). */
		if (e->hedged &&
		    __sync_val_compare_and_swap(&e->state, QH_DONE, QH_SETTLED) == QH_DONE)
			count(QH_HEDGES_SETTLED);
		count(QH_DUPS_DROPPED);
		return TC_ACT_SHOT;
	}
	if (!from_replica)
		return TC_ACT_OK;
	count(QH_HEDGES_WON);
	__u32 client = e->client_addr;
	if (set_addr(skb, &p, p.l3 + offsetof(struct iphdr, saddr), p.saddr, cfg.svc_addr) ||
	    set_addr(skb, &p, p.l3 + offsetof(struct iphdr, daddr), p.daddr, client) ||
	    set_port(skb, &p, p.l4 + offsetof(struct udphdr, source), p.sport, cfg.svc_port))
		return TC_ACT_SHOT;
	if (cfg.replica_ifindex == cfg.svc_ifindex)
		return TC_ACT_OK;
	/* Handed in where the service's answers arrive, so reverse-path
	 * filtering sees the service's address on its own interface. */
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), (void *)cfg.svc_mac, 6, 0))
		return TC_ACT_SHOT;
	skb->mark = QH_HANDED_IN_MARK;
	return bpf_redirect(cfg.svc_ifindex, BPF_F_INGRESS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
