//! A real Kubernetes control plane on loopback for the tests: etcd
//! (Debian's `etcd-server`) and `kube-apiserver` (built from the Go
//! module proxy by `make tools` into target/tools), with a CA, serving
//! certificate and service-account key made by openssl, a static admin
//! token, RBAC on. No kubelet: the tests play its part (pods' status,
//! cgroups, processes). `kubectl` runs against it through an admin
//! kubeconfig. Everything lives in a temp dir and is killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::{free_port, repo, text, wait_for, Killed};

pub fn kube_apiserver() -> PathBuf {
    let p = std::env::var_os("KUBE_APISERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/tools/kube-apiserver"));
    assert!(
        p.is_file(),
        "kube-apiserver not found at {}: run `make tools` (built from the Go module proxy)",
        p.display()
    );
    p
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

fn openssl(dir: &Path, args: &[&str]) {
    run(Command::new("openssl").current_dir(dir).args(args));
}

/// etcd + kube-apiserver, and the admin's kubeconfig.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub server: String,
    pub admin_kubeconfig: PathBuf,
    // Dropped in order: the API server before etcd.
    _apiserver: Killed,
    _etcd: Killed,
}

impl Cluster {
    pub fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // CA, the API server's certificate (127.0.0.1), the service
        // accounts' signing key.
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=qosd-test-ca",
            ],
        );
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=kube-apiserver",
            ],
        );
        std::fs::write(
            d.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n",
        )
        .unwrap();
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ],
        );
        openssl(d, &["genrsa", "-out", "sa.key", "2048"]);
        openssl(d, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        let admin_token = format!("admin-{}", std::process::id());
        std::fs::write(
            d.join("tokens.csv"),
            format!("{admin_token},admin,admin-uid,\"system:masters\"\n"),
        )
        .unwrap();

        let (client, peer) = (free_port(), free_port());
        let etcd = Killed::spawn(
            Command::new("etcd")
                .args(["--name", "qosd-test-k8s", "--data-dir"])
                .arg(d.join("etcd"))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
                ))
                .arg(format!(
                    "--initial-cluster=qosd-test-k8s=http://127.0.0.1:{peer}"
                ))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(d.join("etcd.log")).unwrap()),
        );
        let port = free_port();
        let p = |f: &str| d.join(f).display().to_string();
        let apiserver = Killed::spawn(
            Command::new(kube_apiserver())
                .arg(format!("--etcd-servers=http://127.0.0.1:{client}"))
                .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
                .arg(format!("--secure-port={port}"))
                .arg(format!("--cert-dir={}", p("certs")))
                .arg(format!("--tls-cert-file={}", p("server.crt")))
                .arg(format!("--tls-private-key-file={}", p("server.key")))
                .arg(format!("--client-ca-file={}", p("ca.crt")))
                .arg(format!("--token-auth-file={}", p("tokens.csv")))
                .arg(format!("--service-account-key-file={}", p("sa.pub")))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    p("sa.key")
                ))
                .arg("--service-account-issuer=https://kubernetes.default.svc")
                .arg("--authorization-mode=RBAC")
                // As every cluster that runs node agents (kubeadm's default).
                .arg("--allow-privileged=true")
                // A service network the API server allocates from: no
                // address of it is ever used (no kube-proxy, no traffic).
                .arg("--service-cluster-ip-range=10.96.0.0/24")
                .arg("--endpoint-reconciler-type=none")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(d.join("apiserver.log")).unwrap()),
        );
        let server = format!("https://127.0.0.1:{port}");
        let admin_kubeconfig = d.join("admin.kubeconfig");
        write_kubeconfig(&admin_kubeconfig, &server, &d.join("ca.crt"), &admin_token);
        let c = Cluster {
            dir,
            server,
            admin_kubeconfig,
            _apiserver: apiserver,
            _etcd: etcd,
        };
        let ready = wait_for(Duration::from_secs(90), || {
            c.kubectl_try(&["get", "--raw", "/readyz"])
                .is_some_and(|o| text(&o.stdout).trim() == "ok")
        });
        assert!(
            ready,
            "kube-apiserver never became ready:\n{}",
            std::fs::read_to_string(c.dir.path().join("apiserver.log"))
                .map(|s| s.lines().rev().take(30).collect::<Vec<_>>().join("\n"))
                .unwrap_or_default()
        );
        c
    }

    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args);
        cmd
    }

    fn kubectl_try(&self, args: &[&str]) -> Option<Output> {
        let out = self.kubectl_cmd(args).output().ok()?;
        out.status.success().then_some(out)
    }

    /// `kubectl ARGS` as the admin; panics on failure; its stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        text(&run(&mut self.kubectl_cmd(args)).stdout)
    }

    /// `kubectl apply --server-side -f -` of a manifest's text.
    pub fn apply(&self, manifest: &str) -> String {
        use std::io::Write;
        let mut child = self
            .kubectl_cmd(&["apply", "--server-side", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(manifest.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl apply: {}{}\n{manifest}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// A kubeconfig for `user` with `token`, beside the admin's.
    pub fn kubeconfig_for(&self, name: &str, token: &str) -> PathBuf {
        let p = self.dir.path().join(format!("{name}.kubeconfig"));
        write_kubeconfig(&p, &self.server, &self.dir.path().join("ca.crt"), token);
        p
    }
}

fn write_kubeconfig(path: &Path, server: &str, ca: &Path, token: &str) {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
             clusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
             contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n\
             users:\n- name: test\n  user:\n    token: {token}\n",
            ca.display()
        ),
    )
    .unwrap();
}
