//! deploy/kubernetes/ and deploy/container/: every manifest validated by
//! kubeconform against the vendored Kubernetes v1.32 schemas (strict: an
//! unknown field fails); then what a schema cannot know: that the
//! DaemonSet, Service, ConfigMap and config agree with each other and with
//! what qosd needs, and that the container's runtime stage installs the
//! libraries the binary links. No container engine here: nothing is
//! built. kube_real.rs applies the same manifests to a real API server.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml_ng::Value;
use support::{repo, text, QOSD};

const SCHEMAS: &str = "deploy/kubernetes/schemas/v1.32.0-standalone-strict";

fn kubeconform() -> PathBuf {
    let candidates = [
        std::env::var_os("KUBECONFORM").map(PathBuf::from),
        Some(repo().join("target/tools/kubeconform")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "kubeconform not found in $KUBECONFORM or target/tools/: run `make tools` \
                 (go install github.com/yannh/kubeconform from the Go module proxy)"
            )
        })
}

fn manifests() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    v.sort();
    v
}

fn run_kubeconform(files: &[PathBuf]) -> (bool, serde_json::Value) {
    let loc = format!(
        "{}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
        repo().join(SCHEMAS).display()
    );
    let out = Command::new(kubeconform())
        .args([
            "-strict",
            "-summary",
            "-output",
            "json",
            "-schema-location",
            &loc,
        ])
        .args(files)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("kubeconform output: {e}\n{}", text(&out.stdout)));
    (out.status.success(), v)
}

#[test]
fn every_manifest_is_valid_against_the_kubernetes_schema() {
    let files = manifests();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "daemonset.yaml",
        "configmap.yaml",
        "service.yaml",
        "serviceaccount.yaml",
        "namespace.yaml",
        "rbac.yaml",
    ] {
        assert!(
            names.contains(&want.to_owned()),
            "{want} missing: {names:?}"
        );
    }
    let (ok, v) = run_kubeconform(&files);
    assert!(ok, "{v:#}");
    let s = &v["summary"];
    // One resource per YAML document (rbac.yaml holds two).
    let nr_docs: usize = files
        .iter()
        .map(|f| text(&std::fs::read(f).unwrap()).split("\n---\n").count())
        .sum();
    assert_eq!(s["valid"], nr_docs, "{v:#}");
    assert_eq!(s["skipped"], 0, "every kind has a vendored schema: {v:#}");
}

/// The negative control: the same check rejects a DaemonSet with a
/// misspelt field and a wrong type, so the pass above is not vacuous.
#[test]
fn kubeconform_rejects_a_broken_daemonset() {
    let d = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(repo().join("deploy/kubernetes/daemonset.yaml")).unwrap();
    let bad = d.path().join("daemonset.yaml");
    std::fs::write(
        &bad,
        good.replace("hostPID: true", "hostPID: \"yes\"")
            .replace("readOnly: true", "readonly: true"),
    )
    .unwrap();
    let (ok, v) = run_kubeconform(&[bad]);
    assert!(!ok);
    let msg = v.to_string();
    assert!(msg.contains("hostPID"), "{msg}");
    assert!(msg.contains("readonly"), "{msg}");
}

fn load(name: &str) -> Value {
    let p = repo().join("deploy/kubernetes").join(name);
    serde_yaml_ng::from_str(&std::fs::read_to_string(&p).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn s<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, k| match k.parse::<usize>() {
        Ok(i) => &v[i],
        Err(_) => &v[k],
    })
}

fn str_of<'a>(v: &'a Value, path: &str) -> &'a str {
    s(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path} is not a string: {:?}", s(v, path)))
}

/// What gen-configmap.sh writes: config.yaml with the API on 0.0.0.0 (and
/// the opt-in that needs), and every policy, byte for byte.
#[test]
fn configmap_is_the_repo_config_and_policies() {
    let cm = load("configmap.yaml");
    let data = s(&cm, "data").as_mapping().unwrap();
    let mut want = BTreeMap::new();
    let conf = std::fs::read_to_string(repo().join("config.yaml")).unwrap();
    assert!(conf.contains("\n  listen: 127.0.0.1:9477\n"));
    assert!(conf.contains("\n  allow_remote: false\n"));
    want.insert(
        "config.yaml".to_owned(),
        conf.replace("\n  listen: 127.0.0.1:9477\n", "\n  listen: 0.0.0.0:9477\n")
            .replace("\n  allow_remote: false\n", "\n  allow_remote: true\n"),
    );
    for e in std::fs::read_dir(repo().join("policies")).unwrap() {
        let p = e.unwrap().path();
        want.insert(
            p.file_name().unwrap().to_string_lossy().into_owned(),
            std::fs::read_to_string(&p).unwrap(),
        );
    }
    let got: BTreeMap<String, String> = data
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().unwrap().to_owned(),
                v.as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        got, want,
        "configmap.yaml is stale: run deploy/kubernetes/gen-configmap.sh"
    );
}

