//! The validation pass of a parsed scenario: ranges, names, one target per
//! latency-critical app, a server or (best-effort apps) a batch job, trace
//! files readable. Returns the key at fault.

use std::collections::HashSet;

use qosd_core::AppClass;

use super::{AppSpec, JobSpec, Scenario, Seg, Server, Shape};
use crate::load::{self, Protocol};

mod sim;
pub use sim::MAX_WAYS;
pub(crate) use sim::{node_ok, sim_spec_ok};

pub(crate) type Fail = (Vec<Seg>, String);

fn at(path: &[&dyn AsSeg]) -> Vec<Seg> {
    path.iter().map(|s| s.seg()).collect()
}

trait AsSeg {
    fn seg(&self) -> Seg;
}
impl AsSeg for &str {
    fn seg(&self) -> Seg {
        Seg::Key((*self).to_owned())
    }
}
impl AsSeg for usize {
    fn seg(&self) -> Seg {
        Seg::Index(*self)
    }
}

fn check(ok: bool, path: Vec<Seg>, msg: impl FnOnce() -> String) -> Result<(), Fail> {
    if ok {
        Ok(())
    } else {
        Err((path, msg()))
    }
}

/// Largest load level accepted: twice the capacity (a deliberate overload).
const MAX_LEVEL: f64 = 2.0;

/// The most timeline rows (intervals × apps) a replay may produce: each
/// is a row of `timeline.csv`, a line of `plans.jsonl` (~180 bytes) and a
/// row held in memory until the end, so this bounds a run's output to a
/// few hundred MB (86400 s at 10 ms would be 8.6 million per app).
pub const MAX_ROWS: f64 = 1_000_000.0;

pub fn validate(s: &mut Scenario) -> Result<(), Fail> {
    check(valid_name(&s.name), at(&[&"name"]), || {
        format!("{:?}: use letters, digits, - and _", s.name)
    })?;
    check(
        s.duration_s > 0.0 && s.duration_s <= 86_400.0,
        at(&[&"duration_s"]),
        || format!("{} s: must be in (0, 86400]", s.duration_s),
    )?;
    check(
        (10..=60_000).contains(&s.interval_ms),
        at(&[&"interval_ms"]),
        || format!("{} ms: must be in 10..=60000", s.interval_ms),
    )?;
    run_size(s.duration_s, s.interval_ms, s.apps.len()).map_err(|m| (at(&[&"duration_s"]), m))?;
    check(
        s.monitor_ms >= 10
            && s.monitor_ms <= s.interval_ms
            && (s.interval_ms / s.monitor_ms) * s.monitor_ms == s.interval_ms,
        at(&[&"monitor_ms"]),
        || {
            format!(
                "{} ms: must be >= 10 and divide interval_ms ({})",
                s.monitor_ms, s.interval_ms
            )
        },
    )?;
    if let Some(rs) = &s.resources {
        check(!rs.is_empty(), at(&[&"resources"]), || {
            "empty: name at least one knob (cores, frequency, cache_ways, memory_bandwidth, cpu_quota), or drop the key for every knob the machine has".into()
        })?;
        for (i, r) in rs.iter().enumerate() {
            check(!rs[..i].contains(r), at(&[&"resources", &i]), || {
                format!("{r} appears twice")
            })?;
        }
    }
    node_ok(&s.node, s.apps.len(), &[Seg::Key("node".into())])?;
    check(
        !s.apps.is_empty() && s.apps.len() <= 16,
        at(&[&"apps"]),
        || "need 1 to 16 apps".into(),
    )?;
    let mut names = HashSet::new();
    let dir = s.dir.clone();
    for (i, a) in s.apps.iter_mut().enumerate() {
        check(
            names.insert(a.name.clone()),
            at(&[&"apps", &i, &"name"]),
            || format!("{:?} appears twice", a.name),
        )?;
        app(i, a)?;
        a.load
            .load_trace(&dir)
            .map_err(|e| (at(&[&"apps", &i, &"load", &"file"]), e))?;
        check(
            a.load.peak() <= MAX_LEVEL,
            at(&[&"apps", &i, &"load"]),
            || {
                format!(
                    "peaks at {:.2} of capacity; at most {MAX_LEVEL}",
                    a.load.peak()
                )
            },
        )?;
    }
    if s.apps.iter().all(|a| a.class == AppClass::Be) {
        return Err((
            at(&[&"apps"]),
            "need at least one latency-critical (lc) app".into(),
        ));
    }
    Ok(())
}

