//! The tracer thread: owns the loaded BPF objects, applies target changes,
//! drains the ring buffer and feeds the per-target statistics.

use std::cell::RefCell;
use std::mem::{offset_of, size_of, MaybeUninit};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject, RingBufferBuilder};

use super::target::TargetStats;
use super::uprobes::{attach_grpc, GrpcProbes};
use super::{seed, Cmd, Mode, Shared, TargetOptions, TraceError, TracerOptions};

#[allow(clippy::all, clippy::undocumented_unsafe_blocks)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/requests.skel.rs"));
}

use skel::types::{conn_key, conn_state, port_key, req_record, target_cfg};
use skel::{RequestsSkel, RequestsSkelBuilder};

// Constants of bpf/requests.h.
const REC_TURN: u8 = 1;
const REC_CONN: u8 = 2;
const REC_GRPC: u8 = 3;
const REC_H2: u8 = 4;
const EMIT_TURN: u8 = 1;
const EMIT_CONN: u8 = 2;
const EMIT_H2: u8 = 4;
const CNT_LOST: u32 = 0;
const TGID_WORDS: u32 = 65536;
const ST_IDLE: u8 = 0;
const ST_RESPONDING: u8 = 2;
/// conn_id of connections seeded from /proc (see requests.bpf.c).
const SEEDED_ID_BIT: u64 = 1 << 63;

// The layout of bpf/requests.h, pinned on this side too (the C side has
// _Static_asserts with the same figures).
const _: () = {
    assert!(size_of::<req_record>() == 40);
    assert!(offset_of!(req_record, start_ns) == 0);
    assert!(offset_of!(req_record, end_ns) == 8);
    assert!(offset_of!(req_record, conn_id) == 16);
    assert!(offset_of!(req_record, tgid) == 24);
    assert!(offset_of!(req_record, fd) == 28);
    assert!(offset_of!(req_record, turns) == 32);
    assert!(offset_of!(req_record, kind) == 36);
    assert!(size_of::<conn_key>() == 8);
    assert!(size_of::<conn_state>() == 40);
    assert!(offset_of!(conn_state, state) == 38);
    assert!(size_of::<target_cfg>() == 8);
    assert!(size_of::<port_key>() == 8);
};

/// Views a plain-old-data BPF type as bytes for map updates.
fn bytes_of<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: T is one of the #[repr(C)] integer-only skeleton types; every
    // byte is initialised (explicit padding fields) and the slice borrows v.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

/// Reads a plain-old-data BPF type from bytes (unaligned).
pub(crate) fn read_pod<T: Copy + Default>(data: &[u8]) -> Option<T> {
    if data.len() < size_of::<T>() {
        return None;
    }
    let mut v = T::default();
    // SAFETY: T is #[repr(C)] made of integers (any bit pattern is valid),
    // and data holds at least size_of::<T>() bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            data.as_ptr(),
            (&mut v as *mut T).cast::<u8>(),
            size_of::<T>(),
        )
    };
    Some(v)
}

fn bpf_err(what: &str) -> impl Fn(libbpf_rs::Error) -> TraceError + '_ {
    move |e| TraceError::Bpf(format!("{what}: {e}"))
}

fn load<'o>(
    storage: &'o mut MaybeUninit<OpenObject>,
    opts: &TracerOptions,
) -> Result<RequestsSkel<'o>, TraceError> {
    let open = RequestsSkelBuilder::default()
        .open(storage)
        .map_err(bpf_err("opening requests.bpf.o"))?;
    let mut open = open;
    open.maps
        .events
        .set_max_entries(opts.ringbuf_bytes)
        .map_err(bpf_err("sizing the ring buffer"))?;
    if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
        // A quarter full wakes the reader at once (a burst must not fill
        // the buffer before the next timed poll); less waits for the poll.
        ro.wakeup_bytes = u64::from(opts.ringbuf_bytes / 4);
    }
    let mut skel = open.load().map_err(bpf_err("loading the request tracer"))?;
    skel.attach()
        .map_err(bpf_err("attaching the syscall tracepoints"))?;
    Ok(skel)
}

