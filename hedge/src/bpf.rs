//! The contract with `bpf/hedge.bpf.c`: one loaded instance of the three
//! programs per hedged app, its configuration (`struct qh_config`, a
//! `const volatile` global written before load, so its Rust type comes from
//! the skeleton), attaching a program to an interface's TC hook, and the
//! counters (`bpf/hedge.h`'s indices, checked against the header by a test).

use std::mem::MaybeUninit;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;

use anyhow::{anyhow, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{OpenObject, TcHookBuilder, TC_EGRESS, TC_INGRESS};
use serde::Serialize;

use crate::HedgeSpec;

#[allow(clippy::all, dead_code, non_camel_case_types, unused_qualifications)]
#[allow(clippy::undocumented_unsafe_blocks)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/hedge.skel.rs"));
}
use skel::{HedgeSkel, HedgeSkelBuilder};

/// Counter indices of `bpf/hedge.h` (QH_*), in order.
const COUNTERS: [&str; 10] = [
    "requests",
    "no_id",
    "hedges_sent",
    "hedges_won",
    "dups_dropped",
    "budget_refused",
    "csum_fixed",
    "answered_in_time",
    "clone_failed",
    "hedges_settled",
];

/// What the programs counted, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Requests to the service seen leaving (each cloned into the delay line).
    pub requests: u64,
    /// Requests too short to hold the id: passed, never hedged.
    pub no_id: u64,
    /// Hedges sent to the replica.
    pub hedges_sent: u64,
    /// Hedges whose answer came first.
    pub hedges_won: u64,
    /// Second answers for an id, dropped.
    pub dups_dropped: u64,
    /// Hedges the budget did not allow.
    pub budget_refused: u64,
    /// Clones whose IP and UDP checksums were rewritten.
    pub csum_fixed: u64,
    /// Clones back from the delay line after their answer: dropped.
    pub answered_in_time: u64,
    /// Requests the kernel could not clone.
    pub clone_failed: u64,
    /// Hedged ids whose second answer came (dropped): no longer in flight.
    pub hedges_settled: u64,
}

impl Counters {
    fn from_slice(v: &[u64; 10]) -> Self {
        Counters {
            requests: v[0],
            no_id: v[1],
            hedges_sent: v[2],
            hedges_won: v[3],
            dups_dropped: v[4],
            budget_refused: v[5],
            csum_fixed: v[6],
            answered_in_time: v[7],
            clone_failed: v[8],
            hedges_settled: v[9],
        }
    }

    /// (name, value) pairs, for /metrics and tables.
    pub fn pairs(&self) -> [(&'static str, u64); 10] {
        let v = [
            self.requests,
            self.no_id,
            self.hedges_sent,
            self.hedges_won,
            self.dups_dropped,
            self.budget_refused,
            self.csum_fixed,
            self.answered_in_time,
            self.clone_failed,
            self.hedges_settled,
        ];
        std::array::from_fn(|i| (COUNTERS[i], v[i]))
    }
}

/// Where the programs sit and send, found in the app's namespace.
#[derive(Debug, Clone)]
pub struct Wiring {
    /// The client's address on the route to the replica.
    pub replica_src: Ipv4Addr,
    pub delay_ifindex: u32,
    pub replica_ifindex: u32,
    pub svc_ifindex: u32,
    pub svc_mac: [u8; 6],
}

/// A TC hook of one interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// Requests leaving toward the service.
    Egress,
    /// Answers arriving (service and replica interfaces).
    Ingress,
    /// Clones leaving the delay line.
    Delay,
}

impl Hook {
    /// The direction `tc` names.
    pub fn direction(self) -> &'static str {
        match self {
            Hook::Egress => "egress",
            Hook::Ingress | Hook::Delay => "ingress",
        }
    }
}

/// One loaded instance of the programs.
pub struct Programs {
    skel: HedgeSkel<'static>,
}

fn be(a: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}

