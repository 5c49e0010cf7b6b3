//! The event loop of one load run: a timerfd wakes the thread at each
//! scheduled send time (nanosecond resolution, unlike epoll's milliseconds),
//! due requests are handed to non-blocking sockets, and replies are matched
//! in order to their scheduled times.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrStorage};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{
    ClockId as TimerClock, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags,
};
use qosd_sensors::stats::LogHistogram;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::proto::{self, Outcome, Parse, ReqKind};
use super::{IntervalReport, LoadError, LoadReport, LoadSpec, Percentiles, Protocol, Schedule};
use qosd_core::LatencySummary;

const TIMER_TOKEN: u64 = u64::MAX;
/// A keep-alive connection that failed before any reply is retried after this.
const RETRY_NS: u64 = 100_000_000;

pub fn now_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or(TimeSpec::new(0, 0));
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    sched_ns: u64,
    seq: u64,
    kind: ReqKind,
    key: u32,
}

struct Conn {
    stream: TcpStream,
    out: Vec<u8>,
    out_pos: usize,
    inb: Vec<u8>,
    inflight: VecDeque<Pending>,
    connecting: bool,
    watching_out: bool,
    /// Replies received since this connection was opened.
    answered: u64,
}

fn connect_nb(addr: SocketAddr) -> io::Result<(TcpStream, bool)> {
    let fam = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket::socket(
        fam,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let pending = match socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(addr)) {
        Ok(()) => false,
        Err(Errno::EINPROGRESS) => true,
        Err(e) => return Err(e.into()),
    };
    let stream = TcpStream::from(fd);
    stream.set_nodelay(true)?;
    Ok((stream, pending))
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
    total: LogHistogram,
    iv: LogHistogram,
    lag: LogHistogram,
    r: LoadReport,
    iv_sched: u64,
    iv_sent: u64,
    iv_done: u64,
    iv_err: u64,
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
            total: LogHistogram::new(),
            iv: LogHistogram::new(),
            lag: LogHistogram::new(),
            r: LoadReport {
                target: spec.target.to_string(),
                protocol: format!("{:?}", spec.protocol).to_lowercase(),
                keepalive: spec.keepalive,
                connections: spec.connections,
                duration_s: spec.duration.as_secs_f64(),
                ..Default::default()
            },
            iv_sched: 0,
            iv_sent: 0,
            iv_done: 0,
            iv_err: 0,
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
        let start = now_ns();
        let end = start + dur_ns;
        let deadline = end + self.spec.drain.as_nanos() as u64;
        let mut next = sched.next().map(|a| start + a);
        let mut next_report = start + iv_ns;
        let mut events = vec![EpollEvent::empty(); 1024];
        let mut dirty = Vec::new();
        loop {
            let now = now_ns();
            while now >= next_report && next_report <= end {
                self.emit(start, next_report, iv_ns, on_interval);
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
                self.r.stopped = true;
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
        self.r.errors.timeout += left;
        let dur = self.spec.duration.as_secs_f64();
        self.r.offered_rps = self.r.scheduled as f64 / dur;
        self.r.send_rps = self.r.sent as f64 / dur;
        self.r.achieved_rps = self.r.completed as f64 / dur;
        self.r.latency_us = percentiles(&self.total);
        self.r.send_lag_us = percentiles(&self.lag);
        Ok(self.r)
    }

    fn emit(
        &mut self,
        start: u64,
        at: u64,
        iv_ns: u64,
        on_interval: &mut dyn FnMut(&IntervalReport),
    ) {
        let s = self.iv.len() as f64;
        let us = |v: Option<u64>| v.map(|x| x as f64 / 1000.0);
        let t_s = (at - start) as f64 / 1e9;
        let rep = IntervalReport {
            t_s,
            interval_s: iv_ns as f64 / 1e9,
            offered_rps: self.spec.rate.at(t_s),
            scheduled: self.iv_sched,
            sent: self.iv_sent,
            completed: self.iv_done,
            errors: self.iv_err,
            latency: LatencySummary {
                rps: s * 1e9 / iv_ns as f64,
                requests: self.iv.len(),
                latest_us: None,
                mean_us: self.iv.mean().map(|m| m / 1000.0),
                p50_us: us(self.iv.percentile(50.0)),
                p95_us: us(self.iv.percentile(95.0)),
                p99_us: us(self.iv.percentile(99.0)),
            },
        };
        self.iv.clear();
        (self.iv_sched, self.iv_sent, self.iv_done, self.iv_err) = (0, 0, 0, 0);
        on_interval(&rep);
    }

    fn next_request(&mut self, sched_ns: u64) -> Pending {
        self.seq += 1;
        let (kind, key) = match self.spec.protocol {
            Protocol::Http => (ReqKind::Http, 0),
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
        self.r.scheduled += 1;
        self.iv_sched += 1;
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
            self.r.errors.connect += 1;
            return;
        };
        if self.conns[i]
            .as_ref()
            .is_some_and(|c| c.inflight.len() >= self.spec.max_in_flight)
        {
            self.fail_request();
            self.r.errors.overflow += 1;
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
        self.r.sent += 1;
        self.iv_sent += 1;
        self.lag.record(now.saturating_sub(sched_ns));
    }

    fn fail_request(&mut self) {
        self.iv_err += 1;
    }

    /// Per-request mode: give waiting requests a connection while slots last.
    fn start_backlog(&mut self, now: u64) {
        while !self.backlog.is_empty() {
            let Some(i) = self.free.pop() else { return };
            let Some(p) = self.backlog.pop_front() else {
                return;
            };
            match connect_nb(self.spec.target) {
                Ok((stream, connecting)) => {
                    let mut out = Vec::new();
                    self.encode(&p, &mut out);
                    let c = Conn::new(stream, connecting, out, p);
                    if self.register(i, &c).is_err() {
                        self.free.push(i);
                        self.fail_request();
                        self.r.errors.connect += 1;
                        continue;
                    }
                    self.conns[i] = Some(c);
                    self.note_sent(p.sched_ns, now);
                    if !connecting {
                        self.flush(i);
                    }
                }
                Err(_) => {
                    self.free.push(i);
                    self.fail_request();
                    self.r.errors.connect += 1;
                }
            }
        }
    }

    fn open_keepalive(&mut self, i: usize, now: u64) -> Result<(), LoadError> {
        match connect_nb(self.spec.target) {
            Ok((stream, connecting)) => {
                let c = Conn::new(stream, connecting, Vec::new(), None::<Pending>);
                self.register(i, &c)?;
                self.conns[i] = Some(c);
                Ok(())
            }
            Err(e) => {
                self.retry_at[i] = now + RETRY_NS;
                Err(e.into())
            }
        }
    }

    fn register(&self, i: usize, c: &Conn) -> Result<(), LoadError> {
        let mut flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
        if c.watching_out {
            flags |= EpollFlags::EPOLLOUT;
        }
        self.epoll
            .add(&c.stream, EpollEvent::new(flags, i as u64))
            .map_err(|e| io::Error::from(e).into())
    }

    /// Writes what is buffered; watches for writability only while needed.
    fn flush(&mut self, i: usize) {
        let Some(c) = self.conns[i].as_mut() else {
            return;
        };
        let mut failed = false;
        if !c.connecting {
            while c.out_pos < c.out.len() {
                match c.stream.write(&c.out[c.out_pos..]) {
                    Ok(0) => {
                        failed = true;
                        break;
                    }
                    Ok(n) => c.out_pos += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            if c.out_pos == c.out.len() {
                c.out.clear();
                c.out_pos = 0;
            }
        }
        let want = c.connecting || !c.out.is_empty();
        if want != c.watching_out {
            c.watching_out = want;
            let mut flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
            if want {
                flags |= EpollFlags::EPOLLOUT;
            }
            let mut ev = EpollEvent::new(flags, i as u64);
            let _ = self.epoll.modify(&c.stream, &mut ev);
        }
        if failed {
            self.close_conn(i, now_ns());
        }
    }

    fn on_event(&mut self, i: usize, ev: EpollFlags) {
        let now = now_ns();
        let Some(c) = self.conns[i].as_mut() else {
            return;
        };
        if c.connecting {
            if !ev.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP) {
                return;
            }
            if !matches!(c.stream.take_error(), Ok(None)) {
                self.close_conn(i, now);
                return;
            }
            c.connecting = false;
        }
        if ev.contains(EpollFlags::EPOLLOUT) {
            self.flush(i);
        }
        if ev.intersects(
            EpollFlags::EPOLLIN
                | EpollFlags::EPOLLRDHUP
                | EpollFlags::EPOLLHUP
                | EpollFlags::EPOLLERR,
        ) {
            self.read(i, now);
        }
    }

    fn read(&mut self, i: usize, now: u64) {
        let mut eof = false;
        loop {
            let Some(c) = self.conns[i].as_mut() else {
                return;
            };
            match c.stream.read(&mut self.scratch) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => {
                    c.inb.extend_from_slice(&self.scratch[..n]);
                    if n < self.scratch.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    eof = true;
                    break;
                }
            }
        }
        let ok = self.parse(i, now, eof);
        // Per-request: done once the reply is in (the server closes too).
        let finished = !self.spec.keepalive
            && self.conns[i]
                .as_ref()
                .is_some_and(|c| c.inflight.is_empty());
        if !ok || eof || finished {
            if !ok {
                let lost = self.conns[i]
                    .as_ref()
                    .map_or(0, |c| c.inflight.len() as u64);
                self.r.errors.protocol += lost;
                self.iv_err += lost;
                if let Some(c) = self.conns[i].as_mut() {
                    // Counted as protocol errors: not sent again.
                    c.inflight.clear();
                    c.answered = 0;
                }
            }
            self.close_conn(i, now);
        }
    }

    /// Matches complete replies to requests in flight. False on a protocol error.
    fn parse(&mut self, i: usize, now: u64, eof: bool) -> bool {
        let proto_kind = self.spec.protocol;
        let mut done = Vec::new();
        let mut ok = true;
        {
            let Some(c) = self.conns[i].as_mut() else {
                return true;
            };
            let mut pos = 0;
            while let Some(front) = c.inflight.front().copied() {
                let buf = &c.inb[pos..];
                if buf.is_empty() {
                    break;
                }
                let r = match proto_kind {
                    Protocol::Http => proto::parse_http(buf),
                    Protocol::Memcache => proto::parse_memcache(buf, front.kind),
                };
                match r {
                    Parse::Done { len, outcome, .. } => {
                        pos += len;
                        c.inflight.pop_front();
                        c.answered += 1;
                        done.push((front, outcome));
                    }
                    Parse::UntilClose { outcome } if eof => {
                        pos = c.inb.len();
                        c.inflight.pop_front();
                        c.answered += 1;
                        done.push((front, outcome));
                    }
                    Parse::Partial | Parse::UntilClose { .. } => break,
                    Parse::Invalid(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            if c.inflight.is_empty() {
                c.inb.clear(); // bytes nobody asked for
            } else {
                c.inb.drain(..pos);
            }
        }
        for (p, outcome) in done {
            self.complete(p, outcome, now);
        }
        ok
    }

    fn complete(&mut self, p: Pending, outcome: Outcome, now: u64) {
        if outcome == Outcome::Failed {
            self.r.errors.status += 1;
            self.iv_err += 1;
            return;
        }
        if outcome == Outcome::Miss {
            self.r.misses += 1;
        }
        let lat = now.saturating_sub(p.sched_ns);
        self.total.record(lat);
        self.iv.record(lat);
        self.r.completed += 1;
        self.iv_done += 1;
    }

    /// A connection ended (EOF, reset, protocol error, failed connect).
    fn close_conn(&mut self, i: usize, now: u64) {
        let Some(c) = self.conns[i].take() else {
            return;
        };
        let _ = self.epoll.delete(&c.stream);
        let lost = c.inflight.len() as u64;
        if !self.spec.keepalive {
            self.free.push(i);
            if lost > 0 {
                if c.answered == 0 && c.connecting {
                    self.r.errors.connect += lost;
                } else {
                    self.r.errors.io += lost;
                }
                self.iv_err += lost;
            }
            self.start_backlog(now);
            return;
        }
        if c.answered > 0 {
            // The server closed a connection that worked (e.g. nginx after
            // keepalive_requests): reopen it and send again what is unanswered,
            // keeping the original scheduled times.
            self.r.reconnects += 1;
            if self.open_keepalive(i, now).is_ok() {
                let mut out = Vec::new();
                for p in &c.inflight {
                    self.encode(p, &mut out);
                }
                if let Some(n) = self.conns[i].as_mut() {
                    n.out = out;
                    n.inflight = c.inflight;
                }
                self.flush(i);
                return;
            }
        }
        self.r.errors.connect += lost;
        self.iv_err += lost;
        self.retry_at[i] = now + RETRY_NS;
    }
}

impl Conn {
    fn new(
        stream: TcpStream,
        connecting: bool,
        out: Vec<u8>,
        first: impl Into<Option<Pending>>,
    ) -> Self {
        let watching_out = connecting || !out.is_empty();
        Self {
            stream,
            out,
            out_pos: 0,
            inb: Vec::new(),
            inflight: first.into().into_iter().collect(),
            connecting,
            watching_out,
            answered: 0,
        }
    }
}

fn percentiles(h: &LogHistogram) -> Percentiles {
    let us = |p: f64| h.percentile(p).map(|v| v as f64 / 1000.0);
    Percentiles {
        mean: h.mean().map(|m| m / 1000.0),
        p50: us(50.0),
        p90: us(90.0),
        p95: us(95.0),
        p99: us(99.0),
        p999: us(99.9),
        max: us(100.0),
    }
}

/// Writes every key once (blocking, pipelined in batches) so `get`s hit.
fn preload(spec: &LoadSpec) -> Result<(), LoadError> {
    let m = &spec.memcache;
    let mut s = TcpStream::connect_timeout(&spec.target, std::time::Duration::from_secs(2))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut key = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while key < m.nr_keys {
        let batch = (m.nr_keys - key).min(500);
        let mut out = Vec::new();
        for k in key..key + batch {
            proto::write_memcache(&mut out, ReqKind::Set, k, m.value_bytes);
        }
        s.write_all(&out)?;
        let mut inb = Vec::new();
        let mut got = 0;
        while got < batch {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Err(LoadError::BadSpec(format!(
                    "{}: memcached closed the connection during preload",
                    spec.target
                )));
            }
            inb.extend_from_slice(&buf[..n]);
            let mut pos = 0;
            while let Parse::Done { len, .. } = proto::parse_memcache(&inb[pos..], ReqKind::Set) {
                pos += len;
                got += 1;
            }
            if let Parse::Invalid(e) = proto::parse_memcache(&inb[pos..], ReqKind::Set) {
                return Err(LoadError::BadSpec(format!(
                    "{}: not a memcached server ({e})",
                    spec.target
                )));
            }
            inb.drain(..pos);
        }
        key += batch;
    }
    Ok(())
}