fn emit_bits(mode: Mode) -> u8 {
    match mode {
        Mode::Auto => EMIT_TURN | EMIT_CONN | EMIT_H2,
        Mode::Connection => EMIT_CONN,
        Mode::Turn => EMIT_TURN,
        // Calls come from the uprobes; the preface tells how many
        // connections carry them.
        Mode::Grpc => EMIT_H2,
    }
}

fn add_target(
    skel: &RequestsSkel<'_>,
    grpc: &mut Result<GrpcProbes<'_>, String>,
    shared: &Shared,
    window: usize,
    pid: u32,
    opts: &TargetOptions,
) -> Result<(), TraceError> {
    if pid == 0 || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Err(TraceError::NoSuchProcess(pid));
    }
    // Attached before the stats exist: a record that comes meanwhile has no
    // target and is dropped, like one from before tracing.
    let (mode, probes, warning) = attach_grpc(grpc, pid, opts.mode);
    let flags = MapFlags::ANY;
    let upd = |what, r: libbpf_rs::Result<()>| r.map_err(bpf_err(what));
    for &port in &opts.ports {
        let k = port_key {
            tgid: pid,
            port,
            pad: 0,
        };
        upd(
            "adding a port",
            skel.maps.ports.update(bytes_of(&k), &[1], flags),
        )?;
    }
    let emit = emit_bits(mode);
    let cfg = target_cfg {
        emit,
        port_filter: u8::from(!opts.ports.is_empty()),
        pad: [0; 6],
    };
    // Stats first, so that no syscall record of this pid finds nowhere to go.
    let mut stats = TargetStats::new(mode, window, super::monotonic_ns());
    stats.probes = probes;
    stats.warning = warning;
    shared
        .targets
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(pid, stats);
    upd(
        "adding the target",
        skel.maps
            .targets
            .update(bytes_of(&pid), bytes_of(&cfg), flags),
    )?;
    set_traced(skel, pid, true).map_err(bpf_err("marking the pid traced"))?;
    for (i, (fd, port)) in seed::accepted_connections(pid).into_iter().enumerate() {
        if !opts.ports.is_empty() && !opts.ports.contains(&port) {
            continue;
        }
        let k = conn_key { tgid: pid, fd };
        let v = conn_state {
            conn_id: SEEDED_ID_BIT | i as u64,
            port,
            state: ST_IDLE,
            emit,
            ..Default::default()
        };
        // NOEXIST: a connection accepted meanwhile is already tracked.
        let _ = skel
            .maps
            .conns
            .update(bytes_of(&k), bytes_of(&v), MapFlags::NO_EXIST);
    }
    tracing::info!(pid, %mode, ports = ?opts.ports, "tracing requests");
    Ok(())
}

/// Sets or clears pid's bit in the `traced` bitmap, the programs' first
/// test (bit pid % 64 of word pid / 64; the tracer thread is its only
/// writer, so read-modify-write is safe).
fn set_traced(skel: &RequestsSkel<'_>, pid: u32, on: bool) -> libbpf_rs::Result<()> {
    let word = pid / 64;
    if word >= TGID_WORDS {
        return Err(libbpf_rs::Error::from(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("pid {pid} is beyond PID_MAX_LIMIT"),
        )));
    }
    let old = skel
        .maps
        .traced
        .lookup(bytes_of(&word), MapFlags::ANY)?
        .and_then(|v| read_pod::<u64>(&v))
        .unwrap_or(0);
    let bit = 1u64 << (pid % 64);
    let new = if on { old | bit } else { old & !bit };
    skel.maps
        .traced
        .update(bytes_of(&word), bytes_of(&new), MapFlags::ANY)
}

