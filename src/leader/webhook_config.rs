//! The MutatingWebhookConfiguration the leader keeps in place: the desired object (a pure
//! function of the flags and the trusted CA bundle) and the drift check (only the fields we
//! own, with the API server's defaults filled in so a defaulted field is not drift).
//!
//! Two webhooks in one configuration:
//! - `nodes.overcommit.dev`: UPDATE nodes/status and CREATE nodes. No object selector: the node
//!   rule itself honours `overcommit.dev/disabled=true`, so that opting out restores the raw
//!   allocatable and removes the annotations at the next status write (docs/architecture.md
//!   rule 3.7). A match condition sends it only registrations (CREATE), status writes by
//!   nodes (the group `system:nodes`) and the leader's nudges (status writes by the
//!   ServiceAccount, `nudge`): the API server does not call the webhook for other status
//!   writers (node-problem-detector, controllers, users), whose writes keep the stored allocatable.
//!   In in-process mode, while the compiled policy is in force, a second condition
//!   (`served-by-webhook`, the complement of the compiled policy: `hand_over`) leaves out the
//!   nodes the compiled policy serves; when it serves every node, the node webhook is left out
//!   of the configuration (the narrowing `in_process::NO_NODE_LEFT`), so that the API server
//!   does not even evaluate its match conditions (each evaluation converts the node and the
//!   old node to CEL values).
//! - `pods.overcommit.dev`: CREATE pods in namespaces labelled
//!   `overcommit.dev/pod-defaults=enabled`, never in kube-system or the webhook's own namespace
//!   (namespaceSelector on that label and `kubernetes.io/metadata.name`), opt-out by the pod label
//!   `overcommit.dev/disabled=true` (objectSelector), never mirror pods (a match condition on
//!   the annotation `kubernetes.io/config.mirror`: the kubelet's copies of static pods).
//!
//! The webhook-guard admission policy (deploy/components/webhook-guard) pins every one of these
//! fields to what `desired` writes: a change here needs the same change there.
//!
//! Both fail open (`failurePolicy: Ignore`) with a short timeout: heartbeats are never blocked.
//!
//! With `serve --request-cap`, a ValidatingWebhookConfiguration of the same name for the
//! placement cap (`/validate`), kept the same way (`desired_validating`, `validating_drift`):
//! - `bindings.cap.overcommit.dev`: CREATE pods/binding and CREATE bindings (the namespace's
//!   older endpoint), the two ways a pod is bound to a node. The object of such a review is a
//!   Binding (no labels, no pod spec), so there is no object selector or match condition.
//! - `placed-pods.cap.overcommit.dev`: CREATE pods, but only those created with `spec.nodeName`
//!   set (a match condition): an ordinary pod create, left to the scheduler, never reaches the
//!   webhook; nor do mirror pods (the kubelet's copies of static pods that already run).
//!
//! Neither sees kube-system or the webhook's own namespace (namespaceSelector,
//! docs/architecture.md rule 3.1): their pods are never refused by the cap (their requests still
//! count in a node's sum: the pod index watches every pod). Both fail open (`Ignore`) with the
//! same timeout: an outage of the webhook never blocks a binding, it only lets it through uncapped.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use serde_json::{Value, json};

use overcommit_core::in_process;
use overcommit_core::policy::POD_DEFAULTS_NAMESPACE_LABEL;

use super::ca::{self, Fingerprint};
use super::cert_source::{INJECTION_ANNOTATIONS, Injection};
use crate::webhook::VALIDATE_PATH;

/// Label that opts an object out.
pub const DISABLED_LABEL: &str = "overcommit.dev/disabled";
/// Name of the node webhook inside the configuration.
pub const NODES_WEBHOOK: &str = "nodes.overcommit.dev";
/// Name of the pod webhook inside the configuration.
pub const PODS_WEBHOOK: &str = "pods.overcommit.dev";
/// Match condition of the pod webhook: never the mirror pods a kubelet makes of static pods.
pub const PODS_CONDITION: (&str, &str) = (
    "not-a-mirror-pod",
    "!has(object.metadata.annotations) || !('kubernetes.io/config.mirror' in object.metadata.annotations)",
);
/// Name of the cap's webhook for bindings (pods/binding, bindings).
pub const BINDINGS_CAP_WEBHOOK: &str = "bindings.cap.overcommit.dev";
/// Name of the cap's webhook for pods created with spec.nodeName.
pub const PLACED_PODS_CAP_WEBHOOK: &str = "placed-pods.cap.overcommit.dev";
/// Match condition of the placed-pods webhook: only pods that name their node.
pub const PLACED_POD_CONDITION: (&str, &str) = (
    "node-name-set",
    "has(object.spec.nodeName) && object.spec.nodeName != ''",
);
/// Label on objects the leader manages.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "kube-overcommit");

/// What the configuration is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSettings {
    pub config_name: String,
    pub namespace: String,
    pub service_name: String,
    pub timeout_seconds: i32,
    /// Keep the ValidatingWebhookConfiguration of the placement cap (`serve --request-cap`).
    pub request_cap: bool,
    /// `--cert-source=cert-manager`: cainjector's annotation on both configurations.
    pub injection: Option<Injection>,
    /// The user whose node status writes are the leader's nudges (the ServiceAccount's): the
    /// node webhook's match condition takes them (`in_process::match_condition`).
    pub nudger: String,
}

fn rule(operation: &str, resource: &str, scope: &str) -> RuleWithOperations {
    RuleWithOperations {
        api_groups: Some(vec![String::new()]),
        api_versions: Some(vec!["v1".into()]),
        operations: Some(vec![operation.into()]),
        resources: Some(vec![resource.into()]),
        scope: Some(scope.into()),
    }
}

