//! The gRPC engine: unary calls on the same open-loop schedule as the other
//! protocols. A pacing thread sleeps on a timerfd to each scheduled time
//! (nanosecond resolution; tokio's timers are millisecond) and hands the
//! time to a single-threaded tokio runtime, which starts the call at once:
//! as an HTTP/2 stream on one of the shared connections (round robin), or
//! on a connection of its own (`keepalive: false`, at most `connections`
//! open at once; later calls wait and their latency still counts from
//! their scheduled time).
//!
//! Errors: a call refused because its connection already has
//! `max_in_flight` streams open is `overflow`; `UNAVAILABLE`/`CANCELLED`
//! (the connection broke) is `io`; a connection per call that cannot be
//! opened is `connect`; a transport or decoding failure is `protocol`; any
//! other status the server returns is `status`. Calls still open when the
//! drain ends are `timeout`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use qosd_core::clock::monotonic_ns;
use tokio::sync::{mpsc, Notify, Semaphore};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::tally::Tally;
use super::{IntervalReport, LoadError, LoadReport, LoadSpec, Schedule};

/// `google.protobuf.UInt64Value`: the fixture's request (CPU work, µs) and
/// reply (a checksum of that work).
#[derive(Clone, PartialEq, prost::Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// How often a waiting loop looks at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// One shared connection and the calls open on it.
struct Shared {
    channel: Channel,
    open: Rc<Cell<usize>>,
}

/// State the call tasks update (one thread: no locks).
struct Run {
    tally: RefCell<Tally>,
    /// Calls started or waiting for a connection, not yet finished.
    outstanding: Cell<u64>,
    /// Woken when `outstanding` drops to zero.
    idle: Notify,
}

pub(super) fn run(
    spec: &LoadSpec,
    stop: &AtomicBool,
    on_interval: &mut dyn FnMut(&IntervalReport),
) -> Result<LoadReport, LoadError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let endpoint = Endpoint::from_shared(format!("http://{}", spec.target))
        .map_err(|e| LoadError::BadTarget(spec.target.to_string(), e.to_string()))?
        .tcp_nodelay(true)
        // Calls beyond this wait inside the channel; `max_in_flight` is
        // enforced before that, so the buffer never refuses one.
        .buffer_size(spec.max_in_flight.min(1 << 16));
    let method = PathAndQuery::try_from(spec.grpc.method.as_str())
        .map_err(|e| LoadError::BadSpec(format!("gRPC method {:?}: {e}", spec.grpc.method)))?;
    let shared = if spec.keepalive {
        local.block_on(&rt, connect_all(&endpoint, spec))?
    } else {
        Vec::new()
    };
    let (tx, rx) = mpsc::unbounded_channel::<u64>();
    let start = monotonic_ns();
    std::thread::scope(|scope| {
        scope.spawn(move || pace(spec, start, stop, tx));
        let drive = Drive {
            spec,
            endpoint,
            method,
            shared,
            slots: Rc::new(Semaphore::new(spec.connections)),
            run: Rc::new(Run {
                tally: RefCell::new(Tally::new(spec)),
                outstanding: Cell::new(0),
                idle: Notify::new(),
            }),
            rr: 0,
        };
        // Dropping the runtime afterwards cancels calls still open.
        local.block_on(&rt, drive.run(start, rx, stop, on_interval))
    })
}

/// Opens the shared connections; a target that refuses them is the user's
/// error, reported before any load is sent.
async fn connect_all(endpoint: &Endpoint, spec: &LoadSpec) -> Result<Vec<Shared>, LoadError> {
    let mut out = Vec::with_capacity(spec.connections);
    for _ in 0..spec.connections {
        let channel = endpoint.connect().await.map_err(|e| {
            LoadError::BadTarget(
                spec.target.to_string(),
                format!("cannot open a gRPC connection: {}", source_chain(&e)),
            )
        })?;
        out.push(Shared {
            channel,
            open: Rc::new(Cell::new(0)),
        });
    }
    Ok(out)
}

/// The pacing thread: sends each scheduled time (ns, CLOCK_MONOTONIC) when
/// it comes, until the schedule ends, `stop` is set or the runtime is gone.
fn pace(spec: &LoadSpec, start: u64, stop: &AtomicBool, tx: mpsc::UnboundedSender<u64>) {
    let Ok(timer) = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_CLOEXEC) else {
        return; // dropping `tx` ends the run's schedule: nothing is sent
    };
    let dur_ns = spec.duration.as_nanos() as u64;
    let sched = Schedule::new(spec.rate.clone(), spec.arrival, spec.seed, dur_ns);
    for at in sched.map(|a| start + a) {
        loop {
            if stop.load(Ordering::Relaxed) || tx.is_closed() {
                return;
            }
            let now = monotonic_ns();
            if now >= at {
                break;
            }
            let wake = at.min(now + POLL.as_nanos() as u64);
            let ts = TimeSpec::new((wake / 1_000_000_000) as i64, (wake % 1_000_000_000) as i64);
            if timer
                .set(
                    Expiration::OneShot(ts),
                    TimerSetTimeFlags::TFD_TIMER_ABSTIME,
                )
                .and_then(|()| timer.wait())
                .is_err()
            {
                return;
            }
        }
        if tx.send(at).is_err() {
            return;
        }
    }
}

