//! The HTTP API (axum, loopback by default): per app and per pid the four
//! calls of the eBeeMetrics paper (`rps`, `latest_latency`,
//! `average_latency`, `latency_percentile?p=`), each app's allocation and
//! figures, the last decisions, client latency feedback, and Prometheus
//! `/metrics`. JSON keys carry their unit (`latency_us`, `window_ms`).
//!
//! Per pid the figures are the eBPF tracer's window of that process's last
//! N requests (the paper's definition); per app they cover the last
//! decision interval from the app's feedback source, merged over its
//! processes (what the policy sees).
//!
//! Reads are open; writes (client feedback) need the token of
//! [`super::auth`]. Every error, whatever produced it (a handler, a bad
//! query string, a wrong method, a body too large), is a JSON object
//! `{"error": "..."}`.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use qosd_core::Resource;
use qosd_sensors::ebpf::{Figure, RequestTracer};
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Credential;
use super::metrics;
use super::state::{AppLive, SharedState};

mod net;
mod pids;
use pids::{pid, pid_call};

#[derive(Clone)]
pub struct Api {
    pub shared: SharedState,
    pub tracer: Option<Arc<RequestTracer>>,
    /// The credential writes must carry.
    pub token: Arc<Credential>,
}

type Failure = (StatusCode, Json<Value>);
type Reply = Result<Json<Value>, Failure>;

fn fail(code: StatusCode, msg: impl Into<String>) -> Failure {
    (code, Json(json!({ "error": msg.into() })))
}

pub fn router(api: Api) -> Router {
    let writes = Router::new()
        .route("/v1/apps/{name}/latency", post(report))
        // The path config.yaml has always documented.
        .route("/apps/{name}/latency", post(report))
        .route_layer(middleware::from_fn_with_state(api.clone(), authorize));
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/apps", get(apps))
        .route("/v1/apps/{name}", get(app))
        .route("/v1/apps/{name}/{call}", get(app_call))
        .route("/v1/pids/{pid}", get(pid))
        .route("/v1/pids/{pid}/{call}", get(pid_call))
        .route("/v1/decisions", get(decisions))
        .route("/v1/net", get(net::net))
        .route("/metrics", get(prometheus))
        .merge(writes)
        .fallback(|| async {
            fail(
                StatusCode::NOT_FOUND,
                "no such endpoint; see GET /v1/status for the list",
            )
        })
        .layer(middleware::map_response(json_errors))
        .with_state(api)
}

/// Refuses a write without the token: 401 and a JSON error saying where
/// the token is (the path is no secret; the file is root's alone).
async fn authorize(State(api): State<Api>, req: Request, next: Next) -> Response {
    // The layer wraps the write paths whatever the method; another method
    // than POST is no write, and gets its 405.
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let given = req.headers().get(header::AUTHORIZATION);
    if api.token.accepts(given.map(HeaderValue::as_bytes)) {
        return next.run(req).await;
    }
    let unusable = api.token.unusable();
    let why = if let Some(e) = &unusable {
        e.as_str()
    } else if given.is_some() {
        "the Authorization header does not carry the API token"
    } else {
        "writes need `Authorization: Bearer <token>`"
    };
    let mut r = fail(
        StatusCode::UNAUTHORIZED,
        format!(
            "{why}; the token is in {} (readable by root only)",
            api.token.path.display()
        ),
    )
    .into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"qosd\""),
    );
    r
}

/// Turns any error response that is not JSON (axum's own rejections: a
/// wrong method, a body too large, an undecodable path) into
/// `{"error": ...}`, keeping its status and its text.
async fn json_errors(r: Response) -> Response {
    let is_json = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let status = r.status();
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return r;
    }
    let (mut parts, body) = r.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let msg = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            "method not allowed: the Allow header lists the ones this endpoint takes; \
             see GET /v1/status"
                .to_owned()
        }
        _ if text.is_empty() => status.canonical_reason().unwrap_or("error").to_lowercase(),
        _ => text,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    (parts, Json(json!({ "error": msg }))).into_response()
}

/// A query string that does not parse, as a JSON 400.
fn bad_query(e: QueryRejection) -> Failure {
    fail(StatusCode::BAD_REQUEST, e.body_text())
}

const ENDPOINTS: &[&str] = &[
    "GET /v1/status",
    "GET /v1/apps",
    "GET /v1/apps/{name}",
    "GET /v1/apps/{name}/rps | latest_latency | average_latency | latency_percentile?p=99",
    "POST /v1/apps/{name}/latency {\"latencies_us\": [...]} (Authorization: Bearer <token>)",
    "GET /v1/pids/{pid}",
    "GET /v1/pids/{pid}/rps | latest_latency | average_latency | latency_percentile?p=99",
    "GET /v1/decisions?limit=N&app=NAME",
    "GET /v1/net",
    "GET /metrics",
];

