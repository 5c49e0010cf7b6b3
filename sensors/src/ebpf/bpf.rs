//! The tracer thread: owns the loaded BPF objects, applies target changes,
//! drains the ring buffer and feeds the per-target statistics.

use std::cell::RefCell;
use std::mem::{offset_of, size_of, MaybeUninit};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use libbpf_rs::{MapCore, MapFlags, RingBufferBuilder};

use super::agg::AggReader;
use super::hooks::{self, sock_skel, sys_skel, Hooks, Maps};
use super::sockfds::SocketFds;
use super::target::TargetStats;
use super::uprobes::{attach_grpc, GrpcProbes};
use super::{seed, Cmd, Mode, Shared, TargetOptions, TraceError, TracerOptions};

use sock_skel::types::sock_state;
use sys_skel::types::{conn_key, conn_state, port_key, req_record, target_cfg};

mod open;
use open::{flush_open, remove_target};

// Constants of bpf/requests.h.
pub(crate) const REC_TURN: u8 = 1;
pub(crate) const REC_CONN: u8 = 2;
const REC_GRPC: u8 = 3;
const REC_H2: u8 = 4;
const EMIT_TURN: u8 = 1;
const EMIT_CONN: u8 = 2;
const EMIT_H2: u8 = 4;
const CNT_LOST: u32 = 0;
const CNT_GAVE_UP: u32 = 2;
const TGID_WORDS: u32 = 65536;
const ST_IDLE: u8 = 0;
const ST_RESPONDING: u8 = 2;
/// conn_id of connections seeded from /proc (see requests.bpf.c).
const SEEDED_ID_BIT: u64 = 1 << 63;

// The layout of bpf/requests.h, pinned on this side too (the C side has
// _Static_asserts with the same figures).
const _: () = {
    assert!(size_of::<req_record>() == 48);
    assert!(offset_of!(req_record, start_ns) == 0);
    assert!(offset_of!(req_record, end_ns) == 8);
    assert!(offset_of!(req_record, conn_id) == 16);
    assert!(offset_of!(req_record, tgid) == 24);
    assert!(offset_of!(req_record, fd) == 28);
    assert!(offset_of!(req_record, turns) == 32);
    assert!(offset_of!(req_record, kind) == 36);
    assert!(offset_of!(req_record, nreq) == 38);
    assert!(offset_of!(req_record, arrive_ns) == 40);
    assert!(size_of::<sock_state>() == 88);
    assert!(offset_of!(sock_state, nreq) == 68);
    assert!(offset_of!(sock_state, tgid) == 56);
    assert!(offset_of!(sock_state, state) == 66);
    assert!(size_of::<sock_skel::types::req_record>() == 48);
    assert!(size_of::<conn_key>() == 8);
    assert!(size_of::<conn_state>() == 64);
    assert!(offset_of!(conn_state, nreq) == 40);
    assert!(offset_of!(conn_state, state) == 38);
    assert!(size_of::<target_cfg>() == 8);
    assert!(offset_of!(target_cfg, root) == 4);
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

/// The target settings of `pid`, counted under `root`.
fn cfg_of(opts: &TargetOptions, emit: u8, root: u32) -> target_cfg {
    target_cfg {
        emit,
        port_filter: u8::from(!opts.ports.is_empty()),
        follow: u8::from(opts.follow_children),
        pad: 0,
        root,
    }
}

/// Adds `pid` (and with `follow_children`, its live descendants) to the
/// traced set.
fn add_target(
    maps: &Maps<'_>,
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
            maps.ports.update(bytes_of(&k), &[1], flags),
        )?;
    }
    let emit = emit_bits(mode);
    // Stats first, so that no record of this pid finds nowhere to go.
    let mut stats = TargetStats::new(mode, window, super::monotonic_ns());
    stats.probes = probes;
    stats.warning = warning;
    shared
        .targets
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(pid, stats);
    let sockets = maps.lports.is_some();
    let mut members = vec![pid];
    if opts.follow_children {
        members.extend(super::descendants(pid));
    }
    for &m in &members {
        let cfg = cfg_of(opts, emit, pid);
        upd(
            "adding the target",
            maps.targets.update(bytes_of(&m), bytes_of(&cfg), flags),
        )?;
        set_traced(maps, m, true).map_err(bpf_err("marking the pid traced"))?;
    }
    if !sockets {
        for &m in &members {
            seed_syscall_conns(maps, m, opts, emit);
        }
    }
    // The socket path adopts connections open before tracing at their
    // first event; it needs the listening ports (refreshed by the caller).
    tracing::info!(pid, %mode, ports = ?opts.ports, followed = members.len() - 1,
        "tracing requests");
    Ok(())
}

