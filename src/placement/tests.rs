//! Table tests for /validate: reviews in, answers out, against an in-memory source with the
//! real ledger.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::ledger::{LEDGER_TTL, Ledger};
use super::*;
use overcommit_core::policy::parse_policy_file;

/// Nodes, pods on nodes (the watch's view) and the ledger, at a fixed time.
struct Fake {
    nodes: BTreeMap<String, NodeFacts>,
    pods: BTreeMap<String, PodFacts>,
    bound: BTreeMap<String, BTreeMap<String, u128>>,
    ledger: Mutex<Ledger>,
    now: Instant,
    synced: bool,
}

impl PlacementSource for Fake {
    fn node(&self, name: &str) -> Option<Arc<NodeFacts>> {
        self.nodes.get(name).cloned().map(Arc::new)
    }
    fn pod(&self, namespace: &str, name: &str) -> Option<PodFacts> {
        self.pods.get(&format!("{namespace}/{name}")).cloned()
    }
    fn requested(&self, node: &str, namespace: &str, name: &str) -> BTreeMap<String, u128> {
        let mut sum = self.bound.get(node).cloned().unwrap_or_default();
        let key = format!("{namespace}/{name}");
        let ledger = self.ledger.lock().map(|l| l.pending(node, &key, self.now));
        for (resource, value) in ledger.unwrap_or_default() {
            *sum.entry(resource).or_insert(0) += value;
        }
        sum
    }
    fn allowed(&self, p: &Allowed<'_>) {
        if let Ok(mut ledger) = self.ledger.lock() {
            let pod = format!("{}/{}", p.namespace, p.name);
            ledger.record(&pod, p.node, p.requests, p.hold, self.now);
        }
    }
    fn synced(&self) -> bool {
        self.synced
    }
}

fn units(items: &[(&str, u128)]) -> BTreeMap<String, u128> {
    items.iter().map(|&(n, v)| (n.to_string(), v)).collect()
}

fn fake(mode: &str) -> (Fake, PolicySet) {
    let yaml = format!(
        "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {{name: capped}}\n\
         spec:\n  nodeSelector: {{matchLabels: {{pool: capped}}}}\n  nodeRatios: {{cpu: \"1.1\"}}\n  \
         requestCap: {{cpu: \"110%\"}}\n  capMode: {mode}\n"
    );
    let policies = match parse_policy_file(&yaml).and_then(PolicySet::new) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    let node = |pool: &str| NodeFacts {
        labels: [("pool".to_string(), pool.to_string())].into(),
        raw: units(&[("cpu", 4000)]),
    };
    let pod = |cpu: u128, mirror: bool| PodFacts {
        requests: units(&[("cpu", cpu)]),
        exempt: mirror.then_some(overcommit_core::cap::Exempt::Mirror),
        bound: false,
    };
    let fake = Fake {
        nodes: [
            ("worker-1".to_string(), node("capped")),
            ("free-1".to_string(), node("other")),
        ]
        .into(),
        pods: [
            ("default/web-1".to_string(), pod(1000, false)),
            ("default/web-2".to_string(), pod(500, false)),
            ("default/web-3".to_string(), pod(400, false)),
            ("default/static".to_string(), pod(2000, true)),
        ]
        .into(),
        bound: [("worker-1".to_string(), units(&[("cpu", 3500)]))].into(),
        ledger: Mutex::new(Ledger::new(LEDGER_TTL)),
        now: Instant::now(),
        synced: true,
    };
    (fake, policies)
}

fn binding(pod: &str, node: &str) -> Vec<u8> {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "operation": "CREATE",
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding", "name": pod, "namespace": "default",
            "object": {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": pod, "namespace": "default"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}},
        }
    });
    review.to_string().into_bytes()
}

/// The same Binding POSTed to /api/v1/namespaces/default/bindings: resource `bindings`, the
/// pod named only in the object.
fn old_binding(pod: &str, node: &str) -> Vec<u8> {
    let mut review: Value = serde_json::from_slice(&binding(pod, node)).unwrap_or_default();
    review["request"]["resource"]["resource"] = json!("bindings");
    if let Some(request) = review["request"].as_object_mut() {
        request.remove("subResource");
        request.remove("name");
    }
    review.to_string().into_bytes()
}

fn pod_create(node: Option<&str>, cpu: &str, mirror: bool) -> Vec<u8> {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "direct", "namespace": "default"},
        "spec": {
            "initContainers": [{"name": "proxy", "image": "x", "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "100m"}}}],
            "containers": [{"name": "app", "image": "x", "resources": {"requests": {"cpu": cpu}}}],
        }
    });
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    if mirror {
        pod["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
    }
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-2", "operation": "CREATE",
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default", "object": pod,
        }
    });
    review.to_string().into_bytes()
}

fn response(validated: &Validated) -> Value {
    let review: Value = serde_json::from_slice(&validated.body).unwrap_or_default();
    review["response"].clone()
}

