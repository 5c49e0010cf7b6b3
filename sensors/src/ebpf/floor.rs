//! The floor of the socket path's hooks (`bpf/floor.bpf.c`): programs that
//! return at once on every attach point of the request sensor, so that a
//! bench can price the dispatch of those hooks alone — what no program body
//! can win back — beside the tracer's full cost.

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::OpenObject;

use super::TraceError;

#[allow(clippy::all, clippy::undocumented_unsafe_blocks)]
mod floor_skel {
    include!(concat!(env!("OUT_DIR"), "/floor.skel.rs"));
}

use floor_skel::{FloorSkel, FloorSkelBuilder};

/// The empty programs, loaded once; attached and detached at will (a
/// bench's rounds) without loading again.
pub struct Floor<'o> {
    skel: FloorSkel<'o>,
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
        Ok(Floor { skel })
    }

    /// Attaches every program to its hook.
    pub fn attach(&mut self) -> Result<(), TraceError> {
        self.skel
            .attach()
            .map_err(|e| TraceError::Bpf(format!("attaching the floor programs: {e}")))
    }

    /// Detaches them all (dropping the links); they stay loaded.
    pub fn detach(&mut self) {
        self.skel.links = Default::default();
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
        ]
    }
}
