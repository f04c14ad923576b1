//! The checks a policy must pass, in code: the same rules the CRD schema states (see
//! `schema.rs`), applied to policies from a file, and to CRD objects as a second line.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::selector::{Requirement, Selector};
use super::usage::CompiledUsage;
use super::{
    CAP_PERCENT_RANGE, CAP_RESOURCES, CompiledCap, CompiledPodDefaults, CompiledPolicy,
    OvercommitPolicy, POD_DEFAULT_RESOURCES, PRIORITY_RANGE, PodDefaults, PolicyError,
};
use crate::quantity::{Quantity, Ratio};

/// Resource names without a domain that may carry a node ratio.
pub(super) const STANDARD_NODE_RESOURCES: [&str; 4] =
    ["cpu", "memory", "ephemeral-storage", "pods"];

/// Most node ratios a policy may list (also the CRD's maxProperties).
pub(super) const MAX_NODE_RATIOS: usize = 32;

pub(super) fn compile(policy: &OvercommitPolicy) -> Result<CompiledPolicy, PolicyError> {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let invalid = |reason: String| PolicyError::Invalid {
        name: if name.is_empty() {
            "<unnamed>".to_string()
        } else {
            name.clone()
        },
        reason,
    };
    if name.is_empty() {
        return Err(invalid("metadata.name is required".into()));
    }
    if !is_dns_subdomain(&name) {
        return Err(invalid(format!(
            "metadata.name {name:?} must be a DNS subdomain (lowercase letters, digits, '-' and '.')"
        )));
    }
    let spec = &policy.spec;
    if !PRIORITY_RANGE.contains(&spec.priority) {
        return Err(invalid(format!(
            "spec.priority {} must be between {} and {}",
            spec.priority,
            PRIORITY_RANGE.start(),
            PRIORITY_RANGE.end()
        )));
    }
    let selector = match &spec.node_selector {
        Some(selector) => compile_selector(selector).map_err(invalid)?,
        None => Selector::default(),
    };
    let ratios = compile_ratios(&spec.node_ratios).map_err(&invalid)?;
    let pod_defaults = match &spec.pod_defaults {
        Some(defaults) => Some(compile_pod_defaults(defaults).map_err(&invalid)?),
        None => None,
    };
    let usage = match &spec.usage {
        Some(usage) => Some(super::usage::compile(usage, &ratios).map_err(invalid)?),
        None => None,
    };
    let cap = compile_cap(policy, &ratios, usage.as_ref()).map_err(&invalid)?;
    let pressure = match &spec.pressure {
        Some(_) if spec.node_ratios.is_empty() && usage.is_none() => {
            return Err(invalid(
                "spec.pressure needs spec.nodeRatios or spec.usage (a policy with neither \
                 applies to no node)"
                    .into(),
            ));
        }
        Some(pressure) => Some(super::pressure::compile(pressure).map_err(invalid)?),
        None => None,
    };
    let eviction = match &spec.eviction {
        Some(eviction) => Some(
            super::eviction::compile(eviction, !ratios.is_empty() || usage.is_some())
                .map_err(invalid)?,
        ),
        None => None,
    };
    Ok(CompiledPolicy {
        name,
        priority: spec.priority,
        selector,
        ratios,
        pod_defaults,
        usage,
        cap,
        pressure,
        eviction,
        generation: policy.metadata.generation,
        staged: spec.rollout.is_some(),
        applied_listed: Default::default(),
    })
}