#[test]
fn placements_are_answered_as_admission_reviews() {
    // What the requester is told: no node figures (those are in `message`, for the log).
    let over = "node worker-1: cpu requests would exceed the node's placement cap; pod web-1 \
                asks 1";
    let direct_over = "node worker-1: cpu requests would exceed the node's placement cap; pod \
                       direct asks 1.1";
    let cases: Vec<(&str, &str, Vec<u8>, CapOutcome, Value)> = vec![
        (
            "a binding within the cap is allowed",
            "Enforce",
            binding("web-2", "worker-1"),
            CapOutcome::Allowed,
            json!({"uid": "u-1", "allowed": true}),
        ),
        (
            "a binding over the cap is denied with the message",
            "Enforce",
            binding("web-1", "worker-1"),
            CapOutcome::Denied,
            json!({"uid": "u-1", "allowed": false,
                "status": {"code": 403, "reason": "Forbidden", "message": over}}),
        ),
        (
            "a binding through the namespace's bindings endpoint is checked too",
            "Enforce",
            old_binding("web-1", "worker-1"),
            CapOutcome::Denied,
            json!({"uid": "u-1", "allowed": false,
                "status": {"code": 403, "reason": "Forbidden", "message": over}}),
        ),
        (
            "Warn mode allows with the message as a warning",
            "Warn",
            binding("web-1", "worker-1"),
            CapOutcome::Warned,
            json!({"uid": "u-1", "allowed": true, "warnings": [over]}),
        ),
        (
            "a pod created with spec.nodeName is checked (sidecar counted)",
            "Enforce",
            pod_create(Some("worker-1"), "1", false),
            CapOutcome::Denied,
            json!({"uid": "u-2", "allowed": false,
                "status": {"code": 403, "reason": "Forbidden", "message": direct_over}}),
        ),
        (
            "a pod created with spec.nodeName within the cap is allowed",
            "Enforce",
            pod_create(Some("worker-1"), "100m", false),
            CapOutcome::Allowed,
            json!({"uid": "u-2", "allowed": true}),
        ),
        (
            "a pod created without spec.nodeName is left to the binding",
            "Enforce",
            pod_create(None, "64", false),
            CapOutcome::Allowed,
            json!({"uid": "u-2", "allowed": true}),
        ),
        (
            "a mirror pod is allowed",
            "Enforce",
            pod_create(Some("worker-1"), "64", true),
            CapOutcome::Allowed,
            json!({"uid": "u-2", "allowed": true}),
        ),
        (
            "a mirror pod's binding is allowed",
            "Enforce",
            binding("static", "worker-1"),
            CapOutcome::Allowed,
            json!({"uid": "u-1", "allowed": true}),
        ),
        (
            "a node without a policy is allowed",
            "Enforce",
            binding("web-1", "free-1"),
            CapOutcome::Allowed,
            json!({"uid": "u-1", "allowed": true}),
        ),
        (
            "a pod not in the index fails open",
            "Enforce",
            binding("unknown", "worker-1"),
            CapOutcome::FailedOpen,
            json!({"uid": "u-1", "allowed": true}),
        ),
        (
            "a node not in the cache fails open",
            "Enforce",
            binding("web-1", "worker-9"),
            CapOutcome::FailedOpen,
            json!({"uid": "u-1", "allowed": true}),
        ),
        (
            "an unparsable quantity fails open",
            "Enforce",
            pod_create(Some("worker-1"), "lots", false),
            CapOutcome::FailedOpen,
            json!({"uid": "u-2", "allowed": true}),
        ),
    ];
    for (name, mode, body, outcome, expected) in cases {
        let (source, policies) = fake(mode);
        let validated = handle(&body, &policies, &source);
        assert_eq!(validated.status, 200, "{name}");
        assert_eq!(
            validated.outcome, outcome,
            "{name}: {:?}",
            validated.message
        );
        assert_eq!(response(&validated), expected, "{name}");
    }
}

#[test]
fn not_a_review_is_a_bad_request() {
    let (source, policies) = fake("Enforce");
    for body in [
        &b"{"[..],
        br#"{"apiVersion":"admission.k8s.io/v1beta1","request":{"uid":"x"}}"#,
        br#"{"apiVersion":"admission.k8s.io/v1"}"#,
        br#"{"apiVersion":"admission.k8s.io/v1","request":{}}"#,
    ] {
        let validated = handle(body, &policies, &source);
        assert_eq!(validated.status, 400, "{}", String::from_utf8_lossy(body));
        assert_eq!(validated.outcome, CapOutcome::BadRequest);
    }
}

#[test]
fn a_burst_of_bindings_is_counted_before_the_watch_shows_it() {
    // 3.5 cores bound, cap 4.4: web-2 (0.5) fits; its retry does not count against itself;
    // web-3 (0.4) reaches 4.4 exactly; web-1 (1) would reach 5.4.
    let (source, policies) = fake("Enforce");
    let steps = [
        ("web-2", "worker-1", CapOutcome::Allowed),
        ("web-2", "worker-1", CapOutcome::Allowed),
        ("web-3", "worker-1", CapOutcome::Allowed),
        ("web-1", "free-1", CapOutcome::Allowed),
        ("web-1", "worker-1", CapOutcome::Denied),
    ];
    for (pod, node, outcome) in steps {
        let validated = handle(&binding(pod, node), &policies, &source);
        assert_eq!(
            validated.outcome, outcome,
            "{pod} -> {node}: {:?}",
            validated.message
        );
    }
    let denied = handle(&binding("web-1", "worker-1"), &policies, &source);
    assert_eq!(
        denied.message.as_deref(),
        Some(
            "node worker-1: cpu requests would reach 5.4 of a cap of 4.4 (110% of 4); pod \
             web-1 asks 1"
        )
    );
}

