//! The API server client: credentials (a kubeconfig's current context, or
//! the in-cluster service account) and one list-then-watch of the pods
//! bound to this node (`fieldSelector=spec.nodeName=NODE`), run on its
//! own thread and kept in a [`PodSet`]. A watch that ends is resumed from
//! the last resourceVersion; one the server refuses as too old (410) and
//! any failure start again from a fresh list, after a growing pause.
//!
//! Why not the `kube` crate: qosd needs one GET and one streamed GET of
//! one resource; `kube` + `k8s-openapi` bring tower, hyper's client
//! stack and every API type (minutes of build on a 2-CPU node). `ureq`
//! (already the CLI's client) with rustls does it in a page.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use base64::Engine;
use serde::Deserialize;
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};

use super::{Pod, PodSet};

/// Where the in-cluster credentials are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How to reach and authenticate to the API server.
#[derive(Clone)]
pub struct Credentials {
    /// `https://host:port`, no trailing slash.
    pub server: String,
    ca: Option<Certificate<'static>>,
    /// A bearer token, or a file re-read on every connection (projected
    /// service-account tokens rotate).
    token: Option<String>,
    token_file: Option<PathBuf>,
    client_cert: Option<ClientCert>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        write!(f, "Credentials({})", self.server)
    }
}

fn pem_cert(pem: &[u8], what: &str) -> anyhow::Result<Certificate<'static>> {
    Certificate::from_pem(pem).map_err(|e| anyhow::anyhow!("{what}: {e}"))
}

impl Credentials {
    /// The pod's service account (`KUBERNETES_SERVICE_HOST`/`_PORT`).
    pub fn in_cluster() -> anyhow::Result<Credentials> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").context(
            "not in a cluster (no KUBERNETES_SERVICE_HOST) and no kubernetes.kubeconfig",
        )?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let dir = Path::new(SERVICE_ACCOUNT_DIR);
        let ca = std::fs::read(dir.join("ca.crt"))
            .with_context(|| format!("reading {}/ca.crt", dir.display()))?;
        Ok(Credentials {
            server: format!("https://{host}:{port}"),
            ca: Some(pem_cert(&ca, "the service account's ca.crt")?),
            token: None,
            token_file: Some(dir.join("token")),
            client_cert: None,
        })
    }

    /// The current context of a kubeconfig file.
    pub fn from_kubeconfig(path: &Path) -> anyhow::Result<Credentials> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let kc: KubeConfig = serde_yaml_ng::from_str(&text)
            .with_context(|| format!("parsing {} as a kubeconfig", path.display()))?;
        kc.credentials(path.parent().unwrap_or(Path::new(".")))
            .with_context(|| format!("kubeconfig {}", path.display()))
    }

    fn agent(&self) -> anyhow::Result<ureq::Agent> {
        let mut tls = TlsConfig::builder();
        if let Some(ca) = &self.ca {
            tls = tls.root_certs(RootCerts::Specific(Arc::new(vec![ca.clone()])));
        }
        if let Some(c) = &self.client_cert {
            tls = tls.client_cert(Some(c.clone()));
        }
        Ok(ureq::Agent::config_builder()
            .tls_config(tls.build())
            .timeout_connect(Some(Duration::from_secs(10)))
            .http_status_as_error(false)
            .build()
            .into())
    }

    fn bearer(&self) -> anyhow::Result<Option<String>> {
        if let Some(f) = &self.token_file {
            let t = std::fs::read_to_string(f)
                .with_context(|| format!("reading the token {}", f.display()))?;
            return Ok(Some(t.trim().to_owned()));
        }
        Ok(self.token.clone())
    }

    /// GET `path` (with its query); the response when it is a 200.
    fn get(
        &self,
        agent: &ureq::Agent,
        path_and_query: &str,
    ) -> anyhow::Result<ureq::http::Response<ureq::Body>> {
        let url = format!("{}{path_and_query}", self.server);
        let mut req = agent.get(&url).header("Accept", "application/json");
        if let Some(t) = self.bearer()? {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let mut resp = req.call().with_context(|| format!("GET {url}"))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = resp.body_mut().read_to_string().unwrap_or_default();
            let msg = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_owned))
                .unwrap_or(body);
            bail!("GET {url}: HTTP {status}: {msg}");
        }
        Ok(resp)
    }
}

// The parts of a kubeconfig qosd reads.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct KubeConfig {
    #[serde(default)]
    current_context: Option<String>,
    #[serde(default)]
    contexts: Vec<Named<ContextJson>>,
    #[serde(default)]
    clusters: Vec<Named<ClusterJson>>,
    #[serde(default)]
    users: Vec<Named<UserJson>>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "context", alias = "cluster", alias = "user")]
    value: T,
}

