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
//! window's order have the read period's granularity, [`READ_EVERY`]).

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
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

// bpf/agg.h, pinned on this side (the C side has _Static_asserts).
const KINDS: [u8; 2] = [super::abi::REC_TURN, super::abi::REC_CONN];
const FIG_LATENCY: u8 = 0;
const FIG_SERVICE: u8 = 1;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AggKey {
    tgid: u32,
    kind: u8,
    fig: u8,
    pad: u16,
}

/// The fixed head of `struct agg_hist`; the u32 buckets follow it.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AggHead {
    first_turns: u64,
    latest_ns: u64,
    latest_end: u64,
}

const BUCKETS_AT: usize = size_of::<AggHead>();
const VALUE_BYTES: usize = BUCKETS_AT + NR_BUCKETS * 4 + 4;
const _: () = {
    assert!(size_of::<AggKey>() == 8);
    assert!(offset_of!(AggHead, latest_end) == 16);
    assert!(NR_BUCKETS == 4609);
    assert!(VALUE_BYTES == 24 + 4609 * 4 + 4);
};

fn key_bytes(k: &AggKey) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&k.tgid.to_ne_bytes());
    b[4] = k.kind;
    b[5] = k.fig;
    b
}

fn u32_at(v: &[u8], at: usize) -> u32 {
    v.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

/// What the last read saw of one entry, per CPU (counters wrap per CPU).
#[derive(Default)]
struct Seen {
    buckets: Vec<Vec<u32>>,
    first_turns: u64,
    latest_end: u64,
}

/// One entry's change since the last read.
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

/// The reader: entries made per target, previous values per entry.
pub(crate) struct AggReader {
    on: bool,
    seen: HashMap<[u8; 8], Seen>,
    last: Instant,
}

/// How often, and how far apart, making a histogram entry is tried again.
/// The map is not preallocated (an entry is ~18 KB per CPU), and the
/// kernel's BPF allocator hands out the large per-CPU values from a cache
/// it refills asynchronously (irq work): a few entries made back to back
/// can meet an empty cache and ENOMEM while memory is plentiful.
const ENOMEM_TRIES: u32 = 100;
const ENOMEM_PAUSE: Duration = Duration::from_millis(2);

fn update_retrying(maps: &Maps<'_>, k: &[u8], zero: &[Vec<u8>]) -> libbpf_rs::Result<()> {
    let mut tries = 0;
    loop {
        match maps.agg.update_percpu(k, zero, MapFlags::ANY) {
            Err(e) if e.kind() == libbpf_rs::ErrorKind::OutOfMemory && tries < ENOMEM_TRIES => {
                tries += 1;
                std::thread::sleep(ENOMEM_PAUSE);
            }
            r => return r,
        }
    }
}

impl AggReader {
    pub fn new(mode: Aggregate) -> Self {
        Self {
            on: mode == Aggregate::Kernel,
            seen: HashMap::new(),
            last: Instant::now(),
        }
    }

    fn keys(root: u32) -> impl Iterator<Item = [u8; 8]> {
        KINDS.into_iter().flat_map(move |kind| {
            [FIG_LATENCY, FIG_SERVICE].map(|fig| {
                key_bytes(&AggKey {
                    tgid: root,
                    kind,
                    fig,
                    pad: 0,
                })
            })
        })
    }

    /// Makes the zeroed entries of `root`: from then on its TURN and CONN
    /// requests are counted in the kernel.
    pub fn add(&mut self, maps: &Maps<'_>, root: u32) -> libbpf_rs::Result<()> {
        if !self.on {
            return Ok(());
        }
        let ncpu = libbpf_rs::num_possible_cpus()?;
        let zero = vec![vec![0u8; VALUE_BYTES]; ncpu];
        for k in Self::keys(root) {
            if let Err(e) = update_retrying(maps, &k, &zero) {
                for k in Self::keys(root) {
                    let _ = maps.agg.delete(&k);
                    self.seen.remove(&k);
                }
                return Err(e);
            }
            self.seen.insert(k, Seen::default());
        }
        Ok(())
    }

    /// Reads `root`'s last counts into its statistics, then drops its entries.
    pub fn remove(&mut self, maps: &Maps<'_>, shared: &Shared, root: u32) {
        if !self.on {
            return;
        }
        self.read(maps, shared, true);
        for k in Self::keys(root) {
            let _ = maps.agg.delete(&k);
            self.seen.remove(&k);
        }
    }

    /// Reads every entry (at most every [`READ_EVERY`] unless `now`) and
    /// adds what changed to the targets' statistics.
    pub fn read(&mut self, maps: &Maps<'_>, shared: &Shared, now: bool) {
        if !self.on || (!now && self.last.elapsed() < READ_EVERY) {
            return;
        }
        self.last = Instant::now();
        let end_ns = super::monotonic_ns();
        let mut deltas = Vec::new();
        for (k, seen) in &mut self.seen {
            match maps.agg.lookup_percpu(k, MapFlags::ANY) {
                Ok(Some(per_cpu)) => deltas.push((*k, diff(seen, &per_cpu))),
                Ok(None) => {}
                Err(e) => tracing::warn!("reading the request histograms: {e}"),
            }
        }
        let mut targets = shared.lock_targets();
        for (k, d) in deltas {
            let tgid = u32::from_ne_bytes([k[0], k[1], k[2], k[3]]);
            let Some(t) = targets.get_mut(&tgid) else {
                continue;
            };
            t.add_aggregated(k[4], k[5] == FIG_SERVICE, end_ns, &d);
        }
    }
}

/// The change of one entry since `seen`, which it then becomes.
fn diff(seen: &mut Seen, per_cpu: &[Vec<u8>]) -> Delta {
    seen.buckets.resize(per_cpu.len(), vec![0; NR_BUCKETS]);
    let mut sum = vec![0u64; NR_BUCKETS];
    let mut first_turns = 0u64;
    let mut latest: Option<(u64, u64)> = None;
    for (v, old) in per_cpu.iter().zip(seen.buckets.iter_mut()) {
        let head: AggHead = super::abi::read_pod(v).unwrap_or_default();
        first_turns += head.first_turns;
        if head.latest_end > seen.latest_end && latest.is_none_or(|(e, _)| head.latest_end > e) {
            latest = Some((head.latest_end, head.latest_ns));
        }
        for (i, (o, s)) in old.iter_mut().zip(sum.iter_mut()).enumerate() {
            let n = u32_at(v, BUCKETS_AT + i * 4);
            *s += u64::from(n.wrapping_sub(*o));
            *o = n;
        }
    }
    let d = Delta {
        buckets: sum
            .into_iter()
            .enumerate()
            .filter(|&(_, n)| n > 0)
            .collect(),
        first_turns: first_turns.saturating_sub(seen.first_turns),
        latest: latest.map(|(_, v)| v),
    };
    seen.first_turns = first_turns;
    if let Some((e, _)) = latest {
        seen.latest_end = e;
    }
    d
}