#[test]
fn the_ledger_counts_until_seen_or_expired() {
    let t0 = Instant::now();
    let mut ledger = Ledger::new(Duration::from_secs(30));
    let cpu = |v| units(&[("cpu", v)]);
    ledger.record("ns/a", "n1", &cpu(100), Hold::Everyone, t0);
    ledger.record(
        "ns/b",
        "n1",
        &cpu(200),
        Hold::Everyone,
        t0 + Duration::from_secs(10),
    );
    ledger.record("ns/c", "n2", &cpu(400), Hold::Everyone, t0);
    assert_eq!(
        ledger.pending("n1", "", t0 + Duration::from_secs(10)),
        cpu(300)
    );
    assert_eq!(ledger.pending("n2", "", t0), cpu(400));
    // a: 30 s old, no longer counted; b still is.
    assert_eq!(
        ledger.pending("n1", "", t0 + Duration::from_secs(30)),
        cpu(200)
    );
    assert_eq!(
        ledger.pending("n1", "ns/b", t0 + Duration::from_secs(10)),
        cpu(100),
        "a pod's own binding is left out"
    );
    ledger.seen_bound("ns/b");
    assert_eq!(ledger.pending("n1", "", t0), cpu(100));
    // Recording again replaces (a pod is bound once), and expires the old entries.
    ledger.record(
        "ns/a",
        "n2",
        &cpu(1),
        Hold::Everyone,
        t0 + Duration::from_secs(31),
    );
    assert_eq!(
        ledger.pending("n1", "", t0 + Duration::from_secs(31)),
        cpu_none()
    );
    assert_eq!(ledger.len(), 1, "c expired, a moved");
    assert_eq!(
        ledger.pending("n2", "", t0 + Duration::from_secs(31)),
        cpu(1)
    );
}

fn cpu_none() -> BTreeMap<String, u128> {
    BTreeMap::new()
}

#[test]
fn pod_facts_count_as_the_scheduler_counts() {
    let pod = |spec: Value, annotations: Value| -> Pod {
        let object = json!({"metadata": {"name": "p", "annotations": annotations}, "spec": spec});
        serde_json::from_value(object).unwrap_or_else(|e| panic!("{e}"))
    };
    let cases = [
        (
            "containers summed, overhead added",
            json!({"containers": [
                {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "0.5"}}}],
                "overhead": {"cpu": "10m"}}),
            json!({}),
            Ok(PodFacts {
                requests: units(&[("cpu", 760), ("memory", 1 << 30)]),
                ..PodFacts::default()
            }),
        ),
        (
            "pod-level requests replace the containers' cpu",
            json!({"containers": [{"name": "a", "resources": {"requests": {"cpu": "3"}}}],
                "resources": {"requests": {"cpu": "1"}}}),
            json!({"kubernetes.io/config.mirror": "x"}),
            Ok(PodFacts {
                requests: units(&[("cpu", 1000)]),
                exempt: Some(overcommit_core::cap::Exempt::Mirror),
                bound: false,
            }),
        ),
        (
            "a bad quantity is an error",
            json!({"containers": [{"name": "a", "resources": {"requests": {"cpu": "1x"}}}]}),
            json!({}),
            Err(()),
        ),
    ];
    for (name, spec, annotations, expected) in cases {
        let got = pod::facts(&pod(spec, annotations)).map_err(|_| ());
        assert_eq!(got, expected, "{name}");
    }
}

fn k8s_pod(name: &str, node: Option<&str>, cpu: &str, phase: &str) -> Pod {
    let mut spec = json!({"containers": [{"name": "a", "resources": {"requests": {"cpu": cpu}}}]});
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    let object = json!({"metadata": {"name": name, "namespace": "ns"}, "spec": spec,
        "status": {"phase": phase}});
    serde_json::from_value(object).unwrap_or_else(|e| panic!("{e}"))
}