/// `spec.nodeRatios`: resource -> (text, ratio).
fn compile_ratios(
    node_ratios: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, (String, Ratio)>, String> {
    if node_ratios.len() > MAX_NODE_RATIOS {
        return Err(format!(
            "spec.nodeRatios lists more than {MAX_NODE_RATIOS} resources"
        ));
    }
    let mut ratios = BTreeMap::new();
    for (resource, text) in node_ratios {
        check_node_resource(resource).map_err(|r| format!("spec.nodeRatios: {r}"))?;
        let ratio = Ratio::parse(text).map_err(|e| format!("spec.nodeRatios[{resource}]: {e}"))?;
        ratios.insert(resource.clone(), (text.clone(), ratio));
    }
    Ok(ratios)
}

/// `spec.podDefaults`: requests above zero and in range, percentages 1 to 100.
fn compile_pod_defaults(defaults: &PodDefaults) -> Result<CompiledPodDefaults, String> {
    let mut requests = BTreeMap::new();
    for (resource, text) in &defaults.requests {
        check_pod_resource(resource).map_err(|r| format!("spec.podDefaults.requests: {r}"))?;
        let quantity = Quantity::parse(text)
            .map_err(|e| format!("spec.podDefaults.requests[{resource}]: {e}"))?;
        if quantity.is_zero() {
            return Err(format!(
                "spec.podDefaults.requests[{resource}] must be greater than zero"
            ));
        }
        let scale = if resource == "cpu" { 3 } else { 0 };
        if !quantity
            .to_units_floor(scale)
            .is_ok_and(|units| units <= crate::quantity::MAX_UNITS)
        {
            return Err(format!(
                "spec.podDefaults.requests[{resource}] {text} is out of range"
            ));
        }
        requests.insert(resource.clone(), quantity);
    }
    for (resource, percent) in &defaults.request_to_limit_percent {
        check_pod_resource(resource)
            .map_err(|r| format!("spec.podDefaults.requestToLimitPercent: {r}"))?;
        if !(1..=100).contains(percent) {
            return Err(format!(
                "spec.podDefaults.requestToLimitPercent[{resource}] is {percent}, must be 1 to 100"
            ));
        }
    }
    Ok(CompiledPodDefaults {
        requests,
        request_to_limit_percent: defaults.request_to_limit_percent.clone(),
    })
}

/// `spec.requestCap` and `spec.capMode`. A cap below the policy's ratio for the same resource
/// is refused: the scheduler would be shown room that the cap then refuses.
fn compile_cap(
    policy: &OvercommitPolicy,
    ratios: &BTreeMap<String, (String, Ratio)>,
    usage: Option<&CompiledUsage>,
) -> Result<Option<CompiledCap>, String> {
    let spec = &policy.spec;
    if spec.request_cap.is_empty() {
        if spec.cap_mode.is_some() {
            return Err("spec.capMode needs spec.requestCap".into());
        }
        return Ok(None);
    }
    if spec.node_ratios.is_empty() && usage.is_none() {
        return Err(
            "spec.requestCap needs spec.nodeRatios or spec.usage (a policy with neither \
             applies to no node)"
                .into(),
        );
    }
    let mut percent = BTreeMap::new();
    for (resource, text) in &spec.request_cap {
        if !CAP_RESOURCES.contains(&resource.as_str()) {
            return Err(format!(
                "spec.requestCap: resource {resource:?} must be cpu or memory"
            ));
        }
        let value = parse_percent(text).ok_or_else(|| {
            format!(
                "spec.requestCap[{resource}] {text:?} must be a whole percent from {}% to {}%",
                CAP_PERCENT_RANGE.start(),
                CAP_PERCENT_RANGE.end()
            )
        })?;
        if let Some((ratio_text, ratio)) = ratios.get(resource)
            && u128::from(value) * 10_000 < ratio.millionths()
        {
            return Err(format!(
                "spec.requestCap[{resource}] {text} is below spec.nodeRatios[{resource}] {ratio_text}: \
                 the scheduler would be shown room the cap then refuses"
            ));
        }
        if let Some(target) = usage.and_then(|u| u.targets.get(resource))
            && u128::from(value) * 10_000 < target.max_ratio.1.millionths()
        {
            return Err(format!(
                "spec.requestCap[{resource}] {text} is below spec.usage.maxRatios[{resource}] {}: \
                 the scheduler could be shown room the cap then refuses",
                target.max_ratio.0
            ));
        }
        percent.insert(resource.clone(), value);
    }
    Ok(Some(CompiledCap {
        percent,
        mode: spec.cap_mode.unwrap_or_default(),
    }))
}

/// "110%" -> 110, within `CAP_PERCENT_RANGE`; anything else (decimals, spaces, no sign) None.
pub(super) fn parse_percent(text: &str) -> Option<u32> {
    let digits = text.strip_suffix('%')?;
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.starts_with('0') {
        return None;
    }
    let value: u32 = digits.parse().ok()?;
    CAP_PERCENT_RANGE.contains(&value).then_some(value)
}

fn compile_selector(selector: &LabelSelector) -> Result<Selector, String> {
    let mut requirements = Vec::new();
    for (key, value) in selector.match_labels.iter().flatten() {
        check_label_key(key).map_err(|r| format!("spec.nodeSelector.matchLabels: {r}"))?;
        check_label_value(value)
            .map_err(|r| format!("spec.nodeSelector.matchLabels[{key}]: {r}"))?;
        requirements.push(Requirement::In(
            key.clone(),
            BTreeSet::from([value.clone()]),
        ));
    }
    for (index, expression) in selector.match_expressions.iter().flatten().enumerate() {
        let at = format!("spec.nodeSelector.matchExpressions[{index}]");
        let key = &expression.key;
        check_label_key(key).map_err(|r| format!("{at}: {r}"))?;
        let values = expression.values.clone().unwrap_or_default();
        for value in &values {
            check_label_value(value).map_err(|r| format!("{at}.values: {r}"))?;
        }
        let set: BTreeSet<String> = values.iter().cloned().collect();
        let requirement = match expression.operator.as_str() {
            "In" | "NotIn" if set.is_empty() => {
                return Err(format!(
                    "{at}: operator {} needs at least one value",
                    expression.operator
                ));
            }
            "Exists" | "DoesNotExist" if !set.is_empty() => {
                return Err(format!(
                    "{at}: operator {} takes no values",
                    expression.operator
                ));
            }
            "In" => Requirement::In(key.clone(), set),
            "NotIn" => Requirement::NotIn(key.clone(), set),
            "Exists" => Requirement::Exists(key.clone()),
            "DoesNotExist" => Requirement::DoesNotExist(key.clone()),
            other => {
                return Err(format!(
                    "{at}: operator {other:?} is not one of In, NotIn, Exists, DoesNotExist"
                ));
            }
        };
        requirements.push(requirement);
    }
    Ok(Selector { requirements })
}

/// cpu, memory, ephemeral-storage, pods, or an extended resource `domain/name` outside
/// kubernetes.io. Hugepages are never overcommitted: they are reserved memory.
pub(super) fn check_node_resource(name: &str) -> Result<(), String> {
    if STANDARD_NODE_RESOURCES.contains(&name) {
        return Ok(());
    }
    let Some((domain, _)) = name.split_once('/') else {
        return Err(format!(
            "resource {name:?} is not one of cpu, memory, ephemeral-storage, pods, or an extended \
             resource like example.com/device"
        ));
    };
    if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") {
        return Err(format!(
            "resource {name:?}: kubernetes.io resources cannot be overcommitted"
        ));
    }
    check_qualified_name(name).map_err(|r| format!("resource {name:?}: {r}"))
}

