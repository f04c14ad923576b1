//! The node rule for static policies, compiled to CEL: one `admissionregistration.k8s.io/v1`
//! MutatingAdmissionPolicy (a JSONPatch mutation) and its binding, which the API server runs
//! in-process instead of calling the webhook. Pure: the input is the `PolicySet`, the output
//! two JSON objects.
//!
//! What the compiled policy does is `node::decide` for the nodes whose winning policy is
//! static (no `spec.usage`, `spec.requestCap` or `spec.rollout`), step by step (the CEL
//! variable in brackets):
//! - **Writers** (`takes`): registrations, kubelets' status writes and the leader's nudges, as
//!   the node webhook's match condition; any other write gets no patch.
//! - **Policy** (`choice`): `overcommit.dev/disabled=true` opts out; else the first policy, in
//!   `PolicySet` order (priority, then name), with ratios whose selector matches. A node whose
//!   winner needs outside data (usage, cap) gets `!`: the compiled policy leaves it alone (the
//!   webhook's).
//! - **Previous record** (`prev*`): the annotations of the object if it carries either one,
//!   else the stored object's; both must be there. The JSON format of earlier versions is
//!   turned into the listed one by text replacement (it was written compactly by serde_json).
//! - **Raw value** (`prN`, `faN`, `rawN` per resource N some static policy inflates, known at
//!   compile time: straight-line expressions, no walk over the allocatable; `restored` for any
//!   other resource the record holds): the value last written is recomputed (raw x recorded
//!   ratio, or the recorded usage value); if the incoming allocatable equals it by value
//!   (`quantity(..).compareTo`) the raw value is the recorded text, else the incoming text. An
//!   incoming text equal to the recorded one (a kubelet's write) is the raw value without
//!   recomputing (every variable is evaluated at most once per request, and only when read).
//! - **New allocatable** (`wantN`) = floor(raw x ratio) in millicores (cpu) or units, by integer
//!   arithmetic (see `inflate`), printed as `quantity::Quantity` prints it (`format_decimal`,
//!   `format_binary`); the raw text where the result equals it.
//! - **Refusal** (`refuse`): a value above capacity that is not what was last written is
//!   left alone (no patch at all), as the webhook fails open.
//! - **Annotations**: written in the listed format when a policy applies, removed otherwise.
//! - **Quiet heartbeats** (`beats`; `node::heartbeat`), on a status update of a node a policy
//!   inflates, unless the refresh period is zero: per incoming condition, the stored condition
//!   of its type (the first) with the same status, reason, message and lastTransitionTime (an
//!   absent field equals only an absent one) and a heartbeat that is not the incoming one but
//!   less than the refresh period from it, either way, gives its heartbeat back
//!   (`add /status/conditions/INDEX/lastHeartbeatTime`); `''` otherwise.
//!
//! Where CEL does not follow the Rust rule exactly (README.md, `compile-inprocess --help`): a
//! raw value below the unit (sub-millicore cpu, fractional bytes; no kubelet reports one) is
//! floored before the ratio, not after; an unreadable record is read as far as it goes (an
//! entry without `=` is skipped; a value that is not a quantity or a ratio, where it is read,
//! stops the evaluation, and the API server admits the write unchanged, `failurePolicy:
//! Ignore`) where the Rust rule ignores the whole record. Quiet heartbeats: admission CEL has no clock, so a stored
//! heartbeat's age is taken from the incoming condition's own lastHeartbeatTime (the time the
//! kubelet wrote it, its clock) instead of the time of the review; a condition sent without a
//! heartbeat keeps nothing (no kubelet sends one).

use std::time::Duration;

use serde_json::{Value, json};

use crate::policy::Requirement;
use crate::policy::{CompiledPolicy, DISABLED_LABEL, NodeChoice, PolicySet};
use crate::quantity::Ratio;

