//! The `net` plugin: the TC packet counters of [`crate::net`] (eCounter,
//! paper 004) as a daemon sensor. Each complete 1 s window is read once:
//! per target, the traffic of its listening ports (`Target::ports`, or
//! where the config gives none, the ports its processes listen on,
//! discovered from their sockets at every window, so they follow the
//! app's pids; a target with neither has no figures: its traffic cannot
//! be told from the node's), and for the node the top-N peers by bytes with the rest
//! summed as one `other` row, so what is exported stays bounded whatever
//! the traffic. Attaching the programs (and journalling the TC objects)
//! is the caller's: the sensors crate knows no journal.

use qosd_core::clock::monotonic_ns;
use qosd_core::control::Tick;
use serde::Serialize;

use super::{Measurements, Quantity, Sensor, Target};
use crate::net::{Direction, Figures, NetSensor, PeerKey, Window};

/// One target's traffic over the windows completed in a tick,
/// `[ingress, egress]`; the peaks are the last window's (an upper bound
/// when the target has several ports: their peaks add up).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NetTick {
    pub dirs: [Figures; 2],
    /// Bin width of the peaks, ms.
    pub bin_ms: u32,
    /// The ports counted, and where they came from.
    pub ports: Vec<u16>,
    pub ports_from: PortsFrom,
}

/// Where a target's ports came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PortsFrom {
    /// The config's `ports:`.
    #[default]
    Config,
    /// Its processes' listening sockets (`qosd_core::sys::sockets`).
    Discovered,
}

/// One peer row of the node's last window (`peer: None`: every peer
/// beyond the top N of that direction, summed).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PeerRow {
    pub peer: Option<PeerKey>,
    pub dir: Direction,
    pub figures: Figures,
}

/// The node's last complete window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NetNode {
    /// CLOCK_MONOTONIC second of the window.
    pub window: u64,
    pub bin_ms: u32,
    /// Top-N peers per direction by bytes, then one `other` row per
    /// direction that had more.
    pub peers: Vec<PeerRow>,
    /// Peer entries the LRU evicted since the programs were loaded.
    pub evicted_peers: u64,
    /// Packets not counted by key (no entry could be made).
    pub map_full: u64,
}

/// The plugin.
pub struct NetPlugin {
    sensor: NetSensor,
    top_n: usize,
    /// The next window to read (the one the programs were attached in
    /// first: it holds everything counted since).
    next: u64,
}

impl NetPlugin {
    /// `sensor`: loaded and attached; `top_n`: peers kept per direction.
    pub fn new(sensor: NetSensor, top_n: usize) -> Self {
        NetPlugin {
            sensor,
            top_n: top_n.max(1),
            next: monotonic_ns() / 1_000_000_000,
        }
    }
}

/// The ports whose traffic is `t`'s: the config's, else those its
/// processes listen on now (none when they cannot be read).
fn ports_of(t: &Target<'_>) -> (Vec<u16>, PortsFrom) {
    if !t.ports.is_empty() {
        return (t.ports.to_vec(), PortsFrom::Config);
    }
    let root = qosd_core::sys::Root::default();
    let found = qosd_core::sys::sockets::listening_ports(&root, t.pids).unwrap_or_else(|e| {
        tracing::debug!("net: the ports of {}: {e}", t.name);
        Vec::new()
    });
    (found, PortsFrom::Discovered)
}

/// A target's figures in window `w`, `[ingress, egress]`.
fn target_figures(w: &Window, ports: &[u16]) -> [Figures; 2] {
    let mut dirs = [Figures::default(); 2];
    for (k, f) in w.ports.iter().filter(|(k, _)| ports.contains(&k.port)) {
        dirs[usize::from(k.dir == Direction::Egress)].add(f);
    }
    dirs
}

/// The top `n` peers of each direction, the rest summed as `other`.
pub fn top_peers(w: &Window, n: usize) -> Vec<PeerRow> {
    let mut out = Vec::new();
    for dir in Direction::BOTH {
        // `w.peers` is sorted by bytes, most first.
        let mut of_dir = w.peers.iter().filter(|(k, _)| k.dir == dir);
        for (k, f) in of_dir.by_ref().take(n) {
            out.push(PeerRow {
                peer: Some(*k),
                dir,
                figures: *f,
            });
        }
        let mut rest: Option<Figures> = None;
        for (_, f) in of_dir {
            rest.get_or_insert_with(Figures::default).add(f);
        }
        if let Some(figures) = rest {
            out.push(PeerRow {
                peer: None,
                dir,
                figures,
            });
        }
    }
    out
}