#[derive(Deserialize)]
struct ContextJson {
    cluster: String,
    #[serde(default)]
    user: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterJson {
    server: String,
    #[serde(default)]
    certificate_authority: Option<PathBuf>,
    #[serde(default)]
    certificate_authority_data: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct UserJson {
    #[serde(default)]
    token: Option<String>,
    #[serde(default, rename = "tokenFile")]
    token_file: Option<PathBuf>,
    #[serde(default)]
    client_certificate: Option<PathBuf>,
    #[serde(default)]
    client_certificate_data: Option<String>,
    #[serde(default)]
    client_key: Option<PathBuf>,
    #[serde(default)]
    client_key_data: Option<String>,
}

/// A kubeconfig value given inline (base64 `*-data`) or as a file
/// relative to the kubeconfig's directory.
fn data_or_file(
    data: Option<&String>,
    file: Option<&PathBuf>,
    dir: &Path,
    what: &str,
) -> anyhow::Result<Option<Vec<u8>>> {
    if let Some(d) = data {
        let b = base64::engine::general_purpose::STANDARD
            .decode(d.trim())
            .with_context(|| format!("{what}-data is not base64"))?;
        return Ok(Some(b));
    }
    match file {
        Some(f) => {
            let p = dir.join(f);
            Ok(Some(std::fs::read(&p).with_context(|| {
                format!("reading {what} {}", p.display())
            })?))
        }
        None => Ok(None),
    }
}

impl KubeConfig {
    fn credentials(&self, dir: &Path) -> anyhow::Result<Credentials> {
        let ctx_name = self
            .current_context
            .as_deref()
            .or_else(|| self.contexts.first().map(|c| c.name.as_str()))
            .context("no current-context and no context")?;
        let ctx = &self
            .contexts
            .iter()
            .find(|c| c.name == ctx_name)
            .with_context(|| format!("no context `{ctx_name}`"))?
            .value;
        let cluster = &self
            .clusters
            .iter()
            .find(|c| c.name == ctx.cluster)
            .with_context(|| format!("no cluster `{}`", ctx.cluster))?
            .value;
        let none = UserJson::default();
        let user = match &ctx.user {
            Some(u) => {
                &self
                    .users
                    .iter()
                    .find(|x| x.name == *u)
                    .with_context(|| format!("no user `{u}`"))?
                    .value
            }
            None => &none,
        };
        let ca = data_or_file(
            cluster.certificate_authority_data.as_ref(),
            cluster.certificate_authority.as_ref(),
            dir,
            "certificate-authority",
        )?
        .map(|pem| pem_cert(&pem, "certificate-authority"))
        .transpose()?;
        let cert = data_or_file(
            user.client_certificate_data.as_ref(),
            user.client_certificate.as_ref(),
            dir,
            "client-certificate",
        )?;
        let key = data_or_file(
            user.client_key_data.as_ref(),
            user.client_key.as_ref(),
            dir,
            "client-key",
        )?;
        let client_cert = match (cert, key) {
            (Some(c), Some(k)) => {
                let key =
                    PrivateKey::from_pem(&k).map_err(|e| anyhow::anyhow!("client-key: {e}"))?;
                Some(ClientCert::new_with_certs(
                    &[pem_cert(&c, "client-certificate")?],
                    key,
                ))
            }
            (None, None) => None,
            _ => bail!("a client certificate needs both client-certificate and client-key"),
        };
        if !cluster.server.starts_with("https://") {
            bail!(
                "server `{}`: qosd speaks HTTPS only (the token would cross in clear)",
                cluster.server
            );
        }
        Ok(Credentials {
            server: cluster.server.trim_end_matches('/').to_owned(),
            ca,
            token: user.token.clone(),
            token_file: user.token_file.as_ref().map(|f| dir.join(f)),
            client_cert,
        })
    }
}

/// One event of a watch stream.
#[derive(Deserialize)]
struct WatchEvent {
    #[serde(rename = "type")]
    kind: String,
    object: serde_json::Value,
}

/// The longest a watch request stays open before qosd renews it.
const WATCH_SECONDS: u32 = 290;

/// Lists and watches the pods of `node` into `set`, forever, on a thread
/// of its own (it ends with the process).
pub fn spawn_watch(creds: Credentials, node: String, set: PodSet) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("qosd-kube-watch".into())
        .spawn(move || watch_forever(&creds, &node, &set))
        .context("starting the pod watch thread")?;
    Ok(())
}

fn watch_forever(creds: &Credentials, node: &str, set: &PodSet) {
    let mut pause = Duration::from_millis(500);
    loop {
        match list_and_watch(creds, node, set) {
            Ok(()) => pause = Duration::from_millis(500),
            Err(e) => {
                let e = format!("{e:#}");
                tracing::warn!("kubernetes: {e}; again in {} ms", pause.as_millis());
                println!("kubernetes: pod watch: {e}");
                set.set_error(e);
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// The query selecting the node's pods.
fn selector(node: &str) -> String {
    format!("fieldSelector=spec.nodeName%3D{}", urlencode(node))
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One list, then watches from its resourceVersion until the server says
/// it is too old (Ok: list again at once) or something fails (Err).
fn list_and_watch(creds: &Credentials, node: &str, set: &PodSet) -> anyhow::Result<()> {
    let agent = creds.agent()?;
    let sel = selector(node);
    let mut resp = creds.get(&agent, &format!("/api/v1/pods?{sel}"))?;
    let list: serde_json::Value = resp
        .body_mut()
        .with_config()
        .limit(256 << 20)
        .read_json()
        .context("reading the pod list")?;
    let mut rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let mut pods = Vec::with_capacity(items.len());
    for it in items {
        match Pod::from_json(it) {
            Ok(p) => pods.push(p),
            Err(e) => tracing::warn!("kubernetes: a pod qosd cannot read: {e}"),
        }
    }
    let n = pods.len();
    set.replace(pods);
    tracing::info!("kubernetes: {n} pods on node {node} (resourceVersion {rv})");
    loop {
        let q = format!(
            "/api/v1/pods?{sel}&watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}&resourceVersion={}",
            urlencode(&rv)
        );
        let resp = creds.get(&agent, &q)?;
        let lines = BufReader::new(resp.into_body().into_reader()).lines();
        for line in lines {
            let line = line.context("reading the pod watch")?;
            if line.trim().is_empty() {
                continue;
            }
            let ev: WatchEvent = serde_json::from_str(&line).context("a watch event")?;
            if let Some(v) = ev.object["metadata"]["resourceVersion"].as_str() {
                rv = v.to_owned();
            }
            match ev.kind.as_str() {
                "ADDED" | "MODIFIED" => match Pod::from_json(ev.object) {
                    Ok(p) => set.upsert(p),
                    Err(e) => tracing::warn!("kubernetes: a pod qosd cannot read: {e}"),
                },
                "DELETED" => {
                    if let Some(uid) = ev.object["metadata"]["uid"].as_str() {
                        set.remove(uid);
                    }
                }
                "BOOKMARK" => {}
                // 410 Gone: the resourceVersion is too old; list again.
                "ERROR" if ev.object["code"].as_u64() == Some(410) => return Ok(()),
                _ => bail!(
                    "watch error: {}",
                    ev.object["message"].as_str().unwrap_or("(no message)")
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_current_context_with_token_and_ca_file() {
        let d = tempfile::tempdir().unwrap();
        let kc = d.path().join("kubeconfig");
        std::fs::write(
            &kc,
            "apiVersion: v1\nkind: Config\ncurrent-context: b\n\
             clusters:\n- name: c1\n  cluster: {server: 'https://127.0.0.1:6443/', certificate-authority: ca.pem}\n\
             - name: c2\n  cluster: {server: 'http://10.0.0.1'}\n\
             contexts:\n- name: a\n  context: {cluster: c2, user: u}\n- name: b\n  context: {cluster: c1, user: u}\n\
             users:\n- name: u\n  user: {token: secret}\n",
        )
        .unwrap();
        let e = Credentials::from_kubeconfig(&kc).unwrap_err();
        assert!(format!("{e:#}").contains("ca.pem"), "{e:#}");
        // Not a certificate: said so.
        std::fs::write(d.path().join("ca.pem"), "nope").unwrap();
        assert!(Credentials::from_kubeconfig(&kc).is_err());
        let text = std::fs::read_to_string(&kc)
            .unwrap()
            .replace("current-context: b", "current-context: a");
        std::fs::write(&kc, text).unwrap();
        let e = Credentials::from_kubeconfig(&kc).unwrap_err();
        assert!(format!("{e:#}").contains("HTTPS only"), "{e:#}");
    }

    #[test]
    fn the_node_selector_is_escaped() {
        assert_eq!(
            selector("node-1.example"),
            "fieldSelector=spec.nodeName%3Dnode-1.example"
        );
        assert_eq!(urlencode("a b&c"), "a%20b%26c");
    }
}