async fn status(State(api): State<Api>) -> Json<Value> {
    let sh = api.shared.lock();
    Json(json!({
        "run": sh.info,
        "ticks": { "monitor": sh.monitor_ticks_total, "decide": sh.decide_ticks_total,
                   "missed": sh.missed_ticks_total },
        "node_cpu_util": sh.node_cpu_util,
        "node_power_w": sh.node_power_w,
        "power_error": sh.power_error,
        "ebpf_dropped_records": api.tracer.as_ref().map(|t| t.dropped()),
        "apps": sh.apps.keys().collect::<Vec<_>>(),
        "endpoints": ENDPOINTS,
    }))
}

/// One app as `GET /v1/apps` shows it.
pub fn app_json(a: &AppLive, window_ms: u64, knobs: &[Resource]) -> Value {
    let s = a.recent.summary();
    let alloc = a.share.map(|sh| {
        let mut o = serde_json::Map::new();
        for k in &qosd_core::KNOBS {
            let v = (k.share)(&sh);
            let level = (knobs.contains(&k.resource) && v > 0).then_some(v);
            o.insert(k.api_key.into(), json!(level));
            if k.resource == Resource::Cores {
                // The CPU list beside the count.
                let cpus = a.cpus.as_ref().map(|c| qosd_core::cpulist::format(c));
                o.insert("cpus".into(), json!(cpus));
            }
        }
        Value::Object(o)
    });
    json!({
        "name": a.name,
        "class": a.class,
        "feedback": a.feedback,
        "target": a.target.map(|t| json!({ "percentile": t.percentile, "latency_us": t.value_us })),
        "running": !a.pids.is_empty(),
        "pids": a.pids,
        // The pods' containers it is (namespace, pod, container, uid).
        "pods": a.pods,
        "managed": a.share.is_some(),
        "allocation": alloc,
        "latency": {
            "window_ms": window_ms,
            "requests": s.requests,
            "rps": s.rps,
            "latest_us": s.latest_us,
            "mean_us": s.mean_us,
            "p50_us": s.p50_us,
            "p95_us": s.p95_us,
            "p99_us": s.p99_us,
            "target_percentile_us": a.target_latency_us(),
        },
        "slack": a.slack(),
        "cpu_util": a.cpu_util,
        "cpu_seconds_total": a.cpu_seconds_total,
        "be_ops_per_s": a.be_ops_per_s,
        "power_w": a.power_w,
        "power": a.power.map(|p| json!({
            "source": p.source,
            "estimate": p.energy_is_estimate,
            "share": p.share,
            "cpus_used": p.cpus_used,
            "energy_per_request_j": p.energy_per_request_j,
        })),
        "requests_total": a.recent.requests_total(),
        "client_latencies_total": a.inbox.accepted_total,
        "apply_errors_total": a.apply_errors_total,
        "cannot_meet": a.cannot_meet,
        "cannot_meet_total": a.cannot_meet_total,
        // Operational analysis of the last decision interval: x_rps,
        // demand_s (CPU s/request), cpus (c), util, x_sat_rps, headroom.
        "oa": a.oa,
        // The SLO's eBPF side: the target eBPF latency is judged against
        // (the client target less the client/server gap) and its source.
        "slo": a.slo,
        // Per knob that counts events (the hedger's: hedges_sent,
        // hedges_won, dups_dropped, budget_refused, csum_fixed, ...).
        "knob_counters": a
            .knob_counters
            .iter()
            .map(|(r, c)| (r.name().to_owned(), json!(c.iter().copied().collect::<std::collections::BTreeMap<_, _>>())))
            .collect::<serde_json::Map<_, _>>(),
        "note": a.note,
    })
}

fn knobs_in_use(api: &Api) -> Vec<Resource> {
    let sh = api.shared.lock();
    sh.info
        .knobs
        .iter()
        .filter(|k| k.in_use)
        .map(|k| k.resource)
        .collect()
}

async fn apps(State(api): State<Api>) -> Json<Value> {
    let knobs = knobs_in_use(&api);
    let sh = api.shared.lock();
    let w = sh.info.latency_window_ms;
    Json(Value::Array(
        sh.apps.values().map(|a| app_json(a, w, &knobs)).collect(),
    ))
}

fn no_app(sh: &super::state::Shared, name: &str) -> Failure {
    let names: Vec<&str> = sh.apps.keys().map(String::as_str).collect();
    fail(
        StatusCode::NOT_FOUND,
        format!("no app named {name} (apps: {})", names.join(", ")),
    )
}

async fn app(State(api): State<Api>, Path(name): Path<String>) -> Reply {
    let knobs = knobs_in_use(&api);
    let sh = api.shared.lock();
    let a = sh.apps.get(&name).ok_or_else(|| no_app(&sh, &name))?;
    Ok(Json(app_json(a, sh.info.latency_window_ms, &knobs)))
}

#[derive(Deserialize)]
struct PQuery {
    p: Option<String>,
    /// `latency` (from arrival) or `service` (from the first read); pid
    /// calls default to latency, app calls to the app's configured figure.
    figure: Option<String>,
}

fn figure(q: &PQuery) -> Result<Figure, Failure> {
    match q.figure.as_deref() {
        None | Some("latency") => Ok(Figure::Latency),
        Some("service") => Ok(Figure::Service),
        Some(f) => Err(fail(
            StatusCode::BAD_REQUEST,
            format!("figure={f}: latency (from arrival) or service (from the first read)"),
        )),
    }
}

