//! Requests filed by the instant they ended, on CLOCK_MONOTONIC (the
//! clock of `bpf_ktime_get_ns()` and of the load generator), so that
//! sensors that learn of a request with different delays put it into the
//! same interval: the one its end falls in. The eBPF ring buffer is read
//! every 20 ms and a turn's record leaves only when the next request comes
//! on its connection; a load generator reports every monitoring tick on
//! its own grid. Filed by end, both sides of an interval hold the same
//! requests.

use crate::stats::LogHistogram;

/// Most requests one [`Ended`] holds; beyond it new ones are counted in
/// [`Ended::dropped`] and not held (a reader that stopped taking them
/// must not grow memory without bound: 16 bytes a request, 64 MiB).
pub const MAX_HELD: usize = 4 << 20;

/// Requests as `(end_ns, duration_ns)`, in the order they were learnt of.
#[derive(Debug, Clone, Default)]
pub struct Ended {
    held: Vec<(u64, u64)>,
    /// Requests not held (over [`MAX_HELD`]).
    pub dropped: u64,
}

impl Ended {
    /// A request that ended at `end_ns` after `ns`.
    #[inline]
    pub fn push(&mut self, end_ns: u64, ns: u64) {
        if self.held.len() < MAX_HELD {
            self.held.push((end_ns, ns));
        } else {
            self.dropped += 1;
        }
    }

    /// Moves `other`'s requests here.
    pub fn append(&mut self, other: &mut Ended) {
        let room = MAX_HELD.saturating_sub(self.held.len());
        let n = other.held.len();
        if n > room {
            self.dropped += (n - room) as u64;
            other.held.truncate(room);
        }
        self.held.append(&mut other.held);
        self.dropped += std::mem::take(&mut other.dropped);
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Records the requests that ended at or before `cut_ns` into `into`
    /// and forgets them; later ones stay for a later cut. Returns how
    /// many were taken.
    pub fn take_until(&mut self, cut_ns: u64, into: &mut LogHistogram) -> u64 {
        let before = self.held.len();
        self.held.retain(|&(end, ns)| {
            if end <= cut_ns {
                into.record(ns);
                false
            } else {
                true
            }
        });
        (before - self.held.len()) as u64
    }

    /// Forgets every request held.
    pub fn clear(&mut self) {
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sides learn of the same requests at different times and in
    /// different batches: cut at the same instants, each interval holds
    /// the same requests on both.
    #[test]
    fn the_same_cut_files_the_same_requests() {
        // (end, latency) of 10 requests, ending 30 ms apart.
        let reqs: Vec<(u64, u64)> = (0..10u64).map(|i| (i * 30, 1000 + i)).collect();
        let (mut early, mut late) = (Ended::default(), Ended::default());
        // One side learns of each at once; the other in two batches, the
        // second after the first cut.
        for &(e, ns) in &reqs {
            early.push(e, ns);
        }
        for &(e, ns) in &reqs[..4] {
            late.push(e, ns);
        }
        let (mut a, mut b) = (LogHistogram::new(), LogHistogram::new());
        assert_eq!(early.take_until(100, &mut a), 4);
        assert_eq!(late.take_until(100, &mut b), 4);
        let mut rest = Ended::default();
        for &(e, ns) in &reqs[4..] {
            rest.push(e, ns);
        }
        late.append(&mut rest);
        assert!(rest.is_empty());
        let (mut a2, mut b2) = (LogHistogram::new(), LogHistogram::new());
        assert_eq!(early.take_until(200, &mut a2), 3);
        assert_eq!(late.take_until(200, &mut b2), 3);
        for (x, y) in [(&a, &b), (&a2, &b2)] {
            assert_eq!(x.len(), y.len());
            assert_eq!(x.percentile(100.0), y.percentile(100.0));
            assert_eq!(x.percentile(0.0), y.percentile(0.0));
        }
        assert_eq!((early.len(), late.len()), (3, 3));
    }

    #[test]
    fn a_reader_that_stops_taking_does_not_grow_it_without_bound() {
        let mut e = Ended::default();
        e.held.resize(MAX_HELD - 1, (0, 0));
        e.push(1, 1);
        e.push(2, 2);
        assert_eq!((e.len(), e.dropped), (MAX_HELD, 1));
        let mut more = Ended::default();
        more.push(3, 3);
        e.append(&mut more);
        assert_eq!((e.len(), e.dropped), (MAX_HELD, 2));
        let mut h = LogHistogram::new();
        assert_eq!(e.take_until(u64::MAX, &mut h), MAX_HELD as u64);
        assert!(e.is_empty());
    }
}
