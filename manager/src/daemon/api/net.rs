//! `GET /v1/net`: the net sensor's view (`sensors.net`): each app's
//! traffic on its ports (totals since start, the last window's peak) and
//! the node's last complete 1 s window, top-N peers per direction with
//! the rest as one `other` row.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::json;

use super::{fail, Api, Reply};

pub async fn net(State(api): State<Api>) -> Reply {
    let sh = api.shared.lock();
    let Some(node) = &sh.net else {
        return Err(fail(
            StatusCode::SERVICE_UNAVAILABLE,
            "no traffic figures: the net sensor is off (sensors.net in the config), \
             did not start (see the daemon's log), or has no complete window yet",
        ));
    };
    let apps: serde_json::Map<String, serde_json::Value> = sh
        .apps
        .values()
        .map(|a| (a.name.clone(), json!(a.net)))
        .collect();
    Ok(Json(json!({ "node": node, "apps": apps })))
}
