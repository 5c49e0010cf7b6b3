//! The event loop of one HTTP/1.1 or memcached load run: a timerfd wakes
//! the thread at each scheduled send time (nanosecond resolution, unlike
//! epoll's milliseconds), due requests are handed to non-blocking sockets,
//! and replies are matched in order to their scheduled times.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{
    ClockId as TimerClock, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags,
};
use qosd_core::clock::monotonic_ns;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::proto::{self, ReqKind};
use super::tally::Tally;
use super::{IntervalReport, LoadError, LoadReport, LoadSpec, Protocol, Schedule};

mod conn;

use conn::{preload, Conn};

const TIMER_TOKEN: u64 = u64::MAX;
/// A keep-alive connection that failed before any reply is retried after this.
const RETRY_NS: u64 = 100_000_000;

#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    sched_ns: u64,
    seq: u64,
    kind: ReqKind,
    key: u32,
}

pub struct Engine<'a> {
    spec: &'a LoadSpec,
    epoll: Epoll,
    timer: TimerFd,
    conns: Vec<Option<Conn>>,
    /// Keep-alive: when a dead connection may be retried (ns).
    retry_at: Vec<u64>,
    /// Per-request: free slots and requests waiting for a slot.
    free: Vec<usize>,
    backlog: VecDeque<Pending>,
    rr: usize,
    rng: ChaCha8Rng,
    seq: u64,
    scratch: Vec<u8>,
    t: Tally,
}

impl<'a> Engine<'a> {
    pub fn new(spec: &'a LoadSpec) -> Result<Self, LoadError> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(io::Error::from)?;
        let timer = TimerFd::new(
            TimerClock::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        epoll
            .add(&timer, EpollEvent::new(EpollFlags::EPOLLIN, TIMER_TOKEN))
            .map_err(io::Error::from)?;
        let n = spec.connections;
        Ok(Self {
            spec,
            epoll,
            timer,
            conns: (0..n).map(|_| None).collect(),
            retry_at: vec![0; n],
            free: (0..n).rev().collect(),
            backlog: VecDeque::new(),
            rr: 0,
            // A different stream from the schedule's, same seed.
            rng: ChaCha8Rng::seed_from_u64(spec.seed ^ 0x9e37_79b9_7f4a_7c15),
            seq: 0,
            scratch: vec![0; 64 * 1024],
            t: Tally::new(spec),
        })
    }

    pub fn run(
        mut self,
        stop: &AtomicBool,
        on_interval: &mut dyn FnMut(&IntervalReport),
    ) -> Result<LoadReport, LoadError> {
        if self.spec.protocol == Protocol::Memcache && self.spec.memcache.preload {
            preload(self.spec)?;
        }
        if self.spec.keepalive {
            for i in 0..self.conns.len() {
                self.open_keepalive(i, 0)?;
            }
        }
        let dur_ns = self.spec.duration.as_nanos() as u64;
        let iv_ns = self.spec.interval.as_nanos() as u64;
        let mut sched = Schedule::new(
            self.spec.rate.clone(),
            self.spec.arrival,
            self.spec.seed,
            dur_ns,
        );
        let start = monotonic_ns();
        let end = start + dur_ns;
        let deadline = end + self.spec.drain.as_nanos() as u64;
        let mut next = sched.next().map(|a| start + a);
        let mut next_report = start + iv_ns;
        let mut events = vec![EpollEvent::empty(); 1024];
        let mut dirty = Vec::new();
        loop {
            let now = monotonic_ns();
            while now >= next_report && next_report <= end {
                self.t.emit(self.spec, start, next_report, on_interval);
                next_report += iv_ns;
            }
            while let Some(t) = next.filter(|&t| t <= now) {
                self.dispatch(t, now, &mut dirty);
                next = sched.next().map(|a| start + a);
            }
            for i in dirty.drain(..) {
                self.flush(i);
            }
            if stop.load(Ordering::Relaxed) {
                self.t.r.stopped = true;
                break;
            }
            let outstanding = self.backlog.len()
                + self
                    .conns
                    .iter()
                    .flatten()
                    .map(|c| c.inflight.len())
                    .sum::<usize>();
            if next.is_none() && ((outstanding == 0 && now >= end) || now >= deadline) {
                break;
            }
            let wake = next.unwrap_or(deadline).min(if next_report <= end {
                next_report
            } else {
                deadline
            });
            let ts = TimeSpec::new((wake / 1_000_000_000) as i64, (wake % 1_000_000_000) as i64);
            self.timer
                .set(
                    Expiration::OneShot(ts),
                    TimerSetTimeFlags::TFD_TIMER_ABSTIME,
                )
                .map_err(io::Error::from)?;
            // The 50 ms cap only bounds how late a stop request is seen.
            let n = match self.epoll.wait(&mut events, 50u16) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => return Err(io::Error::from(e).into()),
            };
            for ev in &events[..n] {
                if ev.data() != TIMER_TOKEN {
                    self.on_event(ev.data() as usize, ev.events());
                }
            }
        }
        // Whatever is left unanswered timed out.
        let left = self.backlog.len() as u64
            + self
                .conns
                .iter()
                .flatten()
                .map(|c| c.inflight.len() as u64)
                .sum::<u64>();
        Ok(self.t.finish(left))
    }