fn conns_of(skel: &RequestsSkel<'_>, pid: u32) -> Vec<(Vec<u8>, conn_state)> {
    skel.maps
        .conns
        .keys()
        .filter_map(|k| {
            let key: conn_key = read_pod(&k)?;
            if key.tgid != pid {
                return None;
            }
            let v = skel.maps.conns.lookup(&k, MapFlags::ANY).ok()??;
            Some((k, read_pod(&v)?))
        })
        .collect()
}

fn remove_target(skel: &RequestsSkel<'_>, grpc: &mut Result<GrpcProbes<'_>, String>, pid: u32) {
    if let Ok(g) = grpc.as_mut() {
        g.detach(pid);
    }
    // First, so that the programs stop looking at the pid at once.
    let _ = set_traced(skel, pid, false);
    let _ = skel.maps.targets.delete(bytes_of(&pid));
    for (k, _) in conns_of(skel, pid) {
        let _ = skel.maps.conns.delete(&k);
    }
    let ports: Vec<Vec<u8>> = skel
        .maps
        .ports
        .keys()
        .filter(|k| read_pod::<port_key>(k).is_some_and(|p| p.tgid == pid))
        .collect();
    for k in ports {
        let _ = skel.maps.ports.delete(&k);
    }
}

/// Turns whose reply went out on connections still open: finished
/// requests whose end the kernel only learns at the next inbound bytes.
fn flush_open(skel: &RequestsSkel<'_>, pid: u32) -> Vec<req_record> {
    conns_of(skel, pid)
        .into_iter()
        .filter(|(_, c)| c.state == ST_RESPONDING && c.emit & EMIT_TURN != 0)
        .map(|(k, c)| {
            let mut idle = c;
            idle.state = ST_IDLE;
            let _ = skel.maps.conns.update(&k, bytes_of(&idle), MapFlags::EXIST);
            let key: conn_key = read_pod(&k).unwrap_or_default();
            req_record {
                start_ns: c.req_start_ns,
                end_ns: c.last_out_ns,
                conn_id: c.conn_id,
                tgid: pid,
                fd: key.fd,
                turns: c.turns,
                kind: REC_TURN,
                pad: [0; 3],
            }
        })
        .collect()
}

fn ingest(shared: &Shared, records: &mut Vec<req_record>) {
    if records.is_empty() {
        return;
    }
    let mut targets = shared.targets.lock().unwrap_or_else(|e| e.into_inner());
    for r in records.drain(..) {
        let Some(t) = targets.get_mut(&r.tgid) else {
            continue;
        };
        let latency = r.end_ns.saturating_sub(r.start_ns);
        match r.kind {
            REC_TURN => {
                if r.turns == 1 {
                    t.first_turns += 1;
                }
                t.turn.record(r.end_ns, latency);
            }
            REC_CONN => t.conn.record(r.end_ns, latency),
            REC_GRPC => t.grpc.record(r.end_ns, latency),
            REC_H2 => t.h2_conns += 1,
            _ => {}
        }
    }
}

fn lost_records(skel: &RequestsSkel<'_>) -> u64 {
    let Ok(Some(per_cpu)) = skel
        .maps
        .counters
        .lookup_percpu(bytes_of(&CNT_LOST), MapFlags::ANY)
    else {
        return 0;
    };
    per_cpu.iter().filter_map(|v| read_pod::<u64>(v)).sum()
}

/// Pids that have exited since the last check, marked as such.
fn newly_exited(shared: &Shared) -> Vec<u32> {
    let mut targets = shared.targets.lock().unwrap_or_else(|e| e.into_inner());
    targets
        .iter_mut()
        .filter(|(pid, t)| !t.exited && !std::path::Path::new(&format!("/proc/{pid}")).exists())
        .map(|(pid, t)| {
            t.exited = true;
            *pid
        })
        .collect()
}

