//! The connection side of the event loop: opening sockets without
//! blocking, writing what is due, reading and matching replies in order, and
//! what to do when a connection ends (reopen and resend, or count errors).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;

use nix::errno::Errno;
use nix::sys::epoll::{EpollEvent, EpollFlags};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrStorage};

use qosd_core::clock::monotonic_ns;

use super::{Engine, Pending, RETRY_NS};
use crate::load::proto::{self, Outcome, Parse, ReqKind};
use crate::load::{LoadError, LoadSpec};

pub(super) struct Conn {
    stream: TcpStream,
    pub(super) out: Vec<u8>,
    out_pos: usize,
    inb: Vec<u8>,
    pub(super) inflight: VecDeque<Pending>,
    connecting: bool,
    watching_out: bool,
    /// Replies received since this connection was opened.
    answered: u64,
}

pub(super) fn connect_nb(addr: SocketAddr) -> io::Result<(TcpStream, bool)> {
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

impl Engine<'_> {
    /// Per-request mode: give waiting requests a connection while slots last.
    pub(super) fn start_backlog(&mut self, now: u64) {
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
                        self.t.r.errors.connect += 1;
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
                    self.t.r.errors.connect += 1;
                }
            }
        }
    }

    pub(super) fn open_keepalive(&mut self, i: usize, now: u64) -> Result<(), LoadError> {
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
    pub(super) fn flush(&mut self, i: usize) {
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
            self.close_conn(i, monotonic_ns());
        }
    }

    pub(super) fn on_event(&mut self, i: usize, ev: EpollFlags) {
        let now = monotonic_ns();
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
                self.t.r.errors.protocol += lost;
                self.t.failed(lost);
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
                let r = match front.kind {
                    ReqKind::Http => proto::parse_http(buf),
                    kind @ (ReqKind::Get | ReqKind::Set) => proto::parse_memcache(buf, kind),
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
            self.t.r.errors.status += 1;
            self.t.failed(1);
            return;
        }
        if outcome == Outcome::Miss {
            self.t.r.misses += 1;
        }
        self.t.completed(p.sched_ns, now);
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
                    self.t.r.errors.connect += lost;
                } else {
                    self.t.r.errors.io += lost;
                }
                self.t.failed(lost);
            }
            self.start_backlog(now);
            return;
        }
        if c.answered > 0 {
            // The server closed a connection that worked (e.g. nginx after
            // keepalive_requests): reopen it and send again what is unanswered,
            // keeping the original scheduled times.
            self.t.r.reconnects += 1;
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
        self.t.r.errors.connect += lost;
        self.t.failed(lost);
        self.retry_at[i] = now + RETRY_NS;
    }
}

impl Conn {
    pub(super) fn new(
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

/// Writes every key once (blocking, pipelined in batches) so `get`s hit.
pub(super) fn preload(spec: &LoadSpec) -> Result<(), LoadError> {
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
