//! The two kernel paths of the request sensor and the choice between them.
//!
//! `sockets` (bpf/sockets.bpf.c, the default): socket tracepoints, requests
//! timed from their arrival in the socket, no syscall tracepoint attached,
//! process trees followed through fork. `syscalls` (bpf/requests.bpf.c, the
//! fallback): the raw sys_exit tracepoint, requests timed from the first
//! read, every syscall of every process on the tracepoint path. Both fill
//! the same maps of who is traced (bpf/targets.h) and send the same records
//! (bpf/emit.h); this module hides which skeleton is loaded from the tracer
//! thread.

use std::mem::MaybeUninit;
use std::path::Path;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{Map, MapCore, MapFlags, OpenObject};

use super::{TraceError, TracerOptions};

/// Slots the kernel's cell map holds in kernel mode: one per traced root
/// process, each two cells (TURN and CONN) of ~30 KiB per CPU, made when
/// the tracer loads (a per-CPU array is preallocated). A root whose two
/// candidate slots are taken is counted through records instead (logged).
pub const AGG_SLOTS: u32 = 16;

#[allow(clippy::all, clippy::undocumented_unsafe_blocks)]
pub(crate) mod sys_skel {
    include!(concat!(env!("OUT_DIR"), "/requests.skel.rs"));
}
#[allow(clippy::all, clippy::undocumented_unsafe_blocks)]
pub(crate) mod sock_skel {
    include!(concat!(env!("OUT_DIR"), "/sockets.skel.rs"));
}

use sock_skel::{SocketsSkel, SocketsSkelBuilder};
use sys_skel::{RequestsSkel, RequestsSkelBuilder};

/// Which kernel path traces requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hooks {
    /// Socket tracepoints (sock:*, sched fork/exit): arrival and service.
    Sockets,
    /// The raw sys_exit tracepoint and sys_enter_close: service only.
    Syscalls,
}

impl Hooks {
    pub fn as_str(self) -> &'static str {
        match self {
            Hooks::Sockets => "sockets",
            Hooks::Syscalls => "syscalls",
        }
    }
}

/// What the caller asks for; `Auto` takes sockets where the kernel has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HookChoice {
    #[default]
    Auto,
    Sockets,
    Syscalls,
}

impl std::str::FromStr for HookChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(HookChoice::Auto),
            "sockets" => Ok(HookChoice::Sockets),
            "syscalls" => Ok(HookChoice::Syscalls),
            _ => Err(format!(
                "unknown hooks {s:?}: expected auto, sockets or syscalls"
            )),
        }
    }
}

/// The tracepoints the socket path attaches to.
pub const SOCKET_TRACEPOINTS: [&str; 6] = [
    "sock/inet_sock_set_state",
    "sock/sk_data_ready",
    "sock/sock_recv_length",
    "sock/sock_send_length",
    "sched/sched_process_fork",
    "sched/sched_process_exit",
];

/// Set to a list of tracepoints (or `all`) to make the probe report them
/// missing: how the tests see the fallback chosen on a kernel without them.
pub const PRETEND_MISSING_ENV: &str = "QOSD_PRETEND_MISSING_TRACEPOINTS";

/// Why the socket path cannot be used here (None: it can, as far as
/// tracefs tells).
pub fn socket_tracepoints_missing() -> Option<String> {
    let pretend = std::env::var(PRETEND_MISSING_ENV).unwrap_or_default();
    let events = [
        "/sys/kernel/tracing/events",
        "/sys/kernel/debug/tracing/events",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.is_dir())?;
    let missing: Vec<&str> = SOCKET_TRACEPOINTS
        .iter()
        .copied()
        .filter(|tp| {
            pretend == "all" || pretend.split(',').any(|p| p == *tp) || !events.join(tp).is_dir()
        })
        .collect();
    (!missing.is_empty()).then(|| format!("tracepoints missing: {}", missing.join(", ")))
}

/// One of the two loaded objects.
pub(crate) enum Loaded<'o> {
    Sockets(Box<SocketsSkel<'o>>),
    Syscalls(Box<RequestsSkel<'o>>),
}

/// The maps every path has, by role.
pub(crate) struct Maps<'a> {
    pub targets: &'a Map<'a>,
    pub ports: &'a Map<'a>,
    pub traced: &'a Map<'a>,
    pub events: &'a Map<'a>,
    pub counters: &'a Map<'a>,
    /// Per-target histograms (bpf/agg.h).
    pub agg: &'a Map<'a>,
    /// `conns` ((tgid, fd) -> conn_state) or `socks` (sock -> sock_state).
    pub conns: &'a Map<'a>,
    /// Traced listening ports (socket path only).
    pub lports: Option<&'a Map<'a>>,
}

impl<'o> Loaded<'o> {
    pub fn hooks(&self) -> Hooks {
        match self {
            Loaded::Sockets(_) => Hooks::Sockets,
            Loaded::Syscalls(_) => Hooks::Syscalls,
        }
    }

    pub fn maps(&self) -> Maps<'_> {
        match self {
            Loaded::Sockets(s) => Maps {
                targets: &s.maps.targets,
                ports: &s.maps.ports,
                traced: &s.maps.traced,
                events: &s.maps.events,
                counters: &s.maps.counters,
                agg: &s.maps.agg,
                conns: &s.maps.socks,
                lports: Some(&s.maps.lports),
            },
            Loaded::Syscalls(s) => Maps {
                targets: &s.maps.targets,
                ports: &s.maps.ports,
                traced: &s.maps.traced,
                events: &s.maps.events,
                counters: &s.maps.counters,
                agg: &s.maps.agg,
                conns: &s.maps.conns,
                lports: None,
            },
        }
    }
}

