//! `qosd net`: per-peer packets, bytes and millisecond peak rates on this
//! namespace's interfaces (eCounter, paper 004; `qosd_sensors::net`). Every
//! clsact qdisc and TC filter is journalled in the state file before it is
//! made and removed on exit or a terminating signal; after a SIGKILL,
//! `qosd restore` removes them. A clsact qdisc that was there before is
//! kept (only qosd's filter goes).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use qosd_actuators::journal::{Entry, Journal};
use qosd_actuators::netns::{NetnsRef, NET_TC_PREF};
use qosd_actuators::{signals, Config, Ctx, Root};
use qosd_core::clock::monotonic_ns;
use qosd_sensors::net::{
    default_ifaces, iface_by_name, proto_name, Direction, Figures, Iface, NetOptions, NetSensor,
    Window,
};

use crate::exit::to_anyhow;
use crate::secs::secs;

/// Journal keys of `qosd net`'s objects start with this.
const KEY_PREFIX: &str = "net:";

#[derive(ClapArgs, Debug)]
#[command(after_help = "Examples:\n  \
    qosd net                                  every up, non-loopback interface; top 10 peers each second\n  \
    qosd net --iface eth0 --bin-ms 10 --top 5 10 ms bins on eth0\n  \
    qosd net --iface eth0 --duration 10 --json one JSON object per 1 s window, for 10 s\n\n\
    Figures are per 1 s window (CLOCK_MONOTONIC seconds): packets and bytes on the\n\
    wire (Ethernet, IP and L4 headers included), the fullest bin's packets and its\n\
    bytes as a rate (peak), and the bins with more than --over-packets packets.\n\
    Ports are local TCP/UDP ports: an app's traffic is its listening ports'.\n\
    The TC programs are removed on exit; after a SIGKILL, `qosd restore` removes them.")]
pub struct Args {
    /// Interface to watch (repeatable); default: every up, non-loopback
    /// Ethernet interface of this network namespace.
    #[arg(long, value_name = "NAME")]
    pub iface: Vec<String>,
    /// Bin width in ms (divides 1000).
    #[arg(long, value_name = "MS", default_value_t = 1)]
    pub bin_ms: u32,
    /// A bin with more packets than this counts as a burst bin.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub over_packets: u32,
    /// Peers (and local ports) shown per window, most bytes first.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Stop after this many seconds (default: until Ctrl-C / SIGTERM).
    #[arg(long, allow_negative_numbers = true, value_name = "SECS")]
    pub duration: Option<f64>,
    /// One JSON object per window instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Entries of the peers LRU map (eCounter's 2048); evictions are counted.
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub peers_max: u32,
    /// Entries of the local-ports LRU map.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub ports_max: u32,
    /// Root prefix of the default state file.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// Where the TC objects are journalled; default <root>/run/qosd/state.json.
    #[arg(long, value_name = "PATH")]
    pub state_file: Option<PathBuf>,
}

impl Args {
    fn options(&self) -> anyhow::Result<NetOptions> {
        let o = NetOptions {
            bin_ms: self.bin_ms,
            over_packets: self.over_packets,
            peers_max: self.peers_max,
            ports_max: self.ports_max,
        };
        o.validate().map_err(|e| crate::usage!("{e}"))?;
        if self.top == 0 {
            return Err(crate::usage!("--top 0: show at least one peer"));
        }
        Ok(o)
    }

