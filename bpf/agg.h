/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * In-kernel aggregation of requests (`--aggregate kernel`): instead of a
 * ring-buffer record per request, emit_record_n() adds the request to
 * per-CPU log-linear histograms of its two figures (latency from arrival,
 * service from the first read), keyed by (root tgid, record kind, figure).
 * Userspace creates the entries of each target it traces and reads them
 * every interval; a record with no entry (aggregation off, gRPC calls, H2
 * prefaces) still goes through the ring buffer.
 *
 * The bucket layout is the one of sensors/src/stats.rs (LogHistogram):
 * exact below 2^(P+1) ns, then 2^P buckets per power of two up to 2^42 ns,
 * then one open-ended bucket. A bucket is at most 1/128 of its value wide,
 * so the figures stay within the userspace histogram's 0.4 %.
 * Rust pins the same constants (sensors/src/ebpf/agg.rs).
 */
#ifndef QOSD_AGG_H
#define QOSD_AGG_H

#define QOSD_AGG_PRECISION 7
#define QOSD_AGG_SUB (1u << QOSD_AGG_PRECISION)
#define QOSD_AGG_MAX_BITS 42
#define QOSD_AGG_BUCKETS                                                      \
	((QOSD_AGG_MAX_BITS - QOSD_AGG_PRECISION + 1) * QOSD_AGG_SUB + 1)

/* agg_key.fig */
#define QOSD_FIG_LATENCY 0
#define QOSD_FIG_SERVICE 1

struct agg_key {
	__u32 tgid; /* the target's root tgid */
	__u8 kind;  /* QOSD_REC_TURN or QOSD_REC_CONN */
	__u8 fig;   /* QOSD_FIG_* */
	__u16 pad;
};

/* One figure of one record kind of one target, on one CPU. Counts only
 * grow; userspace takes differences between reads. */
struct agg_hist {
	__u64 first_turns; /* TURN records that opened their connection */
	__u64 latest_ns;   /* the value of the last request on this CPU */
	__u64 latest_end;  /* its end (bpf_ktime_get_ns) */
	__u32 buckets[QOSD_AGG_BUCKETS];
	__u32 pad;
};

_Static_assert(sizeof(struct agg_key) == 8, "agg_key layout");
_Static_assert(QOSD_AGG_BUCKETS == 4609, "agg bucket count");
_Static_assert(sizeof(struct agg_hist) == 24 + 4609 * 4 + 4, "agg_hist layout");

/* Set before load: 1 with --aggregate kernel. */
const volatile __u8 aggregate = 0;

/* Entries are made by userspace only (one per target, kind and figure):
 * no preallocation of 1024 x ncpus x 18 KiB. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct agg_key);
	__type(value, struct agg_hist);
} agg SEC(".maps");

/* floor(log2(v)) for v > 0, without a loop (no clz in BPF). */
static __always_inline __u32 agg_log2(__u64 v)
{
	__u32 r = 0;
	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) r += 1;
	return r;
}

/* LogHistogram::bucket_of. */
static __always_inline __u32 agg_bucket(__u64 v)
{
	if (v < 2 * QOSD_AGG_SUB)
		return v;
	__u32 e = agg_log2(v);
	if (e >= QOSD_AGG_MAX_BITS)
		return QOSD_AGG_BUCKETS - 1;
	__u64 mant = v >> (e - QOSD_AGG_PRECISION);
	return (e - QOSD_AGG_PRECISION + 1) * QOSD_AGG_SUB +
	       (__u32)(mant - QOSD_AGG_SUB);
}

static __always_inline bool agg_add(__u32 tgid, __u8 kind, __u8 fig,
				    __u16 nreq, bool first, __u64 ns,
				    __u64 end)
{
	struct agg_key k = { .tgid = tgid, .kind = kind, .fig = fig };
	struct agg_hist *h = bpf_map_lookup_elem(&agg, &k);
	if (!h)
		return false;
	if (first)
		h->first_turns++;
	if (nreq) {
		__u32 b = agg_bucket(ns);
		if (b < QOSD_AGG_BUCKETS)
			h->buckets[b] += nreq;
		h->latest_ns = ns;
		h->latest_end = end;
	}
	return true;
}

/*
 * Aggregates one record when its target has entries: true if done (no
 * ring-buffer record then). The two figures as ingest() in
 * sensors/src/ebpf/bpf.rs computes them.
 */
static __always_inline bool agg_record(__u8 kind, __u32 tgid, __u32 turns,
				       __u16 nreq, __u64 arrive, __u64 start,
				       __u64 end)
{
	if (!aggregate || (kind != QOSD_REC_TURN && kind != QOSD_REC_CONN))
		return false;
	__u64 from = arrive < start ? arrive : start;
	bool first = kind == QOSD_REC_TURN && turns == 1;
	__u64 lat = end > from ? end - from : 0;
	/* A turn's requests after its first came while the first waited in
	 * the socket: timed from the middle of that wait (turn_latencies in
	 * sensors/src/ebpf/target.rs). */
	__u64 half_wait = (start - from) / 2;
	if (!agg_add(tgid, kind, QOSD_FIG_LATENCY, nreq ? 1 : 0, first, lat,
		     end))
		return false;
	if (nreq > 1)
		agg_add(tgid, kind, QOSD_FIG_LATENCY, nreq - 1, false,
			lat > half_wait ? lat - half_wait : 0, end);
	agg_add(tgid, kind, QOSD_FIG_SERVICE, nreq, false,
		end > start ? end - start : 0, end);
	return true;
}

#endif
