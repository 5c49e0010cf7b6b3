//! In-kernel aggregation (`--aggregate kernel`, bpf/agg.h): the kernel
//! keeps per-CPU histograms of both figures per target and record kind
//! instead of sending a record per request; this module makes their
//! entries, reads them each interval and feeds the differences into the
//! same per-target statistics the records feed, so the four calls, the
//! windows, the `auto` choice and the exact counts work alike in both modes.
//!
//! What kernel mode loses: a request's exact value (it arrives as its
//! bucket's midpoint, within 0.4 %, except the latest, which is exact) and
//! its end time (requests are timed as ending at the read, so `rps` and the
//! window's order have the read period's granularity, [`READ_EVERY`]); and
//! values of 2^36 ns (68.7 s) and more, which count as 68.7-69.2 s (the
//! kernel's histograms stop there to fit a per-CPU value).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use libbpf_rs::{MapCore, MapFlags};

use super::hooks::Maps;
use super::Shared;
use crate::stats::NR_BUCKETS;

/// How requests reach userspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregate {
    /// One ring-buffer record per request; statistics in userspace.
    #[default]
    Records,
    /// Histograms and counters in BPF maps, read every [`READ_EVERY`].
    Kernel,
}

impl Aggregate {
    pub fn as_str(self) -> &'static str {
        match self {
            Aggregate::Records => "records",
            Aggregate::Kernel => "kernel",
        }
    }

    /// `QOSD_AGGREGATE=kernel|records`: how a whole test suite is run in
    /// one mode; the default otherwise.
    pub fn from_env() -> Self {
        std::env::var("QOSD_AGGREGATE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    }
}

impl std::str::FromStr for Aggregate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "records" => Ok(Aggregate::Records),
            "kernel" => Ok(Aggregate::Kernel),
            _ => Err(format!(
                "unknown aggregation {s:?}: expected kernel or records"
            )),
        }
    }
}

impl std::fmt::Display for Aggregate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How often the histograms are read (more often on flushes and exits).
pub const READ_EVERY: Duration = Duration::from_millis(100);

pub use super::hooks::AGG_SLOTS;

// bpf/agg.h, pinned on this side (the C side has _Static_asserts).
const KINDS: [u8; 2] = [super::abi::REC_TURN, super::abi::REC_CONN];
/// Buckets per figure in the kernel: a prefix of LogHistogram's, the last
/// one open-ended from 2^36 ns (a cell must fit a 32 KiB per-CPU value).
const KERNEL_BUCKETS: usize = 3841;
/// struct agg_fig: latest_ns, latest_end, then the u32 buckets and a pad.
const FIG_BYTES: usize = 16 + KERNEL_BUCKETS * 4 + 4;
/// struct agg_cell: tgid, pad, first_turns, then the two figures.
const FIGS_AT: usize = 16;
const CELL_BYTES: usize = FIGS_AT + 2 * FIG_BYTES;
const _: () = {
    assert!(KERNEL_BUCKETS <= NR_BUCKETS);
    assert!(CELL_BYTES == 30784);
    assert!(CELL_BYTES <= 32768);
};

fn u32_at(v: &[u8], at: usize) -> u32 {
    v.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

fn u64_at(v: &[u8], at: usize) -> u64 {
    v.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

/// What the last read saw of one figure of a cell, per CPU (counters wrap
/// per CPU).
#[derive(Default)]
struct Seen {
    buckets: Vec<Vec<u32>>,
    latest_end: u64,
}

/// One figure's change since the last read.
#[derive(Default)]
pub(crate) struct Delta {
    /// (bucket, requests) with requests > 0.
    pub buckets: Vec<(usize, u64)>,
    pub first_turns: u64,
    /// The exact value of the most recent request, if it came since.
    pub latest: Option<u64>,
}

impl Delta {
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|&(_, n)| n).sum()
    }
}

/// The cells of one root: its slot and what was seen of each (kind, figure).
struct Cells {
    slot: u32,
    seen: [[Seen; 2]; 2],
    first_turns: u64,
}

/// The reader: the slot of each target, previous values per cell.
pub(crate) struct AggReader {
    on: bool,
    cells: HashMap<u32, Cells>,
    last: Instant,
}

fn cell_key(slot: u32, kind_idx: usize) -> [u8; 4] {
    (2 * slot + kind_idx as u32).to_ne_bytes()
}

/// Sets both cells of `slot` to zero counts owned by `tgid` (0: free) on
/// every CPU.
fn write_cells(maps: &Maps<'_>, slot: u32, tgid: u32) -> libbpf_rs::Result<()> {
    let ncpu = libbpf_rs::num_possible_cpus()?;
    let mut cell = vec![0u8; CELL_BYTES];
    cell[..4].copy_from_slice(&tgid.to_ne_bytes());
    let values = vec![cell; ncpu];
    for k in 0..KINDS.len() {
        maps.agg
            .update_percpu(&cell_key(slot, k), &values, MapFlags::ANY)?;
    }
    Ok(())
}

impl AggReader {
    pub fn new(mode: Aggregate) -> Self {
        Self {
            on: mode == Aggregate::Kernel,
            cells: HashMap::new(),
            last: Instant::now(),
        }
    }

    /// Claims a slot for `root` (where bpf/agg.h looks: root % AGG_SLOTS,
    /// or the next) and zeroes its cells: from then on its TURN and CONN
    /// requests are counted in the kernel. No slot free: its requests keep
    /// coming as records (the kernel finds no cell of its own).
    pub fn add(&mut self, maps: &Maps<'_>, root: u32) -> libbpf_rs::Result<()> {
        if !self.on || self.cells.contains_key(&root) {
            return Ok(());
        }
        let first = root % AGG_SLOTS;
        let free = [first, (first + 1) % AGG_SLOTS]
            .into_iter()
            .find(|s| self.cells.values().all(|c| c.slot != *s));
        let Some(slot) = free else {
            tracing::warn!(
                pid = root,
                "no free in-kernel histogram slot: this process's requests come as records"
            );
            return Ok(());
        };
        write_cells(maps, slot, root)?;
        self.cells.insert(
            root,
            Cells {
                slot,
                seen: Default::default(),
                first_turns: 0,
            },
        );
        Ok(())
    }