/// The thread body: load, report readiness, then poll until told to stop.
pub(super) fn run(
    opts: TracerOptions,
    shared: Arc<Shared>,
    cmds: mpsc::Receiver<Cmd>,
    ready: mpsc::Sender<Result<(), TraceError>>,
) {
    let mut storage = MaybeUninit::uninit();
    let skel = match load(&mut storage, &opts) {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    // Declared after `skel`, so dropped (detached) before it.
    let mut grpc_storage = MaybeUninit::uninit();
    let mut grpc = GrpcProbes::load(
        &mut grpc_storage,
        &skel.maps.events,
        &skel.maps.counters,
        opts.ringbuf_bytes,
    );
    if let Err(e) = &grpc {
        // Syscall tracing still works; gRPC targets get this as a warning.
        tracing::warn!("gRPC uprobes unavailable: {e}");
    }
    let pending: RefCell<Vec<req_record>> = RefCell::new(Vec::with_capacity(4096));
    let mut builder = RingBufferBuilder::new();
    let added = builder.add(&skel.maps.events, |data: &[u8]| {
        if let Some(r) = read_pod::<req_record>(data) {
            pending.borrow_mut().push(r);
        }
        0
    });
    let ring = match added.map(|_| ()).and_then(|()| builder.build()) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(TraceError::Bpf(format!(
                "opening the ring buffer: {e}"
            ))));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    // Everything the kernel has sent so far, into the statistics.
    let drain = |batch: &mut Vec<req_record>| {
        let _ = ring.consume();
        std::mem::swap(batch, &mut *pending.borrow_mut());
        ingest(&shared, batch);
    };
    // Replies already sent on connections still open are finished requests
    // (their end is otherwise only known at the next inbound bytes).
    let flush = |batch: &mut Vec<req_record>, pid: u32| {
        drain(batch); // a close already sent must not count twice
        let mut open = flush_open(&skel, pid);
        ingest(&shared, &mut open);
    };
    let mut last_check = Instant::now();
    let mut batch = Vec::with_capacity(4096);
    loop {
        if let Err(e) = ring.poll(Duration::from_millis(20)) {
            tracing::warn!("polling the ring buffer: {e}");
        }
        // Records below the wakeup threshold raise no epoll event: take
        // them now (the poll above was their timer).
        if let Err(e) = ring.consume() {
            tracing::warn!("reading the ring buffer: {e}");
        }
        drain(&mut batch);
        loop {
            match cmds.try_recv() {
                Ok(Cmd::Add(pid, t, reply)) => {
                    let r = add_target(&skel, &mut grpc, &shared, opts.window, pid, &t);
                    let _ = reply.send(r);
                }
                Ok(Cmd::Remove(pid, reply)) => {
                    remove_target(&skel, &mut grpc, pid);
                    shared
                        .targets
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&pid);
                    let _ = reply.send(Ok(()));
                }
                Ok(Cmd::FlushOpen(pid, reply)) => {
                    flush(&mut batch, pid);
                    let _ = reply.send(Ok(()));
                }
                Ok(Cmd::Stop) | Err(mpsc::TryRecvError::Disconnected) => return,
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
        if last_check.elapsed() >= Duration::from_millis(200) {
            last_check = Instant::now();
            shared.dropped.store(lost_records(&skel), Ordering::Relaxed);
            for pid in newly_exited(&shared) {
                tracing::info!(pid, "traced process exited");
                // Its last replies were complete; then stop matching the
                // pid in the kernel (it may be reused).
                flush(&mut batch, pid);
                remove_target(&skel, &mut grpc, pid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_through_bytes() {
        let r = req_record {
            start_ns: 1,
            end_ns: 2,
            conn_id: 3,
            tgid: 4,
            fd: 5,
            turns: 6,
            kind: REC_CONN,
            pad: [0; 3],
        };
        let back: req_record = read_pod(bytes_of(&r)).unwrap();
        assert_eq!(
            (
                back.start_ns,
                back.end_ns,
                back.conn_id,
                back.tgid,
                back.fd,
                back.turns,
                back.kind
            ),
            (1, 2, 3, 4, 5, 6, REC_CONN)
        );
        assert!(read_pod::<req_record>(&[0u8; 39]).is_none());
    }
}