/// Whether a run of `duration_s` in `interval_ms` intervals with `nr_apps`
/// apps is at least one interval long and at most [`MAX_ROWS`] rows (the
/// scenario's own duration, or `replay --duration`).
pub fn run_size(duration_s: f64, interval_ms: u64, nr_apps: usize) -> Result<(), String> {
    if duration_s.is_nan() || duration_s * 1000.0 < interval_ms as f64 {
        return Err(format!(
            "{duration_s} s: shorter than one interval ({interval_ms} ms)"
        ));
    }
    let rows = duration_s * 1000.0 / interval_ms as f64 * nr_apps.max(1) as f64;
    if rows > MAX_ROWS {
        return Err(format!(
            "{duration_s} s at {interval_ms} ms intervals with {nr_apps} app(s) is {rows:.0} \
             timeline rows; at most {MAX_ROWS:.0} (a longer interval_ms or a shorter run)"
        ));
    }
    Ok(())
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn app(i: usize, a: &AppSpec) -> Result<(), Fail> {
    let p = |k: &'static str| at(&[&"apps", &i, &k]);
    check(valid_name(&a.name), p("name"), || {
        format!("{:?}: use letters, digits, - and _", a.name)
    })?;
    check(
        a.connections >= 1 && a.connections <= load::MAX_CONNECTIONS,
        p("connections"),
        || {
            format!(
                "{}: must be in 1..={}",
                a.connections,
                load::MAX_CONNECTIONS
            )
        },
    )?;
    check(
        a.http_path.starts_with('/') && !a.http_path.contains(char::is_whitespace),
        p("http_path"),
        || format!("{:?}: must start with / and hold no spaces", a.http_path),
    )?;
    let server = match (&a.server, &a.job) {
        (Some(srv), None) => Some(srv),
        (None, Some(j)) => {
            job(i, a, j)?;
            None
        }
        (Some(_), Some(_)) => {
            return Err((p("job"), "give a `server` or a `job`, not both".into()))
        }
        (None, None) => {
            return Err((
                p("server"),
                "missing: how to start the app (a best-effort app may run a `job` instead)".into(),
            ))
        }
    };
    if let Some(srv) = server {
        server_ok(i, a, srv)?;
    }
    if let Some(m) = &a.mix {
        check(a.protocol == Some(Protocol::Memcache), p("mix"), || {
            "a request mix is for memcache apps".into()
        })?;
        check(
            (0.0..=1.0).contains(&m.set_ratio) && m.nr_keys >= 1 && m.value_bytes <= 1 << 20,
            p("mix"),
            || "set_ratio in [0, 1], nr_keys >= 1, value_bytes <= 1 MiB".into(),
        )?;
    }
    match (&a.class, &a.target) {
        (AppClass::Lc, None) => {
            return Err((p("target"), "a latency-critical app needs a target".into()))
        }
        (AppClass::Lc, Some(t)) => {
            let tp = |k: &'static str| at(&[&"apps", &i, &"target", &k]);
            check(
                t.percentile > 0.0 && t.percentile <= 100.0,
                tp("percentile"),
                || format!("{}: must be in (0, 100]", t.percentile),
            )?;
            match (t.ms, t.knee_factor) {
                (Some(ms), None) => check(ms > 0.0 && ms.is_finite(), tp("ms"), || {
                    format!("{ms}: must be > 0")
                })?,
                (None, Some(k)) => check(k > 0.0 && k <= 100.0, tp("knee_factor"), || {
                    format!("{k}: must be in (0, 100]")
                })?,
                _ => {
                    return Err((
                        p("target"),
                        "give exactly one of `ms` and `knee_factor`".into(),
                    ))
                }
            }
        }
        (AppClass::Be, Some(_)) => {
            return Err((p("target"), "a best-effort app has no target".into()))
        }
        (AppClass::Be, None) => {}
    }
    shape(i, &a.load)?;
    if matches!(a.server, Some(Server::Command { .. })) {
        check(a.sim.service_us.is_some(), p("sim"), || {
            "a `command` server needs sim.service_us for --sim".into()
        })?;
    }
    sim_spec_ok(&a.sim, &at(&[&"apps", &i, &"sim"]))?;
    Ok(())
}

/// A server app: its protocol is given and is the one its server speaks.
fn server_ok(i: usize, a: &AppSpec, srv: &Server) -> Result<(), Fail> {
    let p = |k: &'static str| at(&[&"apps", &i, &k]);
    let Some(proto) = a.protocol else {
        return Err((
            p("protocol"),
            "missing: how the load generator talks to the server (http, memcache or grpc)".into(),
        ));
    };
    match srv {
        Server::Memcached { threads, .. } => {
            check(proto == Protocol::Memcache, p("protocol"), || {
                "memcached speaks `memcache`".into()
            })?;
            check(
                (1..=256).contains(threads),
                at(&[&"apps", &i, &"server", &"threads"]),
                || format!("{threads}: must be in 1..=256"),
            )?;
        }
        Server::Nginx { workers } => {
            check(proto == Protocol::Http, p("protocol"), || {
                "nginx speaks `http`".into()
            })?;
            check(
                (1..=64).contains(workers),
                at(&[&"apps", &i, &"server", &"workers"]),
                || format!("{workers}: must be in 1..=64"),
            )?;
        }
        Server::Fixture { work_us, delay_us } => {
            check(proto == Protocol::Http, p("protocol"), || {
                "the fixture server speaks `http`".into()
            })?;
            check(
                *work_us <= 1_000_000 && *delay_us <= 10_000_000,
                p("server"),
                || "work_us <= 1 s and delay_us <= 10 s".into(),
            )?;
        }
        Server::Grpc { work_us } => {
            check(proto == Protocol::Grpc, p("protocol"), || {
                "the gRPC fixture server speaks `grpc`".into()
            })?;
            check(*work_us <= 1_000_000, p("server"), || {
                "work_us <= 1 s".into()
            })?;
        }
        Server::Command { argv } => {
            check(
                !argv.is_empty(),
                at(&[&"apps", &i, &"server", &"argv"]),
                || "empty command".into(),
            )?;
        }
    }
    Ok(())
}

/// A best-effort app's batch job: no protocol, no load, no target.
fn job(i: usize, a: &AppSpec, j: &JobSpec) -> Result<(), Fail> {
    let p = |k: &'static str| at(&[&"apps", &i, &k]);
    check(a.class == AppClass::Be, p("job"), || {
        "a batch job is for best-effort apps (class: be)".into()
    })?;
    check(a.protocol.is_none(), p("protocol"), || {
        "a batch job takes no requests: drop `protocol`".into()
    })?;
    check(a.load.peak() == 0.0, p("load"), || {
        "a batch job takes no load: drop `load`".into()
    })?;
    j.check()
        .map_err(|(k, msg)| (at(&[&"apps", &i, &"job", &k]), msg))
}

fn shape(i: usize, s: &Shape) -> Result<(), Fail> {
    let p = |k: &'static str| at(&[&"apps", &i, &"load", &k]);
    let level = |k: &'static str, v: f64| {
        check(v.is_finite() && v >= 0.0, p(k), || {
            format!("{v}: must be >= 0")
        })
    };
    let time = |k: &'static str, v: f64| {
        check(v.is_finite() && v >= 0.0, p(k), || {
            format!("{v} s: must be >= 0")
        })
    };
    let span = |k: &'static str, v: f64| {
        check(v.is_finite() && v > 0.0, p(k), || {
            format!("{v} s: must be > 0")
        })
    };
    match s {
        Shape::Constant { level: l } => level("level", *l),
        Shape::Ramp {
            from,
            to,
            start_s,
            over_s,
            hold_s,
            back_s,
        } => {
            level("from", *from)?;
            level("to", *to)?;
            time("start_s", *start_s)?;
            span("over_s", *over_s)?;
            time("hold_s", *hold_s)?;
            back_s.map_or(Ok(()), |b| span("back_s", b))
        }
        Shape::Steps { steps } => {
            check(!steps.is_empty(), p("steps"), || {
                "need at least one step".into()
            })?;
            for (j, st) in steps.iter().enumerate() {
                let q = |k: &'static str| at(&[&"apps", &i, &"load", &"steps", &j, &k]);
                check(st.level.is_finite() && st.level >= 0.0, q("level"), || {
                    format!("{}: must be >= 0", st.level)
                })?;
                check(st.at_s.is_finite() && st.at_s >= 0.0, q("at_s"), || {
                    format!("{} s: must be a time >= 0", st.at_s)
                })?;
                check(j == 0 || st.at_s > steps[j - 1].at_s, q("at_s"), || {
                    "step times must increase".into()
                })?;
            }
            Ok(())
        }
        Shape::Diurnal {
            min,
            max,
            period_s,
            phase_s,
        } => {
            level("min", *min)?;
            check(max >= min, p("max"), || format!("{max} < min {min}"))?;
            span("period_s", *period_s)?;
            time("phase_s", *phase_s)
        }
        Shape::Spike {
            base,
            peak,
            at_s,
            width_s,
            rise_s,
        } => {
            level("base", *base)?;
            level("peak", *peak)?;
            time("at_s", *at_s)?;
            time("width_s", *width_s)?;
            span("rise_s", *rise_s)
        }
        Shape::Trace { file, .. } => {
            check(!file.is_empty(), p("file"), || "empty file name".into())
        }
    }
}
