//! The eBPF request sensor: per-request, server-side latency and throughput
//! of running processes, from socket tracepoints (or syscall tracepoints
//! where the kernel lacks those), with no change to the application and no
//! client feedback.
//!
//! [`RequestTracer`] loads `bpf/sockets.bpf.c` (or, as the fallback,
//! `bpf/requests.bpf.c`; see [`hooks`]) and `bpf/grpc.bpf.c` (gRPC
//! uprobes, attached per process) once and traces any number of processes.
//! Per pid it answers the four calls of the eBeeMetrics paper (`rps`,
//! `latest_latency`, `average_latency`, `latency_percentile`) over a window
//! of the last N requests, for either [`Figure`] (latency from the
//! request's arrival, or service from the server's first read), plus
//! counts, drops and the request boundary mode in use. The kernel side
//! emits one record per request; the statistics are all done here (see
//! [`crate::stats`]).

mod abi;
pub(crate) use abi::read_pod;
mod agg;
mod auto;
mod bpf;
pub mod floor;
mod grpc;
pub mod hooks;
mod probe;
mod seed;
mod sockfds;
mod target;
mod uprobes;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use qosd_core::clock::monotonic_ns;

pub use agg::Aggregate;
pub use hooks::{HookChoice, Hooks};
pub use probe::check_environment;

/// Every live descendant of `pid`, from /proc: what tracing `pid` follows
/// on the socket path.
pub fn descendants(pid: u32) -> Vec<u32> {
    let root = qosd_core::sys::Root::default();
    qosd_core::sys::tree::descendants(&root, pid as i32)
        .into_iter()
        .map(|p| p as u32)
        .collect()
}
pub use target::{Figure, KindReport, TargetReport};

use target::TargetStats;

/// How a target's byte stream is cut into requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Pick `Connection`, `Turn` or `Grpc` per target from what is observed.
    #[default]
    Auto,
    /// One request per accepted connection: accept -> close.
    Connection,
    /// Request/response turns on persistent connections: first inbound bytes
    /// after the server last wrote -> last outbound bytes before the next
    /// inbound bytes or the close.
    Turn,
    /// gRPC calls multiplexed as HTTP/2 streams: uprobes on the server's
    /// gRPC library (grpc-go or C-core), from the call's start to its status
    /// being written. Falls back to `Turn` with a warning where the library
    /// cannot be probed.
    Grpc,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Connection => "connection",
            Mode::Turn => "turn",
            Mode::Grpc => "grpc",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Mode::Auto),
            "connection" => Ok(Mode::Connection),
            "turn" => Ok(Mode::Turn),
            "grpc" => Ok(Mode::Grpc),
            _ => Err(format!(
                "unknown mode {s:?}: expected auto, connection, turn or grpc"
            )),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Settings of the tracer as a whole.
/// The largest ring buffer the tracer takes (1 GiB): far above any need,
/// and checked by the config too so `qosd check` refuses what `run` would.
pub const MAX_RINGBUF_BYTES: u32 = 1 << 30;

/// Bytes one request record takes in the ring buffer: the 48-byte record
/// and the buffer's 8-byte header (`QOSD_REC_FOOTPRINT`, bpf/emit.h).
pub const RECORD_FOOTPRINT: u32 = 56;

/// The smallest ring buffer (a power of two, 4 KiB at least) that holds
/// `records` records should the reader not run at all meanwhile: 128 KiB
/// holds 2340, 64 KiB only 1170.
pub fn ringbuf_bytes_for(records: u32) -> u32 {
    records
        .saturating_mul(RECORD_FOOTPRINT)
        .max(4096)
        .checked_next_power_of_two()
        .unwrap_or(MAX_RINGBUF_BYTES)
        .min(MAX_RINGBUF_BYTES)
}

#[derive(Debug, Clone)]
pub struct TracerOptions {
    /// Size of the BPF ring buffer, bytes: a power of two, 4096 to
    /// [`MAX_RINGBUF_BYTES`].
    pub ringbuf_bytes: u32,
    /// Latencies kept per target for the windowed calls.
    pub window: usize,
    /// Which kernel path to use (`Auto`: sockets where the kernel has them).
    pub hooks: HookChoice,
    /// Where requests are aggregated (`QOSD_AGGREGATE` sets the default).
    pub aggregate: Aggregate,
}

