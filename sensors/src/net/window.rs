//! One complete 1 s window from the maps' per-CPU values: each CPU keeps
//! the window being filled and the one before, so a window is read after
//! it ends from whichever slot holds it. Packets and bytes are summed over
//! CPUs; a bin lives on one CPU, so the peak bin and the burst bins are the
//! largest per-CPU figures (exact when a peer's packets of a bin are
//! handled by one CPU, a lower bound otherwise).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Serialize;

use super::Direction;

/// One CPU's figures of one window (`struct qn_win`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RawWin {
    pub window: u64,
    pub packets: u64,
    pub bytes: u64,
    pub peak_packets: u32,
    pub peak_bytes: u64,
    pub bins_over: u32,
}

/// One CPU's value (`struct qn_val`): the window being filled and the one before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RawVal {
    pub cur: RawWin,
    pub prev: RawWin,
}

/// A map key as the kernel wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawKey {
    Peer {
        addr: [u8; 16],
        family: u8,
        proto: u8,
        dir: u8,
    },
    Port {
        port: u16,
        proto: u8,
        dir: u8,
    },
}

/// What the programs counted besides the maps, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// New peer entries made since load.
    pub peer_inserts: u64,
    /// New local-port entries made since load.
    pub port_inserts: u64,
    /// Frames neither IPv4 nor IPv6 (ARP, ...), counted only here.
    pub not_ip: u64,
    /// Packets not counted by key because an entry could not be made.
    pub map_full: u64,
}

/// Figures of one key in one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Figures {
    pub packets: u64,
    /// Bytes on the wire: Ethernet, IP and L4 headers included.
    pub bytes: u64,
    /// Packets of the fullest bin (largest per CPU).
    pub peak_packets: u32,
    /// Bytes of the fullest bin by bytes (largest per CPU).
    pub peak_bytes: u64,
    /// Bins with more packets than the threshold (largest per CPU).
    pub bins_over: u32,
}

impl Figures {
    /// Adds another key's figures (a sum of keys: peaks add up to an upper bound).
    pub fn add(&mut self, o: &Figures) {
        self.packets += o.packets;
        self.bytes += o.bytes;
        self.peak_packets = self.peak_packets.saturating_add(o.peak_packets);
        self.peak_bytes += o.peak_bytes;
        self.bins_over = self.bins_over.saturating_add(o.bins_over);
    }

    /// The peak bin's rate in bit/s for bins of `bin_ms`.
    pub fn peak_bps(&self, bin_ms: u32) -> f64 {
        self.peak_bytes as f64 * 8.0 * 1000.0 / f64::from(bin_ms.max(1))
    }
}

/// A peer: its address, IP protocol and direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PeerKey {
    pub addr: IpAddr,
    pub proto: u8,
    pub dir: Direction,
}

/// A local TCP/UDP port, protocol and direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PortKey {
    pub port: u16,
    pub proto: u8,
    pub dir: Direction,
}

/// One complete window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Window {
    /// CLOCK_MONOTONIC second the window covers.
    pub window: u64,
    pub bin_ms: u32,
    /// Peers with traffic in the window, most bytes first.
    pub peers: Vec<(PeerKey, Figures)>,
    /// Local ports with traffic in the window, most bytes first.
    pub ports: Vec<(PortKey, Figures)>,
    pub counters: Counters,
    /// Peer entries in the map when read.
    pub live_peers: u64,
    /// Peer entries the LRU evicted since load (inserts − live: nothing
    /// else deletes).
    pub evicted_peers: u64,
}

/// The figures of `window` from one key's per-CPU values (`None`: no
/// traffic then).
pub(crate) fn combine(vals: &[RawVal], window: u64) -> Option<Figures> {
    let mut f = Figures::default();
    let mut any = false;
    for v in vals {
        let w = if v.cur.window == window {
            &v.cur
        } else if v.prev.window == window {
            &v.prev
        } else {
            continue;
        };
        if w.packets == 0 {
            continue;
        }
        any = true;
        f.packets += w.packets;
        f.bytes += w.bytes;
        f.peak_packets = f.peak_packets.max(w.peak_packets);
        f.peak_bytes = f.peak_bytes.max(w.peak_bytes);
        f.bins_over = f.bins_over.max(w.bins_over);
    }
    any.then_some(f)
}

