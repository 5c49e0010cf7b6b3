//! qosd against a real Kubernetes API server (etcd + kube-apiserver on
//! loopback, support/kube.rs): the manifests are applied server-side and
//! the ServiceAccount's permissions checked with `kubectl auth can-i`;
//! then qosd, with that account's token, watches the pods of its node.
//! There is no kubelet: the test plays it — it creates each pod's cgroup
//! in a kubelet layout (systemd driver on the unified hierarchy, cgroupfs
//! driver on a v1 one), starts a real memcached in it inside the pod's own
//! network namespace, and reports the container's id in the pod's status.
//! qosd finds the pods by labels and by annotation, counts their requests
//! exactly, puts their knobs on real cgroups, follows a pod re-created
//! with a new UID and releases one whose labels stop matching.
//!
//! `make test-k8s`, or `cargo test --release -p qosd-manager --test
//! kube_real` (root; needs target/tools/kube-apiserver from `make tools`,
//! etcd, kubectl, memcached, iproute2).

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::kube::Cluster;
use support::*;

const NODE: &str = "qosd-test-k8s-node";

/// Where the test's kubelet puts a pod's container.
#[derive(Clone, Copy)]
enum Layout {
    /// systemd driver on the unified (v2) hierarchy.
    SystemdV2,
    /// cgroupfs driver on the v1 `pids` hierarchy.
    CgroupfsV1,
}

/// The kubelet's `--cgroup-root` of this test run: its own subtree.
fn cgroup_root() -> String {
    format!("qosd-test-k8s-{}", std::process::id())
}

/// A pod as the test's kubelet runs it: cgroup, network namespace and a
/// memcached inside both. Dropped: killed, namespace and cgroups removed.
struct FakePod {
    uid: String,
    netns: String,
    /// The cgroup directories made, innermost first.
    dirs: Vec<PathBuf>,
    server: Option<Killed>,
}