    /// Reads `root`'s last counts into its statistics, then frees its slot.
    pub fn remove(&mut self, maps: &Maps<'_>, shared: &Shared, root: u32) {
        if !self.on {
            return;
        }
        self.read(maps, shared, true);
        if let Some(c) = self.cells.remove(&root) {
            if let Err(e) = write_cells(maps, c.slot, 0) {
                tracing::warn!("freeing the request histograms of {root}: {e}");
            }
        }
    }

    /// Reads every cell (at most every [`READ_EVERY`] unless `now`) and
    /// adds what changed to the targets' statistics.
    pub fn read(&mut self, maps: &Maps<'_>, shared: &Shared, now: bool) {
        if !self.on || (!now && self.last.elapsed() < READ_EVERY) {
            return;
        }
        self.last = Instant::now();
        let end_ns = qosd_core::clock::monotonic_ns();
        let mut deltas = Vec::new();
        for (&root, cells) in &mut self.cells {
            for (k, seen) in cells.seen.iter_mut().enumerate() {
                match maps
                    .agg
                    .lookup_percpu(&cell_key(cells.slot, k), MapFlags::ANY)
                {
                    Ok(Some(per_cpu)) => {
                        let mut lat = diff(&mut seen[0], &per_cpu, 0);
                        let svc = diff(&mut seen[1], &per_cpu, 1);
                        let first: u64 = per_cpu.iter().map(|v| u64_at(v, 8)).sum();
                        if k == 0 {
                            lat.first_turns = first.saturating_sub(cells.first_turns);
                            cells.first_turns = first;
                        }
                        deltas.push((root, KINDS[k], lat, svc));
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!("reading the request histograms: {e}"),
                }
            }
        }
        let mut targets = shared.lock_targets();
        for (root, kind, lat, svc) in deltas {
            let Some(t) = targets.get_mut(&root) else {
                continue;
            };
            t.add_aggregated(kind, false, end_ns, &lat);
            t.add_aggregated(kind, true, end_ns, &svc);
        }
    }
}

/// The change of figure `fig` of a cell since `seen`, which it then
/// becomes.
fn diff(seen: &mut Seen, per_cpu: &[Vec<u8>], fig: usize) -> Delta {
    let at = FIGS_AT + fig * FIG_BYTES;
    seen.buckets.resize(per_cpu.len(), vec![0; KERNEL_BUCKETS]);
    let mut sum = vec![0u64; KERNEL_BUCKETS];
    let mut latest: Option<(u64, u64)> = None;
    for (v, old) in per_cpu.iter().zip(seen.buckets.iter_mut()) {
        let (latest_ns, latest_end) = (u64_at(v, at), u64_at(v, at + 8));
        if latest_end > seen.latest_end && latest.is_none_or(|(e, _)| latest_end > e) {
            latest = Some((latest_end, latest_ns));
        }
        for (i, (o, s)) in old.iter_mut().zip(sum.iter_mut()).enumerate() {
            let n = u32_at(v, at + 16 + i * 4);
            *s += u64::from(n.wrapping_sub(*o));
            *o = n;
        }
    }
    if let Some((e, _)) = latest {
        seen.latest_end = e;
    }
    Delta {
        buckets: sum
            .into_iter()
            .enumerate()
            .filter(|&(_, n)| n > 0)
            .collect(),
        first_turns: 0,
        latest: latest.map(|(_, v)| v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::bucket_of;

    #[test]
    fn kernel_buckets_are_a_prefix_of_the_userspace_layout() {
        // The kernel's last bucket is open-ended from 2^36 ns, which is
        // where LogHistogram's bucket of that index starts.
        assert_eq!(bucket_of((1 << 36) - 1), KERNEL_BUCKETS - 2);
        assert_eq!(bucket_of(1 << 36), KERNEL_BUCKETS - 1);
        assert_eq!(bucket_of(255), 255);
    }

    #[test]
    fn diff_takes_wrapping_per_cpu_differences_and_the_newest_latest() {
        let cell = |b: usize, n: u32, latest: u64, end: u64| {
            let mut v = vec![0u8; CELL_BYTES];
            let at = FIGS_AT + FIG_BYTES; // the service figure
            v[at..at + 8].copy_from_slice(&latest.to_ne_bytes());
            v[at + 8..at + 16].copy_from_slice(&end.to_ne_bytes());
            v[at + 16 + b * 4..at + 20 + b * 4].copy_from_slice(&n.to_ne_bytes());
            v
        };
        let mut seen = Seen::default();
        let d = diff(&mut seen, &[cell(7, u32::MAX, 7, 10), cell(9, 2, 9, 20)], 1);
        assert_eq!(d.buckets, vec![(7, u64::from(u32::MAX)), (9, 2)]);
        assert_eq!(d.latest, Some(9));
        // CPU 0's count wraps: 3 more.
        let d = diff(&mut seen, &[cell(7, 2, 7, 30), cell(9, 2, 9, 20)], 1);
        assert_eq!(d.buckets, vec![(7, 3)]);
        assert_eq!(d.latest, Some(7));
        assert_eq!(
            diff(&mut seen, &[cell(7, 2, 7, 30), cell(9, 2, 9, 20)], 1).count(),
            0
        );
    }
}