    fn ifaces(&self) -> anyhow::Result<Vec<Iface>> {
        if self.iface.is_empty() {
            let all = default_ifaces().map_err(|e| anyhow::anyhow!("{e}"))?;
            if all.is_empty() {
                return Err(crate::usage!(
                    "no up, non-loopback Ethernet interface here: name one with --iface"
                ));
            }
            return Ok(all);
        }
        let mut out: Vec<Iface> = Vec::new();
        for name in &self.iface {
            let i = iface_by_name(name).map_err(|e| crate::usage!("{e}"))?;
            if !out.contains(&i) {
                out.push(i);
            }
        }
        Ok(out)
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let opts = args.options()?;
    let end = args
        .duration
        .map(|d| secs("--duration", d, 0.0, f64::INFINITY))
        .transpose()?;
    let ifaces = args.ifaces()?;
    let sigs = signals::block_termination().map_err(to_anyhow)?;
    let cfg = Config {
        root: args.root.clone(),
        state_file: args.state_file.clone(),
        ..Config::default()
    };
    let root = Root::new(&cfg.root);
    let journal = Journal::open(root.clone(), Some(cfg.state_path()), false).map_err(to_anyhow)?;
    let mut guard = Guard(Ctx::new(root, false, journal));
    // Loaded before anything is made: a kernel that refuses the programs
    // leaves the interfaces untouched.
    let sensor = NetSensor::load(opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    let ns = NetnsRef::of_pid(std::process::id() as i32).map_err(to_anyhow)?;
    let attached = attach_all(&mut guard.0, &sensor, &ns, &ifaces);
    let result = attached.and_then(|()| watch(&args, end, &sensor, &ifaces, &sigs));
    if let Some(e) = guard.restore().into_iter().next() {
        return Err(to_anyhow(e));
    }
    let sig = result?;
    if let Some(sig) = sig {
        note(&format!("TC programs removed on {}", signals::name(sig)));
    }
    Ok(())
}

/// Removes what `qosd net` made, also when a panic unwinds past it.
struct Guard(Ctx);

impl Guard {
    fn restore(&mut self) -> Vec<qosd_actuators::Error> {
        let (restored, errs) = self
            .0
            .restore_where(|e| matches!(e, Entry::Net { key, .. } if key.starts_with(KEY_PREFIX)));
        for c in &restored {
            tracing::info!("restored {c}");
        }
        errs
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Nothing left after a normal restore; after a panic, everything.
        for e in self.restore() {
            tracing::error!("qosd net: restoring: {e}");
        }
    }
}

/// A line on stderr; a closed stderr is no reason to skip the restore.
fn note(msg: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "qosd net: {msg}");
}

/// Journals, then attaches, both programs on every interface.
fn attach_all(
    ctx: &mut Ctx,
    sensor: &NetSensor,
    ns: &NetnsRef,
    ifaces: &[Iface],
) -> anyhow::Result<()> {
    for i in ifaces {
        for dir in Direction::BOTH {
            ctx.tc_hook("net", ns, KEY_PREFIX, &i.name, dir.as_str(), NET_TC_PREF)
                .map_err(to_anyhow)?;
        }
        sensor
            .attach(i.ifindex, NET_TC_PREF)
            .map_err(|e| anyhow::anyhow!("{}: {e}", i.name))?;
    }
    Ok(())
}

/// Prints each complete window until the duration ends (`None`) or a
/// terminating signal comes (`Some(signal)`).
fn watch(
    args: &Args,
    end: Option<Duration>,
    sensor: &NetSensor,
    ifaces: &[Iface],
    sigs: &signals::Blocked,
) -> anyhow::Result<Option<i32>> {
    let names: Vec<&str> = ifaces.iter().map(|i| i.name.as_str()).collect();
    note(&format!(
        "counting on {} ({} ms bins); SIGINT/SIGTERM stops and removes the TC programs",
        names.join(", "),
        args.bin_ms
    ));
    let start = Instant::now();
    // The first window is the one the programs were attached in: it holds
    // everything counted since.
    let mut window = monotonic_ns() / 1_000_000_000;
    loop {
        let until = (window + 1) * 1_000_000_000 + 2_000_000;
        let mut left = Duration::from_nanos(until.saturating_sub(monotonic_ns()));
        if let Some(end) = end {
            left = left.min(end.saturating_sub(start.elapsed()));
        }
        if let Some(sig) = sigs.wait_timeout(left).map_err(to_anyhow)? {
            return Ok(Some(sig));
        }
        if monotonic_ns() >= until {
            let w = sensor.read(window).map_err(|e| anyhow::anyhow!("{e}"))?;
            print_window(&w, args)?;
            window += 1;
        }
        if end.is_some_and(|e| start.elapsed() >= e) {
            return Ok(None);
        }
    }
}

fn print_window(w: &Window, args: &Args) -> anyhow::Result<()> {
    if args.json {
        let mut top = w.clone();
        top.peers.truncate(args.top);
        top.ports.truncate(args.top);
        crate::outln!("{}", serde_json::to_string(&top)?)?;
        return Ok(());
    }
    let total = w.peers.iter().fold(Figures::default(), |mut t, (_, f)| {
        t.add(f);
        t
    });
    crate::outln!(
        "window {} s: {} peers, {} packets, {} bytes; peer entries {} live, {} evicted; {} non-IP frames",
        w.window,
        w.peers.len(),
        total.packets,
        total.bytes,
        w.live_peers,
        w.evicted_peers,
        w.counters.not_ip
    )?;
    if w.peers.is_empty() {
        return Ok(());
    }
    let over = format!("bins>{}", args.over_packets);
    crate::outln!(
        "  {:<8} {:<39} {:<6} {:>10} {:>12} {:>9} {:>12} {:>9}",
        "dir",
        "peer",
        "proto",
        "packets",
        "bytes",
        "peak-pkts",
        "peak-Mbit/s",
        over
    )?;
    for (k, f) in w.peers.iter().take(args.top) {
        row(k.dir, &k.addr.to_string(), k.proto, f, w.bin_ms)?;
    }
    for (k, f) in w.ports.iter().take(args.top) {
        row(
            k.dir,
            &format!("local port {}", k.port),
            k.proto,
            f,
            w.bin_ms,
        )?;
    }
    Ok(())
}

fn row(dir: Direction, what: &str, proto: u8, f: &Figures, bin_ms: u32) -> anyhow::Result<()> {
    crate::outln!(
        "  {:<8} {:<39} {:<6} {:>10} {:>12} {:>9} {:>12.3} {:>9}",
        dir.as_str(),
        what,
        proto_name(proto),
        f.packets,
        f.bytes,
        f.peak_packets,
        f.peak_bps(bin_ms) / 1e6,
        f.bins_over
    )?;
    Ok(())
}