fn webhook(
    s: &WebhookSettings,
    name: &str,
    ca_bundle: &[u8],
    condition: (&str, &str),
) -> MutatingWebhook {
    webhook_at(s, name, "/mutate", ca_bundle, &[condition])
}

fn webhook_at(
    s: &WebhookSettings,
    name: &str,
    path: &str,
    ca_bundle: &[u8],
    conditions: &[(&str, &str)],
) -> MutatingWebhook {
    MutatingWebhook {
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        client_config: WebhookClientConfig {
            // Empty: not filled yet (cainjector's to fill, --cert-source=cert-manager).
            ca_bundle: (!ca_bundle.is_empty()).then(|| ByteString(ca_bundle.to_vec())),
            service: Some(ServiceReference {
                namespace: s.namespace.clone(),
                name: s.service_name.clone(),
                path: Some(path.into()),
                port: Some(443),
            }),
            url: None,
        },
        failure_policy: Some("Ignore".into()),
        match_conditions: Some(
            conditions
                .iter()
                .map(|(name, expression)| MatchCondition {
                    name: (*name).into(),
                    expression: (*expression).into(),
                })
                .collect(),
        ),
        match_policy: Some("Equivalent".into()),
        reinvocation_policy: Some("Never".into()),
        side_effects: "None".into(),
        timeout_seconds: Some(s.timeout_seconds),
        ..Default::default()
    }
}

/// The configuration as it must be; `narrowing`: the node webhook's second match condition
/// (`hand_over::narrowing`), None: wide; `in_process::NO_NODE_LEFT`: no node webhook.
pub fn desired(
    s: &WebhookSettings,
    ca_bundle: &[u8],
    narrowing: Option<&str>,
) -> MutatingWebhookConfiguration {
    let nodes = (narrowing != Some(in_process::NO_NODE_LEFT)).then(|| {
        let nodes_condition = in_process::match_condition(&s.nudger);
        let mut conditions = vec![(in_process::MATCH_CONDITION_NAME, nodes_condition.as_str())];
        conditions.extend(narrowing.map(|n| (in_process::WEBHOOK_CONDITION_NAME, n)));
        let mut nodes = webhook_at(s, NODES_WEBHOOK, "/mutate", ca_bundle, &conditions);
        nodes.rules = Some(vec![
            rule("UPDATE", "nodes/status", "Cluster"),
            rule("CREATE", "nodes", "Cluster"),
        ]);
        nodes
    });
    let mut pods = webhook(s, PODS_WEBHOOK, ca_bundle, PODS_CONDITION);
    pods.rules = Some(vec![rule("CREATE", "pods", "Namespaced")]);
    // Only namespaces that opted in (docs/policy.md: an AdmissionReview does not carry the
    // namespace's labels, so this choice is the API server's).
    pods.namespace_selector = Some(LabelSelector {
        match_expressions: Some(vec![
            not_system_namespaces(s),
            LabelSelectorRequirement {
                key: POD_DEFAULTS_NAMESPACE_LABEL.into(),
                operator: "In".into(),
                values: Some(vec!["enabled".into()]),
            },
        ]),
        match_labels: None,
    });
    pods.object_selector = Some(LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: DISABLED_LABEL.into(),
            operator: "NotIn".into(),
            values: Some(vec!["true".into()]),
        }]),
        match_labels: None,
    });
    MutatingWebhookConfiguration {
        metadata: metadata(s),
        webhooks: Some(nodes.into_iter().chain([pods]).collect()),
    }
}

/// The node webhook's narrowing in a live configuration: its `served-by-webhook` condition,
/// `in_process::NO_NODE_LEFT` without a node webhook.
pub fn live_narrowing(actual: &MutatingWebhookConfiguration) -> Option<String> {
    let Some(nodes) = node_webhook(actual) else {
        return Some(in_process::NO_NODE_LEFT.into());
    };
    nodes
        .match_conditions
        .iter()
        .flatten()
        .find(|c| c.name == in_process::WEBHOOK_CONDITION_NAME)
        .map(|c| c.expression.clone())
}

fn node_webhook(config: &MutatingWebhookConfiguration) -> Option<&MutatingWebhook> {
    config
        .webhooks
        .iter()
        .flatten()
        .find(|w| w.name == NODES_WEBHOOK)
}

/// The `action` of a repair, for the log and `kube_overcommit_config_repairs_total`: `narrowed`
/// or `widened` when only the node webhook's narrowing changes (in-process hand-over: its
/// condition, or the node webhook left out or put back), `repaired` otherwise.
pub fn repair_action(
    actual: &MutatingWebhookConfiguration,
    want: &MutatingWebhookConfiguration,
    drifted: &[String],
) -> &'static str {
    let without_nodes = |c: &MutatingWebhookConfiguration| {
        let mut c = c.clone();
        c.webhooks = c
            .webhooks
            .map(|w| w.into_iter().filter(|w| w.name != NODES_WEBHOOK).collect());
        c
    };
    let node_webhook_only = match (node_webhook(actual), node_webhook(want)) {
        (Some(_), Some(_)) => drifted == [format!("{NODES_WEBHOOK}.matchConditions")],
        (None, None) => false,
        _ => drift(&without_nodes(actual), &without_nodes(want)).is_empty(),
    };
    match (live_narrowing(actual), live_narrowing(want)) {
        (None, Some(_)) if node_webhook_only => "narrowed",
        (Some(_), None) if node_webhook_only => "widened",
        _ => "repaired",
    }
}

/// Name, managed-by label and (cert-manager) cainjector's annotation.
fn metadata(s: &WebhookSettings) -> ObjectMeta {
    ObjectMeta {
        name: Some(s.config_name.clone()),
        labels: Some([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())].into()),
        annotations: s
            .injection
            .as_ref()
            .map(|(key, value)| [(key.to_string(), value.clone())].into()),
        ..Default::default()
    }
}

