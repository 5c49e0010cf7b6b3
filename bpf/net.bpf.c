// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * qosd net: per-peer and per-local-port packet and byte counters with
 * millisecond bins inside 1 s windows (eCounter, paper 004), from two TC
 * programs (clsact ingress and egress of each watched interface).
 *
 * In the kernel, for every IPv4/IPv6 frame:
 *   - key (peer address, IP version, IP protocol, direction) in an LRU
 *     per-CPU hash (`peers`, 2048 entries unless userspace sets another
 *     size before load); a new key is inserted with NOEXIST and counted in
 *     QN_PEER_INSERTS, so userspace gets the LRU's evictions exactly as
 *     inserts minus live entries (nothing else deletes);
 *   - the same figures per local TCP/UDP port (`ports`: the destination
 *     port of received traffic, the source port of sent traffic), so an
 *     app's traffic is that of its listening ports;
 *   - each CPU's value keeps the 1 s window being filled (packets, bytes,
 *     the largest bin in packets and in bytes, bins with more than
 *     `over_packets` packets) and the window before it, plus the open bin
 *     (`bin_ns` wide, aligned to ktime). Per-CPU values need no atomics; a
 *     peer's bin is split across CPUs only when its packets are, which
 *     userspace states (it reports the largest per-CPU bin).
 *   - a GSO packet counts as its segments (gso_segs), each with its own
 *     headers, so figures are those of the wire, not of the skb.
 * Left to userspace: choosing interfaces, attaching, reading windows once
 * they are complete, summing CPUs, top-N, evictions, restoring.
 * Hooks: TC (sched_cls) because it sees both directions of every packet on
 * the interface with no change to the apps; XDP sees ingress only.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "net.h"
#include "counters.h"

#define TC_ACT_OK 0
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_HLEN_ 14
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff
#define NS_PER_WINDOW 1000000000ULL

/* Set before load. */
const volatile __u64 bin_ns = 1000000;
/* NS_PER_WINDOW / bin_ns: bin_ns divides 1 s (userspace checks). */
const volatile __u64 bins_per_window = 1000;
const volatile __u32 over_packets = 100;

/* Globals of the contract's types, so the skeleton carries them. */
struct qn_key qn_key_type = {};
struct qn_port_key qn_port_key_type = {};
struct qn_val qn_val_type = {};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, 2048);
	__type(key, struct qn_key);
	__type(value, struct qn_val);
} peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct qn_port_key);
	__type(value, struct qn_val);
} ports SEC(".maps");

QOSD_COUNTERS(QN_NR_COUNTERS)

/* The packet's clock: one read, and its bin and window worked out only
 * when a value's open bin has ended (`known`), at most once per packet. */
struct clock {
	__u64 now;
	__u64 bin;    /* now / bin_ns */
	__u64 window; /* now / NS_PER_WINDOW */
	bool known;
};

/* Adds `segs` packets of `bytes` to one CPU's value at `c->now`. The bin
 * is the same floor(now / bin_ns) as a division per packet would give:
 * a packet still inside the open bin (bin * bin_ns <= now < (bin + 1) *
 * bin_ns, one multiply and one compare; unsigned, so a clock behind the
 * bin also falls through) needs no division; otherwise the bin is
 * divided out and its window is bin / bins_per_window, exact because
 * bin_ns divides 1 s (floor(floor(n / a) / b) = floor(n / (a b))), which
 * also means a new window always starts a new bin. */
static __always_inline void add(struct qn_val *v, struct clock *c, __u32 segs, __u64 bytes)
{
	if (c->now - v->bin * bin_ns >= bin_ns) {
		if (!c->known) {
			c->bin = c->now / bin_ns;
			c->window = c->bin / bins_per_window;
			c->known = true;
		}
		if (v->cur.window != c->window) {
			v->prev = v->cur;
			__builtin_memset(&v->cur, 0, sizeof(v->cur));
			v->cur.window = c->window;
		}
		v->bin = c->bin;
		v->bin_packets = 0;
		v->bin_bytes = 0;
	}
	v->cur.packets += segs;
	v->cur.bytes += bytes;
	__u32 before = v->bin_packets;
	v->bin_packets += segs;
	v->bin_bytes += bytes;
	if (v->bin_packets > v->cur.peak_packets)
		v->cur.peak_packets = v->bin_packets;
	if (v->bin_bytes > v->cur.peak_bytes)
		v->cur.peak_bytes = v->bin_bytes;
	if (before <= over_packets && v->bin_packets > over_packets)
		v->cur.bins_over += 1;
}

/* Finds or makes `key`'s entry in `map` and adds to it: one lookup for a
 * known key; a new entry is counted in `inserts` only when this CPU made
 * it (NOEXIST). */
static __always_inline void bump(void *map, void *key, __u32 inserts, struct clock *c,
				 __u32 segs, __u64 bytes)
{
	struct qn_val *v = bpf_map_lookup_elem(map, key);
	if (!v) {
		struct qn_val zero = {};
		long err = bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
		if (err == 0)
			count(inserts);
		else if (err != -17 /* EEXIST: another CPU made it */) {
			count(QN_MAP_FULL);
			return;
		}
		v = bpf_map_lookup_elem(map, key);
		if (!v) {
			count(QN_MAP_FULL);
			return;
		}
	}
	add(v, c, segs, bytes);
}

