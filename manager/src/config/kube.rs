//! The Kubernetes parts of the config: `match: { pod: ... }` (which pods
//! and containers on this node an app is) and the `kubernetes:` section
//! (how to reach the API server, which node this is, where the kubelet
//! puts its cgroups). Checked by [`PodMatch::validate`] and
//! [`KubernetesConfig::validate`].

use std::collections::BTreeMap;
use std::path::{Component, PathBuf};

use serde::{Deserialize, Serialize};

use crate::yamlfile::{Invalid, KeyPath};

/// Pods chosen in Kubernetes terms; any subset of the fields, all of them
/// must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodMatch {
    /// The pod's namespace (any namespace when absent).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The pod's name (a StatefulSet's pods keep theirs across restarts).
    #[serde(default)]
    pub name: Option<String>,
    /// Labels the pod must carry, values compared exactly.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// One container of the pod by name (every container when absent).
    #[serde(default)]
    pub container: Option<String>,
}

/// How qosd learns the pods of its node.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// A kubeconfig file (its current context: server, CA, token or client
    /// certificate). Absent: the in-cluster service account
    /// (`KUBERNETES_SERVICE_HOST`, the mounted token and CA).
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name as the API server knows it; absent: `$NODE_NAME`
    /// (the DaemonSet sets it from `spec.nodeName`).
    #[serde(default)]
    pub node_name: Option<String>,
    /// The kubelet's `--cgroup-root` (default `/`): the parent of its
    /// `kubepods` (cgroupfs driver) or `kubepods.slice` (systemd driver).
    #[serde(default)]
    pub cgroup_root: Option<PathBuf>,
    /// Manage pods annotated `qosd.io/class: lc|be` with no config entry
    /// (default true; config entries win over annotations).
    #[serde(default = "default_true")]
    pub annotations: bool,
}

fn default_true() -> bool {
    true
}

/// A label key or value, a namespace or container name: printable, no
/// spaces, at most 253 bytes (what the API server accepts).
fn k8s_word(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.chars().all(|c| c.is_ascii_graphic())
}

impl PodMatch {
    pub fn validate(&self, at: &KeyPath) -> Result<(), Invalid> {
        if let Some(ns) = &self.namespace {
            if !k8s_word(ns) {
                return Err(Invalid::new(
                    at.key("namespace"),
                    "a namespace name: 1 to 253 printable characters, no spaces",
                ));
            }
        }
        if let Some(n) = &self.name {
            if !k8s_word(n) {
                return Err(Invalid::new(
                    at.key("name"),
                    "a pod name: 1 to 253 printable characters, no spaces",
                ));
            }
        }
        if let Some(c) = &self.container {
            if !k8s_word(c) {
                return Err(Invalid::new(
                    at.key("container"),
                    "a container name: 1 to 253 printable characters, no spaces",
                ));
            }
        }
        for (k, v) in &self.labels {
            let ok_value = v.is_empty() || k8s_word(v);
            if !k8s_word(k) || !ok_value {
                return Err(Invalid::new(
                    at.key("labels").key(k),
                    "label keys and values are printable, without spaces",
                ));
            }
        }
        Ok(())
    }
}

impl KubernetesConfig {
    pub fn validate(&self, at: &KeyPath) -> Result<(), Invalid> {
        if let Some(n) = &self.node_name {
            if !k8s_word(n) {
                return Err(Invalid::new(
                    at.key("node_name"),
                    "a node name: 1 to 253 printable characters, no spaces",
                ));
            }
        }
        if let Some(r) = &self.cgroup_root {
            if !r.is_absolute() || r.components().any(|c| c == Component::ParentDir) {
                return Err(Invalid::new(
                    at.key("cgroup_root"),
                    "must be an absolute path without `..`",
                ));
            }
        }
        Ok(())
    }
}
