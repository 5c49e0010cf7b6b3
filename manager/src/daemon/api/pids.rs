//! The per-pid calls of the API (`/v1/pids/{pid}` and its four calls):
//! the eBPF tracer's window of one traced process's last N requests, both
//! figures, and the app that holds the process.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use qosd_sensors::ebpf::{Figure, RequestTracer};
use serde_json::json;

use super::{bad_query, fail, figure, percentile, unknown_call, Api, Failure, PQuery, Reply};

/// Checks that `pid` is traced; names the app holding it.
fn traced(api: &Api, pid: i32) -> Result<(Arc<RequestTracer>, Option<String>), Failure> {
    let Some(t) = api.tracer.clone() else {
        return Err(fail(
            StatusCode::SERVICE_UNAVAILABLE,
            "the eBPF request tracer is not running (no app uses feedback: ebpf, or it could not start); per-pid figures are unavailable",
        ));
    };
    let app = api.shared.lock().app_of_pid(pid).map(str::to_owned);
    if pid <= 0 || !t.pids().contains(&(pid as u32)) {
        return Err(fail(
            StatusCode::NOT_FOUND,
            format!(
                "pid {pid} is not traced: it is not a process of a configured app, or it is \
                 followed under its topmost matched ancestor (see GET /v1/apps)"
            ),
        ));
    }
    Ok((t, app))
}

fn us(d: Option<std::time::Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64() * 1e6)
}

/// A pid from the path, or a JSON 400 naming what was given.
fn pid_arg(raw: &str) -> Result<i32, Failure> {
    raw.parse().map_err(|_| {
        fail(
            StatusCode::BAD_REQUEST,
            format!("{raw:?} is not a process id"),
        )
    })
}

pub(super) async fn pid(State(api): State<Api>, Path(raw): Path<String>) -> Reply {
    let pid = pid_arg(&raw)?;
    let (t, app) = traced(&api, pid)?;
    let p = pid as u32;
    let s = t.summary(p).unwrap_or_default();
    let v = t.summary_of(p, Figure::Service).unwrap_or_default();
    Ok(Json(json!({
        "pid": pid,
        "app": app,
        "mode": t.mode(p).map(|m| m.as_str()),
        "hooks": t.hooks().as_str(),
        // The same requests from the server's first read.
        "service": {
            "latest_us": v.latest_us,
            "mean_us": v.mean_us,
            "p50_us": v.p50_us,
            "p95_us": v.p95_us,
            "p99_us": v.p99_us,
        },
        "requests_total": t.requests(p),
        "window": {
            "requests": s.requests,
            "rps": s.rps,
            "latest_us": s.latest_us,
            "mean_us": s.mean_us,
            "p50_us": s.p50_us,
            "p95_us": s.p95_us,
            "p99_us": s.p99_us,
        },
        "exited": t.exited(p),
    })))
}

pub(super) async fn pid_call(
    State(api): State<Api>,
    Path((raw, call)): Path<(String, String)>,
    q: Result<Query<PQuery>, QueryRejection>,
) -> Reply {
    let Query(q) = q.map_err(bad_query)?;
    let pid = pid_arg(&raw)?;
    let (t, app) = traced(&api, pid)?;
    let p = pid as u32;
    let f = figure(&q)?;
    let fs = f.as_str();
    Ok(Json(match call.as_str() {
        "rps" => json!({ "pid": pid, "app": app, "rps": t.rps(p).unwrap_or(0.0) }),
        "latest_latency" => {
            json!({ "pid": pid, "app": app, "figure": fs, "latency_us": us(t.latest(p, f)) })
        }
        "average_latency" => {
            json!({ "pid": pid, "app": app, "figure": fs, "latency_us": us(t.average(p, f)) })
        }
        "latency_percentile" => {
            let pc = percentile(&q)?;
            json!({ "pid": pid, "app": app, "p": pc, "figure": fs,
                    "latency_us": us(t.percentile(p, f, pc)) })
        }
        _ => return Err(unknown_call(&call)),
    }))
}