/// The cap's view of the shared pod index and its ledger, fed as the pod watch feeds them
/// (`sources::pods`): requested sums follow pods as they come and go, a pending pod is read
/// from the index, and an allowed binding counts once, from the ledger until the watch shows
/// the pod bound, from the index after.
#[test]
fn the_shared_index_and_the_ledger_give_requested_sums_as_pods_come_and_go() {
    use crate::sources::placement::WatchedPlacement;
    use crate::sources::pod_cache::{PodCache, index_pod};
    use crate::sources::pods::{apply_event, delete_event, relist_event};
    let pods = PodCache::new(crate::sources::metrics::UsageMetrics::default());
    let placement = WatchedPlacement::new(pods.clone(), None);
    let source: &dyn PlacementSource = &placement;
    let cpu = |v| units(&[("cpu", v)]);
    let requested = |pod: &str| source.requested("n1", "ns", pod);
    let watch = |pod: &Pod| apply_event(&pods, Some(&placement), pod);
    for pod in [
        k8s_pod("a", Some("n1"), "1", "Running"),
        k8s_pod("b", Some("n1"), "500m", "Pending"),
        k8s_pod("c", None, "2", "Pending"),
        k8s_pod("d", Some("n2"), "3", "Running"),
        k8s_pod("e", Some("n1"), "4", "Succeeded"),
    ] {
        assert!(watch(&pod).is_ok());
    }
    assert_eq!(
        requested("x"),
        cpu(1500),
        "terminal and unbound pods do not count"
    );
    assert_eq!(
        requested("a"),
        cpu(500),
        "a pod's own requests are left out"
    );
    assert_eq!(source.pod("ns", "c").map(|p| p.requests), Some(cpu(2000)));
    assert_eq!(source.pod("ns", "e"), None);
    // c is allowed onto n1: counted from the ledger until the watch shows it bound.
    source.allowed(&Allowed {
        namespace: "ns",
        name: "c",
        node: "n1",
        requests: &cpu(2000),
        hold: Hold::Everyone,
    });
    assert_eq!(requested("x"), cpu(3500));
    assert_eq!(requested("c"), cpu(1500), "its own binding is left out");
    // Still pending in the watch's eyes (a status change): still from the ledger.
    assert!(watch(&k8s_pod("c", None, "2", "Pending")).is_ok());
    assert_eq!(requested("x"), cpu(3500));
    assert!(watch(&k8s_pod("c", Some("n1"), "2", "Running")).is_ok());
    assert_eq!(
        requested("x"),
        cpu(3500),
        "counted once, from the index now"
    );
    // a finishes, b is deleted, c is resized.
    assert!(watch(&k8s_pod("a", Some("n1"), "1", "Failed")).is_ok());
    delete_event(&pods, Some(&placement), "ns/b");
    assert!(watch(&k8s_pod("c", Some("n1"), "250m", "Running")).is_ok());
    assert_eq!(requested("x"), cpu(250));
    assert_eq!(pods.read().len(), 2);
    // An unreadable pod leaves the index.
    assert!(watch(&k8s_pod("c", Some("n1"), "1x", "Running")).is_err());
    assert_eq!(requested("x"), cpu_none());
    // A relist replaces the pods; the ledger keeps what the list does not show bound.
    source.allowed(&Allowed {
        namespace: "ns",
        name: "y",
        node: "n1",
        requests: &cpu(100),
        hold: Hold::Everyone,
    });
    source.allowed(&Allowed {
        namespace: "ns",
        name: "z",
        node: "n1",
        requests: &cpu(7000),
        hold: Hold::Everyone,
    });
    let mut index = overcommit_core::pod_index::PodIndex::default();
    assert!(index_pod(&mut index, &k8s_pod("z", Some("n1"), "7", "Running")).is_ok());
    assert!(index_pod(&mut index, &k8s_pod("y", None, "100m", "Pending")).is_ok());
    relist_event(&pods, Some(&placement), index);
    assert_eq!(
        requested("x"),
        cpu(7100),
        "z from the index, y from the ledger"
    );
    // Memory is counted beside cpu.
    let mut with_memory = k8s_pod("m", Some("n1"), "0", "Running");
    if let Some(c) = with_memory
        .spec
        .as_mut()
        .and_then(|s| s.containers.first_mut())
    {
        c.resources = serde_json::from_value(json!({"requests": {"memory": "1Gi"}})).ok();
    }
    assert!(watch(&with_memory).is_ok());
    assert_eq!(requested("x"), units(&[("cpu", 7100), ("memory", 1 << 30)]));
}

#[test]
fn node_facts_read_raw_allocatable() {
    use super::node::node_facts;
    use k8s_openapi::api::core::v1::Node;
    let node = |annotations: Value| -> Node {
        let object = json!({"metadata": {"name": "n1", "labels": {"pool": "a"},
            "annotations": annotations},
            "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}}});
        serde_json::from_value(object).unwrap_or_else(|e| panic!("{e}"))
    };
    // The listed format, and the JSON one of earlier versions.
    for raw in ["cpu=3900m", "{\"cpu\":\"3900m\"}"] {
        let inflated = node(json!({ "overcommit.dev/raw-allocatable": raw }));
        let facts = node_facts(&inflated).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            facts.raw,
            units(&[("cpu", 3900), ("memory", 16 << 30), ("pods", 110)])
        );
    }
    let inflated = node(json!({"overcommit.dev/raw-allocatable": "cpu=3900m"}));
    let facts = node_facts(&inflated).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(facts.labels.get("pool").map(String::as_str), Some("a"));
    let plain = node_facts(&node(json!({}))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plain.raw.get("cpu"), Some(&8000));
    for bad in [
        json!({"overcommit.dev/raw-allocatable": "not name=value"}),
        json!({"overcommit.dev/raw-allocatable": "cpu=x"}),
        json!({"overcommit.dev/raw-allocatable": "{\"cpu\":\"x\"}"}),
        json!({"overcommit.dev/raw-allocatable": "{\"cpu\":"}),
    ] {
        assert!(node_facts(&node(bad)).is_err());
    }
}

/// Pending pods asking `cpu` millicores each.
fn add_pods(fake: &mut Fake, names: &[&str], cpu: u128) {
    for name in names {
        fake.pods.insert(
            name.to_string(),
            PodFacts {
                requests: units(&[("cpu", cpu)]),
                ..PodFacts::default()
            },
        );
    }
}

/// A source whose `requested` reads the node's sum, then waits (up to 300 ms) until a second
/// review has read it too: without one decision at a time, both decide on the same sum.
struct Rendezvous<'a> {
    inner: &'a Fake,
    arrived: std::sync::atomic::AtomicUsize,
}