/// The namespaces the webhooks exempt: kube-system and the webhook's own (docs/architecture.md
/// rule 3.1); memory relief never evicts there either.
pub fn exempt_namespaces(own: &str) -> Vec<String> {
    let mut excluded = vec!["kube-system".to_string()];
    if own != "kube-system" {
        excluded.push(own.to_string());
    }
    excluded
}

/// Never kube-system or the webhook's own namespace (docs/architecture.md rule 3.1).
fn not_system_namespaces(s: &WebhookSettings) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: "kubernetes.io/metadata.name".into(),
        operator: "NotIn".into(),
        values: Some(exempt_namespaces(&s.namespace)),
    }
}

/// A validating webhook from the shared builder (the fields a validating webhook has).
fn validating(w: MutatingWebhook) -> ValidatingWebhook {
    ValidatingWebhook {
        name: w.name,
        admission_review_versions: w.admission_review_versions,
        client_config: w.client_config,
        failure_policy: w.failure_policy,
        match_conditions: w.match_conditions,
        match_policy: w.match_policy,
        namespace_selector: w.namespace_selector,
        object_selector: w.object_selector,
        rules: w.rules,
        side_effects: w.side_effects,
        timeout_seconds: w.timeout_seconds,
    }
}

/// The owned fields of a validating webhook, as a mutating one (reinvocationPolicy unset, which
/// the view reads as its default), so that one view serves both kinds.
fn as_mutating(w: &ValidatingWebhook) -> MutatingWebhook {
    MutatingWebhook {
        name: w.name.clone(),
        admission_review_versions: w.admission_review_versions.clone(),
        client_config: w.client_config.clone(),
        failure_policy: w.failure_policy.clone(),
        match_conditions: w.match_conditions.clone(),
        match_policy: w.match_policy.clone(),
        namespace_selector: w.namespace_selector.clone(),
        object_selector: w.object_selector.clone(),
        rules: w.rules.clone(),
        side_effects: w.side_effects.clone(),
        timeout_seconds: w.timeout_seconds,
        reinvocation_policy: None,
    }
}

/// The ValidatingWebhookConfiguration of the placement cap as it must be; None without
/// `--request-cap` (then the leader removes the one it kept, if any).
pub fn desired_validating(
    s: &WebhookSettings,
    ca_bundle: &[u8],
) -> Option<ValidatingWebhookConfiguration> {
    if !s.request_cap {
        return None;
    }
    let namespaces = Some(LabelSelector {
        match_expressions: Some(vec![not_system_namespaces(s)]),
        match_labels: None,
    });
    let mut bindings = webhook_at(s, BINDINGS_CAP_WEBHOOK, VALIDATE_PATH, ca_bundle, &[]);
    bindings.match_conditions = None;
    bindings.rules = Some(vec![
        rule("CREATE", "pods/binding", "Namespaced"),
        rule("CREATE", "bindings", "Namespaced"),
    ]);
    bindings.namespace_selector = namespaces.clone();
    let mut placed = webhook_at(
        s,
        PLACED_PODS_CAP_WEBHOOK,
        VALIDATE_PATH,
        ca_bundle,
        &[PLACED_POD_CONDITION, PODS_CONDITION],
    );
    placed.rules = Some(vec![rule("CREATE", "pods", "Namespaced")]);
    placed.namespace_selector = namespaces;
    Some(ValidatingWebhookConfiguration {
        metadata: metadata(s),
        webhooks: Some(vec![validating(bindings), validating(placed)]),
    })
}

/// The owned fields of the validating configuration that differ (empty: no drift).
pub fn validating_drift(
    actual: &ValidatingWebhookConfiguration,
    want: &ValidatingWebhookConfiguration,
) -> Vec<String> {
    let view = |c: &ValidatingWebhookConfiguration| -> Vec<MutatingWebhook> {
        c.webhooks.iter().flatten().map(as_mutating).collect()
    };
    let mut out = annotation_drift(&actual.metadata, &want.metadata);
    out.extend(drift_of(&view(actual), &view(want)));
    out
}

/// cainjector's annotations that differ from the wanted ones (pinned both ways: one left over
/// from another source would make cainjector fight the leader over caBundle).
fn annotation_drift(actual: &ObjectMeta, want: &ObjectMeta) -> Vec<String> {
    let get =
        |meta: &ObjectMeta, key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).cloned();
    INJECTION_ANNOTATIONS
        .iter()
        .filter(|key| get(actual, key) != get(want, key))
        .map(|key| format!("metadata.annotations[{key}]"))
        .collect()
}

/// Put cainjector's annotations as `want` has them, leaving every other annotation alone.
fn pin_annotations(meta: &mut ObjectMeta, want: &ObjectMeta) {
    for key in INJECTION_ANNOTATIONS {
        match want.annotations.as_ref().and_then(|a| a.get(key)) {
            Some(value) => {
                meta.annotations
                    .get_or_insert_with(Default::default)
                    .insert(key.into(), value.clone());
            }
            None => {
                if let Some(a) = meta.annotations.as_mut() {
                    a.remove(key);
                }
            }
        }
    }
}

fn first_ca_bundle<'a>(
    mut configs: impl Iterator<Item = &'a WebhookClientConfig>,
) -> Option<Vec<u8>> {
    configs.find_map(|c| c.ca_bundle.as_ref().map(|b| b.0.clone()))
}

fn mark_managed(meta: &mut ObjectMeta) {
    let labels = meta.labels.get_or_insert_with(Default::default);
    labels.insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
}

/// What the leader does with the validating configuration, from what it wants and what is live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValidatingUpkeep {
    /// Nothing to write.
    Keep,
    Create,
    /// Replace the live one; the drifted fields, for the log.
    Repair(Vec<String>),
    /// `--request-cap` is off and the live one is ours (managed-by label): delete it.
    Delete,
}

