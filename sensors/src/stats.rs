//! The latency statistics engine: a log-linear histogram with O(1) insert
//! and removal and a bounded-cost percentile query, and a sliding window of
//! the last N requests built on it (the paper's four calls).
//!
//! Values are quantised into buckets whose width is at most 1/128 of their
//! value (exact below 256 ns), so every percentile up to [`MAX_EXACT_NS`]
//! (about 73 minutes) is the nearest-rank answer to within 0.4 % relative
//! error, whatever the percentile asked for; larger values share one last
//! bucket and a percentile that falls there is reported as that bucket's
//! floor ([`MAX_EXACT_NS`], a lower bound), never as a made-up midpoint.
//! The sum behind the mean is a u128, so it cannot wrap. A percentile query
//! walks 73 block sums and at most 64 buckets, independent of the window
//! size, so any percentile costs the same as p99.

/// Sub-bucket bits per power of two: bucket width <= value / 2^PRECISION.
const PRECISION: u32 = 7;
const SUB: u64 = 1 << PRECISION;
/// Values below 2^MAX_BITS ns (about 73 minutes, above the API's one-hour
/// limit on reported latencies) keep their 0.4 % precision; larger ones
/// share the last bucket.
const MAX_BITS: u32 = 42;
/// The floor of the last bucket: every value at or above it is reported as it.
pub const MAX_EXACT_NS: u64 = 1 << MAX_BITS;
/// Number of buckets: exact region [0, 2^(P+1)), then 2^P per octave up
/// to 2^MAX_BITS, then one open-ended bucket from MAX_EXACT_NS up.
pub const NR_BUCKETS: usize = ((MAX_BITS - PRECISION + 1) as usize) * SUB as usize + 1;
const BLOCK: usize = 64;
const NR_BLOCKS: usize = NR_BUCKETS.div_ceil(BLOCK);

/// Bucket index of a value.
pub fn bucket_of(v: u64) -> usize {
    if v < 2 * SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // floor(log2 v) >= PRECISION + 1
    if e >= MAX_BITS {
        return NR_BUCKETS - 1;
    }
    let mantissa = v >> (e - PRECISION); // in [SUB, 2*SUB)
    ((e - PRECISION + 1) as u64 * SUB + (mantissa - SUB)) as usize
}

/// Smallest value that falls in bucket `i`.
pub fn bucket_low(i: usize) -> u64 {
    let i = i as u64;
    if i < 2 * SUB {
        return i;
    }
    let octave = i / SUB - 1; // e - PRECISION
    let mantissa = i % SUB + SUB;
    mantissa << octave
}

/// The value reported for bucket `i`: its midpoint (exact for width 1);
/// the last bucket is open-ended, so its floor (a lower bound).
pub fn bucket_value(i: usize) -> u64 {
    let lo = bucket_low(i);
    if i + 1 >= NR_BUCKETS {
        return lo;
    }
    let hi = bucket_low(i + 1);
    lo + (hi - lo - 1) / 2
}

/// Counts per bucket with block sums, so that add/remove are O(1) and a rank
/// query is at most NR_BLOCKS + BLOCK steps.
#[derive(Clone)]
pub struct LogHistogram {
    counts: Box<[u32]>,
    blocks: Box<[u32]>,
    total: u64,
    /// Exact: u64::MAX values of u64::MAX each still fit.
    sum: u128,
}

impl Default for LogHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for LogHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogHistogram")
            .field("total", &self.total)
            .finish()
    }
}

impl LogHistogram {
    pub fn new() -> Self {
        Self {
            counts: vec![0; NR_BUCKETS].into_boxed_slice(),
            blocks: vec![0; NR_BLOCKS].into_boxed_slice(),
            total: 0,
            sum: 0,
        }
    }

    #[inline]
    pub fn record(&mut self, v: u64) {
        let b = bucket_of(v);
        self.counts[b] += 1;
        self.blocks[b / BLOCK] += 1;
        self.total += 1;
        self.sum += u128::from(v);
    }