impl PlacementSource for Rendezvous<'_> {
    fn node(&self, name: &str) -> Option<Arc<NodeFacts>> {
        self.inner.node(name)
    }
    fn pod(&self, namespace: &str, name: &str) -> Option<PodFacts> {
        self.inner.pod(namespace, name)
    }
    fn requested(&self, node: &str, namespace: &str, name: &str) -> BTreeMap<String, u128> {
        use std::sync::atomic::Ordering;
        let sum = self.inner.requested(node, namespace, name);
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let until = Instant::now() + Duration::from_millis(300);
        while self.arrived.load(Ordering::SeqCst) < 2 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        sum
    }
    fn allowed(&self, placement: &Allowed<'_>) {
        self.inner.allowed(placement);
    }
    fn synced(&self) -> bool {
        self.inner.synced()
    }
}

/// Two bindings to one node reviewed at the same moment (the API server calls a replica over
/// several connections at once), each fitting alone but not together: exactly one is allowed.
#[test]
fn concurrent_bindings_cannot_both_pass_on_the_same_sum() {
    let (mut fake, policies) = fake("Enforce");
    // worker-1 holds 3.5 of a cap of 4.4: 0.6 fits, 0.6 + 0.6 does not.
    add_pods(&mut fake, &["default/a", "default/b"], 600);
    let source = Rendezvous {
        inner: &fake,
        arrived: std::sync::atomic::AtomicUsize::new(0),
    };
    let reviews = [binding("a", "worker-1"), binding("b", "worker-1")];
    let outcomes: Vec<CapOutcome> = std::thread::scope(|s| {
        let handles: Vec<_> = reviews
            .iter()
            .map(|body| s.spawn(|| handle(body, &policies, &source).outcome))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(CapOutcome::FailedOpen))
            .collect()
    });
    let allowed = outcomes
        .iter()
        .filter(|o| **o == CapOutcome::Allowed)
        .count();
    let denied = outcomes
        .iter()
        .filter(|o| **o == CapOutcome::Denied)
        .count();
    assert_eq!((allowed, denied), (1, 1), "{outcomes:?}");
}

/// A dry-run binding gets the real answer but reserves nothing: the binding after it is
/// decided on the same sum (sideEffects None in the ValidatingWebhookConfiguration).
#[test]
fn dry_run_bindings_are_answered_but_not_counted() {
    let (mut source, policies) = fake("Enforce");
    // worker-1 holds 3.5 of a cap of 4.4: one 0.6 fits, two do not.
    add_pods(&mut source, &["default/x", "default/y"], 600);
    let dry = |pod: &str| -> Vec<u8> {
        let mut review: Value =
            serde_json::from_slice(&binding(pod, "worker-1")).unwrap_or_default();
        review["request"]["dryRun"] = json!(true);
        review.to_string().into_bytes()
    };
    let outcome = |body: &[u8]| handle(body, &policies, &source);
    assert_eq!(outcome(&dry("x")).outcome, CapOutcome::Allowed);
    assert_eq!(outcome(&dry("web-1")).outcome, CapOutcome::Denied);
    // Had x's dry run been counted, y would reach 4.7.
    assert_eq!(
        outcome(&binding("y", "worker-1")).outcome,
        CapOutcome::Allowed
    );
    let after = outcome(&binding("x", "worker-1"));
    assert_eq!(after.outcome, CapOutcome::Denied);
    assert_eq!(
        after.message.as_deref(),
        Some(
            "node worker-1: cpu requests would reach 4.7 of a cap of 4.4 (110% of 4); pod x \
             asks 0.6"
        )
    );
}

/// A source whose `requested` for worker-1 waits (up to 2 s) until a review for another node
/// has been decided, and records whether it was.
struct HoldsWorker1<'a> {
    inner: &'a Fake,
    inside: std::sync::atomic::AtomicBool,
    other_done: std::sync::atomic::AtomicBool,
    saw_other_done: std::sync::atomic::AtomicBool,
}

