use serde_json::json;

use super::*;

fn pod(labels: serde_json::Value, annotations: serde_json::Value) -> Pod {
    Pod::from_json(json!({
        "metadata": {"name": "cart-0", "namespace": "shop", "uid": "u-1",
                     "labels": labels, "annotations": annotations},
        "spec": {"nodeName": "n1", "containers": [{"name": "app"}, {"name": "sidecar"}]},
        "status": {"qosClass": "BestEffort", "containerStatuses": [
            {"name": "app", "containerID": "containerd://abc"},
            {"name": "sidecar"}]}
    }))
    .unwrap()
}

#[test]
fn reads_a_pod_object() {
    let p = pod(json!({"app": "cart"}), json!({}));
    assert_eq!((p.uid.as_str(), p.qos), ("u-1", QosClass::BestEffort));
    assert_eq!(
        p.containers[0].id,
        Some(ContainerId {
            runtime: "containerd".into(),
            id: "abc".into()
        })
    );
    assert_eq!(p.containers[1].id, None, "not started yet");
}

#[test]
fn matches_by_namespace_name_labels_and_container() {
    let p = pod(json!({"app": "cart", "tier": "web"}), json!({}));
    let m = |ns: Option<&str>, labels: &[(&str, &str)]| PodMatch {
        namespace: ns.map(str::to_owned),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    };
    assert!(p.matches(&m(Some("shop"), &[("app", "cart")])));
    assert!(p.matches(&m(None, &[])));
    assert!(!p.matches(&m(Some("other"), &[])));
    assert!(!p.matches(&m(None, &[("app", "cartx")])));
    assert!(!p.matches(&m(None, &[("missing", "")])));
    let named: Vec<_> = p.containers_named(Some("sidecar")).collect();
    assert_eq!(named.len(), 1);
    assert_eq!(p.containers_named(None).count(), 2);
}

#[test]
fn annotations_make_an_app_or_name_the_bad_key() {
    let lc = pod(
        json!({}),
        json!({"qosd.io/class": "lc", "qosd.io/target": "p99=5ms", "qosd.io/port": "8080"}),
    );
    let a = annotations::app_of(&lc).unwrap().unwrap();
    assert_eq!(a.name, "shop.cart-0");
    assert_eq!(a.ports, vec![8080]);
    assert_eq!(a.qos_target().unwrap().value_us, 5000.0);
    assert_eq!(
        annotations::app_of(&pod(json!({}), json!({}))).unwrap(),
        None
    );
    for (ann, key) in [
        (json!({"qosd.io/class": "gold"}), "qosd.io/class"),
        (json!({"qosd.io/class": "lc"}), "qosd.io/target"),
        (
            json!({"qosd.io/class": "lc", "qosd.io/target": "p99=5"}),
            "qosd.io/target",
        ),
        (
            json!({"qosd.io/class": "be", "qosd.io/target": "p99=5ms"}),
            "qosd.io/target",
        ),
        (
            json!({"qosd.io/class": "be", "qosd.io/port": "0"}),
            "qosd.io/port",
        ),
    ] {
        let e = annotations::app_of(&pod(json!({}), ann)).unwrap_err();
        assert!(e.starts_with("pod shop/cart-0: ") && e.contains(key), "{e}");
    }
}
