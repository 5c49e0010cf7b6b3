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

/* Adds `segs` packets of `bytes` to one CPU's value at time `now`. */
static __always_inline void add(struct qn_val *v, __u64 now, __u32 segs, __u64 bytes)
{
	__u64 w = now / NS_PER_WINDOW;
	__u64 b = now / bin_ns;

	if (v->cur.window != w) {
		v->prev = v->cur;
		__builtin_memset(&v->cur, 0, sizeof(v->cur));
		v->cur.window = w;
	}
	if (v->bin != b) {
		v->bin = b;
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

/* Finds or makes `key`'s entry in `map` and adds to it; a new entry is
 * counted in `inserts` only when this CPU made it (NOEXIST). */
static __always_inline void bump(void *map, void *key, __u32 inserts, __u64 now, __u32 segs,
				 __u64 bytes)
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
	add(v, now, segs, bytes);
}

struct l4 {
	__u8 proto;
	__u32 off;  /* offset of the L4 header */
	__u16 sport, dport;
	__u32 hlen; /* all headers of one segment, L2 to L4 */
};

/* Ports and header length of a TCP or UDP packet at `l4->off`. */
static __always_inline void ports_of(struct __sk_buff *skb, struct l4 *l)
{
	l->hlen = l->off;
	if (l->proto == IPPROTO_TCP) {
		struct tcphdr t;
		if (bpf_skb_load_bytes(skb, l->off, &t, sizeof(t)))
			return;
		l->sport = bpf_ntohs(t.source);
		l->dport = bpf_ntohs(t.dest);
		l->hlen = l->off + t.doff * 4;
	} else if (l->proto == IPPROTO_UDP) {
		struct udphdr u;
		if (bpf_skb_load_bytes(skb, l->off, &u, sizeof(u)))
			return;
		l->sport = bpf_ntohs(u.source);
		l->dport = bpf_ntohs(u.dest);
		l->hlen = l->off + sizeof(u);
	}
}

static __always_inline int handle(struct __sk_buff *skb, __u8 dir)
{
	struct qn_key key = {};
	struct l4 l = {};
	__u16 proto = bpf_ntohs(skb->protocol);

	key.dir = dir;
	if (proto == ETH_P_IP) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, ETH_HLEN_, &ip, sizeof(ip)))
			return TC_ACT_OK;
		__u32 peer = dir == QN_INGRESS ? ip.saddr : ip.daddr;
		__builtin_memcpy(key.addr, &peer, 4);
		key.family = 4;
		l.proto = ip.protocol;
		l.off = ETH_HLEN_ + ip.ihl * 4;
		/* Only a first fragment carries the ports. */
		if (!(ip.frag_off & bpf_htons(IP_OFFSET)))
			ports_of(skb, &l);
	} else if (proto == ETH_P_IPV6) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, ETH_HLEN_, &ip6, sizeof(ip6)))
			return TC_ACT_OK;
		if (dir == QN_INGRESS)
			__builtin_memcpy(key.addr, &ip6.saddr, 16);
		else
			__builtin_memcpy(key.addr, &ip6.daddr, 16);
		key.family = 6;
		/* The first next-header; extension headers are not walked. */
		l.proto = ip6.nexthdr;
		l.off = ETH_HLEN_ + sizeof(ip6);
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
	__u64 now = bpf_ktime_get_ns();

	bump(&peers, &key, QN_PEER_INSERTS, now, segs, bytes);
	if (l.sport || l.dport) {
		struct qn_port_key pk = {
			.port = dir == QN_INGRESS ? l.dport : l.sport,
			.proto = l.proto,
			.dir = dir,
		};
		bump(&ports, &pk, QN_PORT_INSERTS, now, segs, bytes);
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
