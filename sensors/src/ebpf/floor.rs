//! The floor of the socket path's hooks (`bpf/floor.bpf.c`): programs that
//! return at once on every attach point of the request sensor, so that a
//! bench can price the dispatch of those hooks alone — what no program body
//! can win back — beside the tracer's full cost. A second floor prices a
//! design scoped to the server's cgroup (cgroup_skb ingress/egress, whose
//! programs run only for that cgroup's sockets, plus the one socket
//! tracepoint such a design still needs for the read: `sock_recv_length`).

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, OpenObject};

use super::TraceError;

#[allow(clippy::all, clippy::undocumented_unsafe_blocks)]
mod floor_skel {
    include!(concat!(env!("OUT_DIR"), "/floor.skel.rs"));
}

use floor_skel::{FloorSkel, FloorSkelBuilder};

/// Which hooks a floor takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorHooks<'a> {
    /// Every tracepoint of the socket path (node-wide, like the tracer).
    Tracepoints,
    /// cgroup_skb ingress + egress on this cgroup (v2) and the
    /// `sock_recv_length` tracepoint.
    Cgroup(&'a Path),
}

/// The empty programs, loaded once; attached and detached at will (a
/// bench's rounds) without loading again.
pub struct Floor<'o> {
    skel: FloorSkel<'o>,
    links: Vec<Link>,
}

fn attach_err(e: impl std::fmt::Display) -> TraceError {
    TraceError::Bpf(format!("attaching the floor programs: {e}"))
}

impl<'o> Floor<'o> {
    /// Loads the programs (needs root); nothing is attached yet.
    pub fn load(storage: &'o mut MaybeUninit<OpenObject>) -> Result<Self, TraceError> {
        let open = FloorSkelBuilder::default()
            .open(storage)
            .map_err(|e| TraceError::Bpf(format!("opening floor.bpf.o: {e}")))?;
        let skel = open
            .load()
            .map_err(|e| TraceError::Bpf(format!("loading the floor programs: {e}")))?;
        Ok(Floor {
            skel,
            links: vec![],
        })
    }

    /// Attaches the programs of `hooks` (what is attached stays).
    pub fn attach(&mut self, hooks: FloorHooks) -> Result<(), TraceError> {
        let p = &self.skel.progs;
        match hooks {
            FloorHooks::Tracepoints => {
                for prog in [
                    &p.floor_set_state,
                    &p.floor_ready,
                    &p.floor_recv,
                    &p.floor_send,
                    &p.floor_fork,
                    &p.floor_exit,
                ] {
                    self.links.push(prog.attach().map_err(attach_err)?);
                }
            }
            FloorHooks::Cgroup(dir) => {
                let cg = std::fs::File::open(dir)
                    .map_err(|e| attach_err(format!("opening {}: {e}", dir.display())))?;
                for prog in [&p.floor_ingress, &p.floor_egress] {
                    let link = prog.attach_cgroup(cg.as_raw_fd()).map_err(attach_err)?;
                    self.links.push(link);
                }
                self.links.push(p.floor_recv.attach().map_err(attach_err)?);
            }
        }
        Ok(())
    }

    /// Detaches them all (dropping the links); they stay loaded.
    pub fn detach(&mut self) {
        self.links.clear();
    }

    /// The programs, for their run statistics (`crate::bpfstats`).
    pub fn progs(&self) -> Vec<BorrowedFd<'_>> {
        let p = &self.skel.progs;
        vec![
            p.floor_set_state.as_fd(),
            p.floor_ready.as_fd(),
            p.floor_recv.as_fd(),
            p.floor_send.as_fd(),
            p.floor_fork.as_fd(),
            p.floor_exit.as_fd(),
            p.floor_ingress.as_fd(),
            p.floor_egress.as_fd(),
        ]
    }
}
