//! Kubernetes: the pods of this node as the API server sees them (one
//! watch with `spec.nodeName`, [`client`]), which of them an app is
//! (`match: { pod: ... }` or `qosd.io/*` annotations, [`annotations`]),
//! and where the kubelet put each container's processes ([`cgroup`]).
//! The watch fills a [`PodSet`]; discovery reads it on every scan.

pub mod annotations;
pub mod cgroup;
pub mod client;
pub mod select;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::config::{KubernetesConfig, PodMatch};

/// The pod's QoS class, which picks its kubelet cgroup parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QosClass {
    Guaranteed,
    #[default]
    Burstable,
    BestEffort,
}

/// A container's runtime id (`containerd://ID`, `cri-o://ID`,
/// `docker://ID` in the pod's status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerId {
    pub runtime: String,
    pub id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub name: String,
    /// None until the container runs (the kubelet reports it).
    pub id: Option<ContainerId>,
}

/// One pod bound to this node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub qos: QosClass,
    pub containers: Vec<Container>,
}

/// Which pod and container an app's processes belong to: the labels its
/// figures carry (Kepler's and Beyla's names).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PodRef {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub uid: String,
}

// The parts of the API's Pod object qosd reads; serde skips the rest.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodJson {
    metadata: MetaJson,
    #[serde(default)]
    spec: SpecJson,
    #[serde(default)]
    status: StatusJson,
}

#[derive(Deserialize)]
struct MetaJson {
    name: String,
    #[serde(default)]
    namespace: String,
    uid: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
struct SpecJson {
    #[serde(default)]
    containers: Vec<NameJson>,
}

#[derive(Deserialize)]
struct NameJson {
    name: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct StatusJson {
    #[serde(default)]
    qos_class: Option<String>,
    #[serde(default)]
    container_statuses: Vec<ContainerStatusJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerStatusJson {
    name: String,
    #[serde(rename = "containerID", default)]
    container_id: Option<String>,
}

impl Pod {
    /// A Pod object of the API (JSON).
    pub fn from_json(v: serde_json::Value) -> Result<Pod, serde_json::Error> {
        let p: PodJson = serde_json::from_value(v)?;
        let ids: BTreeMap<String, ContainerId> = p
            .status
            .container_statuses
            .into_iter()
            .filter_map(|s| {
                let (runtime, id) = s
                    .container_id?
                    .split_once("://")
                    .map(|(r, i)| (r.to_owned(), i.to_owned()))?;
                (!id.is_empty()).then_some((s.name, ContainerId { runtime, id }))
            })
            .collect();
        let qos = match p.status.qos_class.as_deref() {
            Some("Guaranteed") => QosClass::Guaranteed,
            Some("BestEffort") => QosClass::BestEffort,
            _ => QosClass::Burstable,
        };
        Ok(Pod {
            uid: p.metadata.uid,
            namespace: p.metadata.namespace,
            name: p.metadata.name,
            labels: p.metadata.labels,
            annotations: p.metadata.annotations,
            qos,
            containers: p
                .spec
                .containers
                .into_iter()
                .map(|c| Container {
                    id: ids.get(&c.name).cloned(),
                    name: c.name,
                })
                .collect(),
        })
    }

    /// Whether the pod is one `m` chooses (its containers aside).
    pub fn matches(&self, m: &PodMatch) -> bool {
        m.namespace.as_ref().is_none_or(|ns| *ns == self.namespace)
            && m.name.as_ref().is_none_or(|n| *n == self.name)
            && m.labels
                .iter()
                .all(|(k, v)| self.labels.get(k).is_some_and(|have| have == v))
    }

    /// The containers `container` names (every one when None).
    pub fn containers_named<'a>(
        &'a self,
        container: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Container> + 'a {
        self.containers
            .iter()
            .filter(move |c| container.is_none_or(|n| n == c.name))
    }

    pub fn pod_ref(&self, c: &Container) -> PodRef {
        PodRef {
            namespace: self.namespace.clone(),
            pod: self.name.clone(),
            container: c.name.clone(),
            uid: self.uid.clone(),
        }
    }
}

/// `namespace shop, labels app=cart, container web`: how the start-up
/// banner names a pod matcher.
pub fn describe(m: &PodMatch) -> String {
    let mut parts = Vec::new();
    if let Some(ns) = &m.namespace {
        parts.push(format!("namespace {ns}"));
    }
    if let Some(n) = &m.name {
        parts.push(format!("name {n}"));
    }
    if !m.labels.is_empty() {
        let l: Vec<String> = m.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts.push(format!("labels {}", l.join(",")));
    }
    if let Some(c) = &m.container {
        parts.push(format!("container {c}"));
    }
    if parts.is_empty() {
        "every pod of the node".into()
    } else {
        parts.join(", ")
    }
}

/// Starts the watch of this node's pods as the `kubernetes:` section
/// says (its defaults when absent). The node's name and the credentials
/// are the user's to give: their absence is a usage error.
pub fn start(k: Option<&KubernetesConfig>) -> Result<(select::PodSource, String), String> {
    let def = KubernetesConfig {
        annotations: true,
        ..Default::default()
    };
    let k = k.unwrap_or(&def);
    let node = match &k.node_name {
        Some(n) => n.clone(),
        None => std::env::var("NODE_NAME").map_err(|_| {
            "kubernetes: no node name: set kubernetes.node_name or $NODE_NAME (the DaemonSet \
             sets it from spec.nodeName)"
                .to_owned()
        })?,
    };
    let creds = match &k.kubeconfig {
        Some(p) => client::Credentials::from_kubeconfig(p),
        None => client::Credentials::in_cluster(),
    }
    .map_err(|e| format!("kubernetes: {e:#}"))?;
    let set = PodSet::default();
    println!(
        "kubernetes: watching the pods of node {node} at {}",
        creds.server
    );
    client::spawn_watch(creds, node.clone(), set.clone()).map_err(|e| format!("{e:#}"))?;
    let root = k.cgroup_root.clone().unwrap_or_else(|| "/".into());
    Ok((select::PodSource::new(set, root), node))
}

/// What the watch knows: the node's pods by uid, and its state.
#[derive(Debug, Default)]
pub struct Pods {
    pub by_uid: BTreeMap<String, Pod>,
    /// Set once the first list arrived: before it, "no pod matches" means
    /// "not known yet".
    pub synced: bool,
    /// The watch's last failure (cleared when it works again).
    pub error: Option<String>,
    /// Bumped on every change, so readers can skip unchanged sets.
    pub generation: u64,
}

/// The pods of the node, shared between the watch thread and discovery.
#[derive(Debug, Clone, Default)]
pub struct PodSet(Arc<Mutex<Pods>>);

impl PodSet {
    pub fn lock(&self) -> MutexGuard<'_, Pods> {
        // A panic in the watch thread leaves the data valid.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces every pod (after a list).
    pub fn replace(&self, pods: Vec<Pod>) {
        let mut g = self.lock();
        g.by_uid = pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
        g.synced = true;
        g.error = None;
        g.generation += 1;
    }

    pub fn upsert(&self, p: Pod) {
        let mut g = self.lock();
        g.by_uid.insert(p.uid.clone(), p);
        g.generation += 1;
    }

    pub fn remove(&self, uid: &str) {
        let mut g = self.lock();
        g.by_uid.remove(uid);
        g.generation += 1;
    }

    pub fn set_error(&self, e: String) {
        self.lock().error = Some(e);
    }
}

#[cfg(test)]
mod tests;
