//! `qosd net`'s sensor: per-peer and per-local-port packet and byte
//! counters with millisecond bins inside 1 s windows, from TC programs on
//! chosen interfaces (eCounter, paper 004; `bpf/net.bpf.c`). This module
//! loads and attaches the programs and reads complete windows; making and
//! removing the clsact qdiscs and filters is journalled by the caller so
//! that a restore removes them (the sensors crate knows no journal).

mod bpf;
mod iface;
mod window;

use std::fmt;
use std::time::Duration;

use qosd_core::clock::monotonic_ns;
use serde::Serialize;

pub use bpf::Programs;
pub use iface::{default_ifaces, iface_by_name, Iface};
pub use window::{Counters, Figures, PeerKey, PortKey, Window};

/// Failures of the net sensor.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{0}")]
    Bpf(String),
    #[error("{0}")]
    Iface(String),
    #[error("{0}")]
    Invalid(String),
}

/// Which way a packet goes through the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Received (the peer is the source).
    Ingress,
    /// Sent (the peer is the destination).
    Egress,
}

impl Direction {
    pub const BOTH: [Direction; 2] = [Direction::Ingress, Direction::Egress];

    /// The word `tc` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Load-time settings of the programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetOptions {
    /// Bin width in ms; divides 1000 so bins tile the 1 s window.
    pub bin_ms: u32,
    /// A bin with more packets than this counts in `bins_over`.
    pub over_packets: u32,
    /// Entries of the peers LRU map (eCounter's 2048 by default).
    pub peers_max: u32,
    /// Entries of the local-ports LRU map.
    pub ports_max: u32,
}

impl Default for NetOptions {
    fn default() -> Self {
        NetOptions {
            bin_ms: 1,
            over_packets: 100,
            peers_max: 2048,
            ports_max: 1024,
        }
    }
}

impl NetOptions {
    /// Checks the ranges; the message names the setting.
    pub fn validate(&self) -> Result<(), NetError> {
        if self.bin_ms == 0 || 1000 % self.bin_ms != 0 {
            return Err(NetError::Invalid(format!(
                "--bin-ms {}: must divide 1000 (1, 2, 4, 5, 10, ..., 1000) so bins tile the 1 s window",
                self.bin_ms
            )));
        }
        for (name, v) in [("peers-max", self.peers_max), ("ports-max", self.ports_max)] {
            if !(1..=65536).contains(&v) {
                return Err(NetError::Invalid(format!(
                    "--{name} {v}: must be 1..=65536 entries (per-CPU values: entries x 104 bytes x CPUs)"
                )));
            }
        }
        Ok(())
    }
}

/// The loaded programs and how to read their windows.
pub struct NetSensor {
    programs: Programs,
    opts: NetOptions,
}

impl NetSensor {
    /// Loads the programs (needs root); attach them with [`Self::attach`].
    pub fn load(opts: NetOptions) -> Result<Self, NetError> {
        opts.validate()?;
        let programs = Programs::load(&opts)?;
        Ok(NetSensor { programs, opts })
    }

    /// Attaches both programs to `ifindex` at TC priority `pref`
    /// ([`Programs::attach`]).
    pub fn attach(&self, ifindex: u32, pref: u32) -> Result<(), NetError> {
        self.programs.attach(ifindex, pref)
    }

    pub fn programs(&self) -> &Programs {
        &self.programs
    }

    pub fn options(&self) -> &NetOptions {
        &self.opts
    }

    /// The figures of window `window` (a CLOCK_MONOTONIC second; complete
    /// once [`monotonic_ns`] has passed its end).
    pub fn read(&self, window: u64) -> Result<Window, NetError> {
        let peers = self.programs.peers()?;
        let ports = self.programs.ports()?;
        let counters = self.programs.counters()?;
        Ok(window::build(
            window,
            self.opts.bin_ms,
            &peers,
            &ports,
            counters,
        ))
    }
}

/// Sleeps until window `w` is complete (plus a small margin for packets
/// being counted at the boundary); `None` when that is longer than `max`.
pub fn wait_window_end(w: u64, max: Duration) -> Option<()> {
    let end = (w + 1) * 1_000_000_000 + 2_000_000;
    let now = monotonic_ns();
    let left = Duration::from_nanos(end.saturating_sub(now));
    if left > max {
        return None;
    }
    std::thread::sleep(left);
    Some(())
}

/// The name of IP protocol `p` (tcp, udp, icmp, icmpv6, or its number).
pub fn proto_name(p: u8) -> String {
    match p {
        0 => "hopopt".into(),
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "icmpv6".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_must_tile_the_window() {
        for ok in [1, 2, 5, 10, 250, 1000] {
            let o = NetOptions {
                bin_ms: ok,
                ..NetOptions::default()
            };
            o.validate().unwrap();
        }
        for bad in [0, 3, 7, 1001, 2000] {
            let o = NetOptions {
                bin_ms: bad,
                ..NetOptions::default()
            };
            let e = o.validate().unwrap_err().to_string();
            assert!(e.contains("bin-ms"), "{e}");
        }
        let o = NetOptions {
            peers_max: 0,
            ..NetOptions::default()
        };
        assert!(o.validate().unwrap_err().to_string().contains("peers-max"));
    }
}