/// Name of the compiled MutatingAdmissionPolicy and of its binding.
pub const POLICY_NAME: &str = "nodes.overcommit.dev";
/// Name of the match condition of the node webhook.
pub const MATCH_CONDITION_NAME: &str = "node-registration-kubelet-or-nudge";
/// Name of the node webhook's second match condition while the compiled policy is in force
/// (`Compiled::webhook_condition`): the API server then calls the webhook only for the nodes the
/// compiled policy leaves to it.
pub const WEBHOOK_CONDITION_NAME: &str = "served-by-webhook";
/// `Compiled::webhook_condition` when the compiled policy serves every node: the leader then
/// leaves the node webhook out of the configuration.
pub const NO_NODE_LEFT: &str = "false";

/// Which node writes the node webhook and the compiled policy take: registrations, status writes
/// by kubelets (the group `system:nodes`), and the leader's nudges, the status writes of the
/// user `nudger` (the ServiceAccount's, `system:serviceaccount:NS:NAME`), and no other user's.
/// The webhook's match condition; in the compiled policy the variable `takes`, not a match
/// condition: the API server converts the whole node and old node for each CEL evaluation
/// (match conditions apart from the mutation), and the writes it leaves out are rare.
pub fn match_condition(nudger: &str) -> String {
    format!(
        "request.operation == 'CREATE' || (has(request.userInfo.groups) && 'system:nodes' in \
         request.userInfo.groups) || request.userInfo.username == {}",
        lit(nudger)
    )
}

const RAW_KEY: &str = crate::node::RAW_ALLOCATABLE_ANNOTATION;
const APPLIED_KEY: &str = crate::node::APPLIED_ANNOTATION;
/// `choice` of a node whose winning policy stays on the webhook.
const WEBHOOK_CHOICE: &str = "!";

/// The compiled objects, and which policies each path serves.
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    pub policy: Value,
    pub binding: Value,
    /// Policies the compiled policy applies (static), highest priority first.
    pub in_process: Vec<String>,
    /// Policies left to the webhook (usage, cap, or names the listed format cannot hold).
    pub webhook: Vec<String>,
    /// A CEL match condition true exactly for the node writes the compiled policy leaves to the
    /// webhook (the complement of what it serves: `serves`); `false` when it serves every node.
    pub webhook_condition: String,
}

/// Whether a policy's node rule needs nothing but the node: no usage, no cap, no staged
/// rollout (`spec.rollout`: the compiled policy cannot pace a change, the webhook does), and
/// names and ratios the listed annotation format holds (the API server and the validation
/// accept no others).
pub fn is_static(policy: &CompiledPolicy) -> bool {
    let listable = |text: &str| {
        !text.is_empty()
            && !text.starts_with('{')
            && !text
                .bytes()
                .any(|b| matches!(b, b',' | b'=' | b';' | b'\'' | b'\\') || b <= b' ')
    };
    policy.usage.is_none()
        && policy.cap.is_none()
        && !policy.staged
        && listable(&policy.name)
        && policy
            .ratios
            .iter()
            .all(|(resource, (text, _))| listable(resource) && listable(text))
}

/// Whether the compiled policy, while in force, serves a node of this choice: every node but
/// those whose winning policy stays on the webhook (its choice `!`). Opted-out nodes and
/// nodes no policy selects are its too (it removes the annotations).
pub fn serves(choice: &NodeChoice<'_>) -> bool {
    match choice {
        NodeChoice::Policy(policy) => is_static(policy),
        NodeChoice::NoPolicy | NodeChoice::OptedOut => true,
    }
}

/// The `overcommit.dev/applied` text the node rule writes under a static policy.
pub fn applied_text(policy: &CompiledPolicy) -> String {
    let ratios: Vec<String> = policy
        .ratios
        .iter()
        .map(|(resource, (text, _))| format!("{resource}={text}"))
        .collect();
    let generation = policy
        .generation
        .map(|g| format!(";generation={g}"))
        .unwrap_or_default();
    format!(
        "policy={};ratios={}{generation}",
        policy.name,
        ratios.join(",")
    )
}