fn percentile(q: &PQuery) -> Result<f64, Failure> {
    let Some(raw) = q.p.as_deref() else {
        return Ok(99.0);
    };
    match raw.trim_start_matches('p').parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        _ => Err(fail(
            StatusCode::BAD_REQUEST,
            format!("p={raw}: a percentile is a number in [0, 100], e.g. p=99 or p=99.9"),
        )),
    }
}

fn unknown_call(call: &str) -> Failure {
    fail(
        StatusCode::NOT_FOUND,
        format!("no call {call}: rps, latest_latency, average_latency or latency_percentile?p="),
    )
}

async fn app_call(
    State(api): State<Api>,
    Path((name, call)): Path<(String, String)>,
    q: Result<Query<PQuery>, QueryRejection>,
) -> Reply {
    let Query(q) = q.map_err(bad_query)?;
    let sh = api.shared.lock();
    let a = sh.apps.get(&name).ok_or_else(|| no_app(&sh, &name))?;
    let w = sh.info.latency_window_ms;
    // The policy's figures by default; `figure=` picks either eBPF figure
    // of an eBPF app (over the same ticks), as the pid calls do.
    let ebpf = a.feedback == qosd_core::Feedback::Ebpf;
    let (r, fig) = match (&q.figure, ebpf) {
        (None, _) => (&a.recent, ebpf.then_some(a.figure)),
        (Some(_), true) => {
            let f = figure(&q)?;
            (&a.ebpf[usize::from(f == Figure::Service)], Some(f))
        }
        (Some(_), false) => {
            return Err(fail(
                StatusCode::BAD_REQUEST,
                format!("app {name} takes client feedback: figure= picks an eBPF figure"),
            ))
        }
    };
    let fs = fig.map(Figure::as_str);
    Ok(Json(match call.as_str() {
        "rps" => json!({ "app": name, "rps": r.rps(), "window_ms": w }),
        "latest_latency" => json!({ "app": name, "figure": fs, "latency_us": r.latest_us() }),
        "average_latency" => {
            json!({ "app": name, "figure": fs, "latency_us": r.mean_us(), "window_ms": w,
                    "requests": r.requests() })
        }
        "latency_percentile" => {
            let p = percentile(&q)?;
            json!({ "app": name, "p": p, "figure": fs, "latency_us": r.percentile_us(p),
                    "window_ms": w, "requests": r.requests() })
        }
        _ => return Err(unknown_call(&call)),
    }))
}

#[derive(Deserialize)]
struct ReportBody {
    latencies_us: Vec<f64>,
}

async fn report(
    State(api): State<Api>,
    Path(name): Path<String>,
    body: Result<Json<ReportBody>, axum::extract::rejection::JsonRejection>,
) -> Reply {
    let Json(body) = body.map_err(|e| {
        fail(
            StatusCode::BAD_REQUEST,
            format!("{e}; expected {{\"latencies_us\": [120.5, 98.0, ...]}}"),
        )
    })?;
    let mut sh = api.shared.lock();
    if !sh.apps.contains_key(&name) {
        return Err(no_app(&sh, &name));
    }
    let Some(a) = sh.apps.get_mut(&name) else {
        return Err(fail(StatusCode::NOT_FOUND, "gone"));
    };
    let n = a
        .inbox
        .record_us(&body.latencies_us)
        .map_err(|e| fail(StatusCode::BAD_REQUEST, e))?;
    let used = a.feedback == qosd_core::Feedback::Client;
    Ok(Json(json!({
        "app": name,
        "accepted": n,
        "feedback": a.feedback,
        "used_by_policy": used,
    })))
}

#[derive(Deserialize)]
struct DecisionQuery {
    limit: Option<usize>,
    app: Option<String>,
}

async fn decisions(
    State(api): State<Api>,
    q: Result<Query<DecisionQuery>, QueryRejection>,
) -> Reply {
    let Query(q) = q.map_err(bad_query)?;
    let sh = api.shared.lock();
    let limit = q.limit.unwrap_or(50);
    let mut v: Vec<&super::state::DecisionRecord> = sh
        .decisions
        .iter()
        .rev()
        .filter(|d| q.app.as_ref().is_none_or(|a| &d.app == a))
        .take(limit)
        .collect();
    v.reverse();
    Ok(Json(
        json!({ "decisions": v, "total": sh.decisions_total.values().sum::<u64>() }),
    ))
}

async fn prometheus(State(api): State<Api>) -> Response {
    let dropped = api.tracer.as_ref().map(|t| t.dropped());
    let mut body = metrics::render(&api.shared.lock(), dropped);
    if let Some(t) = &api.tracer {
        let apps: Vec<(String, Vec<i32>)> = api
            .shared
            .lock()
            .apps
            .values()
            .map(|a| (a.name.clone(), a.pids.clone()))
            .collect();
        body.push_str(&metrics::render_traced(t, &apps));
    }
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body).into_response()
}