impl Programs {
    /// Loads the programs configured for `spec` and `w` (needs root).
    pub fn load(spec: &HedgeSpec, w: &Wiring) -> Result<Self> {
        // The skeleton borrows its OpenObject storage for its whole life;
        // leaking one pointer-sized box per load gives it 'static storage
        // without unsafe (the BPF object itself closes on drop).
        let storage: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = HedgeSkelBuilder::default()
            .open(storage)
            .context("opening the hedge BPF object")?;
        let ro = open
            .maps
            .rodata_data
            .as_deref_mut()
            .ok_or_else(|| anyhow!("the hedge BPF object has no rodata"))?;
        let c = &mut ro.cfg;
        c.svc_addr = be(*spec.service.ip());
        c.svc_port = spec.service.port().to_be();
        c.replica_addr = be(*spec.replica.ip());
        c.replica_port = spec.replica.port().to_be();
        c.replica_src = be(w.replica_src);
        c.delay_ifindex = w.delay_ifindex;
        c.replica_ifindex = w.replica_ifindex;
        c.svc_ifindex = w.svc_ifindex;
        c.svc_mac = w.svc_mac;
        c.id_offset = spec.id.offset;
        c.id_len = spec.id.len;
        c.budget_permille = spec.budget_permille;
        c.burst = spec.burst;
        c.enabled = 1;
        let skel = open
            .load()
            .context("loading the hedge BPF programs (needs root)")?;
        Ok(Programs { skel })
    }

    /// Attaches the program of `hook` to `ifindex` at qosd's TC priority
    /// (call inside the app's namespace; the clsact qdisc is made if
    /// missing). The filter outlives this object: removing it is the
    /// journal's `tc filter del`.
    pub fn attach(&self, hook: Hook, ifindex: u32) -> Result<()> {
        let p = &self.skel.progs;
        let (prog, point) = match hook {
            Hook::Egress => (&p.hedge_egress, TC_EGRESS),
            Hook::Ingress => (&p.hedge_ingress, TC_INGRESS),
            Hook::Delay => (&p.hedge_delay, TC_INGRESS),
        };
        let ifindex = i32::try_from(ifindex).context("interface index")?;
        let mut h = TcHookBuilder::new(prog.as_fd())
            .ifindex(ifindex)
            .replace(true)
            .handle(1)
            .priority(qosd_actuators::netns::TC_PREF)
            .hook(point);
        h.create()
            .with_context(|| format!("making the clsact qdisc of interface {ifindex}"))?;
        h.attach()
            .with_context(|| format!("attaching the {hook:?} program to interface {ifindex}"))?;
        Ok(())
    }

    /// (program, runs, total ns) of each program, from the kernel's
    /// `bpf_stats` (zero unless `kernel.bpf_stats_enabled` was on).
    pub fn run_stats(&self) -> Vec<qosd_sensors::bpfstats::RunStat> {
        let p = &self.skel.progs;
        qosd_sensors::bpfstats::run_stats([
            p.hedge_egress.as_fd(),
            p.hedge_ingress.as_fd(),
            p.hedge_delay.as_fd(),
        ])
    }

    /// The counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        let sums = qosd_sensors::percpu::sum_u64_slots(&self.skel.maps.counters, 10)
            .context("reading the hedge counters")?;
        let mut v = [0u64; 10];
        v.copy_from_slice(&sums);
        Ok(Counters::from_slice(&v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_names_follow_the_header() {
        let h = include_str!("../../bpf/hedge.h");
        let mut defs: Vec<(u32, String)> = h
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                (w.next()? == "#define").then_some(())?;
                let name = w.next()?.strip_prefix("QH_")?;
                let idx: u32 = w.next()?.parse().ok()?;
                (![
                    "NR_COUNTERS",
                    "PENDING",
                    "DONE",
                    "SETTLED",
                    "HANDED_IN_MARK",
                ]
                .contains(&name))
                .then(|| (idx, name.to_ascii_lowercase()))
            })
            .collect();
        defs.sort();
        let names: Vec<&str> = defs.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(names, COUNTERS);
        assert!(h.contains(&format!("#define QH_NR_COUNTERS {}", COUNTERS.len())));
    }
}