/// Compile the policy set; `heartbeat_refresh` is `serve --heartbeat-refresh` (zero, or below a
/// millisecond as the webhook reads it: no quiet heartbeats); `nudger` the user whose status
/// writes are the leader's nudges (`match_condition`).
pub fn compile(policies: &PolicySet, heartbeat_refresh: Duration, nudger: &str) -> Compiled {
    let mut in_process = Vec::new();
    let mut webhook = Vec::new();
    // (selector requirements, choice) in the order `for_node` tries them.
    let mut chain: Vec<(&[Requirement], &str)> = Vec::new();
    let mut ratios = vec![
        (lit(""), "{}".to_string()),
        (lit(WEBHOOK_CHOICE), "{}".into()),
    ];
    // Per static policy, the resources it inflates (for the raw record), and their union.
    let mut keys: Vec<(&str, Vec<&str>)> = Vec::new();
    let mut union = std::collections::BTreeSet::new();
    let mut applied = vec![(lit(""), lit("")), (lit(WEBHOOK_CHOICE), lit(""))];
    for policy in policies.policies() {
        // `for_node` skips a policy with neither ratios nor usage.
        if policy.ratios.is_empty() && policy.usage.is_none() {
            continue;
        }
        let choice = if is_static(policy) {
            in_process.push(policy.name.clone());
            let inflated: Vec<(&String, &Ratio)> = policy
                .ratios
                .iter()
                .filter(|(_, (_, ratio))| !ratio.is_one())
                .map(|(resource, (_, ratio))| (resource, ratio))
                .collect();
            let map: Vec<String> = inflated
                .iter()
                .map(|(r, ratio)| format!("{}: {}", lit(r), ratio.millionths()))
                .collect();
            ratios.push((lit(&policy.name), format!("{{{}}}", map.join(", "))));
            let list: Vec<&str> = inflated.iter().map(|(r, _)| r.as_str()).collect();
            union.extend(list.iter().copied());
            keys.push((&policy.name, list));
            applied.push((lit(&policy.name), lit(&applied_text(policy))));
            policy.name.as_str()
        } else {
            webhook.push(policy.name.clone());
            WEBHOOK_CHOICE
        };
        chain.push((&policy.selector.requirements, choice));
    }
    let choice = chain
        .iter()
        .rev()
        .fold(lit(""), |rest, (requirements, choice)| {
            let selector = selector(requirements, "variables.labels");
            format!("({selector} ? {} : {rest})", lit(choice))
        });
    let resources: Vec<&str> = union.into_iter().collect();
    let variables = rule_variables(&choice, &ratios, &applied, nudger)
        .into_iter()
        .chain(record_variables(&resources, &keys))
        .chain(beats(heartbeat_refresh).map(|expression| ("beats".to_string(), expression)));
    let variables: Vec<Value> = variables
        .map(|(name, expression)| json!({"name": name, "expression": expression}))
        .collect();
    let heartbeats = variables.iter().any(|v| v["name"] == "beats");
    let patch = patch_expression(&resources, heartbeats);
    let (policy, binding) = objects(variables, patch);
    Compiled {
        policy,
        binding,
        in_process,
        webhook,
        webhook_condition: webhook_condition(&chain),
    }
}

/// The MutatingAdmissionPolicy of `variables` and the JSONPatch `patch`, and its binding.
fn objects(variables: Vec<Value>, patch: String) -> (Value, Value) {
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/managed-by": "kube-overcommit"}},
        "spec": {
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConstraints": node_writes(),
            "variables": variables,
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/managed-by": "kube-overcommit"}},
        // The binding's matchResources bound what the policy can ever act on, whatever its
        // matchConstraints say: the binding is installed by the operator and the
        // ServiceAccount cannot write it (SECURITY.md).
        "spec": {"policyName": POLICY_NAME, "matchResources": node_writes()},
    });
    (policy, binding)
}

