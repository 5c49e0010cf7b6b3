//! Serving the API over HTTP/1.1 (hyper) so that no client can hold the
//! daemon: at most `max_connections` at once (when full, the oldest
//! connection with no request in progress is closed for the new one, the
//! way nginx reuses idle keep-alive connections); a request's headers, and
//! an idle keep-alive connection's next request, must arrive within the
//! request timeout, and its body within the same time after its headers;
//! and [`Server::shutdown`] returns within its grace period whatever the
//! clients do (slow headers, half a body, idle keep-alive), so SIGTERM
//! restores the knobs at once.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::{BoxError, Router};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle, JoinSet};

/// How many connections and how long a request may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub request_timeout: Duration,
}

impl Limits {
    /// `configured`, but at most half the process's open-file limit: the
    /// other half stays for /proc, cgroup files and BPF objects, so a full
    /// API never starves discovery (the issue: EMFILE taken for an exit).
    pub fn capped(configured: usize, request_timeout: Duration) -> (Limits, Option<u64>) {
        let nofile = open_file_limit();
        let cap = nofile.map_or(configured, |n| (n / 2).max(1) as usize);
        let lowered = (cap < configured).then_some(nofile).flatten();
        (
            Limits {
                max_connections: configured.min(cap),
                request_timeout,
            },
            lowered,
        )
    }
}

/// The soft RLIMIT_NOFILE, if it can be read and is finite.
fn open_file_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct we own.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// The running server: its accept loop and every connection task.
pub struct Server {
    stop: watch::Sender<Option<Duration>>,
    task: JoinHandle<()>,
}

impl Server {
    pub fn spawn(listener: TcpListener, app: Router, limits: Limits) -> Server {
        let (stop, rx) = watch::channel(None);
        let task = tokio::spawn(accept_loop(listener, app, limits, rx));
        Server { stop, task }
    }

    /// Stops accepting, lets requests in progress finish for at most
    /// `grace`, then drops every connection, whatever state it is in.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.stop.send(Some(grace));
        let _ = self.task.await;
    }
}

/// One open connection, as the accept loop sees it.
struct Conn {
    accepted: Instant,
    /// Requests being handled (0: idle, between requests or still
    /// receiving headers).
    busy: Arc<AtomicUsize>,
    abort: AbortHandle,
}

type Registry = Arc<Mutex<HashMap<u64, Conn>>>;

async fn accept_loop(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let conns: Registry = Arc::default();
    let mut tasks = JoinSet::new();
    let mut next_id = 0u64;
    let mut last_error: Option<Instant> = None;
    let grace = loop {
        tokio::select! {
            r = stop.changed() => {
                break match r { Ok(()) => (*stop.borrow()).unwrap_or_default(), Err(_) => Duration::ZERO };
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    make_room(&conns, limits.max_connections);
                    let busy = Arc::new(AtomicUsize::new(0));
                    let id = next_id;
                    next_id += 1;
                    let fut = serve_one(stream, app.clone(), limits, busy.clone(), stop.clone(), conns.clone(), id);
                    // On the daemon's one-thread runtime the task cannot
                    // run (and remove itself) before it is registered; were
                    // it to, the stale entry is idle and the first evicted.
                    let abort = tasks.spawn(fut);
                    lock(&conns).insert(id, Conn { accepted: Instant::now(), busy, abort });
                }
                Err(e) => {
                    // Out of descriptors (EMFILE/ENFILE) or a connection
                    // reset before accept: say so at most every 10 s, and
                    // let the kernel's backlog hold the rest meanwhile.
                    if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        println!("api: accepting a connection failed: {e} (retrying)");
                        last_error = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    };
    drop(listener);
    // Every connection was told through `stop`: idle ones close now,
    // requests in progress get `grace`, then everything is dropped.
    let _ = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

fn lock(r: &Registry) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
    // A panic elsewhere cannot leave the map inconsistent (single inserts
    // and removes): keep serving.
    r.lock().unwrap_or_else(|p| p.into_inner())
}

/// At the limit, closes the oldest idle connection; if every connection
/// is in the middle of a request, the oldest one.
fn make_room(conns: &Registry, max: usize) {
    let mut c = lock(conns);
    while c.len() >= max {
        let victim = c
            .iter()
            .filter(|(_, k)| k.busy.load(Ordering::Relaxed) == 0)
            .min_by_key(|(_, k)| k.accepted)
            .or_else(|| c.iter().min_by_key(|(_, k)| k.accepted))
            .map(|(&id, _)| id);
        let Some(id) = victim else { break };
        if let Some(k) = c.remove(&id) {
            k.abort.abort();
        }
    }
}

async fn serve_one(
    stream: TcpStream,
    app: Router,
    limits: Limits,
    busy: Arc<AtomicUsize>,
    mut stop: watch::Receiver<Option<Duration>>,
    conns: Registry,
    id: u64,
) {
    let svc = TowerToHyperService::new(app);
    let timeout = limits.request_timeout;
    let handler = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let guard = Busy::enter(&busy);
        let req = req.map(|b| Deadline::new(b, timeout));
        let fut = hyper::service::Service::call(&svc, req);
        async move {
            let r = fut.await;
            drop(guard);
            r
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .serve_connection(TokioIo::new(stream), handler);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
    lock(&conns).remove(&id);
}

/// Counts a request in progress on its connection while alive.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn enter(b: &Arc<AtomicUsize>) -> Busy {
        b.fetch_add(1, Ordering::Relaxed);
        Busy(b.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request body that fails once its deadline passes (a client sending
/// half a body, or one byte a minute, is cut off).
struct Deadline {
    inner: Incoming,
    sleep: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl Deadline {
    fn new(inner: Incoming, timeout: Duration) -> Self {
        Deadline {
            inner,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            timeout,
        }
    }
}

impl Body for Deadline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                "the request body did not arrive within {} ms",
                self.timeout.as_millis()
            )
            .into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