fn bpf_err(what: &str) -> impl Fn(libbpf_rs::Error) -> TraceError + '_ {
    move |e| TraceError::Bpf(format!("{what}: {e}"))
}

/// The ring buffer wakes the reader as it fills to a quarter, a half and
/// three quarters (a burst must not fill it before the next timed poll);
/// less waits for the poll. Once per crossing, not per record above it
/// (bpf/emit.h).
fn wakeup_bytes(opts: &TracerOptions) -> u64 {
    u64::from(opts.ringbuf_bytes / 4)
}

/// Opens a skeleton, sizes its ring buffer, sets its load-time settings,
/// loads and attaches it. The two generated skeletons share no trait for
/// their maps and rodata, hence a macro rather than a generic function.
macro_rules! load_skel {
    ($builder:ty, $storage:expr, $opts:expr, $obj:literal, $what:literal, $hooks:literal) => {{
        let opts: &TracerOptions = $opts;
        let mut open = <$builder>::default()
            .open($storage)
            .map_err(bpf_err(concat!("opening ", $obj)))?;
        open.maps
            .events
            .set_max_entries(opts.ringbuf_bytes)
            .map_err(bpf_err("sizing the ring buffer"))?;
        let kernel_agg = opts.aggregate == super::Aggregate::Kernel;
        if kernel_agg {
            open.maps
                .agg
                .set_max_entries(2 * AGG_SLOTS)
                .map_err(bpf_err("sizing the request histograms"))?;
        }
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.wakeup_bytes = wakeup_bytes(opts);
            ro.aggregate = u8::from(kernel_agg);
            if kernel_agg {
                ro.agg_slots = AGG_SLOTS;
            }
        }
        let mut skel = open
            .load()
            .map_err(bpf_err(concat!("loading the ", $what)))?;
        skel.attach()
            .map_err(bpf_err(concat!("attaching the ", $hooks)))?;
        Ok(skel)
    }};
}

fn load_sockets<'o>(
    storage: &'o mut MaybeUninit<OpenObject>,
    opts: &TracerOptions,
) -> Result<SocketsSkel<'o>, TraceError> {
    load_skel!(
        SocketsSkelBuilder,
        storage,
        opts,
        "sockets.bpf.o",
        "socket tracer",
        "socket tracepoints"
    )
}

fn load_syscalls<'o>(
    storage: &'o mut MaybeUninit<OpenObject>,
    opts: &TracerOptions,
) -> Result<RequestsSkel<'o>, TraceError> {
    load_skel!(
        RequestsSkelBuilder,
        storage,
        opts,
        "requests.bpf.o",
        "request tracer",
        "syscall tracepoints"
    )
}

/// Loads the path asked for; `Auto` tries sockets first and falls back to
/// syscalls, returning why.
pub(crate) fn load<'o>(
    sock_storage: &'o mut MaybeUninit<OpenObject>,
    sys_storage: &'o mut MaybeUninit<OpenObject>,
    opts: &TracerOptions,
) -> Result<(Loaded<'o>, Option<String>), TraceError> {
    let missing = socket_tracepoints_missing();
    match (opts.hooks, missing) {
        (HookChoice::Syscalls, _) => Ok((
            Loaded::Syscalls(Box::new(load_syscalls(sys_storage, opts)?)),
            Some("syscall hooks asked for".into()),
        )),
        (HookChoice::Sockets, Some(why)) => Err(TraceError::Environment(format!(
            "socket hooks asked for, but {why}"
        ))),
        (HookChoice::Sockets, None) => Ok((
            Loaded::Sockets(Box::new(load_sockets(sock_storage, opts)?)),
            None,
        )),
        (HookChoice::Auto, Some(why)) => Ok((
            Loaded::Syscalls(Box::new(load_syscalls(sys_storage, opts)?)),
            Some(why),
        )),
        (HookChoice::Auto, None) => match load_sockets(sock_storage, opts) {
            Ok(s) => Ok((Loaded::Sockets(Box::new(s)), None)),
            Err(e) => Ok((
                Loaded::Syscalls(Box::new(load_syscalls(sys_storage, opts)?)),
                Some(e.to_string()),
            )),
        },
    }
}

/// Sets the listening-port bitmap to exactly `ports` (socket path only;
/// `shadow` is what was last written, so only changed words are written).
pub(crate) fn set_ports(
    maps: &Maps<'_>,
    shadow: &mut Vec<u64>,
    ports: impl IntoIterator<Item = u16>,
) -> libbpf_rs::Result<()> {
    let Some(lports) = maps.lports else {
        return Ok(());
    };
    let mut want = vec![0u64; 1024];
    for p in ports {
        want[usize::from(p / 64)] |= 1 << (p % 64);
    }
    shadow.resize(1024, 0);
    for (i, (w, old)) in want.iter().zip(shadow.iter_mut()).enumerate() {
        if w != old {
            let k = (i as u32).to_ne_bytes();
            lports.update(&k, &w.to_ne_bytes(), MapFlags::ANY)?;
            *old = *w;
        }
    }
    Ok(())
}