impl Default for TracerOptions {
    fn default() -> Self {
        Self {
            ringbuf_bytes: 128 * 1024,
            window: 100_000,
            // QOSD_HOOKS=syscalls|sockets|auto: how a whole test suite (or
            // a daemon on a doubtful kernel) is run on one path.
            hooks: std::env::var("QOSD_HOOKS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or_default(),
            aggregate: Aggregate::from_env(),
        }
    }
}

/// Settings of one traced process.
#[derive(Debug, Clone, Default)]
pub struct TargetOptions {
    pub mode: Mode,
    /// Only connections accepted on these local ports count (empty: all).
    pub ports: Vec<u16>,
    /// Also trace its descendants, present and forked later, counting
    /// their requests under this pid (on either kernel path).
    pub follow_children: bool,
}

/// Why tracing could not start or a target could not be added.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{0}")]
    Environment(String),
    #[error("no such process: pid {0}")]
    NoSuchProcess(u32),
    #[error("invalid option: {0}")]
    InvalidOption(String),
    #[error("eBPF: {0}")]
    Bpf(String),
}

impl TraceError {
    /// Whether the caller's input is at fault (exit code 2 in the CLI).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            TraceError::NoSuchProcess(_) | TraceError::InvalidOption(_)
        )
    }
}

type Reply = mpsc::Sender<Result<(), TraceError>>;

enum Cmd {
    Add(u32, TargetOptions, Reply),
    Remove(u32, Reply),
    /// Count the requests whose reply was sent but whose connection is
    /// still open (their end is otherwise only known at the next inbound
    /// bytes or the close).
    FlushOpen(u32, Reply),
    Stop,
}

/// State shared between the tracer thread and the callers.
struct Shared {
    targets: Mutex<HashMap<u32, TargetStats>>,
    dropped: AtomicU64,
    /// QOSD_CNT_GAVE_UP: connections of a known protocol counted by turns.
    by_turns: AtomicU64,
    /// QOSD_CNT_BY_TURNS: HTTP connections whose requests are timed by
    /// turns after all (their replies could not be followed).
    timed_by_turns: AtomicU64,
}