/// The pure decision of the validating configuration's upkeep. A configuration of that name
/// without our managed-by label is left alone when the cap is off (someone else's).
pub fn validating_upkeep(
    want: Option<&ValidatingWebhookConfiguration>,
    actual: Option<&ValidatingWebhookConfiguration>,
) -> ValidatingUpkeep {
    match (want, actual) {
        (Some(_), None) => ValidatingUpkeep::Create,
        (Some(want), Some(actual)) => {
            let drifted = validating_drift(actual, want);
            if drifted.is_empty() {
                ValidatingUpkeep::Keep
            } else {
                ValidatingUpkeep::Repair(drifted)
            }
        }
        (None, Some(actual)) if is_managed(&actual.metadata) => ValidatingUpkeep::Delete,
        (None, _) => ValidatingUpkeep::Keep,
    }
}

/// The CAs both configurations trust, in the mutating one's order (None when either is
/// missing): what a CA rotation may rely on while both are kept.
pub fn trusted_by_both<T: PartialEq>(
    mutating: Option<Vec<T>>,
    validating: Option<Vec<T>>,
) -> Option<Vec<T>> {
    let (mutating, validating) = (mutating?, validating?);
    Some(
        mutating
            .into_iter()
            .filter(|fp| validating.contains(fp))
            .collect(),
    )
}

fn is_managed(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY.0))
        .is_some_and(|v| v == MANAGED_BY.1)
}

fn selector_view(sel: &Option<LabelSelector>) -> Value {
    match sel {
        None => Value::Null,
        Some(sel) => {
            let labels = sel.match_labels.clone().unwrap_or_default();
            let exprs = sel.match_expressions.clone().unwrap_or_default();
            if labels.is_empty() && exprs.is_empty() {
                Value::Null
            } else {
                json!({ "matchLabels": labels, "matchExpressions": exprs })
            }
        }
    }
}

/// The fields we own, with the API server's defaults made explicit.
fn owned_view(webhooks: &[MutatingWebhook]) -> Value {
    let views: Vec<Value> = webhooks
        .iter()
        .map(|w| {
            let service = w.client_config.service.as_ref().map(|svc| {
                json!({
                    "namespace": svc.namespace,
                    "name": svc.name,
                    "path": svc.path,
                    "port": svc.port.unwrap_or(443),
                })
            });
            let rules: Vec<Value> = w
                .rules
                .iter()
                .flatten()
                .map(|r| {
                    json!({
                        "apiGroups": r.api_groups,
                        "apiVersions": r.api_versions,
                        "operations": r.operations,
                        "resources": r.resources,
                        "scope": r.scope.clone().unwrap_or_else(|| "*".into()),
                    })
                })
                .collect();
            json!({
                "name": w.name,
                "admissionReviewVersions": w.admission_review_versions,
                "caBundle": w.client_config.ca_bundle.as_ref().map(|b| b.0.clone()),
                "service": service,
                "url": w.client_config.url,
                "failurePolicy": w.failure_policy.clone().unwrap_or_else(|| "Fail".into()),
                "matchPolicy": w.match_policy.clone().unwrap_or_else(|| "Equivalent".into()),
                "reinvocationPolicy": w.reinvocation_policy.clone().unwrap_or_else(|| "Never".into()),
                "sideEffects": w.side_effects,
                "timeoutSeconds": w.timeout_seconds.unwrap_or(10),
                "rules": rules,
                "namespaceSelector": selector_view(&w.namespace_selector),
                "objectSelector": selector_view(&w.object_selector),
                "matchConditions": w.match_conditions.clone().unwrap_or_default(),
            })
        })
        .collect();
    Value::Array(views)
}

/// The owned fields that differ (empty: no drift). Names only, for logs and metrics.
pub fn drift(
    actual: &MutatingWebhookConfiguration,
    want: &MutatingWebhookConfiguration,
) -> Vec<String> {
    let mut out = annotation_drift(&actual.metadata, &want.metadata);
    out.extend(drift_of(
        actual.webhooks.as_deref().unwrap_or_default(),
        want.webhooks.as_deref().unwrap_or_default(),
    ));
    out
}

fn drift_of(actual: &[MutatingWebhook], want: &[MutatingWebhook]) -> Vec<String> {
    let a = owned_view(actual);
    let w = owned_view(want);
    let (Value::Array(a), Value::Array(w)) = (a, w) else {
        return vec!["webhooks".into()];
    };
    if a.len() != w.len() {
        return vec!["webhooks".into()];
    }
    let mut out = Vec::new();
    for (av, wv) in a.iter().zip(&w) {
        let (Value::Object(am), Value::Object(wm)) = (av, wv) else {
            continue;
        };
        for (key, want_value) in wm {
            if am.get(key) != Some(want_value) {
                let name = wm.get("name").and_then(Value::as_str).unwrap_or("?");
                out.push(format!("{name}.{key}"));
            }
        }
    }
    out
}

/// What the leader keeps of either configuration type: its metadata and its webhooks.
pub trait WebhookConfiguration: Clone {
    fn metadata(&self) -> &ObjectMeta;
    fn metadata_mut(&mut self) -> &mut ObjectMeta;
    /// Put `want`'s webhooks in place of these.
    fn take_webhooks(&mut self, want: &Self);
    /// The client configs of its webhooks, in order.
    fn client_configs(&self) -> impl Iterator<Item = &WebhookClientConfig>;
}