/// The policy's CEL variables, `choice` the policy chain and `ratios`, `applied` the
/// per-policy tables (policy literal, CEL value), `takes` the writers (`match_condition` of
/// `nudger`); the record's (`record_variables`) and `beats` (when on) come after them.
fn rule_variables(
    choice: &str,
    ratios: &[(String, String)],
    applied: &[(String, String)],
    nudger: &str,
) -> Vec<(String, String)> {
    let table = |entries: &[(String, String)]| {
        let body: Vec<String> = entries.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        format!("{{{}}}[variables.choice]", body.join(", "))
    };
    [
        (
            "labels",
            "has(object.metadata.labels) ? object.metadata.labels : {}".to_string(),
        ),
        (
            "choice",
            format!(
                "{d} in variables.labels && variables.labels[{d}] == 'true' ? '' : {choice}",
                d = lit(DISABLED_LABEL)
            ),
        ),
        ("ratios", table(ratios)),
        ("applied", table(applied)),
        (
            "alloc",
            "has(object.status) && has(object.status.allocatable) ? object.status.allocatable : {}"
                .into(),
        ),
        (
            "capacity",
            "has(object.status) && has(object.status.capacity) ? object.status.capacity : {}"
                .into(),
        ),
        ("takes", match_condition(nudger)),
    ]
    .into_iter()
    .map(|(name, expression)| (name.to_string(), expression))
    .collect()
}

/// The variables that read the previous record and recompute each resource: per resource of
/// `resources` (those some static policy inflates, sorted) straight-line variables
/// (`resource_variables`), `restored` for any other the record holds (an earlier policy's, or
/// the webhook's: rare), then `refuse` and `rawRecord` (per policy, its resources in `keys`).
fn record_variables(resources: &[&str], keys: &[(&str, Vec<&str>)]) -> Vec<(String, String)> {
    let mut variables: Vec<(String, String)> = [
        ("prevAnn", prev_annotations()),
        (
            "prevOK",
            format!(
                "{} in variables.prevAnn && {} in variables.prevAnn",
                lit(RAW_KEY),
                lit(APPLIED_KEY)
            ),
        ),
        (
            "prevRaw",
            format!(
                "variables.prevOK ? [{}].map(t, t == '' ? [] : t.split(','))[0] : []",
                from_json(&format!("variables.prevAnn[{}]", lit(RAW_KEY)))
            ),
        ),
        (
            "prevSections",
            format!(
                "variables.prevOK ? {}.split(';') : []",
                from_json(&format!("variables.prevAnn[{}]", lit(APPLIED_KEY)))
            ),
        ),
        (
            "prevRatios",
            "variables.prevSections.size() > 1 && variables.prevSections[1] != 'ratios=' ? \
             variables.prevSections[1].substring(7).split(',') : []"
                .into(),
        ),
        (
            // The last section, after an optional `generation=N`.
            "prevUsage",
            "variables.prevSections.size() > 2 && \
             variables.prevSections[variables.prevSections.size() - 1].startsWith('usage=') && \
             variables.prevSections[variables.prevSections.size() - 1] != 'usage=' ? \
             variables.prevSections[variables.prevSections.size() - 1].substring(6).split(',') : []"
                .into(),
        ),
    ]
    .into_iter()
    .map(|(name, expression)| (name.to_string(), expression))
    .collect();
    for (i, resource) in resources.iter().enumerate() {
        variables.extend(resource_variables(i, resource));
    }
    let refuse: Vec<String> = resources
        .iter()
        .enumerate()
        .map(|(i, r)| {
            format!(
                "({r} in variables.ratios && {r} in variables.alloc && {r} in variables.capacity && \
                 isQuantity(variables.capacity[{r}]) && \
                 quantity(variables.alloc[{r}]).isGreaterThan(quantity(variables.capacity[{r}])) && \
                 !variables.fa{i})",
                r = lit(r)
            )
        })
        .collect();
    let refuse = if refuse.is_empty() {
        "false".to_string()
    } else {
        refuse.join(" || ")
    };
    variables.push(("restored".into(), restored(resources)));
    variables.push(("refuse".into(), refuse));
    variables.push(("rawRecord".into(), raw_record(resources, keys)));
    variables
}