impl Shared {
    /// The per-target statistics. A panic while holding the lock leaves
    /// plain counters behind: still readable.
    fn lock_targets(&self) -> MutexGuard<'_, HashMap<u32, TargetStats>> {
        self.targets.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running request tracer. Cheap to share (`Send + Sync`); stopping it
/// (drop) detaches every program.
pub struct RequestTracer {
    shared: Arc<Shared>,
    hooks: Hooks,
    aggregate: Aggregate,
    /// Why the socket path is not in use, when it is not.
    fallback_reason: Option<String>,
    cmd: mpsc::Sender<Cmd>,
    thread: Option<JoinHandle<()>>,
}

impl RequestTracer {
    /// Checks the environment, loads and attaches the BPF programs.
    pub fn start(opts: TracerOptions) -> Result<Self, TraceError> {
        let size = opts.ringbuf_bytes;
        if !(4096..=MAX_RINGBUF_BYTES).contains(&size) || !size.is_power_of_two() {
            return Err(TraceError::InvalidOption(format!(
                "ring buffer size {} bytes: must be a power of two, 4096 to 1 GiB",
                opts.ringbuf_bytes
            )));
        }
        if opts.window == 0 {
            return Err(TraceError::InvalidOption(
                "window must hold at least 1 request".into(),
            ));
        }
        probe::check_environment()?;
        let shared = Arc::new(Shared {
            targets: Mutex::new(HashMap::new()),
            dropped: AtomicU64::new(0),
            by_turns: AtomicU64::new(0),
            timed_by_turns: AtomicU64::new(0),
        });
        let aggregate = opts.aggregate;
        let (cmd_tx, cmd_rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("qosd-bpf".into())
            .spawn(move || bpf::run(opts, thread_shared, cmd_rx, ready_tx))
            .map_err(|e| TraceError::Bpf(format!("spawning the tracer thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok((hooks, fallback_reason))) => Ok(Self {
                shared,
                hooks,
                aggregate,
                fallback_reason,
                cmd: cmd_tx,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(TraceError::Bpf(
                    "the tracer thread died while loading".into(),
                ))
            }
        }
    }

    fn call(&self, make: impl FnOnce(Reply) -> Cmd) -> Result<(), TraceError> {
        let (tx, rx) = mpsc::channel();
        self.cmd
            .send(make(tx))
            .map_err(|_| TraceError::Bpf("the tracer thread has stopped".into()))?;
        rx.recv()
            .map_err(|_| TraceError::Bpf("the tracer thread has stopped".into()))?
    }

    /// Starts tracing `pid`. Connections it accepted before this call are
    /// picked up too (from /proc), so a long-lived keep-alive connection is
    /// followed from its next request on.
    pub fn add_target(&self, pid: u32, opts: TargetOptions) -> Result<(), TraceError> {
        self.call(|r| Cmd::Add(pid, opts, r))
    }

    pub fn remove_target(&self, pid: u32) -> Result<(), TraceError> {
        self.call(|r| Cmd::Remove(pid, r))
    }

    /// Counts requests answered on connections that are still open; call it
    /// once when a trace ends, before the final report.
    pub fn flush_open(&self, pid: u32) -> Result<(), TraceError> {
        self.call(|r| Cmd::FlushOpen(pid, r))
    }

    fn targets(&self) -> MutexGuard<'_, HashMap<u32, TargetStats>> {
        self.shared.lock_targets()
    }

    fn with<T>(&self, pid: u32, f: impl FnOnce(&TargetStats) -> T) -> Option<T> {
        self.targets().get(&pid).map(f)
    }

    /// The kernel path in use.
    pub fn hooks(&self) -> Hooks {
        self.hooks
    }

    /// Where requests are aggregated.
    pub fn aggregate(&self) -> Aggregate {
        self.aggregate
    }

    /// Why the socket path is not in use (None when it is).
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// Requests per second over the last second (`get_RPS`).
    pub fn rps(&self, pid: u32) -> Option<f64> {
        let now = monotonic_ns();
        self.with(pid, |t| t.chosen().lat.window.rps(now))
    }

    /// Latency of the most recent request (`get_latest_latency`).
    pub fn latest_latency(&self, pid: u32) -> Option<Duration> {
        self.latest(pid, Figure::Latency)
    }

    /// Mean latency over the window (`get_average_latency`).
    pub fn average_latency(&self, pid: u32) -> Option<Duration> {
        self.average(pid, Figure::Latency)
    }

    /// Any latency percentile over the window (`get_latency_percentile`),
    /// `p` in [0, 100].
    pub fn latency_percentile(&self, pid: u32, p: f64) -> Option<Duration> {
        self.percentile(pid, Figure::Latency, p)
    }

    /// `latest_latency` of either figure.
    pub fn latest(&self, pid: u32, f: Figure) -> Option<Duration> {
        self.with(pid, |t| {
            t.chosen().fig(f).window.latest().map(Duration::from_nanos)
        })
        .flatten()
    }

    /// `average_latency` of either figure.
    pub fn average(&self, pid: u32, f: Figure) -> Option<Duration> {
        self.with(pid, |t| {
            t.chosen()
                .fig(f)
                .window
                .mean()
                .map(|m| Duration::from_nanos(m as u64))
        })
        .flatten()
    }

    /// `latency_percentile` of either figure.
    pub fn percentile(&self, pid: u32, f: Figure, p: f64) -> Option<Duration> {
        self.with(pid, |t| {
            t.chosen()
                .fig(f)
                .window
                .percentile(p)
                .map(Duration::from_nanos)
        })
        .flatten()
    }

    /// Requests counted since tracing of `pid` began.
    pub fn requests(&self, pid: u32) -> Option<u64> {
        self.with(pid, |t| t.chosen().total_count)
    }

    /// The boundary mode in use for `pid` (`Auto` until it has seen enough).
    pub fn mode(&self, pid: u32) -> Option<Mode> {
        self.with(pid, |t| t.effective_mode())
    }

    /// Whether `pid` has exited since tracing began.
    pub fn exited(&self, pid: u32) -> Option<bool> {
        self.with(pid, |t| t.exited)
    }

    /// Records lost because the ring buffer was full (all targets).
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Connections (all targets) whose requests are counted by turns after
    /// all: their bytes could not be read, or a read needed more than the
    /// counter's bound of steps (docs/requests.md). Refreshed every 200 ms.
    pub fn counted_by_turns(&self) -> u64 {
        self.shared.by_turns.load(Ordering::Relaxed)
    }

    /// HTTP connections (all targets) whose requests are timed by turns
    /// after all, not each by its own reply: a reply could not be parsed
    /// (chunked, a HEAD request, bytes not in user memory), or more
    /// requests waited for replies than the kernel keeps
    /// (docs/requests.md, "Replies"). Refreshed every 200 ms.
    pub fn timed_by_turns(&self) -> u64 {
        self.shared.timed_by_turns.load(Ordering::Relaxed)
    }

    /// The window figures of `pid` in one call (one lock): latencies.
    pub fn summary(&self, pid: u32) -> Option<qosd_core::LatencySummary> {
        self.summary_of(pid, Figure::Latency)
    }

    /// The window figures of `pid` for either figure.
    pub fn summary_of(&self, pid: u32, f: Figure) -> Option<qosd_core::LatencySummary> {
        let now = monotonic_ns();
        self.with(pid, |t| t.window_summary(now, f))
    }

    /// Connections seen for `pid` since tracing began.
    pub fn connections(&self, pid: u32) -> Option<u64> {
        self.with(pid, |t| t.connections())
    }

    /// The figures since the last call (interval) and since the start
    /// (total), and resets the interval.
    pub fn take_report(&self, pid: u32) -> Option<TargetReport> {
        self.targets().get_mut(&pid).map(|t| t.take_report())
    }

    /// Pids being traced.
    pub fn pids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.targets().keys().copied().collect();
        v.sort_unstable();
        v
    }
}

impl Drop for RequestTracer {
    fn drop(&mut self) {
        let _ = self.cmd.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