/// The syscall path keys connections by fd: those accepted before tracing
/// began are found in /proc.
fn seed_syscall_conns(maps: &Maps<'_>, pid: u32, opts: &TargetOptions, emit: u8) {
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
        let _ = maps
            .conns
            .update(bytes_of(&k), bytes_of(&v), MapFlags::NO_EXIST);
    }
}

/// Sets or clears pid's bit in the `traced` bitmap, the programs' first
/// test (bit pid % 64 of word pid / 64). The kernel sets bits too (forks
/// on the socket path): a fork in the very word being rewritten here can
/// lose its bit, a race of microseconds at target changes only.
fn set_traced(maps: &Maps<'_>, pid: u32, on: bool) -> libbpf_rs::Result<()> {
    let word = pid / 64;
    if word >= TGID_WORDS {
        return Err(libbpf_rs::Error::from(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("pid {pid} is beyond PID_MAX_LIMIT"),
        )));
    }
    let old = maps
        .traced
        .lookup(bytes_of(&word), MapFlags::ANY)?
        .and_then(|v| read_pod::<u64>(&v))
        .unwrap_or(0);
    let bit = 1u64 << (pid % 64);
    let new = if on { old | bit } else { old & !bit };
    maps.traced
        .update(bytes_of(&word), bytes_of(&new), MapFlags::ANY)
}

/// The tgids traced under `root` (itself and followed descendants).
fn members_of(maps: &Maps<'_>, root: u32) -> Vec<u32> {
    maps.targets
        .keys()
        .filter_map(|k| {
            let tgid: u32 = read_pod(&k)?;
            let v = maps.targets.lookup(&k, MapFlags::ANY).ok()??;
            let cfg: target_cfg = read_pod(&v)?;
            (cfg.root == root || tgid == root).then_some(tgid)
        })
        .collect()
}

/// The TURN record of a reply in flight and the connection's entry made
/// idle, to write back once it is counted.
type Pending = Option<(req_record, Vec<u8>)>;

/// Listening ports of every traced process (socket path): the bitmap the
/// softirq programs test first. Honours each target's port filter.
fn refresh_ports(maps: &Maps<'_>, shared: &Shared, shadow: &mut Vec<u64>) {
    if maps.lports.is_none() {
        return;
    }
    let roots: Vec<(u32, Vec<u16>)> = shared
        .targets
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(pid, t)| (*pid, t.ports.clone()))
        .collect();
    let mut ports = Vec::new();
    for (root, filter) in roots {
        for m in members_of(maps, root) {
            ports.extend(
                seed::listening_ports(m)
                    .into_iter()
                    .filter(|p| filter.is_empty() || filter.contains(p)),
            );
        }
    }
    if let Err(e) = hooks::set_ports(maps, shadow, ports) {
        tracing::warn!("updating the traced-port bitmap: {e}");
    }
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
        // Arrival is never after the first read; a record that says so
        // (clock of another CPU) is taken as arriving at the read.
        let latency = r.end_ns.saturating_sub(r.arrive_ns.min(r.start_ns));
        let service = r.end_ns.saturating_sub(r.start_ns);
        match r.kind {
            REC_TURN => {
                if r.turns == 1 {
                    t.first_turns += 1;
                }
                // Requests read together (pipelined) were answered by
                // this turn's replies: each is timed as the turn; a TLS
                // handshake turn stands for none (bpf/count.h).
                for _ in 0..r.nreq {
                    t.turn.record(r.end_ns, latency, service);
                }
            }
            REC_CONN => t.conn.record(r.end_ns, latency, service),
            REC_GRPC => t.grpc.record(r.end_ns, latency, service),
            REC_H2 => t.h2_conns += 1,
            _ => {}
        }
    }
}