/// Resource `r`'s variables (`i` its index in the union), straight-line: `prI` its recorded raw
/// text (`''`: none); `faI` whether the incoming value is the one last written (by value),
/// needed only where the incoming text is not the recorded one (a kubelet sends its raw value,
/// the recorded text) or above capacity; `rawI` the raw value; `wantI` the new allocatable.
/// Read only where `r` is in the incoming allocatable.
fn resource_variables(i: usize, r: &str) -> [(String, String); 4] {
    let scale = if r == "cpu" { "3" } else { "0" };
    let inc = format!("string(variables.alloc[{}])", lit(r));
    let pr = format!("variables.pr{i}");
    let usage = lookup_const("variables.prevUsage", r);
    let ratio = lookup_const("variables.prevRatios", r);
    let written = previously_written(&pr, &usage, &ratio, scale);
    let raw = format!("variables.raw{i}");
    [
        (format!("pr{i}"), lookup_const("variables.prevRaw", r)),
        (
            format!("fa{i}"),
            format!("{pr} != '' && quantity({written}).compareTo(quantity({inc})) == 0"),
        ),
        (
            format!("raw{i}"),
            format!("{pr} != '' && {pr} != {inc} && variables.fa{i} ? {pr} : {inc}"),
        ),
        (
            format!("want{i}"),
            format!(
                "{r} in variables.ratios ? {} : {raw}",
                inflate_in(&raw, &format!("variables.ratios[{}]", lit(r)), scale),
                r = lit(r)
            ),
        ),
    ]
}

/// `restored`: per resource outside `resources` that the record holds, `{r, inc, desired}`,
/// the raw value put back where the incoming one is the one last written. The whole walk only
/// where the record holds such a resource.
fn restored(resources: &[&str]) -> String {
    let union: Vec<String> = resources.iter().map(|r| lit(r)).collect();
    let union = format!("[{}]", union.join(", "));
    let recorded = lookup("variables.prevRaw", "r");
    let written = previously_written(
        "pr",
        &lookup("variables.prevUsage", "r"),
        &lookup("variables.prevRatios", "r"),
        "s",
    );
    format!(
        "variables.prevRaw.exists(p, !(p.split('=')[0] in {union})) ? \
         variables.alloc.filter(r, !(r in {union}) && {recorded} != '').map(r, [{recorded}]\
         .map(pr, [r == 'cpu' ? 3 : 0].map(s, {{'r': string(r), 'inc': string(variables.alloc[r]), \
         'desired': quantity({written}).compareTo(quantity(variables.alloc[r])) == 0 ? pr : \
         string(variables.alloc[r])}})[0])[0]) : []"
    )
}

/// `rawRecord`: the raw values of the resources the winning policy inflates that the node
/// has, `r=raw` in the policy's (sorted) order; `''` for no policy.
fn raw_record(resources: &[&str], keys: &[(&str, Vec<&str>)]) -> String {
    keys.iter()
        .rev()
        .fold("''".to_string(), |rest, (name, list)| {
            let items: Vec<String> = list
                .iter()
                .map(|r| {
                    let i = resources.iter().position(|u| u == r).unwrap_or_default();
                    format!(
                        "({} in variables.alloc ? {} + variables.raw{i} : '')",
                        lit(r),
                        lit(&format!("{r}="))
                    )
                })
                .collect();
            let record = match items.len() {
                0 => "''".to_string(),
                _ => format!("[{}].filter(t, t != '').join(',')", items.join(", ")),
            };
            format!("(variables.choice == {} ? {record} : {rest})", lit(name))
        })
}

/// The node webhook's match condition while the compiled policy is in force: the node is not
/// opted out and its winning policy is one `compile` leaves to the webhook (`choice` `!`).
/// Webhook match conditions have no variables: the labels are bound once by a one-element
/// `exists`. Static policies after the last webhook one are dropped (they, like no policy,
/// give false).
fn webhook_condition(chain: &[(&[Requirement], &str)]) -> String {
    let last = chain
        .iter()
        .rposition(|(_, choice)| *choice == WEBHOOK_CHOICE);
    let Some(last) = last else {
        return NO_NODE_LEFT.into();
    };
    let choice =
        chain[..=last]
            .iter()
            .rev()
            .fold("false".to_string(), |rest, (requirements, choice)| {
                let selector = selector(requirements, "labels");
                format!("({selector} ? {} : {rest})", *choice == WEBHOOK_CHOICE)
            });
    format!(
        "[has(object.metadata.labels) ? object.metadata.labels : {{}}].exists(labels, \
         !({d} in labels && labels[{d}] == 'true') && {choice})",
        d = lit(DISABLED_LABEL)
    )
}