struct Drive<'a> {
    spec: &'a LoadSpec,
    endpoint: Endpoint,
    method: PathAndQuery,
    shared: Vec<Shared>,
    /// Connection per call: connections that may be open at once.
    slots: Rc<Semaphore>,
    run: Rc<Run>,
    rr: usize,
}

impl Drive<'_> {
    async fn run(
        mut self,
        start: u64,
        mut rx: mpsc::UnboundedReceiver<u64>,
        stop: &AtomicBool,
        on_interval: &mut dyn FnMut(&IntervalReport),
    ) -> Result<LoadReport, LoadError> {
        let spec = self.spec;
        let iv_ns = spec.interval.as_nanos() as u64;
        let end = start + spec.duration.as_nanos() as u64;
        let deadline = end + spec.drain.as_nanos() as u64;
        // tokio's clock and ours are both CLOCK_MONOTONIC.
        let (t0, n0) = (tokio::time::Instant::now(), monotonic_ns());
        let instant = |ns: u64| t0 + Duration::from_nanos(ns.saturating_sub(n0));
        let mut next_report = start + iv_ns;
        let mut schedule_done = false;
        loop {
            let now = monotonic_ns();
            while now >= next_report && next_report <= end {
                self.run
                    .tally
                    .borrow_mut()
                    .emit(spec, start, next_report, on_interval);
                next_report += iv_ns;
            }
            if stop.load(Ordering::Relaxed) {
                self.run.tally.borrow_mut().r.stopped = true;
                break;
            }
            let outstanding = self.run.outstanding.get();
            if schedule_done && ((outstanding == 0 && now >= end) || now >= deadline) {
                break;
            }
            let report_at = if next_report <= end {
                next_report
            } else {
                deadline
            };
            let wake = report_at.min(now + POLL.as_nanos() as u64);
            tokio::select! {
                due = rx.recv(), if !schedule_done => match due {
                    Some(at) => self.dispatch(at),
                    None => schedule_done = true,
                },
                _ = self.run.idle.notified(), if outstanding > 0 => {}
                _ = tokio::time::sleep_until(instant(wake)) => {}
            }
        }
        drop(rx); // the pacing thread sees it and ends
        let left = self.run.outstanding.get();
        let tally = self.run.tally.replace(Tally::new(spec));
        Ok(tally.finish(left))
    }

    /// Starts the call due at `at`.
    fn dispatch(&mut self, at: u64) {
        let run = Rc::clone(&self.run);
        run.tally.borrow_mut().scheduled();
        let request = UInt64Value {
            value: self.spec.grpc.work_us,
        };
        let method = self.method.clone();
        if !self.spec.keepalive {
            let (endpoint, slots) = (self.endpoint.clone(), Rc::clone(&self.slots));
            run.outstanding.set(run.outstanding.get() + 1);
            tokio::task::spawn_local(async move {
                // Only fails when the semaphore is closed, which it never is.
                let _slot = slots.acquire().await;
                run.tally.borrow_mut().sent(at, monotonic_ns());
                let result = match endpoint.connect().await {
                    Ok(channel) => call(channel, method, request).await,
                    Err(_) => Err(Failure::Connect),
                };
                run.finish(at, result);
            });
            return;
        }
        let conn = &self.shared[self.rr % self.shared.len()];
        self.rr = self.rr.wrapping_add(1);
        if conn.open.get() >= self.spec.max_in_flight {
            let mut t = run.tally.borrow_mut();
            t.r.errors.overflow += 1;
            t.failed(1);
            return;
        }
        let (channel, open) = (conn.channel.clone(), Rc::clone(&conn.open));
        open.set(open.get() + 1);
        run.outstanding.set(run.outstanding.get() + 1);
        run.tally.borrow_mut().sent(at, monotonic_ns());
        tokio::task::spawn_local(async move {
            let result = call(channel, method, request).await;
            open.set(open.get() - 1);
            run.finish(at, result);
        });
    }
}

impl Run {
    fn finish(&self, at: u64, result: Result<(), Failure>) {
        let now = monotonic_ns();
        let mut t = self.tally.borrow_mut();
        match result {
            Ok(()) => t.completed(at, now),
            Err(f) => {
                let e = &mut t.r.errors;
                match f {
                    Failure::Connect => e.connect += 1,
                    Failure::Io => e.io += 1,
                    Failure::Protocol => e.protocol += 1,
                    Failure::Status => e.status += 1,
                }
                t.failed(1);
            }
        }
        drop(t);
        let n = self.outstanding.get() - 1;
        self.outstanding.set(n);
        if n == 0 {
            self.idle.notify_one();
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Connect,
    Io,
    Protocol,
    Status,
}

/// One unary call; `Ok` once the reply and its trailers are in.
async fn call(channel: Channel, method: PathAndQuery, req: UInt64Value) -> Result<(), Failure> {
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.map_err(|_| Failure::Io)?;
    client
        .unary::<_, UInt64Value, _>(
            tonic::Request::new(req),
            method,
            tonic_prost::ProstCodec::default(),
        )
        .await
        .map(drop)
        .map_err(|s| classify(&s))
}

fn classify(s: &Status) -> Failure {
    match s.code() {
        Code::Unavailable | Code::Cancelled => Failure::Io,
        // tonic's own failures (transport, decoding) carry their cause.
        Code::Internal | Code::Unknown if std::error::Error::source(s).is_some() => {
            Failure::Protocol
        }
        _ => Failure::Status,
    }
}

/// An error and its causes, `a: b: c` (tonic's top level says only
/// "transport error").
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