/// The pod's /etc/qosd as the DaemonSet's volume items lay it out passes
/// `qosd check`, and names the port and state dir the manifests use.
#[test]
fn daemonset_config_volume_passes_qosd_check() {
    let cm = load("configmap.yaml");
    let ds = load("daemonset.yaml");
    let pod = s(&ds, "spec.template.spec");
    let vol = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "config")
        .expect("config volume");
    assert_eq!(str_of(vol, "configMap.name"), str_of(&cm, "metadata.name"));
    let etc = tempfile::tempdir().unwrap();
    let items = s(vol, "configMap.items").as_sequence().unwrap();
    let keys = s(&cm, "data").as_mapping().unwrap().len();
    assert_eq!(items.len(), keys, "every ConfigMap key is mounted");
    for it in items {
        let key = str_of(it, "key");
        let path = etc.path().join(str_of(it, "path"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let body = cm["data"][key].as_str().expect("ConfigMap data is text");
        std::fs::write(&path, body).unwrap();
    }
    // The container's command names the mounted config.
    let c = &pod["containers"][0];
    let cmd: Vec<&str> = c["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(cmd[..2], ["/usr/local/bin/qosd", "run"]);
    let conf_arg = cmd[cmd.iter().position(|a| *a == "--config").unwrap() + 1];
    let mount = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "config")
        .unwrap();
    let rel = Path::new(conf_arg)
        .strip_prefix(str_of(mount, "mountPath"))
        .expect("--config is inside the config mount");
    let out = Command::new(QOSD)
        .arg("check")
        .arg(etc.path().join(rel))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let conf: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(etc.path().join(rel)).unwrap()).unwrap();
    // Listening on the pod's addresses, on the port every manifest names.
    let listen = str_of(&conf, "api.listen");
    assert!(listen.starts_with("0.0.0.0:"), "{listen}");
    let port: u64 = listen.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(c["ports"][0]["containerPort"].as_u64(), Some(port));
    let svc = load("service.yaml");
    assert_eq!(s(&svc, "spec.ports.0.port").as_u64(), Some(port));
    assert_eq!(
        str_of(&svc, "spec.ports.0.targetPort"),
        str_of(c, "ports.0.name")
    );
    for ann in [
        s(&svc, "metadata.annotations"),
        s(&ds, "spec.template.metadata.annotations"),
    ] {
        assert_eq!(ann["prometheus.io/scrape"], "true");
        assert_eq!(
            ann["prometheus.io/port"].as_str(),
            Some(port.to_string().as_str())
        );
        assert_eq!(ann["prometheus.io/path"], "/metrics");
    }
    // The state file is on the host (survives a pod restart).
    let state = Path::new(str_of(&conf, "state_file"));
    assert_eq!(
        host_path_of(pod, c, state.parent().unwrap()).as_deref(),
        Some(state.parent().unwrap())
    );
    // Listening beyond loopback is opted into, and writes need the token,
    // which lives on the node (a hostPath only root reads), not in the
    // pod's image or the ConfigMap another pod could read.
    assert_eq!(s(&conf, "api.allow_remote"), &Value::Bool(true));
    let token = Path::new(str_of(&conf, "api.token_file"));
    assert_eq!(
        host_path_of(pod, c, token.parent().unwrap()).as_deref(),
        Some(token.parent().unwrap()),
        "the API token is on the node"
    );
    assert!(!cm["data"]
        .as_mapping()
        .unwrap()
        .keys()
        .any(|k| k.as_str().is_some_and(|k| k.contains("token"))));
}

/// The hostPath a container path comes from, if it is mounted from one.
fn host_path_of(pod: &Value, c: &Value, path: &Path) -> Option<PathBuf> {
    let m = c["volumeMounts"]
        .as_sequence()?
        .iter()
        .find(|m| Path::new(m["mountPath"].as_str().unwrap()) == path)?;
    let v = pod["volumes"]
        .as_sequence()?
        .iter()
        .find(|v| v["name"] == m["name"])?;
    Some(PathBuf::from(v["hostPath"]["path"].as_str()?))
}

