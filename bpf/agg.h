/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * In-kernel aggregation of requests (`--aggregate kernel`): instead of a
 * ring-buffer record per request, emit_record_n() adds the request to
 * per-CPU log-linear histograms of its two figures (latency from arrival,
 * service from the first read) in the cell of its (root tgid, record kind).
 * Userspace claims a cell for each target it traces and reads the cells
 * every interval; a record with no cell (aggregation off, gRPC calls, H2
 * prefaces, a target that found no free cell) still goes through the ring
 * buffer.
 *
 * Cost: a cell is found with inlined per-CPU array loads (no BPF call; a
 * call costs ~40 ns here, count.h): the cells of root tgid t are at slot
 * t % agg_slots or the next one, and a cell holds its owner's tgid, so a
 * taken or stale slot is never counted into (the record goes through the
 * ring buffer). One cell holds both figures of one kind: a per-CPU value is
 * at most 32 KiB, so the histograms stop at 2^36 ns (68.7 s, one open-ended
 * bucket above).
 *
 * The bucket layout is a prefix of the one of sensors/src/stats.rs
 * (LogHistogram): exact below 2^(P+1) ns, then 2^P buckets per power of
 * two. A bucket is at most 1/128 of its value wide, so the figures stay
 * within the userspace histogram's 0.4 %. Rust pins the same constants
 * (sensors/src/ebpf/agg.rs).
 */
#ifndef QOSD_AGG_H
#define QOSD_AGG_H

#define QOSD_AGG_PRECISION 7
#define QOSD_AGG_SUB (1u << QOSD_AGG_PRECISION)
#define QOSD_AGG_MAX_BITS 36
#define QOSD_AGG_BUCKETS                                                      \
	((QOSD_AGG_MAX_BITS - QOSD_AGG_PRECISION + 1) * QOSD_AGG_SUB + 1)

/* agg_cell.fig[] */
#define QOSD_FIG_LATENCY 0
#define QOSD_FIG_SERVICE 1

/* One figure's histogram. Counts only grow (u32, per CPU: userspace takes
 * wrapping differences between reads). */
struct agg_fig {
	__u64 latest_ns;  /* the value of the last request on this CPU */
	__u64 latest_end; /* its end (bpf_ktime_get_ns) */
	__u32 buckets[QOSD_AGG_BUCKETS];
	__u32 pad;
};

/* Both figures of one record kind of one target, on one CPU. */
struct agg_cell {
	__u32 tgid; /* the owner's root tgid (0: free), set on every CPU */
	__u32 pad;
	__u64 first_turns; /* TURN records that opened their connection */
	struct agg_fig fig[2];
};

_Static_assert(QOSD_AGG_BUCKETS == 3841, "agg bucket count");
_Static_assert(sizeof(struct agg_fig) == 16 + 3841 * 4 + 4, "agg_fig layout");
_Static_assert(sizeof(struct agg_cell) == 16 + 2 * sizeof(struct agg_fig),
	       "agg_cell layout");
_Static_assert(sizeof(struct agg_cell) <= 32768, "per-CPU value limit");

/* Set before load: 1 with --aggregate kernel; the slots (cell pairs, one
 * cell per record kind) the map holds. */
const volatile __u8 aggregate = 0;
const volatile __u32 agg_slots = 1;

/* Cell 2 * slot + (kind == CONN). max_entries is set by userspace before
 * load (2 * agg_slots). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct agg_cell);
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

/* LogHistogram::bucket_of, up to the open-ended bucket at 2^36 ns. */
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

/* The cell of (tgid, kind) on this CPU; NULL: none (not aggregated). */
static __always_inline struct agg_cell *agg_cell_of(__u32 tgid, __u8 kind)
{
	__u32 n = agg_slots;
	if (!n)
		return NULL;
	__u32 slot = tgid % n;
	__u32 conn = kind == QOSD_REC_CONN;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		__u32 key = 2 * slot + conn;
		struct agg_cell *c = bpf_map_lookup_elem(&agg, &key);
		if (c && c->tgid == tgid)
			return c;
		slot = slot + 1 == n ? 0 : slot + 1;
	}
	return NULL;
}

static __always_inline void agg_add(struct agg_fig *f, __u16 nreq, __u64 ns,
				    __u64 end)
{
	__u32 b = agg_bucket(ns);
	if (b < QOSD_AGG_BUCKETS)
		f->buckets[b] += nreq;
	f->latest_ns = ns;
	f->latest_end = end;
}

/*
 * Aggregates one record when its target has a cell: true if done (no
 * ring-buffer record then). The two figures as ingest() in
 * sensors/src/ebpf/bpf.rs computes them.
 */
static __always_inline bool agg_record(__u8 kind, __u32 tgid, __u32 turns,
				       __u16 nreq, __u64 arrive, __u64 start,
				       __u64 end)
{
	if (!aggregate || (kind != QOSD_REC_TURN && kind != QOSD_REC_CONN))
		return false;
	struct agg_cell *c = agg_cell_of(tgid, kind);
	if (!c)
		return false;
	if (kind == QOSD_REC_TURN && turns == 1)
		c->first_turns++;
	if (!nreq)
		return true;
	__u64 from = arrive < start ? arrive : start;
	__u64 lat = end > from ? end - from : 0;
	agg_add(&c->fig[QOSD_FIG_LATENCY], 1, lat, end);
	/* A turn's requests after its first came while the first waited in
	 * the socket: timed from the middle of that wait (turn_latencies in
	 * sensors/src/ebpf/target.rs). */
	if (nreq > 1) {
		__u64 half_wait = (start - from) / 2;
		agg_add(&c->fig[QOSD_FIG_LATENCY], nreq - 1,
			lat > half_wait ? lat - half_wait : 0, end);
	}
	agg_add(&c->fig[QOSD_FIG_SERVICE], nreq, end > start ? end - start : 0,
		end);
	return true;
}

#endif
