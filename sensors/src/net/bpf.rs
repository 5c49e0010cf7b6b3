//! The contract with `bpf/net.bpf.c`: loading the two TC programs with the
//! bin width, burst threshold and map sizes, attaching them to an
//! interface's clsact hooks, and reading the maps' per-CPU values (the
//! types come from the skeleton; their layout is pinned below and in
//! `bpf/net.h`).

use std::mem::{size_of, MaybeUninit};
use std::os::fd::AsFd;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject, TcHookBuilder, TC_EGRESS, TC_INGRESS};

use super::window::{Counters, RawKey, RawVal};
use super::{Direction, NetError, NetOptions};

#[allow(clippy::all, dead_code, non_camel_case_types, unused_qualifications)]
#[allow(clippy::undocumented_unsafe_blocks)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/net.skel.rs"));
}
use crate::ebpf::read_pod;
use skel::types::{qn_key, qn_port_key, qn_val, qn_win};
use skel::{NetSkel, NetSkelBuilder};

// bpf/net.h's layout, pinned on this side too.
const _: () = {
    assert!(size_of::<qn_key>() == 20);
    assert!(size_of::<qn_port_key>() == 4);
    assert!(size_of::<qn_win>() == 40);
    assert!(size_of::<qn_val>() == 104);
    assert!(std::mem::offset_of!(qn_val, prev) == 40);
    assert!(std::mem::offset_of!(qn_val, bin) == 80);
};

/// Counter indices of `bpf/net.h` (QN_*), in order.
pub(crate) const COUNTERS: [&str; 4] = ["peer_inserts", "port_inserts", "not_ip", "map_full"];

fn bpf_err(what: &'static str) -> impl Fn(libbpf_rs::Error) -> NetError {
    move |e| NetError::Bpf(format!("{what}: {e}"))
}

fn win(w: &qn_win) -> super::window::RawWin {
    super::window::RawWin {
        window: w.window,
        packets: w.packets,
        bytes: w.bytes,
        peak_packets: w.peak_packets,
        peak_bytes: w.peak_bytes,
        bins_over: w.bins_over,
    }
}

/// Every entry of a per-CPU hash map of `K` keys and `qn_val` values: the
/// key as `to_raw` makes it and the value of each CPU. An entry evicted
/// between `keys()` and its lookup is skipped.
fn entries<K: Copy + Default>(
    m: &impl MapCore,
    what: &'static str,
    to_raw: impl Fn(K) -> RawKey,
) -> Result<Vec<(RawKey, Vec<RawVal>)>, NetError> {
    let mut out = Vec::new();
    for k in m.keys() {
        let Some(key) = read_pod::<K>(&k) else {
            continue;
        };
        let Some(cpus) = m.lookup_percpu(&k, MapFlags::ANY).map_err(bpf_err(what))? else {
            continue;
        };
        let vals = cpus.iter().filter_map(|b| read_pod(b)).map(|v| val(&v));
        out.push((to_raw(key), vals.collect()));
    }
    Ok(out)
}

fn val(v: &qn_val) -> RawVal {
    RawVal {
        cur: win(&v.cur),
        prev: win(&v.prev),
    }
}

/// One loaded instance of the programs and their maps.
pub struct Programs {
    skel: NetSkel<'static>,
}

impl Programs {
    /// Loads the programs configured by `o` (needs root).
    pub fn load(o: &NetOptions) -> Result<Self, NetError> {
        // The skeleton borrows its OpenObject storage for its whole life;
        // leaking one pointer-sized box per load gives it 'static storage
        // without unsafe (the BPF object itself closes on drop).
        let storage: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = NetSkelBuilder::default()
            .open(storage)
            .map_err(bpf_err("opening the net BPF object"))?;
        let ro = open
            .maps
            .rodata_data
            .as_deref_mut()
            .ok_or_else(|| NetError::Bpf("the net BPF object has no rodata".into()))?;
        ro.bin_ns = u64::from(o.bin_ms) * 1_000_000;
        // validate() made sure bin_ms divides 1000: the kernel's window of
        // a bin is then an exact division of the bin.
        ro.bins_per_window = u64::from(1000 / o.bin_ms.max(1));
        ro.over_packets = o.over_packets;
        open.maps
            .peers
            .set_max_entries(o.peers_max)
            .map_err(bpf_err("sizing the peers map"))?;
        open.maps
            .ports
            .set_max_entries(o.ports_max)
            .map_err(bpf_err("sizing the ports map"))?;
        let skel = open
            .load()
            .map_err(bpf_err("loading the net BPF programs (needs root)"))?;
        Ok(Programs { skel })
    }