impl PlacementSource for HoldsWorker1<'_> {
    fn node(&self, name: &str) -> Option<Arc<NodeFacts>> {
        self.inner.node(name)
    }
    fn pod(&self, namespace: &str, name: &str) -> Option<PodFacts> {
        self.inner.pod(namespace, name)
    }
    fn requested(&self, node: &str, namespace: &str, name: &str) -> BTreeMap<String, u128> {
        use std::sync::atomic::Ordering;
        if node == "worker-1" {
            self.inside.store(true, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(2);
            while !self.other_done.load(Ordering::SeqCst) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.saw_other_done
                .store(self.other_done.load(Ordering::SeqCst), Ordering::SeqCst);
        }
        self.inner.requested(node, namespace, name)
    }
    fn allowed(&self, placement: &Allowed<'_>) {
        self.inner.allowed(placement);
    }
    fn synced(&self) -> bool {
        self.inner.synced()
    }
}

/// Bindings to different nodes do not wait for each other: while a decision for worker-1 is
/// in the middle (between reading the sum and recording the binding), one for worker-2 is
/// decided (with one lock for every node, it would wait until worker-1's is done).
#[test]
fn bindings_to_different_nodes_are_decided_side_by_side() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (mut fake, policies) = fake("Enforce");
    if let Some(worker) = fake.nodes.get("worker-1").cloned() {
        fake.nodes.insert("worker-2".to_string(), worker);
    }
    add_pods(&mut fake, &["default/a", "default/b"], 600);
    let source = HoldsWorker1 {
        inner: &fake,
        inside: AtomicBool::new(false),
        other_done: AtomicBool::new(false),
        saw_other_done: AtomicBool::new(false),
    };
    let (one, two) = (binding("a", "worker-1"), binding("b", "worker-2"));
    let outcomes = std::thread::scope(|s| {
        let first = s.spawn(|| handle(&one, &policies, &source).outcome);
        let second = s.spawn(|| {
            let until = Instant::now() + Duration::from_secs(2);
            while !source.inside.load(Ordering::SeqCst) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            let outcome = handle(&two, &policies, &source).outcome;
            source.other_done.store(true, Ordering::SeqCst);
            outcome
        });
        [first.join(), second.join()].map(|h| h.unwrap_or(CapOutcome::FailedOpen))
    });
    assert_eq!(outcomes, [CapOutcome::Allowed, CapOutcome::Allowed]);
    assert!(source.inside.load(Ordering::SeqCst));
    assert!(
        source.saw_other_done.load(Ordering::SeqCst),
        "the binding to worker-2 waited for the one to worker-1"
    );
}

/// The fake, plus an API server holding `remote` pods (a read of anything else finds nothing,
/// or fails with `fail`), counting reads.
struct Remote<'a> {
    inner: &'a Fake,
    remote: BTreeMap<String, PodFacts>,
    fail: Option<&'static str>,
    reads: std::sync::atomic::AtomicUsize,
}

impl PlacementSource for Remote<'_> {
    fn node(&self, name: &str) -> Option<Arc<NodeFacts>> {
        self.inner.node(name)
    }
    fn pod(&self, namespace: &str, name: &str) -> Option<PodFacts> {
        self.inner.pod(namespace, name)
    }
    fn requested(&self, node: &str, namespace: &str, name: &str) -> BTreeMap<String, u128> {
        self.inner.requested(node, namespace, name)
    }
    fn allowed(&self, placement: &Allowed<'_>) {
        self.inner.allowed(placement);
    }
    fn synced(&self) -> bool {
        self.inner.synced()
    }
    fn fetch_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<PodFacts>, String>> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let answer = match self.fail {
            Some(reason) => Err(reason.to_string()),
            None => Ok(self.remote.get(&format!("{namespace}/{name}")).cloned()),
        };
        Box::pin(async move { answer })
    }
}