impl FakePod {
    fn start(
        c: &Cluster,
        name: &str,
        labels: Value,
        annotations: Value,
        layout: Layout,
    ) -> FakePod {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "shop", "labels": labels, "annotations": annotations},
            "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                     "containers": [{"name": "memcached", "image": "memcached:1.6"}]}
        });
        c.apply(&pod.to_string());
        let uid = c.kubectl(&[
            "get",
            "pod",
            name,
            "-n",
            "shop",
            "-o",
            "jsonpath={.metadata.uid}",
        ]);
        let qos = c.kubectl(&[
            "get",
            "pod",
            name,
            "-n",
            "shop",
            "-o",
            "jsonpath={.status.qosClass}",
        ]);
        assert_eq!(qos, "BestEffort", "no resources: the API server's class");
        let id = format!("{:0>64}", uid.replace('-', ""));
        let root = Path::new(match layout {
            Layout::SystemdV2 => "/sys/fs/cgroup/unified",
            Layout::CgroupfsV1 => "/sys/fs/cgroup/pids",
        })
        .join(cgroup_root());
        let chain: Vec<String> = match layout {
            Layout::SystemdV2 => vec![
                "kubepods.slice".into(),
                "kubepods-besteffort.slice".into(),
                format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_")),
                format!("cri-containerd-{id}.scope"),
            ],
            Layout::CgroupfsV1 => vec![
                "kubepods".into(),
                "besteffort".into(),
                format!("pod{uid}"),
                id.clone(),
            ],
        };
        let mut dirs = vec![root.clone()];
        let mut p = root;
        for part in chain {
            p = p.join(part);
            dirs.push(p.clone());
        }
        for d in &dirs {
            if !d.is_dir() {
                std::fs::create_dir(d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
            }
        }
        dirs.reverse();
        let netns = format!("qosd-k8s-{}-{}", name, std::process::id());
        let ip = |args: &[&str]| {
            let ok = Command::new("ip").args(args).status().unwrap().success();
            assert!(ok, "ip {args:?}");
        };
        ip(&["netns", "add", &netns]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        let mut pod = FakePod {
            uid,
            netns,
            dirs,
            server: None,
        };
        // Into the container's cgroup first, then the pod's network.
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec ip netns exec {} memcached -u nobody -l 127.0.0.1 -p 11211 -U 0 -t 1",
            pod.dirs[0].display(),
            pod.netns
        );
        pod.server = Some(Killed::spawn(Command::new("sh").args(["-c", &script])));
        let ns = pod.netns.clone();
        assert!(
            wait_for(Duration::from_secs(10), || in_netns(&ns, || {
                TcpStream::connect("127.0.0.1:11211").is_ok()
            })),
            "memcached of {name} never listened"
        );
        let status = json!({"status": {"phase": "Running", "containerStatuses": [{
            "name": "memcached", "containerID": format!("containerd://{id}"),
            "image": "memcached:1.6", "imageID": "", "ready": true, "restartCount": 0,
            "started": true, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}});
        c.kubectl(&[
            "patch",
            "pod",
            name,
            "-n",
            "shop",
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ]);
        pod
    }

    fn pid(&self) -> u32 {
        self.server.as_ref().unwrap().pid()
    }

    /// `n` memcached `get`s on one connection from inside the pod's
    /// network namespace; each one answered.
    fn gets(&self, n: usize) {
        in_netns(&self.netns, move || {
            let s = TcpStream::connect("127.0.0.1:11211").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut r = BufReader::new(s);
            let mut line = String::new();
            for i in 0..n {
                r.get_mut()
                    .write_all(format!("get k{i}\r\n").as_bytes())
                    .unwrap();
                line.clear();
                r.read_line(&mut line).unwrap();
                assert_eq!(line, "END\r\n");
            }
        });
    }
}

impl Drop for FakePod {
    fn drop(&mut self) {
        drop(self.server.take());
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
        for d in &self.dirs {
            // The subtree's root stays while another pod uses it.
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Runs `f` on a thread inside network namespace `ns`.
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).unwrap();
        nix::sched::setns(fd.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

fn manifest(name: &str) -> String {
    std::fs::read_to_string(repo().join("deploy/kubernetes").join(name)).unwrap()
}

/// `kubectl auth can-i VERB RESOURCE` as qosd's ServiceAccount.
fn can_i(c: &Cluster, verb: &str, what: &str) -> bool {
    let out = c
        .kubectl_cmd(&[
            "auth",
            "can-i",
            verb,
            what,
            "--all-namespaces",
            "--as=system:serviceaccount:qosd:qosd",
        ])
        .output()
        .unwrap();
    match text(&out.stdout).trim() {
        "yes" => true,
        "no" => false,
        other => panic!("can-i {verb} {what}: {other} {}", text(&out.stderr)),
    }
}

fn app(d: &Daemon, name: &str) -> Option<Value> {
    d.try_get(&format!("/v1/apps/{name}"))
        .filter(|v| v.get("name").is_some())
}

fn pids(a: &Value) -> Vec<u64> {
    a["pids"]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

fn wait_app(d: &Daemon, name: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let mut last = None;
    let ok = wait_for(Duration::from_secs(20), || {
        last = app(d, name);
        last.as_ref().is_some_and(&f)
    });
    assert!(
        ok,
        "app {name}: {what}; last {last:?}\n{}",
        d.output().join("\n")
    );
    last.unwrap()
}

fn config(dir: &Path, port: u16, kubeconfig: &Path) -> PathBuf {
    let quota = "{ cpu_quota_milli: 500 }";
    let y = format!(
        "apps:\n  - name: cart\n    class: lc\n    target: {{ p99: 50ms }}\n\
         \x20   match: {{ pod: {{ namespace: shop, labels: {{ app: cart }} }} }}\n\
         \x20   resources: {{ initial: {quota}, min: {quota}, max: {quota} }}\n\
         kubernetes:\n  kubeconfig: {}\n  node_name: {NODE}\n  cgroup_root: /{}\n\
         actuators: {{ enabled: [cpu_quota] }}\n\
         policy: {}\napi:\n  listen: 127.0.0.1:{port}\n  token_file: {}\nstate_file: {}\n",
        kubeconfig.display(),
        cgroup_root(),
        parties().display(),
        dir.join("api.token").display(),
        dir.join("state.json").display()
    );
    let p = dir.join("config.yaml");
    std::fs::write(&p, y).unwrap();
    p
}

/// The CPU quota in force on the v1 or v2 group qosd made for `app`, as
/// a fraction of a CPU.
fn group_quota(app: &str) -> Option<f64> {
    let g = format!("qosd-{app}");
    let v2 = std::fs::read_to_string(format!("/sys/fs/cgroup/unified/{g}/cpu.max")).ok();
    if let Some((q, p)) = v2.as_deref().and_then(|s| s.trim().split_once(' ')) {
        return Some(q.parse::<f64>().ok()? / p.parse::<f64>().ok()?);
    }
    let v1 = |f: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/{g}/{f}"))
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()
    };
    Some(v1("cpu.cfs_quota_us")? / v1("cpu.cfs_period_us")?)
}

#[test]
fn qosd_follows_the_pods_of_its_node_from_a_real_api_server() {
    let c = Cluster::start();
    // The deployment, applied server-side and accepted.
    for m in [
        "namespace.yaml",
        "serviceaccount.yaml",
        "rbac.yaml",
        "configmap.yaml",
        "daemonset.yaml",
        "service.yaml",
    ] {
        c.apply(&manifest(m));
    }
    let ds = c.kubectl(&[
        "get",
        "daemonset",
        "qosd",
        "-n",
        "qosd",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].env[1].valueFrom.fieldRef.fieldPath}",
    ]);
    assert_eq!(ds, "spec.nodeName", "NODE_NAME from the downward API");
    // Its ServiceAccount reads pods and does nothing else.
    for verb in ["get", "list", "watch"] {
        assert!(can_i(&c, verb, "pods"), "{verb} pods");
    }
    for (verb, what) in [
        ("create", "pods"),
        ("delete", "pods"),
        ("patch", "pods"),
        ("get", "secrets"),
        ("list", "nodes"),
        ("get", "configmaps"),
        ("create", "pods/eviction"),
    ] {
        assert!(!can_i(&c, verb, what), "{verb} {what} must be refused");
    }

    let token = c.kubectl(&["create", "token", "qosd", "-n", "qosd", "--duration=1h"]);
    let kubeconfig = c.kubeconfig_for("qosd", token.trim());
    c.kubectl(&["create", "namespace", "shop"]);
    c.kubectl(&["create", "serviceaccount", "default", "-n", "shop"]);

    let cart = FakePod::start(
        &c,
        "cart-0",
        json!({"app": "cart"}),
        json!({}),
        Layout::SystemdV2,
    );
    let web = FakePod::start(
        &c,
        "web-0",
        json!({"app": "web"}),
        json!({"qosd.io/class": "lc", "qosd.io/target": "p99=50ms"}),
        Layout::CgroupfsV1,
    );
    // A malformed annotation: logged with the pod and the key, left alone.
    c.apply(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "odd-0", "namespace": "shop", "annotations": {"qosd.io/class": "gold"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "x", "image": "x"}]}}).to_string());
    // Another node's pod, labelled like cart: not this node's business.
    c.apply(
        &json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "cart-elsewhere", "namespace": "shop", "labels": {"app": "cart"}},
        "spec": {"nodeName": "another-node", "containers": [{"name": "memcached", "image": "x"}]}})
        .to_string(),
    );

    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let d = Daemon::start(&config(dir.path(), port, &kubeconfig), port, &[]);

    // Found by labels: its process, its pod, its knob on a real cgroup.
    let a = wait_app(&d, "cart", "managed with cart-0's memcached", |a| {
        pids(a) == [u64::from(cart.pid())] && a["managed"] == true
    });
    assert_eq!(
        a["pods"],
        json!([{"namespace": "shop", "pod": "cart-0", "container": "memcached", "uid": cart.uid}])
    );
    assert_eq!(a["allocation"]["cpu_quota_milli"], 500, "{a}");
    assert!(
        cgroups(cart.pid()).contains("qosd-cart"),
        "{}",
        cgroups(cart.pid())
    );
    assert_eq!(group_quota("cart"), Some(0.5));
    // Found by annotation, with no config entry.
    let w = wait_app(&d, "shop.web-0", "managed from its annotation", |a| {
        pids(a) == [u64::from(web.pid())] && a["managed"] == true
    });
    assert_eq!(w["target"]["latency_us"], 50_000.0);
    assert!(
        d.output()
            .iter()
            .any(|l| l.contains("pod shop/odd-0: qosd.io/class")),
        "{:?}",
        d.output()
    );
    assert!(app(&d, "shop.odd-0").is_none());

    // Exact request counts, each from inside its pod's network.
    cart.gets(300);
    web.gets(170);
    wait_app(&d, "cart", "300 requests", |a| a["requests_total"] == 300);
    wait_app(&d, "shop.web-0", "170 requests", |a| {
        a["requests_total"] == 170
    });
    let (_, metrics) = d.get_text("/metrics");
    let line = "qosd_app_requests_total{app=\"cart\",namespace=\"shop\",pod=\"cart-0\",container=\"memcached\"} 300";
    assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");

    // Deleted and re-created: a new UID, a new cgroup, a new process.
    c.kubectl(&[
        "delete",
        "pod",
        "cart-0",
        "-n",
        "shop",
        "--grace-period=0",
        "--force",
    ]);
    let old_uid = cart.uid.clone();
    drop(cart);
    wait_app(&d, "cart", "released once its pod is gone", |a| {
        pids(a).is_empty() && a["managed"] == false
    });
    let cart = FakePod::start(
        &c,
        "cart-0",
        json!({"app": "cart"}),
        json!({}),
        Layout::SystemdV2,
    );
    assert_ne!(cart.uid, old_uid);
    let a = wait_app(&d, "cart", "re-admitted with the new pod", |a| {
        pids(a) == [u64::from(cart.pid())] && a["managed"] == true
    });
    assert_eq!(a["pods"][0]["uid"], cart.uid);
    assert_eq!(group_quota("cart"), Some(0.5));

    // Labels that stop matching: released while the process runs on.
    c.kubectl(&[
        "label",
        "pod",
        "cart-0",
        "-n",
        "shop",
        "app=other",
        "--overwrite",
    ]);
    wait_app(&d, "cart", "released when its labels stop matching", |a| {
        pids(a).is_empty() && a["managed"] == false
    });
    assert!(
        !cgroups(cart.pid()).contains("qosd-cart"),
        "{}",
        cgroups(cart.pid())
    );
    // The annotation withdrawn: the app goes.
    c.kubectl(&["annotate", "pod", "web-0", "-n", "shop", "qosd.io/class-"]);
    assert!(
        wait_for(Duration::from_secs(20), || app(&d, "shop.web-0").is_none()),
        "{:?}",
        d.output()
    );
    let (status, out) = d.stop();
    assert!(status.success(), "{out:?}");
    drop((cart, web));
    let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup/unified").join(cgroup_root()));
    let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup/pids").join(cgroup_root()));
}