/// What the compiled policy acts on: node registrations and node status writes.
fn node_writes() -> Value {
    json!({
        "matchPolicy": "Equivalent",
        "resourceRules": [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes/status"], "scope": "Cluster"},
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["nodes"], "scope": "Cluster"},
        ],
    })
}

/// A CEL string literal.
fn lit(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A selector's requirements over the label map `labels` (none: every node).
fn selector(requirements: &[Requirement], labels: &str) -> String {
    if requirements.is_empty() {
        return "true".into();
    }
    let values = |values: &std::collections::BTreeSet<String>| {
        let list: Vec<String> = values.iter().map(|v| lit(v)).collect();
        format!("[{}]", list.join(", "))
    };
    let parts: Vec<String> = requirements
        .iter()
        .map(|r| match r {
            Requirement::In(key, v) => format!(
                "({k} in {labels} && {labels}[{k}] in {v})",
                k = lit(key),
                v = values(v)
            ),
            Requirement::NotIn(key, v) => format!(
                "!({k} in {labels} && {labels}[{k}] in {v})",
                k = lit(key),
                v = values(v)
            ),
            Requirement::Exists(key) => format!("({} in {labels})", lit(key)),
            Requirement::DoesNotExist(key) => format!("!({} in {labels})", lit(key)),
        })
        .collect();
    format!("({})", parts.join(" && "))
}

/// The annotations the record is read from: the object's if it carries either, else the
/// stored object's (`oldObject`, null on CREATE).
fn prev_annotations() -> String {
    let carries = |object: &str| {
        format!(
            "has({object}.metadata.annotations) && ({raw} in {object}.metadata.annotations || \
             {applied} in {object}.metadata.annotations)",
            raw = lit(RAW_KEY),
            applied = lit(APPLIED_KEY)
        )
    };
    format!(
        "{} ? object.metadata.annotations : (oldObject != null && {} ? \
         oldObject.metadata.annotations : {{}})",
        carries("object"),
        carries("oldObject")
    )
}

/// An annotation text in the listed format: the JSON of earlier versions
/// (`{"cpu":"4"}`, `{"policy":"p","ratios":{"cpu":"2"},"usage":{...}}`) rewritten by text
/// replacement into `cpu=4` and `policy=p;ratios=cpu=2;usage=...`.
fn from_json(text: &str) -> String {
    format!(
        "[{text}].map(t, t.trim().startsWith('{{') ? t.trim().replace('{{\"policy\":\"', 'policy=')\
         .replace('\",\"ratios\":{{', ';ratios=').replace('}},\"usage\":{{', ';usage=')\
         .replace('\":\"', '=').replace('{{', '').replace('}}', '').replace('\"', '') : t)[0]"
    )
}

/// The value for `resource` in a list of `name=value` texts (`''`: none).
fn lookup(list: &str, resource: &str) -> String {
    format!(
        "({list}.exists(p, p.startsWith({resource} + '=')) ? \
         {list}.filter(p, p.startsWith({resource} + '='))[0].substring(size({resource}) + 1) : '')"
    )
}

/// Ratio text (`1.5`) -> millionths (1500000).
fn millionths(text: &str) -> String {
    format!(
        "[{text}.split('.')].map(ps, int(ps[0]) * 1000000 + \
         (ps.size() > 1 ? int((ps[1] + '000000').substring(0, 6)) : 0))[0]"
    )
}

/// floor(quantity text `raw` x 10^s) as an int: exact for whole quantities (`asInteger`);
/// otherwise a float estimate checked and corrected by exact comparisons.
fn units(raw: &str, s: &str) -> String {
    format!(
        "[quantity({raw})].map(q, q.isInteger() ? q.asInteger() * ({s} == 3 ? 1000 : 1) : \
         [int(q.asApproximateFloat() * ({s} == 3 ? 1000.0 : 1.0))].map(c, [c + 1, c, c - 1]\
         .filter(cm, cm >= 0 && quantity(string(cm) + ({s} == 3 ? 'm' : '')).compareTo(q) <= 0)[0])[0])[0]"
    )
}

/// `w` (an int of units of 10^-s) printed as `Quantity` prints a decimal quantity: the largest
/// suffix keeping the number whole (23835m, 24, 1500, 2k).
fn format_decimal(w: &str, s: &str) -> String {
    let pows: Vec<String> = (1..=18).map(|n| 10u64.pow(n).to_string()).collect();
    let all: Vec<String> = (0..=18).map(|n| 10u64.pow(n).to_string()).collect();
    format!(
        "({w} == 0 ? '0' : [[{pows}].filter(p, {w} % p == 0).size()].map(z, [z - {s}].map(e, \
         [((e + 3) / 3) * 3 - 3].map(se, string({w} / [{all}][z]) + ['', '0', '00'][e - se] + \
         {{-3: 'm', 0: '', 3: 'k', 6: 'M', 9: 'G', 12: 'T', 15: 'P', 18: 'E'}}[se])[0])[0])[0])",
        pows = pows.join(", "),
        all = all.join(", ")
    )
}

/// `w` (whole units, at least 1024) with the largest binary suffix dividing it.
fn format_binary(w: &str) -> String {
    let pows: Vec<String> = (1..=6).map(|n| (1u64 << (10 * n)).to_string()).collect();
    let all: Vec<String> = (0..=6).map(|n| (1u64 << (10 * n)).to_string()).collect();
    format!(
        "[[{pows}].filter(p, {w} % p == 0).size()].map(b, string({w} / [{all}][b]) + \
         ['', 'Ki', 'Mi', 'Gi', 'Ti', 'Pi', 'Ei'][b])[0]",
        pows = pows.join(", "),
        all = all.join(", ")
    )
}

/// floor(`raw` x ratio), as text: `raw` a CEL expression of a string, `ratio` of an int of
/// millionths, `s` of the resource's scale (3 for cpu, counted in millicores; 0 else). Integer
/// arithmetic only: u x whole + floor(u x frac / 10^6), the second split at 10^6 so that no
/// product leaves int64 before the result does (an overflow is an evaluation error: the write
/// goes through unchanged).
fn inflate_in(raw: &str, ratio: &str, s: &str) -> String {
    let units = units(raw, s);
    let decimal = format_decimal("w", s);
    let binary = format_binary("w");
    format!(
        "[{ratio}].map(rm, [{units}].map(u, \
         u * (rm / 1000000) + (u / 1000000) * (rm % 1000000) + \
         (u % 1000000) * (rm % 1000000) / 1000000)[0]).map(w, \
         [{s} == 0 && {raw}.matches('[KMGTPE]i$') && w >= 1024 ? {binary} : {decimal}]\
         .map(t, quantity(t).compareTo(quantity({raw})) == 0 ? {raw} : t)[0])[0]"
    )
}

/// The value last written for a resource whose recorded raw text is `pr`: the recorded usage
/// value (`usage`, a lookup), else `pr` x the recorded ratio (`ratio`), `s` the scale.
fn previously_written(pr: &str, usage: &str, ratio: &str, s: &str) -> String {
    format!(
        "[{usage}].map(pu, pu != '' ? pu : [{ratio}].map(pt, pt == '' ? {pr} : \
         [{millionths}].map(pm, pm == 1000000 ? {pr} : {inflated})[0])[0])[0]",
        millionths = millionths("pt"),
        inflated = inflate_in(pr, "pm", s),
    )
}

/// The value for the constant `resource` in a list of `name=value` texts (`''`: none).
fn lookup_const(list: &str, resource: &str) -> String {
    format!(
        "[{list}.filter(p, p.startsWith({}))].map(m, m.size() > 0 ? m[0].substring({}) : '')[0]",
        lit(&format!("{resource}=")),
        resource.chars().count() + 1
    )
}

/// The longest refresh period compiled: beyond it a CEL duration may not hold the difference
/// of two times (+-290 years); no heartbeat is that old.
const MAX_REFRESH: Duration = Duration::from_secs(100 * 365 * 86_400);

/// `beats`: per incoming condition (by index) the stored heartbeat to put back, or `''`; None
/// when the refresh period is off (zero, or below the millisecond the webhook counts in).
/// Cheapest test first: a heartbeat sent as stored (a writer other than the kubelet) needs no
/// lookup of the other fields and no time parsed. Every field is tested for presence and type
/// first, so no node makes the expression fail (which would drop the whole mutation); a time
/// present is an RFC 3339 text `timestamp` reads, as the API server holds no other.
fn beats(refresh: Duration) -> Option<String> {
    let ms = refresh.min(MAX_REFRESH).as_millis();
    if ms == 0 {
        return None;
    }
    let same = ["status", "reason", "message", "lastTransitionTime"]
        .iter()
        .map(|field| format!("c.?{field} == o.?{field}"))
        .collect::<Vec<_>>()
        .join(" && ");
    Some(format!(
        "variables.choice != '' && oldObject != null && has(object.status) && \
         has(object.status.conditions) && has(oldObject.status) && \
         has(oldObject.status.conditions) ? object.status.conditions.map(c, \
         has(c.lastHeartbeatTime) && type(c.lastHeartbeatTime) == string && has(c.type) ? \
         [oldObject.status.conditions.filter(o, has(o.type) && o.type == c.type)].map(m, \
         m.size() > 0 && has(m[0].lastHeartbeatTime) && type(m[0].lastHeartbeatTime) == string && \
         m[0].lastHeartbeatTime != c.lastHeartbeatTime ? [m[0]].map(o, {same} && \
         [timestamp(c.lastHeartbeatTime) - timestamp(o.lastHeartbeatTime)].map(d, \
         d < duration('{ms}ms') && d > duration('-{ms}ms'))[0] ? o.lastHeartbeatTime : '')[0] : '')[0] \
         : '') : []"
    ))
}

/// The JSONPatch: allocatable where it differs by value (per resource of `resources`, then
/// `restored`), then the annotations, then (with `heartbeats`) the stored heartbeats put back.
fn patch_expression(resources: &[&str], heartbeats: bool) -> String {
    let beats = if heartbeats {
        " + variables.beats.transformList(i, t, t != '', JSONPatch{op: 'add', path: \
         '/status/conditions/' + string(i) + '/lastHeartbeatTime', value: t})"
    } else {
        ""
    };
    let allocatable: String = resources
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let pointer = r.replace('~', "~0").replace('/', "~1");
            format!(
                "({r} in variables.alloc && variables.want{i} != variables.alloc[{r}] && \
                 quantity(variables.want{i}).compareTo(quantity(variables.alloc[{r}])) != 0 ? \
                 [JSONPatch{{op: 'replace', path: {path}, value: variables.want{i}}}] : []) + ",
                r = lit(r),
                path = lit(&format!("/status/allocatable/{pointer}"))
            )
        })
        .collect();
    let path = |key: &str| format!("'/metadata/annotations/' + jsonpatch.escapeKey({key})");
    let keys = format!("[{}, {}]", lit(RAW_KEY), lit(APPLIED_KEY));
    format!(
        "!variables.takes || variables.choice == {webhook} || variables.refuse ? [] : {allocatable}\
         variables.restored.filter(l, quantity(l.desired).compareTo(quantity(l.inc)) != 0)\
         .map(l, JSONPatch{{op: 'replace', path: '/status/allocatable/' + jsonpatch.escapeKey(l.r), value: l.desired}}) + \
         (variables.choice == '' ? \
         (has(object.metadata.annotations) ? {keys}.filter(k, k in object.metadata.annotations)\
         .map(k, JSONPatch{{op: 'remove', path: {path_k}}}) : []) : \
         [{{{raw}: variables.rawRecord, {applied}: variables.applied}}].map(want, \
         has(object.metadata.annotations) ? {keys}.filter(k, !(k in object.metadata.annotations) || \
         object.metadata.annotations[k] != want[k]).map(k, JSONPatch{{op: 'add', path: {path_k}, value: want[k]}}) : \
         [JSONPatch{{op: 'add', path: '/metadata/annotations', value: want}}])[0]){beats}",
        webhook = lit(WEBHOOK_CHOICE),
        raw = lit(RAW_KEY),
        applied = lit(APPLIED_KEY),
        path_k = path("k"),
    )
}

#[cfg(test)]
mod tests;