/// A binding whose pod this replica's watch has not shown yet is decided on one read of the
/// pod (refused over the cap, counted in the ledger when allowed); a pod the API server does
/// not have, or a read that fails, is allowed (fail open) with the lookup reported; a pod in
/// the index is never read.
#[test]
fn a_pod_missing_from_the_index_is_read_once() {
    use futures::executor::block_on;
    use std::sync::atomic::Ordering;
    let (fake, policies) = fake("Enforce");
    let pod = |cpu: u128| PodFacts {
        requests: units(&[("cpu", cpu)]),
        ..PodFacts::default()
    };
    let source = Remote {
        inner: &fake,
        remote: [
            ("default/new-big".to_string(), pod(1000)),
            ("default/new-small".to_string(), pod(600)),
            ("default/new-next".to_string(), pod(600)),
        ]
        .into(),
        fail: None,
        reads: Default::default(),
    };
    let run = |pod: &str| {
        block_on(handle_fetching(
            &binding(pod, "worker-1"),
            &policies,
            &source,
        ))
    };

    // worker-1 holds 3.5 of a cap of 4.4.
    let big = run("new-big");
    assert_eq!(
        (big.outcome, big.lookup),
        (CapOutcome::Denied, Some(PodLookup::Found))
    );
    assert_eq!(
        big.message.as_deref(),
        Some(
            "node worker-1: cpu requests would reach 4.5 of a cap of 4.4 (110% of 4); pod \
             new-big asks 1"
        )
    );
    let small = run("new-small");
    assert_eq!(
        (small.outcome, small.lookup),
        (CapOutcome::Allowed, Some(PodLookup::Found))
    );
    // new-small's binding counts (ledger): 3.5 + 0.6 + 0.6 is over.
    assert_eq!(run("new-next").outcome, CapOutcome::Denied);
    assert_eq!(source.reads.load(Ordering::SeqCst), 3);

    let gone = run("never-created");
    assert_eq!(
        (gone.outcome, gone.lookup),
        (CapOutcome::FailedOpen, Some(PodLookup::NotFound))
    );
    assert_eq!(response(&gone)["allowed"], json!(true));

    // In the index: decided without a read (3.5 + 0.6 + 0.4 is over).
    let indexed = run("web-3");
    assert_eq!(
        (indexed.outcome, indexed.lookup),
        (CapOutcome::Denied, None)
    );
    assert_eq!(source.reads.load(Ordering::SeqCst), 4);

    let failing = Remote {
        inner: &fake,
        remote: BTreeMap::new(),
        fail: Some("no answer within 500ms"),
        reads: Default::default(),
    };
    let failed = block_on(handle_fetching(
        &binding("new-big", "worker-1"),
        &policies,
        &failing,
    ));
    assert_eq!(
        (failed.outcome, failed.lookup),
        (CapOutcome::FailedOpen, Some(PodLookup::Failed))
    );
    assert_eq!(response(&failed)["allowed"], json!(true));
    assert_eq!(
        failed.message.as_deref(),
        Some(
            "pod default/new-big: not in this replica's pod index yet, and reading it failed: \
             no answer within 500ms"
        )
    );
}

/// Issue 32's attacks on the ledger, by a tenant with `create pods` only: pod creates that pass
/// admission but are never stored. A create reusing a stored pod's name (AlreadyExists after
/// admission) is not counted at all; a create with a new name that a full ResourceQuota then
/// refuses holds back only its own namespace's placements until the TTL, never another
/// tenant's, nor the scheduler's bindings.
#[test]
fn creates_that_never_persist_hold_no_one_elses_capacity() {
    let (source, policies) = fake("Enforce");
    // worker-1 holds 3.5 of a cap of 4.4.
    let create = |namespace: &str, name: &str, cpu: &str| -> Vec<u8> {
        let mut review: Value =
            serde_json::from_slice(&pod_create(Some("worker-1"), cpu, false)).unwrap_or_default();
        review["request"]["namespace"] = json!(namespace);
        review["request"]["object"]["metadata"]["namespace"] = json!(namespace);
        review["request"]["object"]["metadata"]["name"] = json!(name);
        review.to_string().into_bytes()
    };
    // The name of a stored pod (web-2): allowed by the cap (0.1 + 0.1 sidecar), not counted.
    for _ in 0..5 {
        let taken = handle(&create("default", "web-2", "800m"), &policies, &source);
        assert_eq!(taken.outcome, CapOutcome::Allowed, "{:?}", taken.message);
    }
    assert_eq!(
        source.ledger.lock().map(|l| l.len()).unwrap_or(usize::MAX),
        0,
        "a create of a name the index holds fails AlreadyExists: never counted"
    );
    // New names in tenant-a (a full quota refuses them after admission): the first fits and
    // is counted, for tenant-a only.
    let first = handle(&create("tenant-a", "jam-1", "700m"), &policies, &source);
    assert_eq!(first.outcome, CapOutcome::Allowed, "{:?}", first.message);
    let second = handle(&create("tenant-a", "jam-2", "700m"), &policies, &source);
    assert_eq!(
        second.outcome,
        CapOutcome::Denied,
        "tenant-a's own burst is held exactly"
    );
    // Another tenant's create and the scheduler's binding of a pending pod still fit.
    let other = handle(&create("tenant-b", "legit", "700m"), &policies, &source);
    assert_eq!(other.outcome, CapOutcome::Allowed, "{:?}", other.message);
    let bound = handle(&binding("web-3", "worker-1"), &policies, &source);
    assert_eq!(bound.outcome, CapOutcome::Allowed, "{:?}", bound.message);
}

/// A binding of a pod the index shows bound already fails (409) after admission: it is
/// answered but not counted, so repeating it holds nothing.
#[test]
fn a_binding_of_a_bound_pod_is_not_counted() {
    let (mut source, policies) = fake("Enforce");
    source.pods.insert(
        "default/running".to_string(),
        PodFacts {
            requests: units(&[("cpu", 800)]),
            exempt: None,
            bound: true,
        },
    );
    for _ in 0..3 {
        let again = handle(&binding("running", "worker-1"), &policies, &source);
        assert_eq!(again.outcome, CapOutcome::Allowed, "{:?}", again.message);
    }
    assert_eq!(
        source.ledger.lock().map(|l| l.len()).unwrap_or(usize::MAX),
        0
    );
    // A pending pod's binding is counted for everyone.
    let pending = handle(&binding("web-3", "worker-1"), &policies, &source);
    assert_eq!(pending.outcome, CapOutcome::Allowed);
    assert_eq!(
        source.ledger.lock().map(|l| l.len()).unwrap_or(usize::MAX),
        1
    );
}

