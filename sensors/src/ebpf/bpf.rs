//! The tracer thread: owns the loaded BPF objects, applies target changes,
//! drains the ring buffer and feeds the per-target statistics.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use libbpf_rs::{MapCore, MapFlags, RingBuffer, RingBufferBuilder};

use super::abi::*;
use super::agg::AggReader;
use super::hooks::{self, sock_skel, sys_skel, Hooks, Maps};
use super::sockfds::SocketFds;
use super::target::TargetStats;
use super::uprobes::{attach_grpc, GrpcProbes};
use super::{seed, Cmd, Mode, Shared, TargetOptions, TraceError, TracerOptions};

use sock_skel::types::sock_state;
use sys_skel::types::{conn_key, conn_state, port_key, req_record, target_cfg};

mod open;
use open::{flush_open, remove_target, Followed};

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
    let mut stats = TargetStats::new(mode, window, qosd_core::clock::monotonic_ns());
    stats.probes = probes;
    stats.warning = warning;
    shared.lock_targets().insert(pid, stats);
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

/// The traced-port bitmap as last written and the listening ports found.
#[derive(Default)]
struct Ports {
    shadow: Vec<u64>,
    listen: seed::ListenCache,
}

/// Listening ports of every traced process (socket path): the bitmap the
/// softirq programs test first. Honours each target's port filter.
fn refresh_ports(maps: &Maps<'_>, shared: &Shared, state: &mut Ports) {
    if maps.lports.is_none() {
        return;
    }
    let roots: Vec<(u32, Vec<u16>)> = shared
        .lock_targets()
        .iter()
        .map(|(pid, t)| (*pid, t.ports.clone()))
        .collect();
    let mut ports = Vec::new();
    let mut seen = Vec::new();
    for (root, filter) in roots {
        for m in members_of(maps, root) {
            ports.extend(
                state
                    .listen
                    .ports(m)
                    .into_iter()
                    .filter(|p| filter.is_empty() || filter.contains(p)),
            );
            seen.push(m);
        }
    }
    state.listen.retain(&seen);
    if let Err(e) = hooks::set_ports(maps, &mut state.shadow, ports) {
        tracing::warn!("updating the traced-port bitmap: {e}");
    }
}

fn ingest(shared: &Shared, records: &mut Vec<req_record>) {
    if records.is_empty() {
        return;
    }
    let mut targets = shared.lock_targets();
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
                // this turn's replies; a TLS handshake turn stands for
                // none (bpf/count.h).
                t.turn
                    .record_turn(r.arrive_ns, r.start_ns, r.end_ns, r.nreq);
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
    let mut targets = shared.lock_targets();
    targets
        .iter_mut()
        .filter(|(pid, t)| !t.exited && !std::path::Path::new(&format!("/proc/{pid}")).exists())
        .map(|(pid, t)| {
            t.exited = true;
            *pid
        })
        .collect()
}

/// The ring buffer's records, as the callback leaves them for the loop.
type Records = RefCell<Vec<req_record>>;

/// The ring buffer over the events map, its records collected in `pending`.
fn open_ring<'a>(maps: &Maps<'a>, pending: &'a Records) -> Result<RingBuffer<'a>, TraceError> {
    let mut builder = RingBufferBuilder::new();
    let added = builder
        .add(maps.events, |data: &[u8]| {
            if let Some(r) = read_pod::<req_record>(data) {
                pending.borrow_mut().push(r);
            }
            0
        })
        .map(|_| ());
    added
        .and_then(|()| builder.build())
        .map_err(|e| TraceError::Bpf(format!("opening the ring buffer: {e}")))
}

/// Starts tracing `pid` for the caller: the kernel's target and its
/// request histograms; then the ports it listens on, before the reply, so
/// that what the caller sends next is seen.
fn on_add(
    maps: &Maps<'_>,
    grpc: &mut Result<GrpcProbes<'_>, String>,
    shared: &Shared,
    agg: &RefCell<AggReader>,
    (window, pid, t): (usize, u32, &TargetOptions),
    port_shadow: &mut Ports,
) -> Result<(), TraceError> {
    add_target(maps, grpc, shared, window, pid, t)?;
    agg.borrow_mut()
        .add(maps, pid)
        .map_err(bpf_err("making the request histograms"))?;
    if let Some(st) = shared.lock_targets().get_mut(&pid) {
        st.ports = t.ports.clone();
    }
    refresh_ports(maps, shared, port_shadow);
    Ok(())
}

/// Every 200 ms: the lost-record and by-turns counters, the replies in
/// flight of followed children that exited (`reap`, [`Followed`]), and the
/// traced processes that exited (their last replies were complete; then
/// the pid is no longer matched in the kernel, as it may be reused).
fn check_counters_and_exits(
    maps: &Maps<'_>,
    grpc: &mut Result<GrpcProbes<'_>, String>,
    shared: &Shared,
    agg: &RefCell<AggReader>,
    reap: impl FnOnce() -> Vec<req_record>,
    flush: &mut dyn FnMut(u32),
) {
    ingest(shared, &mut reap());
    shared
        .dropped
        .store(counter(maps, CNT_LOST), Ordering::Relaxed);
    let gave_up = counter(maps, CNT_GAVE_UP);
    shared.by_turns.store(gave_up, Ordering::Relaxed);
    let timed = counter(maps, CNT_BY_TURNS);
    shared.timed_by_turns.store(timed, Ordering::Relaxed);
    for pid in newly_exited(shared) {
        tracing::info!(pid, "traced process exited");
        flush(pid);
        remove_target(maps, grpc, pid);
        agg.borrow_mut().remove(maps, shared, pid);
    }
}

/// `Cmd::Remove`: the target leaves the kernel's maps, the histograms and
/// the statistics, and its ports stop being traced.
fn on_remove(
    maps: &Maps<'_>,
    grpc: &mut Result<GrpcProbes<'_>, String>,
    shared: &Shared,
    agg: &RefCell<AggReader>,
    pid: u32,
    port_shadow: &mut Ports,
) {
    remove_target(maps, grpc, pid);
    agg.borrow_mut().remove(maps, shared, pid);
    shared.lock_targets().remove(&pid);
    refresh_ports(maps, shared, port_shadow);
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
    let pending: Records = RefCell::new(Vec::with_capacity(4096));
    let ring = match open_ring(&maps, &pending) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(e));
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
    let followed = RefCell::new(Followed::default());
    let flush = |batch: &mut Vec<req_record>, pid: u32| {
        drain(batch, true); // a close already sent must not count twice
        let mut open = followed.borrow_mut().reap(&maps);
        open.extend(flush_open(&maps, pid));
        ingest(&shared, &mut open);
    };
    let mut last_check = Instant::now();
    let mut last_ports = Instant::now();
    let mut port_shadow = Ports::default();
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
                    let what = (opts.window, pid, &t);
                    let r = on_add(&maps, &mut grpc, &shared, &agg, what, &mut port_shadow);
                    let _ = reply.send(r);
                }
                Ok(Cmd::Remove(pid, reply)) => {
                    on_remove(&maps, &mut grpc, &shared, &agg, pid, &mut port_shadow);
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
            let mut flush_pid = |pid| flush(&mut batch, pid);
            let reap = || followed.borrow_mut().reap(&maps);
            check_counters_and_exits(&maps, &mut grpc, &shared, &agg, reap, &mut flush_pid);
        }
        // A traced process (or a child) may listen on a new port.
        if last_ports.elapsed() >= Duration::from_secs(1) {
            last_ports = Instant::now();
            refresh_ports(&maps, &shared, &mut port_shadow);
        }
    }
}
