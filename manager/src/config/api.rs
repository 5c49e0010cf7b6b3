//! The `api:` section: where the HTTP API listens, who may write to it
//! (a bearer token kept in a root-only file), and the bounds that keep a
//! hostile or broken client from holding the daemon (connections,
//! request timeout). Checked by [`ApiConfig::validate`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::yamlfile::{Invalid, KeyPath};

/// Where the HTTP API and `/metrics` listen unless the config says otherwise.
pub const DEFAULT_API_ADDR: &str = "127.0.0.1:9477";

/// The HTTP API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// Address and port, default `127.0.0.1:9477` (loopback only).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Must be true for a `listen` address that is not loopback: the reads
    /// (every GET, `/metrics`) are then open to whoever reaches it (writes
    /// still need the token). qosd logs a warning when it does so.
    #[serde(default)]
    pub allow_remote: bool,
    /// File holding the bearer token that writes (`POST .../latency`)
    /// must carry: `Authorization: Bearer <token>`. Created (mode 0600,
    /// owned by root) with a random token if missing; refused if it is
    /// not a regular file owned by qosd's user or if others may read or
    /// write it. Absolute path; default `<actuators.root>/run/qosd/api.token`.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Most connections the API holds at once (1 to 65536); when full, the
    /// oldest idle one (no request in progress) is closed for the new one.
    /// Also capped at half the process's open-file limit.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// Longest wait, ms, for a request's headers (also an idle keep-alive
    /// connection's next request) and for its body (100 to 600000).
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_listen() -> SocketAddr {
    // The constant is a valid literal; the config tests keep it so.
    DEFAULT_API_ADDR
        .parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 9477)))
}
fn default_max_connections() -> u32 {
    256
}
fn default_request_timeout_ms() -> u64 {
    5000
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: default_listen(),
            allow_remote: false,
            token_file: None,
            max_connections: default_max_connections(),
            request_timeout_ms: default_request_timeout_ms(),
        }
    }
}

/// Why a listen address is refused without `allow_remote`, or None.
pub fn remote_refusal(listen: SocketAddr, allow_remote: bool) -> Option<String> {
    (!listen.ip().is_loopback() && !allow_remote).then(|| {
        format!(
            "{listen} is not a loopback address: the API's reads (GET, /metrics) would be \
             open to the network; set `api.allow_remote: true` to mean it (writes still \
             need the token)"
        )
    })
}

impl ApiConfig {
    /// The token file: the configured one, or the default under `root`.
    pub fn token_path(&self, root: &Path) -> PathBuf {
        self.token_file
            .clone()
            .unwrap_or_else(|| root.join("run/qosd/api.token"))
    }

    pub(super) fn validate(&self, at: &KeyPath) -> Result<(), Invalid> {
        if let Some(msg) = remote_refusal(self.listen, self.allow_remote) {
            return Err(Invalid::new(at.key("listen"), msg));
        }
        if let Some(p) = &self.token_file {
            super::validate::file_path_ok(p).map_err(|m| Invalid::new(at.key("token_file"), m))?;
        }
        if !(1..=65536).contains(&self.max_connections) {
            return Err(Invalid::new(
                at.key("max_connections"),
                format!("{} is outside 1..=65536", self.max_connections),
            ));
        }
        if !(100..=600_000).contains(&self.request_timeout_ms) {
            return Err(Invalid::new(
                at.key("request_timeout_ms"),
                format!("{} is outside 100..=600000 ms", self.request_timeout_ms),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_needs_no_opt_in_and_anything_else_does() {
        for ok in ["127.0.0.1:9477", "127.8.0.1:1", "[::1]:9477"] {
            assert_eq!(remote_refusal(ok.parse().unwrap(), false), None, "{ok}");
        }
        for remote in ["0.0.0.0:9477", "10.0.0.5:9477", "[::]:9477"] {
            let msg = remote_refusal(remote.parse().unwrap(), false).unwrap();
            assert!(msg.contains("api.allow_remote"), "{msg}");
            assert_eq!(remote_refusal(remote.parse().unwrap(), true), None);
        }
    }

    /// Each bad `api:` key is reported at its line and column.
    #[test]
    fn bad_api_keys_name_file_line_col_and_key() {
        let head = "apps:\n  - { name: a, match: { comm: a }, class: be }\napi:\n";
        for (api, want) in [
            (
                "  listen: 0.0.0.0:9477\n",
                "4:3: api.listen: 0.0.0.0:9477 is not a loopback",
            ),
            (
                "  token_file: api.token\n",
                "4:3: api.token_file: must be an absolute path",
            ),
            (
                "  max_connections: 0\n",
                "4:3: api.max_connections: 0 is outside 1..=65536",
            ),
            (
                "  request_timeout_ms: 10\n",
                "4:3: api.request_timeout_ms: 10 is outside",
            ),
            ("  allow_remote: maybe\n", "api.allow_remote"),
        ] {
            let text = format!("{head}{api}");
            let e = crate::config::Config::parse(Path::new("c.yaml"), &text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{api}: {e}");
        }
        let ok = format!("{head}  listen: 0.0.0.0:9477\n  allow_remote: true\n");
        assert!(crate::config::Config::parse(Path::new("c.yaml"), &ok).is_ok());
    }

    #[test]
    fn default_token_file_follows_the_root() {
        let a = ApiConfig::default();
        assert_eq!(
            a.token_path(Path::new("/")),
            PathBuf::from("/run/qosd/api.token")
        );
        assert_eq!(
            a.token_path(Path::new("/tmp/fake")),
            PathBuf::from("/tmp/fake/run/qosd/api.token")
        );
        assert_eq!(default_listen().to_string(), DEFAULT_API_ADDR);
    }
}
