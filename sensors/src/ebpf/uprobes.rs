//! The gRPC uprobes (`bpf/grpc.bpf.c`): a second skeleton whose ring buffer
//! and counters are the request tracer's own maps (their fds are handed over
//! before load), so one consumer drains every record kind in order. Its
//! programs attach per traced pid, at the file offsets [`super::grpc`]
//! resolved; dropping a pid's links detaches them.
//!
//! A second skeleton rather than more programs in requests.bpf.c: the
//! syscall tracer auto-attaches everything it has, while these programs
//! only make sense attached to one process's file at a known offset.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, OpenObject};

use super::grpc::{self, Discovery, Prog, Site};
use super::Mode;

#[allow(clippy::all, clippy::undocumented_unsafe_blocks)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/grpc.skel.rs"));
}

use skel::{GrpcSkel, GrpcSkelBuilder};

// The layout of struct grpc_key in bpf/requests.h (_Static_assert there too).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<skel::types::grpc_key>() == 16);
    assert!(offset_of!(skel::types::grpc_key, tgid) == 0);
    assert!(offset_of!(skel::types::grpc_key, stream) == 8);
};

/// The loaded gRPC programs and the links of each traced pid.
pub(crate) struct GrpcProbes<'o> {
    skel: GrpcSkel<'o>,
    links: HashMap<u32, Vec<Link>>,
}

impl<'o> GrpcProbes<'o> {
    /// Loads grpc.bpf.o on the maps `events` and `counters` of the request
    /// tracer.
    pub fn load(
        storage: &'o mut MaybeUninit<OpenObject>,
        events: impl AsFd,
        counters: impl AsFd,
        ringbuf_bytes: u32,
    ) -> Result<Self, String> {
        let mut open = GrpcSkelBuilder::default()
            .open(storage)
            .map_err(|e| format!("opening grpc.bpf.o: {e}"))?;
        let share = |e: libbpf_rs::Error| format!("sharing the ring buffer with grpc.bpf.o: {e}");
        open.maps
            .events
            .set_max_entries(ringbuf_bytes)
            .map_err(share)?;
        open.maps.events.reuse_fd(events.as_fd()).map_err(share)?;
        open.maps
            .counters
            .reuse_fd(counters.as_fd())
            .map_err(share)?;
        let skel = open
            .load()
            .map_err(|e| format!("loading the gRPC uprobes: {e}"))?;
        Ok(Self {
            skel,
            links: HashMap::new(),
        })
    }

    /// Attaches every site to `pid` only; all or nothing.
    pub fn attach(&mut self, pid: u32, sites: &[Site]) -> Result<(), String> {
        let mut links = Vec::with_capacity(sites.len());
        for s in sites {
            let p = &self.skel.progs;
            let prog = match s.prog {
                Prog::GoStreamHandOff => &p.go_stream_handoff,
                Prog::GoHandleStream => &p.go_handle_stream,
                Prog::GoWriteStatus => &p.go_write_status,
                Prog::CcoreStreamNew => &p.ccore_stream_new,
                Prog::CcoreStreamClosed => &p.ccore_stream_closed,
            };
            let offset = usize::try_from(s.offset).map_err(|_| "offset overflow".to_string())?;
            let pid_i = i32::try_from(pid).map_err(|_| format!("pid {pid} out of range"))?;
            let link = prog
                .attach_uprobe(false, pid_i, &s.path, offset)
                .map_err(|e| {
                    format!(
                        "attaching a uprobe to {} at {} (file offset {:#x}) in pid {pid}: {e}",
                        s.path.display(),
                        s.symbol,
                        s.offset
                    )
                })?;
            tracing::debug!(pid, path = %s.path.display(), symbol = %s.symbol, offset = s.offset, "uprobe attached");
            links.push(link);
        }
        self.links.insert(pid, links);
        Ok(())
    }

    /// Detaches the probes of `pid` (no-op if it has none) and forgets its
    /// calls in flight, so that a reused pid cannot end one of them.
    pub fn detach(&mut self, pid: u32) {
        if self.links.remove(&pid).is_none() {
            return;
        }
        let calls = &self.skel.maps.grpc_calls;
        let stale: Vec<Vec<u8>> = calls
            .keys()
            .filter(|k| k.get(..4).is_some_and(|t| t == pid.to_ne_bytes()))
            .collect();
        for k in stale {
            let _ = calls.delete(&k);
        }
    }
}

/// For `auto` and `grpc`: finds the process's gRPC library and attaches the
/// uprobes. Returns the mode to trace with (`grpc` falls back to `turn`),
/// the probed stack, and a warning when gRPC is there but not traceable.
pub(crate) fn attach_grpc(
    grpc: &mut Result<GrpcProbes<'_>, String>,
    pid: u32,
    mode: Mode,
) -> (Mode, Option<String>, Option<String>) {
    if !matches!(mode, Mode::Auto | Mode::Grpc) {
        return (mode, None, None);
    }
    let problem = match (grpc::discover(pid), grpc.as_mut()) {
        (Discovery::Probes { stack, sites }, Ok(probes)) => match probes.attach(pid, &sites) {
            Ok(()) => {
                tracing::info!(pid, %stack, "gRPC uprobes attached");
                return (mode, Some(stack), None);
            }
            Err(e) => e,
        },
        (Discovery::Probes { stack, .. }, Err(e)) => {
            format!("found {stack} in pid {pid}, but the gRPC uprobes did not load: {e}")
        }
        (Discovery::Unusable(why), _) => why,
        (Discovery::NotGrpc, _) if mode == Mode::Grpc => format!(
            "no gRPC server library in pid {pid} (neither grpc-go symbols in /proc/{pid}/exe \
             nor a gRPC C-core library in /proc/{pid}/maps)"
        ),
        (Discovery::NotGrpc, _) => return (mode, None, None),
    };
    let (mode, then) = if mode == Mode::Grpc {
        (Mode::Turn, "falling back to turn mode")
    } else {
        (mode, "auto mode chooses between connection and turn")
    };
    let warning = format!("{problem}; {then}");
    tracing::warn!(pid, "{warning}");
    (mode, None, Some(warning))
}