// The two types have the same fields here (`metadata`, `webhooks[].client_config`).
macro_rules! webhook_configuration {
    ($($config:ty),*) => {$(
        impl WebhookConfiguration for $config {
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
            fn take_webhooks(&mut self, want: &Self) {
                self.webhooks = want.webhooks.clone();
            }
            fn client_configs(&self) -> impl Iterator<Item = &WebhookClientConfig> {
                self.webhooks.iter().flatten().map(|w| &w.client_config)
            }
        }
    )*};
}

webhook_configuration!(MutatingWebhookConfiguration, ValidatingWebhookConfiguration);

/// The repaired object: the live one (metadata, resourceVersion, others' labels kept) with our
/// webhooks in place.
pub fn repaired<C: WebhookConfiguration>(actual: &C, want: &C) -> C {
    let mut out = actual.clone();
    out.take_webhooks(want);
    mark_managed(out.metadata_mut());
    pin_annotations(out.metadata_mut(), want.metadata());
    out
}

/// The CA bundle bytes of a live configuration (the first webhook's; they are kept equal).
pub fn live_ca_bundle<C: WebhookConfiguration>(actual: &C) -> Option<Vec<u8>> {
    first_ca_bundle(actual.client_configs())
}

fn fingerprints_of(pem: Option<Vec<u8>>) -> Vec<Fingerprint> {
    pem.and_then(|pem| ca::parse_pem_bundle(&pem).ok())
        .map(|certs| certs.iter().map(|c| c.fingerprint).collect())
        .unwrap_or_default()
}

/// The fingerprints of the CAs in a live configuration's caBundle.
pub fn bundle_fingerprints<C: WebhookConfiguration>(cfg: &C) -> Vec<Fingerprint> {
    fingerprints_of(live_ca_bundle(cfg))
}