pub(crate) fn direction(d: u8) -> Direction {
    if d == 0 {
        Direction::Ingress
    } else {
        Direction::Egress
    }
}

/// The address of a peer key (`None`: a family the programs never write).
pub(crate) fn addr(a: &[u8; 16], family: u8) -> Option<IpAddr> {
    match family {
        4 => Some(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))),
        6 => Some(IpAddr::V6(Ipv6Addr::from(*a))),
        _ => None,
    }
}

/// Builds `window` from the maps' entries.
pub(crate) fn build(
    window: u64,
    bin_ms: u32,
    peers: &[(RawKey, Vec<RawVal>)],
    ports: &[(RawKey, Vec<RawVal>)],
    counters: Counters,
) -> Window {
    let mut w = Window {
        window,
        bin_ms,
        counters,
        live_peers: peers.len() as u64,
        evicted_peers: counters.peer_inserts.saturating_sub(peers.len() as u64),
        ..Window::default()
    };
    for (k, vals) in peers.iter().chain(ports) {
        let Some(f) = combine(vals, window) else {
            continue;
        };
        match *k {
            RawKey::Peer {
                addr: a,
                family,
                proto,
                dir,
            } => {
                if let Some(addr) = addr(&a, family) {
                    let dir = direction(dir);
                    w.peers.push((PeerKey { addr, proto, dir }, f));
                }
            }
            RawKey::Port { port, proto, dir } => {
                let dir = direction(dir);
                w.ports.push((PortKey { port, proto, dir }, f));
            }
        }
    }
    w.peers
        .sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
    w.ports
        .sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(window: u64, packets: u64, peak: u32) -> RawWin {
        RawWin {
            window,
            packets,
            bytes: packets * 100,
            peak_packets: peak,
            peak_bytes: u64::from(peak) * 100,
            bins_over: u32::from(peak > 10),
        }
    }

    #[test]
    fn a_window_is_taken_from_the_slot_that_holds_it() {
        // CPU 0 has moved on to window 8 (7 is in prev); CPU 1 still has 7
        // in cur; CPU 2 only saw window 5.
        let vals = [
            RawVal {
                cur: rw(8, 3, 3),
                prev: rw(7, 20, 12),
            },
            RawVal {
                cur: rw(7, 5, 4),
                prev: rw(6, 1, 1),
            },
            RawVal {
                cur: rw(5, 9, 9),
                prev: RawWin::default(),
            },
        ];
        let f = combine(&vals, 7).unwrap();
        assert_eq!(f.packets, 25);
        assert_eq!(f.bytes, 2500);
        assert_eq!(f.peak_packets, 12);
        assert_eq!(f.bins_over, 1);
        assert_eq!(combine(&vals, 4), None);
    }

    #[test]
    fn evictions_are_inserts_minus_live_entries() {
        let key = |i: u8| RawKey::Peer {
            addr: [10, 0, 0, i, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            family: 4,
            proto: 17,
            dir: 1,
        };
        let v = vec![RawVal {
            cur: rw(3, 1, 1),
            prev: RawWin::default(),
        }];
        let peers: Vec<_> = (1..=4).map(|i| (key(i), v.clone())).collect();
        let c = Counters {
            peer_inserts: 10,
            ..Counters::default()
        };
        let w = build(3, 1, &peers, &[], c);
        assert_eq!((w.live_peers, w.evicted_peers), (4, 6));
        assert_eq!(w.peers.len(), 4);
        assert_eq!(w.peers[0].0.addr.to_string(), "10.0.0.1");
        assert_eq!(w.peers[0].0.dir, Direction::Egress);
    }

    #[test]
    fn peak_rate_is_the_bin_scaled_to_a_second() {
        let f = Figures {
            peak_bytes: 1500,
            ..Figures::default()
        };
        assert_eq!(f.peak_bps(1), 12_000_000.0);
        assert_eq!(f.peak_bps(10), 1_200_000.0);
    }
}