/// DaemonSet and critical pods are never refused: over the cap they are allowed with the
/// public warning (outcome `exempted`, the detail in the log) and counted like any other.
#[test]
fn daemonset_and_critical_pods_are_allowed_over_the_cap_and_counted() {
    use overcommit_core::cap::Exempt;
    let (mut source, policies) = fake("Enforce");
    for (name, exempt) in [("agent", Exempt::DaemonSet), ("dns", Exempt::Critical)] {
        source.pods.insert(
            format!("default/{name}"),
            PodFacts {
                requests: units(&[("cpu", 1000)]),
                exempt: Some(exempt),
                bound: false,
            },
        );
    }
    let agent = handle(&binding("agent", "worker-1"), &policies, &source);
    assert_eq!(agent.outcome, CapOutcome::Exempted, "{:?}", agent.message);
    assert_eq!(
        response(&agent),
        json!({"uid": "u-1", "allowed": true, "warnings": [
            "node worker-1: cpu requests would exceed the node's placement cap; pod agent asks \
             1; allowed: a DaemonSet's pod is never refused by the cap"]})
    );
    assert_eq!(
        agent.message.as_deref(),
        Some(
            "node worker-1: cpu requests would reach 4.5 of a cap of 4.4 (110% of 4); pod agent \
             asks 1 (allowed: daemonset pod)"
        )
    );
    // agent's 1 counts: 3.5 + 1 + 1.
    let dns = handle(&binding("dns", "worker-1"), &policies, &source);
    assert_eq!(dns.outcome, CapOutcome::Exempted);
    assert!(
        dns.message
            .as_deref()
            .is_some_and(|m| m.contains("would reach 5.5 of a cap of 4.4")),
        "{:?}",
        dns.message
    );
    let plain = handle(&binding("web-3", "worker-1"), &policies, &source);
    assert_eq!(plain.outcome, CapOutcome::Denied);
}

/// Until the pod index has listed every pod, no node's sums are known: a placement is allowed
/// undecided (fail open) with the reason, never decided as if the node were empty or counted.
#[test]
fn placements_fail_open_until_the_pod_index_has_synced() {
    let (mut source, policies) = fake("Enforce");
    source.synced = false;
    let review = handle(&binding("web-1", "worker-1"), &policies, &source);
    assert_eq!(review.outcome, CapOutcome::FailedOpen);
    assert_eq!(review.failed_open, Some("pods_not_synced"));
    assert_eq!(response(&review), json!({"uid": "u-1", "allowed": true}));
    assert_eq!(
        source.ledger.lock().map(|l| l.len()).unwrap_or(usize::MAX),
        0
    );
    // A review that places nothing is not a failure.
    let nothing = handle(&pod_create(None, "64", false), &policies, &source);
    assert_eq!(nothing.outcome, CapOutcome::Allowed);
    source.synced = true;
    assert_eq!(
        handle(&binding("web-1", "worker-1"), &policies, &source).outcome,
        CapOutcome::Denied
    );
}

#[test]
fn daemonset_ownership_and_priority_are_read_from_the_pod() {
    use overcommit_core::cap::Exempt;
    let pod = |metadata: Value, spec: Value| -> Pod {
        serde_json::from_value(json!({"metadata": metadata, "spec": spec}))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let owner = |kind: &str, api: &str, controller: bool| {
        json!({"name": "p", "ownerReferences": [{"apiVersion": api, "kind": kind, "name": "o",
            "uid": "1", "controller": controller}]})
    };
    let containers = json!({"containers": [{"name": "a"}]});
    let cases = [
        ("plain", pod(json!({"name": "p"}), containers.clone()), None),
        (
            "DaemonSet controller",
            pod(owner("DaemonSet", "apps/v1", true), containers.clone()),
            Some(Exempt::DaemonSet),
        ),
        (
            "DaemonSet owner that is not the controller",
            pod(owner("DaemonSet", "apps/v1", false), containers.clone()),
            None,
        ),
        (
            "a DaemonSet kind of another group",
            pod(
                owner("DaemonSet", "example.com/v1", true),
                containers.clone(),
            ),
            None,
        ),
        (
            "ReplicaSet controller",
            pod(owner("ReplicaSet", "apps/v1", true), containers.clone()),
            None,
        ),
        (
            "system-cluster-critical",
            pod(
                json!({"name": "p"}),
                json!({"containers": [{"name": "a"}], "priority": 2_000_000_000}),
            ),
            Some(Exempt::Critical),
        ),
        (
            "the highest user priority",
            pod(
                json!({"name": "p"}),
                json!({"containers": [{"name": "a"}], "priority": 1_000_000_000}),
            ),
            None,
        ),
    ];
    for (name, pod, expect) in cases {
        assert_eq!(pod::exempt(&pod), expect, "{name}");
    }
}