/// True when a validated timeout is allowed by the API server and by docs/architecture.md rule 3.1.
pub fn valid_timeout(seconds: i64) -> Result<i32, String> {
    if (1..=5).contains(&seconds) {
        Ok(seconds as i32)
    } else {
        Err(format!(
            "webhook timeout must be 1 to 5 seconds, got {seconds}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> WebhookSettings {
        WebhookSettings {
            config_name: "kube-overcommit".into(),
            namespace: "kube-overcommit".into(),
            service_name: "kube-overcommit".into(),
            timeout_seconds: 2,
            request_cap: false,
            injection: None,
            nudger: "system:serviceaccount:kube-overcommit:kube-overcommit".into(),
        }
    }

    fn cap_settings() -> WebhookSettings {
        WebhookSettings {
            request_cap: true,
            ..settings()
        }
    }

    fn rules_of(w: &ValidatingWebhook) -> Vec<String> {
        w.rules
            .iter()
            .flatten()
            .map(|r| {
                format!(
                    "{} {}",
                    r.operations.clone().unwrap_or_default().join(","),
                    r.resources.clone().unwrap_or_default().join(",")
                )
            })
            .collect()
    }

    #[test]
    fn desired_validating_shape() {
        assert_eq!(desired_validating(&settings(), b"CA"), None, "off");
        let cfg = desired_validating(&cap_settings(), b"CA").unwrap();
        assert_eq!(cfg.metadata.name.as_deref(), Some("kube-overcommit"));
        assert!(is_managed(&cfg.metadata));
        let hooks = cfg.webhooks.unwrap();
        let names: Vec<&str> = hooks.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, [BINDINGS_CAP_WEBHOOK, PLACED_PODS_CAP_WEBHOOK]);
        for h in &hooks {
            assert_eq!(h.failure_policy.as_deref(), Some("Ignore"));
            assert_eq!(h.timeout_seconds, Some(2));
            assert_eq!(h.side_effects, "None");
            assert_eq!(h.admission_review_versions, vec!["v1"]);
            assert_eq!(
                h.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()),
                Some(&b"CA"[..])
            );
            let svc = h.client_config.service.as_ref().unwrap();
            assert_eq!(
                (svc.name.as_str(), svc.namespace.as_str()),
                ("kube-overcommit", "kube-overcommit")
            );
            assert_eq!(
                (svc.path.as_deref(), svc.port),
                (Some("/validate"), Some(443))
            );
            let ns = h.namespace_selector.as_ref().unwrap();
            let ns = ns.match_expressions.as_ref().unwrap();
            assert_eq!(
                ns.len(),
                1,
                "never kube-system or its own namespace, nothing else"
            );
            assert_eq!(
                (ns[0].key.as_str(), ns[0].operator.as_str()),
                ("kubernetes.io/metadata.name", "NotIn")
            );
            assert_eq!(
                ns[0].values.as_ref().unwrap(),
                &vec!["kube-system".to_string(), "kube-overcommit".to_string()]
            );
            assert!(h.object_selector.is_none());
        }
        assert_eq!(
            rules_of(&hooks[0]),
            ["CREATE pods/binding", "CREATE bindings"]
        );
        assert!(hooks[0].match_conditions.is_none(), "a Binding has no spec");
        assert_eq!(rules_of(&hooks[1]), ["CREATE pods"]);
        let conditions: Vec<(String, String)> = hooks[1]
            .match_conditions
            .iter()
            .flatten()
            .map(|c| (c.name.clone(), c.expression.clone()))
            .collect();
        assert_eq!(
            conditions,
            [PLACED_POD_CONDITION, PODS_CONDITION].map(|(n, e)| (n.to_string(), e.to_string()))
        );
    }

    #[test]
    fn trusted_by_both_table() {
        type Bundle = Option<Vec<u8>>;
        let cases: [(Bundle, Bundle, Bundle); 6] = [
            (Some(vec![1]), Some(vec![1]), Some(vec![1])),
            // Published in the mutating one only: not live yet.
            (Some(vec![1, 2]), Some(vec![1]), Some(vec![1])),
            (Some(vec![1]), Some(vec![1, 2]), Some(vec![1])),
            (Some(vec![1, 2]), Some(vec![2, 1]), Some(vec![1, 2])),
            (Some(vec![1]), None, None),
            (None, Some(vec![1]), None),
        ];
        for (m, v, want) in cases {
            assert_eq!(trusted_by_both(m.clone(), v.clone()), want, "{m:?} {v:?}");
        }
    }

    #[test]
    fn validating_upkeep_table() {
        let want = desired_validating(&cap_settings(), b"CA").unwrap();
        let unlabelled = {
            let mut c = want.clone();
            c.metadata.labels = None;
            c
        };
        type Edit = fn(&mut ValidatingWebhook);
        let edits: Vec<(&str, Edit, bool)> = vec![
            ("unchanged", |_| {}, false),
            (
                "defaults filled in",
                |w| {
                    w.client_config.service.as_mut().unwrap().port = None;
                    w.match_policy = None;
                    if w.object_selector.is_none() {
                        w.object_selector = Some(LabelSelector::default());
                    }
                },
                false,
            ),
            (
                "failurePolicy",
                |w| w.failure_policy = Some("Fail".into()),
                true,
            ),
            (
                "caBundle",
                |w| w.client_config.ca_bundle = Some(ByteString(b"garbage".to_vec())),
                true,
            ),
            ("timeout", |w| w.timeout_seconds = Some(10), true),
            ("rules", |w| w.rules = Some(vec![]), true),
            (
                "path",
                |w| w.client_config.service.as_mut().unwrap().path = Some("/mutate".into()),
                true,
            ),
            // (Only the placed-pods webhook has conditions.)
            ("matchConditions", |w| w.match_conditions = None, true),
            ("namespaceSelector", |w| w.namespace_selector = None, true),
        ];
        for (what, edit, drifted) in edits {
            let mut actual = want.clone();
            for w in actual.webhooks.as_mut().unwrap() {
                edit(w);
            }
            let got = validating_upkeep(Some(&want), Some(&actual));
            assert_eq!(
                matches!(got, ValidatingUpkeep::Repair(_)),
                drifted,
                "{what}: {got:?}"
            );
            assert!(
                validating_drift(&repaired(&actual, &want), &want).is_empty(),
                "{what}: repaired"
            );
        }
        let mut one = want.clone();
        one.webhooks.as_mut().unwrap().pop();
        assert_eq!(
            validating_upkeep(Some(&want), Some(&one)),
            ValidatingUpkeep::Repair(vec!["webhooks".into()])
        );
        let cases = [
            ("on, missing", Some(&want), None, ValidatingUpkeep::Create),
            (
                "on, in place",
                Some(&want),
                Some(&want),
                ValidatingUpkeep::Keep,
            ),
            ("off, ours", None, Some(&want), ValidatingUpkeep::Delete),
            (
                "off, someone else's",
                None,
                Some(&unlabelled),
                ValidatingUpkeep::Keep,
            ),
            ("off, none", None, None, ValidatingUpkeep::Keep),
        ];
        for (what, want, actual, expected) in cases {
            assert_eq!(validating_upkeep(want, actual), expected, "{what}");
        }
        // Taking over a hand-made one of that name: repaired with our label.
        let taken = repaired(&unlabelled, &want);
        assert!(is_managed(&taken.metadata));
        assert_eq!(live_ca_bundle(&taken), Some(b"CA".to_vec()));
    }

    #[test]
    fn desired_shape() {
        let cfg = desired(&settings(), b"CA", None);
        let hooks = cfg.webhooks.unwrap();
        assert_eq!(hooks.len(), 2);
        for h in &hooks {
            assert_eq!(h.failure_policy.as_deref(), Some("Ignore"));
            assert_eq!(h.timeout_seconds, Some(2));
            assert_eq!(h.side_effects, "None");
            assert_eq!(h.admission_review_versions, vec!["v1"]);
            let svc = h.client_config.service.as_ref().unwrap();
            assert_eq!(
                (svc.path.as_deref(), svc.port),
                (Some("/mutate"), Some(443))
            );
        }
        let node_resources: Vec<_> = hooks[0]
            .rules
            .iter()
            .flatten()
            .flat_map(|r| r.resources.clone().unwrap())
            .collect();
        assert_eq!(node_resources, vec!["nodes/status", "nodes"]);
        let never = serde_json::to_string(&hooks).unwrap();
        assert!(!never.contains("leases") && !never.contains("events"));
        let ns = hooks[1]
            .namespace_selector
            .as_ref()
            .unwrap()
            .match_expressions
            .as_ref()
            .unwrap();
        assert_eq!(
            ns[0].values.as_ref().unwrap(),
            &vec!["kube-system".to_string(), "kube-overcommit".to_string()]
        );
        assert_eq!(
            (ns[1].key.as_str(), ns[1].operator.as_str()),
            ("overcommit.dev/pod-defaults", "In")
        );
        assert_eq!(ns[1].values.as_ref().unwrap(), &vec!["enabled".to_string()]);
        let conditions = |h: &MutatingWebhook| -> Vec<(String, String)> {
            h.match_conditions
                .iter()
                .flatten()
                .map(|c| (c.name.clone(), c.expression.clone()))
                .collect()
        };
        assert_eq!(conditions(&hooks[0]).len(), 1);
        assert!(
            conditions(&hooks[0])[0]
                .1
                .contains("'system:nodes' in request.userInfo.groups")
        );
        assert!(
            conditions(&hooks[0])[0]
                .1
                .contains("request.operation == 'CREATE'")
        );
        assert!(
            conditions(&hooks[0])[0].1.ends_with(
                "|| request.userInfo.username == \
                 'system:serviceaccount:kube-overcommit:kube-overcommit'"
            ),
            "the leader's nudges, and no other user's"
        );
        assert_eq!(conditions(&hooks[1]).len(), 1);
        assert!(
            conditions(&hooks[1])[0]
                .1
                .contains("kubernetes.io/config.mirror")
        );
    }

    /// In-process mode: the narrowing is the node webhook's second condition, after the first
    /// (which the webhook guard pins); the pod webhook is untouched; it reads back as written
    /// and a change of it is drift, repaired like any other.
    #[test]
    fn narrowing_is_the_node_webhooks_second_condition() {
        let wide = desired(&settings(), b"CA", None);
        let narrowed = desired(&settings(), b"CA", Some("labels['a'] == 'b'"));
        let hooks = narrowed.webhooks.clone().unwrap_or_default();
        let names: Vec<&str> = hooks[0]
            .match_conditions
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            names,
            [in_process::MATCH_CONDITION_NAME, "served-by-webhook"]
        );
        assert_eq!(
            hooks[1].match_conditions,
            wide.webhooks.clone().unwrap_or_default()[1].match_conditions
        );
        assert_eq!(
            live_narrowing(&narrowed).as_deref(),
            Some("labels['a'] == 'b'")
        );
        assert_eq!(live_narrowing(&wide), None);
        assert_eq!(
            drift(&wide, &narrowed),
            vec!["nodes.overcommit.dev.matchConditions"]
        );
        assert!(drift(&repaired(&wide, &narrowed), &narrowed).is_empty());
        let drifted = drift(&wide, &narrowed);
        assert_eq!(repair_action(&wide, &narrowed, &drifted), "narrowed");
        assert_eq!(repair_action(&narrowed, &wide, &drifted), "widened");
        let other = desired(&settings(), b"CA", Some("true"));
        assert_eq!(
            repair_action(&narrowed, &other, &drift(&narrowed, &other)),
            "repaired"
        );
    }

    /// In-process mode with every node served by the compiled policy: no node webhook at all
    /// (the API server evaluates nothing for node writes); it reads back as that narrowing, and
    /// putting it back is widening.
    #[test]
    fn narrowing_to_no_node_leaves_the_node_webhook_out() {
        let wide = desired(&settings(), b"CA", None);
        let none = desired(&settings(), b"CA", Some(in_process::NO_NODE_LEFT));
        let names: Vec<&str> = none
            .webhooks
            .iter()
            .flatten()
            .map(|w| w.name.as_str())
            .collect();
        assert_eq!(names, [PODS_WEBHOOK]);
        assert_eq!(
            none.webhooks.as_ref().map(|w| &w[0]),
            wide.webhooks.as_ref().map(|w| &w[1]),
            "the pod webhook is untouched"
        );
        assert_eq!(
            live_narrowing(&none).as_deref(),
            Some(in_process::NO_NODE_LEFT)
        );
        let drifted = drift(&wide, &none);
        assert_eq!(drifted, ["webhooks"]);
        assert!(drift(&repaired(&wide, &none), &none).is_empty());
        assert_eq!(repair_action(&wide, &none, &drifted), "narrowed");
        assert_eq!(repair_action(&none, &wide, &drift(&none, &wide)), "widened");
        // Anything else changed beside it is a repair.
        let mut tampered = wide.clone();
        if let Some(hooks) = tampered.webhooks.as_mut() {
            hooks[1].timeout_seconds = Some(30);
        }
        assert_eq!(
            repair_action(&tampered, &none, &drift(&tampered, &none)),
            "repaired"
        );
        let narrowed = desired(&settings(), b"CA", Some("labels['a'] == 'b'"));
        assert_eq!(
            repair_action(&narrowed, &none, &drift(&narrowed, &none)),
            "repaired"
        );
    }

    #[test]
    fn drift_table() {
        let want = desired(&settings(), b"CA", None);
        type Edit = fn(&mut MutatingWebhook);
        let cases: Vec<(&str, Edit, bool)> = vec![
            ("unchanged", |_| {}, false),
            // What the API server fills in by default is not drift.
            (
                "defaults filled in",
                |w| {
                    w.client_config.service.as_mut().unwrap().port = None;
                    if w.namespace_selector.is_none() {
                        w.namespace_selector = Some(LabelSelector::default());
                    }
                },
                false,
            ),
            (
                "caBundle",
                |w| w.client_config.ca_bundle = Some(ByteString(b"other".to_vec())),
                true,
            ),
            (
                "failurePolicy",
                |w| w.failure_policy = Some("Fail".into()),
                true,
            ),
            (
                "failurePolicy unset means Fail",
                |w| w.failure_policy = None,
                true,
            ),
            ("timeout", |w| w.timeout_seconds = Some(30), true),
            ("sideEffects", |w| w.side_effects = "Unknown".into(), true),
            (
                "versions",
                |w| w.admission_review_versions = vec!["v1beta1".into()],
                true,
            ),
            ("rules", |w| w.rules = Some(vec![rule("*", "*", "*")]), true),
            (
                "matchPolicy",
                |w| w.match_policy = Some("Exact".into()),
                true,
            ),
            (
                "selector",
                |w| {
                    w.object_selector = Some(LabelSelector {
                        match_labels: Some([("a".to_string(), "b".to_string())].into()),
                        match_expressions: None,
                    })
                },
                true,
            ),
            (
                "matchConditions removed",
                |w| w.match_conditions = None,
                true,
            ),
            (
                "matchConditions changed",
                |w| {
                    w.match_conditions = Some(vec![MatchCondition {
                        name: "any".into(),
                        expression: "true".into(),
                    }])
                },
                true,
            ),
            (
                "reinvocationPolicy",
                |w| w.reinvocation_policy = Some("IfNeeded".into()),
                true,
            ),
            (
                "reinvocationPolicy unset means Never",
                |w| w.reinvocation_policy = None,
                false,
            ),
            (
                "service port",
                |w| w.client_config.service.as_mut().unwrap().port = Some(9999),
                true,
            ),
            (
                "service path",
                |w| w.client_config.service.as_mut().unwrap().path = Some("/x".into()),
                true,
            ),
        ];
        for (what, edit, drifted) in cases {
            let mut actual = want.clone();
            for w in actual.webhooks.as_mut().unwrap() {
                edit(w);
            }
            assert_eq!(!drift(&actual, &want).is_empty(), drifted, "{what}");
            assert!(
                drift(&repaired(&actual, &want), &want).is_empty(),
                "{what}: repaired"
            );
        }
        let mut missing_one = want.clone();
        missing_one.webhooks.as_mut().unwrap().pop();
        assert_eq!(drift(&missing_one, &want), vec!["webhooks"]);
        let mut none = want.clone();
        none.webhooks = None;
        assert!(!drift(&none, &want).is_empty());
    }

    #[test]
    fn timeout_bounds() {
        assert!(valid_timeout(0).is_err());
        assert_eq!(valid_timeout(1), Ok(1));
        assert_eq!(valid_timeout(5), Ok(5));
        assert!(valid_timeout(6).is_err());
    }

    fn cert_manager_settings() -> WebhookSettings {
        WebhookSettings {
            request_cap: true,
            injection: Some((
                crate::leader::cert_source::INJECT_CA_FROM,
                "kube-overcommit/kube-overcommit".into(),
            )),
            ..settings()
        }
    }

    fn annotation<C: WebhookConfiguration>(cfg: &C, key: &str) -> Option<String> {
        cfg.metadata()
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .cloned()
    }

    #[test]
    fn cert_manager_annotation_on_both() {
        use crate::leader::cert_source::INJECT_CA_FROM;
        let s = cert_manager_settings();
        let mutating = desired(&s, b"", None);
        let validating = desired_validating(&s, b"").unwrap();
        let want = Some("kube-overcommit/kube-overcommit".to_string());
        assert_eq!(annotation(&mutating, INJECT_CA_FROM), want);
        assert_eq!(annotation(&validating, INJECT_CA_FROM), want);
        // Created before cainjector filled it: no caBundle at all (not an empty one).
        for h in mutating.webhooks.iter().flatten() {
            assert_eq!(h.client_config.ca_bundle, None);
        }
        assert_eq!(
            annotation(&desired(&settings(), b"CA", None), INJECT_CA_FROM),
            None
        );
    }

    #[test]
    fn annotation_drift_table() {
        use crate::leader::cert_source::{INJECT_CA_FROM, INJECT_CA_FROM_SECRET};
        let with = |pairs: &[(&str, &str)]| {
            let mut cfg = desired(&settings(), b"CA", None);
            cfg.metadata.annotations = Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .chain([("someone/else".to_string(), "kept".to_string())])
                    .collect(),
            );
            cfg
        };
        let cm = desired(&cert_manager_settings(), b"CA", None);
        let leader = desired(&settings(), b"CA", None);
        let from = "kube-overcommit/kube-overcommit";
        let cases: Vec<(
            &str,
            MutatingWebhookConfiguration,
            &MutatingWebhookConfiguration,
            Vec<String>,
        )> = vec![
            (
                "cert-manager, in place",
                with(&[(INJECT_CA_FROM, from)]),
                &cm,
                vec![],
            ),
            (
                "cert-manager, removed",
                with(&[]),
                &cm,
                vec![format!("metadata.annotations[{INJECT_CA_FROM}]")],
            ),
            (
                "cert-manager, other Certificate",
                with(&[(INJECT_CA_FROM, "ns/other")]),
                &cm,
                vec![format!("metadata.annotations[{INJECT_CA_FROM}]")],
            ),
            (
                "cert-manager, secret added",
                with(&[(INJECT_CA_FROM, from), (INJECT_CA_FROM_SECRET, "ns/s")]),
                &cm,
                vec![format!("metadata.annotations[{INJECT_CA_FROM_SECRET}]")],
            ),
            ("leader, none", with(&[]), &leader, vec![]),
            (
                "leader, left over",
                with(&[(INJECT_CA_FROM, from)]),
                &leader,
                vec![format!("metadata.annotations[{INJECT_CA_FROM}]")],
            ),
        ];
        for (name, actual, want, drifted) in cases {
            assert_eq!(drift(&actual, want), drifted, "{name}");
            let fixed = repaired(&actual, want);
            assert!(drift(&fixed, want).is_empty(), "{name}: repaired");
            assert_eq!(
                annotation(&fixed, "someone/else").as_deref(),
                Some("kept"),
                "{name}"
            );
        }
    }

    #[test]
    fn cert_manager_copy_of_live_bundle_is_not_drift() {
        let s = cert_manager_settings();
        // What cainjector wrote; the leader builds its wanted object from it.
        let live = desired(&s, b"INJECTED", None);
        let want = desired(&s, &live_ca_bundle(&live).unwrap_or_default(), None);
        assert!(drift(&live, &want).is_empty());
        let mut timeout_changed = live.clone();
        if let Some(h) = timeout_changed
            .webhooks
            .as_mut()
            .and_then(|w| w.first_mut())
        {
            h.timeout_seconds = Some(30);
        }
        let fixed = repaired(&timeout_changed, &want);
        assert_eq!(
            drift(&timeout_changed, &want),
            vec![format!("{NODES_WEBHOOK}.timeoutSeconds")]
        );
        assert_eq!(live_ca_bundle(&fixed), Some(b"INJECTED".to_vec()));
        let v_live = desired_validating(&s, b"INJECTED").unwrap();
        let v_want = desired_validating(&s, &live_ca_bundle(&v_live).unwrap_or_default()).unwrap();
        assert!(validating_drift(&v_live, &v_want).is_empty());
    }
}