/// What qosd needs from the node, which the schema allows to be absent.
#[test]
fn daemonset_has_host_pids_privilege_and_the_host_mounts() {
    let ds = load("daemonset.yaml");
    let pod = s(&ds, "spec.template.spec");
    let c = &pod["containers"][0];
    assert_eq!(pod["hostPID"], true, "apps are host PIDs");
    assert_eq!(s(c, "securityContext.privileged"), &Value::Bool(true));
    for p in [
        "/sys",
        "/sys/fs/cgroup",
        "/sys/fs/resctrl",
        "/sys/kernel/tracing",
        "/sys/kernel/btf",
        "/run/qosd",
    ] {
        assert_eq!(
            host_path_of(pod, c, Path::new(p)).as_deref(),
            Some(Path::new(p)),
            "{p} is the host's"
        );
    }
    // Labels, selector, Service and ServiceAccount line up.
    let labels = s(&ds, "spec.template.metadata.labels");
    let sel = s(&ds, "spec.selector.matchLabels").as_mapping().unwrap();
    for (k, v) in sel {
        assert_eq!(&labels[k.as_str().unwrap()], v);
    }
    let svc = load("service.yaml");
    for (k, v) in s(&svc, "spec.selector").as_mapping().unwrap() {
        assert_eq!(&labels[k.as_str().unwrap()], v);
    }
    let sa = load("serviceaccount.yaml");
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    let ns = str_of(&load("namespace.yaml"), "metadata.name").to_owned();
    for m in [
        "daemonset.yaml",
        "service.yaml",
        "serviceaccount.yaml",
        "configmap.yaml",
    ] {
        assert_eq!(str_of(&load(m), "metadata.namespace"), ns, "{m}");
    }
    // The image's entrypoint is the binary the command names.
    let cf = std::fs::read_to_string(repo().join("deploy/container/Containerfile")).unwrap();
    assert!(cf.contains("COPY --from=build /src/target/release/qosd /usr/local/bin/qosd"));
}

/// The `FROM ... AS name` stages of the Containerfile, with their lines.
fn stages(cf: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let joined = cf.replace("\\\n", " ");
    for line in joined.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("FROM ") {
            let name = rest
                .split(" AS ")
                .nth(1)
                .unwrap_or("final")
                .trim()
                .to_owned();
            out.push((name, String::new()));
        } else if let Some(last) = out.last_mut() {
            last.1.push_str(l);
            last.1.push('\n');
        }
    }
    out
}

fn apt_packages(stage: &str) -> Vec<String> {
    stage
        .lines()
        .filter(|l| l.contains("apt-get install"))
        .flat_map(|l| {
            let after = l.split("apt-get install").nth(1).unwrap();
            let upto = after.split("&&").next().unwrap();
            upto.split_whitespace()
                .filter(|w| !w.starts_with('-'))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// No container engine here, so the image is not built; what can be
/// checked is: the build stage has the build packages the Makefile
/// installs for the same build, every COPY source exists, and the runtime
/// stage installs the package of every shared library `qosd` links (or
/// it is in debian-slim's required set).
#[test]
fn containerfile_stages_have_what_the_binary_needs() {
    let cf = std::fs::read_to_string(repo().join("deploy/container/Containerfile")).unwrap();
    let st = stages(&cf);
    assert_eq!(st.len(), 2, "build and runtime stages");
    let build = apt_packages(&st[0].1);
    for p in ["clang", "libelf-dev", "zlib1g-dev", "pkg-config"] {
        assert!(
            build.contains(&p.to_owned()),
            "build stage lacks {p}: {build:?}"
        );
    }
    for l in st.iter().flat_map(|s| s.1.lines()) {
        if let Some(rest) = l.strip_prefix("COPY ") {
            if rest.starts_with("--from") {
                continue;
            }
            let src = rest.split_whitespace().next().unwrap();
            assert!(repo().join(src).exists(), "COPY source {src} missing");
        }
    }
    let runtime = apt_packages(&st[1].1);
    let ldd = Command::new("ldd").arg(QOSD).output().unwrap();
    assert!(ldd.status.success());
    let mut checked = 0;
    for line in text(&ldd.stdout).lines() {
        let Some(path) = line
            .split("=>")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
        else {
            continue;
        };
        // Merged /usr: dpkg may have registered either spelling.
        let alt = match path.strip_prefix("/usr") {
            Some(p) => p.to_owned(),
            None => format!("/usr{path}"),
        };
        let owner = [path, alt.as_str()]
            .iter()
            .map(|p| {
                text(
                    &Command::new("dpkg")
                        .args(["-S", p])
                        .output()
                        .unwrap()
                        .stdout,
                )
            })
            .find(|o| !o.is_empty())
            .unwrap_or_default();
        let pkg = owner
            .split(':')
            .next()
            .unwrap_or_else(|| panic!("no package owns {path}"))
            .trim()
            .to_owned();
        assert!(!pkg.is_empty(), "no package owns {path}");
        let prio = Command::new("dpkg-query")
            .args(["-W", "-f=${Priority} ${Essential}", &pkg])
            .output()
            .unwrap();
        let prio = text(&prio.stdout);
        assert!(
            runtime.contains(&pkg) || prio.starts_with("required") || prio.ends_with("yes"),
            "{path} is in {pkg} ({prio}), not installed by the runtime stage {runtime:?}"
        );
        checked += 1;
    }
    assert!(checked >= 3, "ldd listed {checked} libraries");
}