impl Sensor for NetPlugin {
    fn name(&self) -> &str {
        "net"
    }

    fn measures(&self) -> &'static [Quantity] {
        &[Quantity::Network]
    }

    fn sample(&mut self, _tick: &Tick, targets: &[Target<'_>]) -> anyhow::Result<Measurements> {
        let mut m = Measurements::empty(targets.len());
        let bin_ms = self.sensor.options().bin_ms;
        // Windows end 2 ms late: packets counted at the boundary are in.
        let done = monotonic_ns().saturating_sub(2_000_000) / 1_000_000_000;
        while self.next < done {
            let w = self.sensor.read(self.next)?;
            self.next += 1;
            for (r, t) in m.apps.iter_mut().zip(targets) {
                let (ports, ports_from) = ports_of(t);
                if ports.is_empty() {
                    continue;
                }
                let figs = target_figures(&w, &ports);
                let net = r.net.get_or_insert(NetTick {
                    bin_ms,
                    ..NetTick::default()
                });
                net.ports = ports;
                net.ports_from = ports_from;
                for (acc, f) in net.dirs.iter_mut().zip(figs) {
                    acc.packets += f.packets;
                    acc.bytes += f.bytes;
                    // The latest window's peaks.
                    acc.peak_packets = f.peak_packets;
                    acc.peak_bytes = f.peak_bytes;
                    acc.bins_over = f.bins_over;
                }
            }
            m.net = Some(NetNode {
                window: w.window,
                bin_ms,
                peers: top_peers(&w, self.top_n),
                evicted_peers: w.evicted_peers,
                map_full: w.counters.map_full,
            });
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn f(bytes: u64) -> Figures {
        Figures {
            packets: bytes / 100,
            bytes,
            peak_packets: 1,
            peak_bytes: 100,
            bins_over: 0,
        }
    }

    fn peer(i: u8, dir: Direction) -> PeerKey {
        PeerKey {
            addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)),
            proto: 17,
            dir,
        }
    }

    #[test]
    fn top_n_per_direction_and_the_rest_as_other() {
        let w = Window {
            peers: vec![
                (peer(1, Direction::Egress), f(5000)),
                (peer(2, Direction::Ingress), f(4000)),
                (peer(3, Direction::Egress), f(3000)),
                (peer(4, Direction::Egress), f(2000)),
                (peer(5, Direction::Egress), f(1000)),
            ],
            ..Window::default()
        };
        let rows = top_peers(&w, 2);
        let shown: Vec<(Option<u8>, Direction, u64)> = rows
            .iter()
            .map(|r| {
                let last = r.peer.map(|p| match p.addr {
                    IpAddr::V4(a) => a.octets()[3],
                    IpAddr::V6(_) => 0,
                });
                (last, r.dir, r.figures.bytes)
            })
            .collect();
        assert_eq!(
            shown,
            vec![
                (Some(2), Direction::Ingress, 4000),
                (Some(1), Direction::Egress, 5000),
                (Some(3), Direction::Egress, 3000),
                (None, Direction::Egress, 3000),
            ]
        );
        // Nothing is lost: the rows add up to the window.
        let total: u64 = rows.iter().map(|r| r.figures.bytes).sum();
        assert_eq!(total, 15_000);
    }

    #[test]
    fn a_target_counts_only_its_ports() {
        use crate::net::PortKey;
        let port = |p: u16, dir| PortKey {
            port: p,
            proto: 17,
            dir,
        };
        let w = Window {
            ports: vec![
                (port(9000, Direction::Ingress), f(1000)),
                (port(9000, Direction::Egress), f(700)),
                (port(9001, Direction::Ingress), f(300)),
                (port(53, Direction::Ingress), f(5000)),
            ],
            ..Window::default()
        };
        let d = target_figures(&w, &[9000, 9001]);
        assert_eq!((d[0].bytes, d[1].bytes), (1300, 700));
        assert_eq!(target_figures(&w, &[80]), [Figures::default(); 2]);
    }
}