fn check_pod_resource(name: &str) -> Result<(), String> {
    if POD_DEFAULT_RESOURCES.contains(&name) {
        Ok(())
    } else {
        Err(format!("resource {name:?} must be cpu or memory"))
    }
}

fn check_label_key(key: &str) -> Result<(), String> {
    check_qualified_name(key).map_err(|r| format!("label key {key:?}: {r}"))
}

/// A label value: empty, or up to 63 of [A-Za-z0-9-_.] starting and ending alphanumeric.
pub(super) fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_name_part(value) {
        Ok(())
    } else {
        Err(format!(
            "label value {value:?} must be at most 63 characters of letters, digits, '-', '_', '.', \
             starting and ending with a letter or digit"
        ))
    }
}

/// `[prefix/]name`: prefix a DNS subdomain, name up to 63 of [A-Za-z0-9-_.].
fn check_qualified_name(text: &str) -> Result<(), String> {
    let (prefix, name) = match text.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, text),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Err(format!("prefix {prefix:?} must be a DNS subdomain"));
    }
    if !is_name_part(name) {
        return Err(format!(
            "name {name:?} must be 1 to 63 characters of letters, digits, '-', '_', '.', starting \
             and ending with a letter or digit"
        ));
    }
    Ok(())
}

fn is_name_part(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    !bytes.is_empty()
        && bytes.len() <= 63
        && edge(bytes.first())
        && edge(bytes.last())
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// RFC 1123 subdomain: at most 253 characters, dot-separated lowercase labels.
pub(super) fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253
        && text.split('.').all(|label| {
            let bytes = label.as_bytes();
            let edge =
                |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
            !bytes.is_empty()
                && bytes.len() <= 63
                && edge(bytes.first())
                && edge(bytes.last())
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        })
}