    /// Attaches both programs to `ifindex` (of the calling thread's
    /// network namespace) at TC priority `pref`, making the clsact qdisc
    /// if missing. The filters outlive this object: removing them is the
    /// caller's (the journal's `tc filter del` or `tc qdisc del`).
    pub fn attach(&self, ifindex: u32, pref: u32) -> Result<(), NetError> {
        let idx = i32::try_from(ifindex)
            .map_err(|_| NetError::Iface(format!("interface index {ifindex}")))?;
        let p = &self.skel.progs;
        for (n, (dir, prog, point)) in [
            (Direction::Ingress, &p.net_ingress, TC_INGRESS),
            (Direction::Egress, &p.net_egress, TC_EGRESS),
        ]
        .into_iter()
        .enumerate()
        {
            let mut h = TcHookBuilder::new(prog.as_fd())
                .ifindex(idx)
                .replace(true)
                .handle(1)
                .priority(pref)
                .hook(point);
            // One clsact qdisc holds both hooks: made once (if missing;
            // libbpf treats an existing one as made).
            if n == 0 {
                h.create().map_err(|e| {
                    NetError::Bpf(format!(
                        "making the clsact qdisc of interface {ifindex}: {e}"
                    ))
                })?;
            }
            h.attach().map_err(|e| {
                NetError::Bpf(format!(
                    "attaching the {dir} program to interface {ifindex}: {e}"
                ))
            })?;
        }
        Ok(())
    }

    /// Every entry of the peers map: key and per-CPU values.
    pub(crate) fn peers(&self) -> Result<Vec<(RawKey, Vec<RawVal>)>, NetError> {
        let to_raw = |k: qn_key| RawKey::Peer {
            addr: k.addr,
            family: k.family,
            proto: k.proto,
            dir: k.dir,
        };
        entries(&self.skel.maps.peers, "reading the peers map", to_raw)
    }

    /// Every entry of the ports map.
    pub(crate) fn ports(&self) -> Result<Vec<(RawKey, Vec<RawVal>)>, NetError> {
        let to_raw = |k: qn_port_key| RawKey::Port {
            port: k.port,
            proto: k.proto,
            dir: k.dir,
        };
        entries(&self.skel.maps.ports, "reading the ports map", to_raw)
    }

    /// The counters, summed over CPUs.
    pub(crate) fn counters(&self) -> Result<Counters, NetError> {
        let v = crate::percpu::sum_u64_slots(&self.skel.maps.counters, COUNTERS.len())
            .map_err(bpf_err("reading the net counters"))?;
        Ok(Counters {
            peer_inserts: v[0],
            port_inserts: v[1],
            not_ip: v[2],
            map_full: v[3],
        })
    }

    /// (program, runs, total ns) of each program, from the kernel's
    /// `bpf_stats` (zero unless `kernel.bpf_stats_enabled` is on).
    pub fn run_stats(&self) -> Vec<crate::bpfstats::RunStat> {
        let p = &self.skel.progs;
        crate::bpfstats::run_stats([p.net_ingress.as_fd(), p.net_egress.as_fd()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_names_follow_the_header() {
        let h = include_str!("../../../bpf/net.h");
        for (i, name) in COUNTERS.iter().enumerate() {
            let def = format!("#define QN_{} {i}", name.to_ascii_uppercase());
            assert!(h.contains(&def), "{def}");
        }
        assert!(h.contains(&format!("#define QN_NR_COUNTERS {}", COUNTERS.len())));
    }
}