/// One of the per-CPU counters (QOSD_CNT_*), summed over the CPUs.
fn counter(maps: &Maps<'_>, idx: u32) -> u64 {
    let Ok(Some(per_cpu)) = maps.counters.lookup_percpu(bytes_of(&idx), MapFlags::ANY) else {
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
    ready: mpsc::Sender<Result<(Hooks, Option<String>), TraceError>>,
) {
    let mut sock_storage = MaybeUninit::uninit();
    let mut sys_storage = MaybeUninit::uninit();
    let (loaded, why) = match hooks::load(&mut sock_storage, &mut sys_storage, &opts) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let maps = loaded.maps();
    // Declared after `loaded`, so dropped (detached) before it.
    let mut grpc_storage = MaybeUninit::uninit();
    let mut grpc = GrpcProbes::load(
        &mut grpc_storage,
        maps.events,
        maps.counters,
        opts.ringbuf_bytes,
    );
    if let Err(e) = &grpc {
        // Request tracing still works; gRPC targets get this as a warning.
        tracing::warn!("gRPC uprobes unavailable: {e}");
    }
    let pending: RefCell<Vec<req_record>> = RefCell::new(Vec::with_capacity(4096));
    let mut builder = RingBufferBuilder::new();
    let added = builder.add(maps.events, |data: &[u8]| {
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
    let _ = ready.send(Ok((loaded.hooks(), why)));
    let agg = RefCell::new(AggReader::new(opts.aggregate));
    // Everything the kernel has sent or counted so far (the histograms
    // every READ_EVERY, or `now`), into the statistics.
    let drain = |batch: &mut Vec<req_record>, now: bool| {
        let _ = ring.consume();
        std::mem::swap(batch, &mut *pending.borrow_mut());
        ingest(&shared, batch);
        agg.borrow_mut().read(&maps, &shared, now);
    };
    // Replies already sent on connections still open are finished requests
    // (their end is otherwise only known at the next inbound bytes).
    let flush = |batch: &mut Vec<req_record>, pid: u32| {
        drain(batch, true); // a close already sent must not count twice
        let mut open = flush_open(&maps, pid);
        ingest(&shared, &mut open);
    };
    let mut last_check = Instant::now();
    let mut last_ports = Instant::now();
    let mut port_shadow = Vec::new();
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
        drain(&mut batch, false);
        loop {
            match cmds.try_recv() {
                Ok(Cmd::Add(pid, t, reply)) => {
                    let r = add_target(&maps, &mut grpc, &shared, opts.window, pid, &t).and_then(
                        |()| {
                            agg.borrow_mut()
                                .add(&maps, pid)
                                .map_err(bpf_err("making the request histograms"))
                        },
                    );
                    if r.is_ok() {
                        if let Some(st) = shared
                            .targets
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_mut(&pid)
                        {
                            st.ports = t.ports.clone();
                        }
                        // Before the reply: what the caller sends next is seen.
                        refresh_ports(&maps, &shared, &mut port_shadow);
                    }
                    let _ = reply.send(r);
                }
                Ok(Cmd::Remove(pid, reply)) => {
                    remove_target(&maps, &mut grpc, pid);
                    agg.borrow_mut().remove(&maps, &shared, pid);
                    shared
                        .targets
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&pid);
                    refresh_ports(&maps, &shared, &mut port_shadow);
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
            shared
                .dropped
                .store(counter(&maps, CNT_LOST), Ordering::Relaxed);
            let gave_up = counter(&maps, CNT_GAVE_UP);
            shared.by_turns.store(gave_up, Ordering::Relaxed);
            for pid in newly_exited(&shared) {
                tracing::info!(pid, "traced process exited");
                // Its last replies were complete; then stop matching the
                // pid in the kernel (it may be reused).
                flush(&mut batch, pid);
                remove_target(&maps, &mut grpc, pid);
                agg.borrow_mut().remove(&maps, &shared, pid);
            }
        }
        // A traced process (or a child) may listen on a new port.
        if last_ports.elapsed() >= Duration::from_secs(1) {
            last_ports = Instant::now();
            refresh_ports(&maps, &shared, &mut port_shadow);
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
            pad: 0,
            nreq: 8,
            arrive_ns: 7,
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
                back.kind,
                back.arrive_ns,
                back.nreq
            ),
            (1, 2, 3, 4, 5, 6, REC_CONN, 7, 8)
        );
        assert!(read_pod::<req_record>(&[0u8; 47]).is_none());
    }
}
