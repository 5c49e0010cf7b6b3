//! Pods that ask to be managed: `qosd.io/class: lc|be`, with
//! `qosd.io/target: "p99=5ms"` for `lc` and an optional `qosd.io/port`.
//! Such a pod becomes an app named `<namespace>.<pod>` with no config
//! edit. A malformed annotation leaves the pod alone (never half
//! managed): the error names the pod and the key.

use std::collections::BTreeMap;

use qosd_core::AppClass;
use serde_yaml_ng::Value;

use super::Pod;
use crate::config::{AppConfig, Match, PodMatch, Target};

pub const CLASS: &str = "qosd.io/class";
pub const TARGET: &str = "qosd.io/target";
pub const PORT: &str = "qosd.io/port";

/// The app an annotated pod asks for; Ok(None) without `qosd.io/class`.
pub fn app_of(p: &Pod) -> Result<Option<AppConfig>, String> {
    let Some(class) = p.annotations.get(CLASS) else {
        return Ok(None);
    };
    let bad = |key: &str, why: String| format!("pod {}/{}: {key}: {why}", p.namespace, p.name);
    let class = match class.trim() {
        "lc" => AppClass::Lc,
        "be" => AppClass::Be,
        other => return Err(bad(CLASS, format!("`{other}` is neither `lc` nor `be`"))),
    };
    let target = match (class, p.annotations.get(TARGET)) {
        (AppClass::Lc, None) => {
            return Err(bad(
                TARGET,
                "an `lc` pod needs one, e.g. \"p99=5ms\"".into(),
            ))
        }
        (AppClass::Be, Some(_)) => {
            return Err(bad(TARGET, "a `be` pod has no latency target".into()))
        }
        (AppClass::Be, None) => None,
        (AppClass::Lc, Some(t)) => {
            let (k, v) = t
                .split_once('=')
                .ok_or_else(|| bad(TARGET, format!("`{t}` is not like \"p99=5ms\"")))?;
            let target = Target(BTreeMap::from([(
                k.trim().to_owned(),
                Value::String(v.trim().to_owned()),
            )]));
            // The config's own parser: the same rules and messages.
            target
                .parse()
                .map_err(|(_, why)| bad(TARGET, format!("`{t}`: {why}")))?;
            Some(target)
        }
    };
    let ports = match p.annotations.get(PORT) {
        None => Vec::new(),
        Some(s) => match s.trim().parse::<u16>() {
            Ok(n) if n > 0 => vec![n],
            _ => return Err(bad(PORT, format!("`{s}` is not a port (1-65535)"))),
        },
    };
    let name = format!("{}.{}", p.namespace, p.name);
    if name.len() > crate::config::MAX_APP_NAME {
        return Err(bad(
            CLASS,
            format!(
                "the app name `{name}` is longer than {} characters",
                crate::config::MAX_APP_NAME
            ),
        ));
    }
    Ok(Some(AppConfig {
        name,
        matcher: Match {
            pod: Some(PodMatch {
                namespace: Some(p.namespace.clone()),
                name: Some(p.name.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        job: None,
        class,
        target,
        feedback: Default::default(),
        ports,
        latency: Default::default(),
        resources: Default::default(),
        hedge: None,
    }))
}