/* skb->data and skb->data_end, each one load from the context: written
 * as asm because clang may otherwise keep &skb->data in a register across
 * a bpf_skb_pull_data and load through it, which the verifier refuses
 * ("dereference of modified ctx ptr"). */
static __always_inline void *pkt_data(struct __sk_buff *skb)
{
	void *p;
	asm volatile("%0 = *(u32 *)(%1 + %2)"
		     : "=r"(p)
		     : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, data)));
	return p;
}

static __always_inline void *pkt_end(struct __sk_buff *skb)
{
	void *p;
	asm volatile("%0 = *(u32 *)(%1 + %2)"
		     : "=r"(p)
		     : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, data_end)));
	return p;
}

/* True when the first `len` bytes of the packet are in its linear part,
 * pulling them in when they are not (headers in page fragments: rare,
 * e.g. after some tunnels or drivers). False when the packet is shorter.
 * A pull invalidates every packet pointer: callers reload data/data_end. */
static __always_inline bool linear(struct __sk_buff *skb, __u32 len)
{
	if (pkt_data(skb) + len <= pkt_end(skb))
		return true;
	return len <= skb->len && bpf_skb_pull_data(skb, len) == 0;
}

struct l4 {
	__u8 proto;
	__u32 off;  /* offset of the L4 header */
	__u16 sport, dport;
	__u32 hlen; /* all headers of one segment, L2 to L4 */
};

/* Ports and header length of a TCP or UDP packet at `l->off` (< 128). */
static __always_inline void ports_of(struct __sk_buff *skb, struct l4 *l)
{
	__u32 off = l->off & 127; /* bounded for the verifier; always < 128 */

	l->hlen = off;
	if (l->proto == IPPROTO_TCP) {
		if (!linear(skb, off + sizeof(struct tcphdr)))
			return;
		void *data = pkt_data(skb), *end = pkt_end(skb);
		struct tcphdr *t = data + off;
		if ((void *)(t + 1) > end)
			return;
		l->sport = bpf_ntohs(t->source);
		l->dport = bpf_ntohs(t->dest);
		l->hlen = off + t->doff * 4;
	} else if (l->proto == IPPROTO_UDP) {
		if (!linear(skb, off + sizeof(struct udphdr)))
			return;
		void *data = pkt_data(skb), *end = pkt_end(skb);
		struct udphdr *u = data + off;
		if ((void *)(u + 1) > end)
			return;
		l->sport = bpf_ntohs(u->source);
		l->dport = bpf_ntohs(u->dest);
		l->hlen = off + sizeof(*u);
	}
}

/* Headers are read in place (direct packet access), not copied out with
 * bpf_skb_load_bytes. */
static __always_inline int handle(struct __sk_buff *skb, __u8 dir)
{
	struct qn_key key = {};
	struct l4 l = {};
	__u16 proto = bpf_ntohs(skb->protocol);

	key.dir = dir;
	if (proto == ETH_P_IP) {
		if (!linear(skb, ETH_HLEN_ + sizeof(struct iphdr)))
			return TC_ACT_OK;
		void *data = pkt_data(skb), *end = pkt_end(skb);
		struct iphdr *ip = data + ETH_HLEN_;
		if ((void *)(ip + 1) > end)
			return TC_ACT_OK;
		__u32 peer = dir == QN_INGRESS ? ip->saddr : ip->daddr;
		__builtin_memcpy(key.addr, &peer, 4);
		key.family = 4;
		l.proto = ip->protocol;
		l.off = ETH_HLEN_ + ip->ihl * 4;
		/* Only a first fragment carries the ports. */
		if (!(ip->frag_off & bpf_htons(IP_OFFSET)))
			ports_of(skb, &l);
	} else if (proto == ETH_P_IPV6) {
		if (!linear(skb, ETH_HLEN_ + sizeof(struct ipv6hdr)))
			return TC_ACT_OK;
		void *data = pkt_data(skb), *end = pkt_end(skb);
		struct ipv6hdr *ip6 = data + ETH_HLEN_;
		if ((void *)(ip6 + 1) > end)
			return TC_ACT_OK;
		if (dir == QN_INGRESS)
			__builtin_memcpy(key.addr, &ip6->saddr, 16);
		else
			__builtin_memcpy(key.addr, &ip6->daddr, 16);
		key.family = 6;
		/* The first next-header; extension headers are not walked. */
		l.proto = ip6->nexthdr;
		l.off = ETH_HLEN_ + sizeof(*ip6);
		ports_of(skb, &l);
	} else {
		count(QN_NOT_IP);
		return TC_ACT_OK;
	}
	key.proto = l.proto;

	__u32 segs = skb->gso_segs > 1 ? skb->gso_segs : 1;
	__u64 bytes = skb->len;
	if (segs > 1 && l.hlen)
		bytes += (__u64)(segs - 1) * l.hlen;
	struct clock c = { .now = bpf_ktime_get_ns() };

	bump(&peers, &key, QN_PEER_INSERTS, &c, segs, bytes);
	if (l.sport || l.dport) {
		struct qn_port_key pk = {
			.port = dir == QN_INGRESS ? l.dport : l.sport,
			.proto = l.proto,
			.dir = dir,
		};
		bump(&ports, &pk, QN_PORT_INSERTS, &c, segs, bytes);
	}
	return TC_ACT_OK;
}

SEC("tc")
int net_ingress(struct __sk_buff *skb)
{
	return handle(skb, QN_INGRESS);
}

SEC("tc")
int net_egress(struct __sk_buff *skb)
{
	return handle(skb, QN_EGRESS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