    /// Removes one occurrence of `v`, which must have been recorded.
    #[inline]
    pub fn remove(&mut self, v: u64) {
        let b = bucket_of(v);
        debug_assert!(self.counts[b] > 0, "removing a value never recorded");
        self.counts[b] -= 1;
        self.blocks[b / BLOCK] -= 1;
        self.total -= 1;
        self.sum -= u128::from(v);
    }

    /// Adds every value of `other` to this histogram.
    pub fn merge(&mut self, other: &LogHistogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        for (a, b) in self.blocks.iter_mut().zip(other.blocks.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
    }

    pub fn clear(&mut self) {
        self.counts.fill(0);
        self.blocks.fill(0);
        self.total = 0;
        self.sum = 0;
    }

    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    pub fn mean(&self) -> Option<f64> {
        (self.total > 0).then(|| self.sum as f64 / self.total as f64)
    }

    /// Values in buckets above the one `v` falls in (those a percentile
    /// query would report above `v`).
    pub fn count_above(&self, v: u64) -> u64 {
        let b = bucket_of(v);
        let block = b / BLOCK;
        let upto: u64 = self.blocks[..block]
            .iter()
            .map(|&x| u64::from(x))
            .sum::<u64>()
            + self.counts[block * BLOCK..=b]
                .iter()
                .map(|&x| u64::from(x))
                .sum::<u64>();
        self.total - upto
    }

    /// Nearest-rank percentile `p` in [0, 100]: the value at rank
    /// ceil(p/100 * n) (at least 1), to within one bucket.
    pub fn percentile(&self, p: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((p.clamp(0.0, 100.0) / 100.0) * self.total as f64).ceil() as u64;
        let mut left = rank.clamp(1, self.total);
        let mut block = 0;
        while left > self.blocks[block] as u64 {
            left -= self.blocks[block] as u64;
            block += 1;
        }
        let mut b = block * BLOCK;
        while left > self.counts[b] as u64 {
            left -= self.counts[b] as u64;
            b += 1;
        }
        Some(bucket_value(b))
    }
}

/// The last `capacity` requests of one target: latency values and their end
/// times, with the four calls of the paper.
#[derive(Debug, Clone)]
pub struct Window {
    hist: LogHistogram,
    /// Ring of (end_ns, latency_ns), oldest at `head`.
    ring: Vec<(u64, u64)>,
    head: usize,
    capacity: usize,
    latest: Option<u64>,
}

/// How far back `rps` looks when the window spans more than this.
pub const RPS_HORIZON_NS: u64 = 1_000_000_000;

impl Window {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            hist: LogHistogram::new(),
            ring: Vec::with_capacity(capacity.min(1 << 20)),
            head: 0,
            capacity,
            latest: None,
        }
    }

    #[inline]
    pub fn push(&mut self, end_ns: u64, latency_ns: u64) {
        self.hist.record(latency_ns);
        self.latest = Some(latency_ns);
        if self.ring.len() < self.capacity {
            self.ring.push((end_ns, latency_ns));
        } else {
            let old = std::mem::replace(&mut self.ring[self.head], (end_ns, latency_ns));
            self.hist.remove(old.1);
            self.head = (self.head + 1) % self.capacity;
        }
    }

    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    fn at(&self, i: usize) -> (u64, u64) {
        self.ring[(self.head + i) % self.ring.len()]
    }

    /// Requests per second completed in the last second before `now_ns`
    /// (CLOCK_MONOTONIC); when the whole window is younger than that, the
    /// window's count over its age (the paper's definition). O(log n).
    pub fn rps(&self, now_ns: u64) -> f64 {
        let n = self.ring.len();
        if n == 0 {
            return 0.0;
        }
        let since = now_ns.saturating_sub(RPS_HORIZON_NS);
        let oldest = self.at(0).0;
        if oldest > since {
            let age = now_ns.saturating_sub(oldest).max(1);
            return n as f64 * 1e9 / age.max(RPS_HORIZON_NS / 1000) as f64;
        }
        // First index whose end time is after `since` (end times are nearly
        // sorted: records arrive in completion order).
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.at(mid).0 > since {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        (n - lo) as f64 * 1e9 / RPS_HORIZON_NS as f64
    }

    /// Latency of the most recent request, ns.
    pub fn latest(&self) -> Option<u64> {
        self.latest
    }

    /// Mean latency over the window, ns. O(1).
    pub fn mean(&self) -> Option<f64> {
        self.hist.mean()
    }

    /// Any latency percentile over the window, ns.
    pub fn percentile(&self, p: f64) -> Option<u64> {
        self.hist.percentile(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn oracle(values: &[u64], p: f64) -> Option<u64> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_unstable();
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        Some(v[rank.clamp(1, v.len()) - 1])
    }

    proptest! {
        #[test]
        fn count_above_counts_the_values_of_higher_buckets(
            values in proptest::collection::vec(0u64..1u64 << 40, 0..300),
            v in 0u64..1u64 << 40,
        ) {
            let mut h = LogHistogram::new();
            for &x in &values {
                h.record(x);
            }
            let want = values.iter().filter(|&&x| bucket_of(x) > bucket_of(v)).count() as u64;
            prop_assert_eq!(h.count_above(v), want);
        }
    }

    #[test]
    fn buckets_are_contiguous_and_bounded() {
        for i in 0..NR_BUCKETS - 1 {
            let lo = bucket_low(i);
            let hi = bucket_low(i + 1);
            assert!(hi > lo, "bucket {i}");
            assert_eq!(bucket_of(lo), i);
            assert_eq!(bucket_of(hi - 1), i);
            assert!(
                (hi - lo) as f64 <= (lo as f64 / SUB as f64).max(1.0),
                "width of {i}"
            );
        }
        assert_eq!(bucket_of(u64::MAX), NR_BUCKETS - 1);
        assert_eq!(bucket_of(MAX_EXACT_NS - 1), NR_BUCKETS - 2);
        assert_eq!(bucket_low(NR_BUCKETS - 1), MAX_EXACT_NS);
    }

    /// The reproduction: two latencies of 1e16 µs (1e19 ns) made
    /// the mean 7.77e14 µs (a u64 sum wrapped) and p99 1.64e9 µs (the
    /// midpoint of a last bucket that starts at 2^40 ns).
    #[test]
    fn huge_values_never_wrap_the_mean_nor_invent_a_percentile() {
        let mut h = LogHistogram::new();
        h.record(10_000_000_000_000_000_000);
        h.record(10_000_000_000_000_000_000);
        assert_eq!(h.mean(), Some(1e19));
        assert_eq!(h.percentile(99.0), Some(MAX_EXACT_NS));
        let mut h = LogHistogram::new();
        for _ in 0..4 {
            h.record(u64::MAX);
        }
        h.remove(u64::MAX);
        assert_eq!(h.mean(), Some(u64::MAX as f64));
        // An hour, the API's limit, keeps its precision.
        let hour_ns = 3_600_000_000_000u64;
        let mut h = LogHistogram::new();
        h.record(hour_ns);
        let p = h.percentile(50.0).unwrap();
        assert!(
            (p as f64 - hour_ns as f64).abs() <= hour_ns as f64 / 256.0,
            "{p}"
        );
    }

    #[test]
    fn merge_equals_recording_both() {
        let (mut a, mut b, mut both) = (
            LogHistogram::new(),
            LogHistogram::new(),
            LogHistogram::new(),
        );
        for v in 0..1000u64 {
            let x = v * v * 37 % 1_000_003;
            if v % 3 == 0 {
                a.record(x)
            } else {
                b.record(x)
            }
            both.record(x);
        }
        a.merge(&b);
        for p in [0.0, 10.0, 50.0, 99.0, 100.0] {
            assert_eq!(a.percentile(p), both.percentile(p));
        }
        assert_eq!(a.mean(), both.mean());
    }

    #[test]
    fn exact_below_256() {
        let mut h = LogHistogram::new();
        for v in [3, 255, 7, 100] {
            h.record(v);
        }
        assert_eq!(h.percentile(100.0), Some(255));
        assert_eq!(h.percentile(0.0), Some(3));
        assert_eq!(h.percentile(50.0), Some(7));
    }

    proptest! {
        #[test]
        fn percentile_matches_sorted_oracle(
            values in prop::collection::vec(0u64..5_000_000_000, 1..600),
            p in 0.0f64..=100.0,
        ) {
            let mut h = LogHistogram::new();
            for &v in &values { h.record(v); }
            let want = oracle(&values, p).unwrap();
            let got = h.percentile(p).unwrap();
            prop_assert_eq!(bucket_of(got), bucket_of(want));
            prop_assert!((got as f64 - want as f64).abs() <= want as f64 / 256.0 + 0.5);
            let mean = values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64;
            prop_assert!((h.mean().unwrap() - mean).abs() <= 1e-6 * mean.max(1.0));
        }

        /// Any u64 values: the mean is the exact (f64) mean, whatever the
        /// magnitude, and a percentile is within one bucket of the oracle
        /// (below MAX_EXACT_NS) or reported as MAX_EXACT_NS (above it).
        #[test]
        fn mean_and_percentiles_of_any_u64_values(
            values in prop::collection::vec(any::<u64>(), 1..300),
            p in 0.0f64..=100.0,
        ) {
            let mut h = LogHistogram::new();
            for &v in &values { h.record(v); }
            let sum: u128 = values.iter().map(|&v| u128::from(v)).sum();
            let mean = sum as f64 / values.len() as f64;
            prop_assert!((h.mean().unwrap() - mean).abs() <= 1e-9 * mean.max(1.0));
            let want = oracle(&values, p).unwrap();
            let got = h.percentile(p).unwrap();
            if want >= MAX_EXACT_NS {
                prop_assert_eq!(got, MAX_EXACT_NS);
            } else {
                prop_assert_eq!(bucket_of(got), bucket_of(want));
            }
            // Removing every value brings the sum back to zero exactly.
            for &v in &values { h.remove(v); }
            prop_assert_eq!(h.mean(), None);
            prop_assert_eq!(h.sum, 0);
        }

        #[test]
        fn window_evicts_oldest(
            values in prop::collection::vec(1u64..100_000_000, 1..800),
            cap in 1usize..200,
            p in 0.0f64..=100.0,
        ) {
            let mut w = Window::new(cap);
            for (i, &v) in values.iter().enumerate() { w.push(i as u64 * 1000, v); }
            let kept = &values[values.len().saturating_sub(cap)..];
            prop_assert_eq!(w.len(), kept.len());
            let want = oracle(kept, p).unwrap();
            prop_assert_eq!(bucket_of(w.percentile(p).unwrap()), bucket_of(want));
            let mean = kept.iter().map(|&v| v as f64).sum::<f64>() / kept.len() as f64;
            prop_assert!((w.mean().unwrap() - mean).abs() <= 1e-6 * mean);
            prop_assert_eq!(w.latest(), values.last().copied());
        }
    }

    #[test]
    fn rps_counts_last_second() {
        let mut w = Window::new(100_000);
        // 5000 requests over 5 s: 1000/s.
        for i in 0..5000u64 {
            w.push(i * 1_000_000, 10);
        }
        let now = 5_000_000_000;
        assert!((w.rps(now) - 1000.0).abs() < 2.0, "{}", w.rps(now));
        // Idle for 10 s: nothing in the last second.
        assert_eq!(w.rps(now + 10_000_000_000), 0.0);
    }

    #[test]
    fn rps_of_a_young_window_uses_its_age() {
        let mut w = Window::new(10);
        for i in 0..10u64 {
            w.push(1_000_000_000 + i * 1_000_000, 10); // 10 in 10 ms
        }
        let r = w.rps(1_000_000_000 + 10_000_000);
        assert!((r - 1000.0).abs() < 1.0, "{r}");
    }
}