    fn next_request(&mut self, sched_ns: u64) -> Pending {
        self.seq += 1;
        let (kind, key) = match self.spec.protocol {
            // gRPC has its own engine (see `load::run`) and never gets here.
            Protocol::Http | Protocol::Grpc => (ReqKind::Http, 0),
            Protocol::Memcache => {
                let m = &self.spec.memcache;
                let set = self.rng.gen::<f64>() < m.set_ratio;
                (
                    if set { ReqKind::Set } else { ReqKind::Get },
                    self.rng.gen_range(0..m.nr_keys),
                )
            }
        };
        Pending {
            sched_ns,
            seq: self.seq,
            kind,
            key,
        }
    }

    fn encode(&self, p: &Pending, out: &mut Vec<u8>) {
        match p.kind {
            ReqKind::Http => proto::write_http(
                out,
                &self.spec.http_path,
                "localhost",
                p.seq,
                self.spec.keepalive,
            ),
            kind => {
                proto::write_memcache(out, kind, p.key, self.spec.memcache.value_bytes);
                if !self.spec.keepalive {
                    // The server closes first, so TIME_WAIT stays on its side.
                    out.extend_from_slice(b"quit\r\n");
                }
            }
        }
    }

    fn dispatch(&mut self, sched_ns: u64, now: u64, dirty: &mut Vec<usize>) {
        let p = self.next_request(sched_ns);
        self.t.scheduled();
        if !self.spec.keepalive {
            self.backlog.push_back(p);
            self.start_backlog(now);
            return;
        }
        // Round-robin over live connections; reopen dead ones when due.
        let n = self.conns.len();
        let mut chosen = None;
        for k in 0..n {
            let i = (self.rr + k) % n;
            if self.conns[i].is_none() && self.retry_at[i] <= now {
                let _ = self.open_keepalive(i, now);
            }
            if self.conns[i].is_some() {
                chosen = Some(i);
                break;
            }
        }
        self.rr = (self.rr + 1) % n;
        let Some(i) = chosen else {
            self.fail_request();
            self.t.r.errors.connect += 1;
            return;
        };
        if self.conns[i]
            .as_ref()
            .is_some_and(|c| c.inflight.len() >= self.spec.max_in_flight)
        {
            self.fail_request();
            self.t.r.errors.overflow += 1;
            return;
        }
        let mut out = self.conns[i]
            .as_mut()
            .map(|c| std::mem::take(&mut c.out))
            .unwrap_or_default();
        self.encode(&p, &mut out);
        if let Some(c) = self.conns[i].as_mut() {
            c.out = out;
            c.inflight.push_back(p);
        }
        self.note_sent(sched_ns, now);
        dirty.push(i);
    }

    fn note_sent(&mut self, sched_ns: u64, now: u64) {
        self.t.sent(sched_ns, now);
    }

    fn fail_request(&mut self) {
        self.t.failed(1);
    }
}
