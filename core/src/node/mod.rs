//! The node rule, in one place. Pure.
//!
//! On every `CREATE nodes` and `UPDATE nodes/status`:
//!
//! 1. **Raw value.** The annotation `overcommit.dev/raw-allocatable` (`cpu=4,memory=16Gi`)
//!    holds the kubelet's own value of each resource this webhook inflated, and
//!    `overcommit.dev/applied` (`policy=batch;ratios=cpu=2`, plus `;usage=...`: the values the
//!    usage rule wrote) what it applied (`annotations`: the format, and the JSON one of
//!    earlier versions, still read). From the two the webhook recomputes what it last wrote. Per resource: if the incoming allocatable equals (by value) what it last wrote,
//!    the raw value comes from the annotation (a status write by someone else, a retry, a
//!    reinvocation); otherwise the incoming value is the kubelet's new raw value.
//! 2. **Policy.** The highest-priority policy whose selector matches the node's labels gives
//!    the ratios; `overcommit.dev/disabled=true` opts the node out.
//! 3. **New allocatable** = floor(raw x ratio): cpu in whole millicores, everything else in whole
//!    units (bytes, pods, devices), printed the way the API server prints it. A ratio of exactly 1
//!    leaves the resource alone. Capacity is never touched.
//! 4. **No policy, or opted out:** allocatable goes back to the raw value and both annotations
//!    are removed.
//!
//! Running the output back through the rule changes nothing (tests below check every case).
//!
//! Safety nets against compounding:
//! - The API server's incoming object carries the stored annotations. Should a status writer
//!   send an object without them, the stored node's (oldObject's) annotations are used.
//! - A kubelet never reports allocatable above capacity, so a value above capacity that is not
//!   what this webhook last wrote is refused (the review fails open). The kubelet's next status
//!   write carries its raw value and repairs the node.
//! - Unreadable annotations are ignored (and reported); the two nets above then apply.
//!
//! Usage-aware policies (`spec.usage`): the per-resource rule is `usage::usage_allocatable`
//! (clamp(requested + target x raw - peak usage, raw, raw x maxRatio), minChange, fallbacks);
//! it takes the node's requested sum and peak usage as plain data (`usage::UsageView`).
//!
//! Known ambiguity: if a node's raw value changes to exactly what the webhook wrote before
//! (raw 4 inflated to 8, then the node is resized to 8), the two cannot be told apart and 4 is
//! kept until the next write that differs. Resizes change capacity too; see docs/policy.md.

mod annotations;
pub mod heartbeat;
pub mod history;
pub mod usage;

use std::borrow::Cow;

use overcommit_json::StrMap;
use serde_json::Value;

use self::annotations::{Desired, RawRecord, Recorded, Written};
use self::heartbeat::{Condition, HeartbeatLine, Quiet};
use self::usage::{FallbackSet, NodeUsage, UsageSource, UsageView};
use crate::Account;
use crate::patch::{PatchOp, pointer, pointer_under};
use crate::policy::{CompiledPolicy, CompiledUsage, NodeChoice, PolicySet, UsageTarget};
use crate::quantity::{Format, MAX_UNITS, Quantity, QuantityError, Ratio};

pub use self::annotations::{
    APPLIED_ANNOTATION, AnnotationError, AppliedSummary, OVERCOMMIT_ANNOTATIONS,
    RAW_ALLOCATABLE_ANNOTATION, applied_summary, carries_overcommit_annotations,
    raw_allocatable_map,
};

/// The parts of a Node the rule reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeView<'v> {
    /// False when the object has no `metadata` at all (then annotations go in with it).
    pub has_metadata: bool,
    pub labels: Option<&'v StrMap<'v>>,
    pub annotations: Option<&'v StrMap<'v>>,
    pub allocatable: Option<&'v StrMap<'v>>,
    pub capacity: Option<&'v StrMap<'v>>,
    /// `status.conditions`, where the review's reader read them (quiet heartbeats).
    pub conditions: Option<&'v [Condition<'v>]>,
}

/// Why the rule could not decide; the review then fails open (allowed, no patch).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InflateError {
    #[error("allocatable {resource}: {source}")]
    Quantity {
        resource: String,
        source: QuantityError,
    },
    #[error(
        "allocatable {resource} {allocatable} is above capacity {capacity} and is not what this \
         webhook last wrote; refusing to inflate it again"
    )]
    AboveCapacity {
        resource: String,
        allocatable: String,
        capacity: String,
    },
    #[error("cannot write annotation: {0}")]
    Encode(String),
}

/// Which way the node went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeOutcome {
    /// A policy applies (its ratios may still leave every value as it is).
    Policy(String),
    NoPolicy,
    OptedOut,
}

/// Where a raw value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawSource {
    /// The incoming allocatable is the kubelet's (new) value.
    Incoming,
    /// The incoming allocatable is what this webhook last wrote: raw from the annotation.
    Annotation,
}

/// One resource the rule looked at, for `review --explain` and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceLine {
    pub resource: String,
    pub incoming: String,
    pub raw: String,
    pub raw_source: RawSource,
    /// The ratio applied, as written in the policy (None: restored to raw).
    pub ratio: Option<String>,
    /// Under a usage policy, for a targeted resource: the usage it was decided on and where the
    /// value came from (a fallback applies `ratio`, or raw).
    pub usage: Option<(UsageView, UsageSource)>,
    pub result: String,
}

/// The rule's answer for one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeDecision {
    pub outcome: NodeOutcome,
    pub resources: Vec<ResourceLine>,
    /// Things worth a log line that did not stop the decision (unreadable annotations).
    pub notes: Vec<String>,
    pub patch: Vec<PatchOp>,
    /// Whether a heartbeat was set back to the stored one (quiet heartbeats).
    pub heartbeats_kept: bool,
    /// Per condition, what happened to its heartbeat (with `Account::Full`), and under which
    /// settings; `None` where quiet heartbeats did not apply.
    pub heartbeats: Option<(Quiet, Vec<HeartbeatLine>)>,
    /// Under a usage policy: why resources took the fallback (with every `Account`; a metric).
    pub usage_fallbacks: FallbackSet,
}

/// What this webhook recorded for `resource`, if anything: the raw text and value, the
/// allocatable it wrote from them, and the ratio it was written by (none: not inflated by one).
fn recorded<'r>(
    recorded: &'r Recorded<'_>,
    resource: &str,
) -> Option<(
    &'r RawRecord<'r>,
    Result<Quantity, InflateError>,
    Option<&'r Ratio>,
)> {
    let (raw, how) = recorded.get(resource)?;
    Some(match how {
        Written::Ratio(Some(ratio)) if !ratio.is_one() => {
            (raw, inflate(resource, &raw.1, ratio), Some(ratio))
        }
        Written::Ratio(_) => (raw, Ok(raw.1), None),
        Written::Usage(value) => (raw, Ok(*value), None),
    })
}

/// Decide the node's allocatable and annotations. `stored` is the node as stored (the review's
/// oldObject on UPDATE); its annotations are read only if `node` carries none.
pub fn decide(
    node: &NodeView<'_>,
    stored: Option<&NodeView<'_>>,
    policies: &PolicySet,
) -> Result<NodeDecision, InflateError> {
    decide_with(node, stored, policies, Account::Full, None)
}

/// `decide`, keeping the per-resource account only if `account` is `Full` (the answer to a
/// review needs only the outcome and the patch). With `quiet` (a status update, quiet
/// heartbeats on), a node a policy selects also gets its stored heartbeats back where only
/// they changed (`heartbeat`): read from `node` and `stored` conditions.
pub fn decide_with(
    node: &NodeView<'_>,
    stored: Option<&NodeView<'_>>,
    policies: &PolicySet,
    account: Account,
    quiet: Option<Quiet>,
) -> Result<NodeDecision, InflateError> {
    decide_with_usage(node, stored, policies, account, quiet, None)
}

/// `decide_with`, with what is known of the node's usage for a policy with `spec.usage`
/// (`None`: nothing, so every targeted resource falls back: `FallbackReason::NoSample`).
/// Static policies never read it. The policy is chosen here; a caller that has chosen it
/// already (the review path) calls [`decide_node`].
pub fn decide_with_usage(
    node: &NodeView<'_>,
    stored: Option<&NodeView<'_>>,
    policies: &PolicySet,
    account: Account,
    quiet: Option<Quiet>,
    usage: Option<&NodeUsage>,
) -> Result<NodeDecision, InflateError> {
    decide_node(NodeInput {
        node,
        stored,
        choice: &policies.for_node(&node.labels),
        account,
        quiet,
        usage,
    })
}

/// What the node rule decides on, as plain input: the node, the node as stored (the review's
/// oldObject on UPDATE), the policy already chosen for it (`PolicySet::for_node` on the node's
/// labels, once per review), and the settings of the decision.
#[derive(Debug, Clone, Copy)]
pub struct NodeInput<'i, 'p> {
    pub node: &'i NodeView<'i>,
    /// Its annotations are read only if `node` carries none.
    pub stored: Option<&'i NodeView<'i>>,
    pub choice: &'i NodeChoice<'p>,
    /// Whether to keep the per-resource account (`Full`, for `explain`) or only the patch.
    pub account: Account,
    /// A status update with quiet heartbeats on: a node a policy selects also gets its stored
    /// heartbeats back where only they changed (`heartbeat`).
    pub quiet: Option<Quiet>,
    /// What is known of the node's usage, for a policy with `spec.usage`.
    pub usage: Option<&'i NodeUsage>,
}

/// Decide the node's allocatable, annotations and heartbeats from plain input.
pub fn decide_node(input: NodeInput<'_, '_>) -> Result<NodeDecision, InflateError> {
    let NodeInput {
        node,
        stored,
        choice,
        account,
        quiet,
        usage,
    } = input;
    let (outcome, policy) = match choice {
        NodeChoice::Policy(p) => (NodeOutcome::Policy(p.name.clone()), Some(*p)),
        NodeChoice::NoPolicy => (NodeOutcome::NoPolicy, None),
        NodeChoice::OptedOut => (NodeOutcome::OptedOut, None),
    };
    let mut notes = Vec::new();
    let previous = previous_record(node, stored, policy, &mut notes);
    let rule = ResourceRule {
        node,
        policy,
        previous: previous.as_ref(),
        usage,
        account,
    };
    let mut out = Outputs::default();
    for (name, incoming_text) in node.allocatable.into_iter().flatten() {
        rule.decide(name, incoming_text, &mut out)?;
    }
    let Outputs {
        mut patch,
        resources,
        raw_record,
        usage_written,
        usage_fallbacks,
    } = out;
    let desired_annotations = policy.map(|policy| Desired {
        policy,
        raw_record: raw_record.as_slice(),
        usage_written: usage_written.as_slice(),
    });
    annotation_patch(node, desired_annotations, &mut patch)?;

    // Only on nodes this webhook inflates: the others' kubelets are quiet already.
    let quiet = quiet.filter(|q| policy.is_some() && !q.refresh.is_zero());
    let conditions = node.conditions.zip(stored.and_then(|s| s.conditions));
    let (heartbeats_kept, heartbeats) = match (quiet, conditions) {
        (Some(quiet), Some((incoming, stored))) => {
            let (kept, lines) =
                heartbeat::keep_stored(incoming, stored, quiet, account, &mut patch);
            (kept, Some((quiet, lines)))
        }
        _ => (false, None),
    };

    Ok(NodeDecision {
        outcome,
        resources,
        notes,
        patch,
        heartbeats_kept,
        heartbeats,
        usage_fallbacks,
    })
}

/// What this webhook recorded on the node (or, when the node carries neither annotation, on
/// the stored node); unreadable annotations are ignored, with a note.
fn previous_record<'a>(
    node: &NodeView<'a>,
    stored: Option<&NodeView<'a>>,
    policy: Option<&'a CompiledPolicy>,
    notes: &mut Vec<String>,
) -> Option<Recorded<'a>> {
    let carries_annotations =
        |view: &NodeView<'_>| carries_overcommit_annotations(view.annotations);
    let previous_source = if carries_annotations(node) {
        node.annotations
    } else {
        stored
            .filter(|s| carries_annotations(s))
            .and_then(|s| s.annotations)
    };
    match annotations::read(previous_source?, policy) {
        Ok(previous) => Some(previous),
        Err(reason) => {
            notes.push(format!(
                "ignoring unreadable overcommit annotations: {reason}"
            ));
            None
        }
    }
}

/// What the per-resource rule reads, the same for every resource of one node.
struct ResourceRule<'r, 'p> {
    node: &'r NodeView<'r>,
    policy: Option<&'p CompiledPolicy>,
    previous: Option<&'r Recorded<'r>>,
    usage: Option<&'r NodeUsage>,
    account: Account,
}

/// What the per-resource rule writes, over all resources of one node.
#[derive(Default)]
struct Outputs<'r> {
    patch: Vec<PatchOp>,
    resources: Vec<ResourceLine>,
    /// resource -> raw text, in the allocatable map's order (sorted, unique).
    raw_record: Vec<(&'r str, &'r str)>,
    /// resource -> value the usage rule wrote (stays empty, unallocated, under static policies).
    usage_written: Vec<(&'r str, Quantity)>,
    usage_fallbacks: FallbackSet,
}

impl<'r> ResourceRule<'r, '_> {
    /// One resource of the node's allocatable: its raw value, the value it should have, and
    /// the patch and records that follow.
    fn decide(
        &self,
        resource: &'r str,
        incoming_text: &'r str,
        out: &mut Outputs<'r>,
    ) -> Result<(), InflateError> {
        let ratio = self
            .policy
            .and_then(|p| p.ratios.get(resource))
            .filter(|(_, ratio)| !ratio.is_one());
        let usage_target = self
            .policy
            .and_then(|p| p.usage.as_ref())
            .and_then(|u| u.targets.get(resource).map(|target| (u, target)));
        let (previous_raw, written_by) = match self.previous.and_then(|p| recorded(p, resource)) {
            Some((raw, written, by)) => (Some((raw, written?)), by),
            None => (None, None),
        };
        if ratio.is_none() && previous_raw.is_none() && usage_target.is_none() {
            return Ok(()); // neither inflated before nor now: not ours
        }
        let incoming = parse(resource, incoming_text)?;
        let (raw_text, raw, raw_source) = match previous_raw {
            Some(((text, raw), written)) if written == incoming => {
                (text.as_ref(), *raw, RawSource::Annotation)
            }
            _ => (incoming_text, incoming, RawSource::Incoming),
        };
        if (usage_target.is_some() || ratio.is_some()) && raw_source == RawSource::Incoming {
            check_capacity(resource, &incoming, incoming_text, self.node.capacity)?;
        }
        let mut usage_line = None;
        let desired = match (usage_target, ratio) {
            (Some((policy_usage, target)), _) => {
                out.raw_record.push((resource, raw_text));
                // What this webhook last wrote counts only if written from this raw value
                // (the kubelet's PATCH carries raw, so the incoming value is no guide).
                let current = previous_raw
                    .as_ref()
                    .filter(|((_, recorded_raw), _)| *recorded_raw == raw)
                    .map(|(_, written)| written);
                let target = UsageInput {
                    raw: &raw,
                    current,
                    policy: policy_usage,
                    target,
                    fallback: ratio.map(|(_, r)| r),
                };
                let (allocatable, line) = self.usage_value(resource, &target, out)?;
                usage_line = Some(line);
                allocatable
            }
            (None, Some((_, ratio))) => {
                out.raw_record.push((resource, raw_text));
                ratio_value(resource, &raw, ratio, previous_raw, written_by)?
            }
            (None, None) => raw,
        };
        let result = || result_text(&desired, &raw, raw_text);
        if desired != incoming {
            out.patch.push(PatchOp::Replace {
                path: allocatable_pointer(resource),
                value: Value::String(result()),
            });
        }
        if self.account == Account::Full {
            out.resources.push(ResourceLine {
                resource: resource.to_string(),
                incoming: incoming_text.to_string(),
                raw: raw_text.to_string(),
                raw_source,
                ratio: ratio.map(|(text, _)| text.clone()),
                usage: usage_line,
                result: result(),
            });
        }
        Ok(())
    }
}

/// The text a resource's allocatable is written with: the raw text as it came when the value is
/// raw, else the value printed.
fn result_text(desired: &Quantity, raw: &Quantity, raw_text: &str) -> String {
    if desired == raw {
        raw_text.to_string()
    } else {
        desired.to_text()
    }
}

/// The ratio rule's value for one resource: what this webhook wrote last when it was written
/// from the same raw value (the same mantissa, exponent and format: quantities are
/// normalised) by the same ratio (the kubelet's usual status write), else raw x ratio.
fn ratio_value(
    resource: &str,
    raw: &Quantity,
    ratio: &Ratio,
    previous_raw: Option<(&RawRecord<'_>, Quantity)>,
    written_by: Option<&Ratio>,
) -> Result<Quantity, InflateError> {
    match previous_raw {
        Some(((_, recorded_raw), written))
            if written_by == Some(ratio)
                && recorded_raw == raw
                && recorded_raw.format() == raw.format() =>
        {
            Ok(written)
        }
        _ => inflate(resource, raw, ratio),
    }
}

/// One resource a usage policy targets, as `ResourceRule::usage_value` decides it.
struct UsageInput<'u> {
    raw: &'u Quantity,
    /// What this webhook last wrote, if written from this raw value.
    current: Option<&'u Quantity>,
    policy: &'u CompiledUsage,
    target: &'u UsageTarget,
    /// The policy's ratio for the resource (the fallback), if any.
    fallback: Option<&'u Ratio>,
}

impl<'r> ResourceRule<'r, '_> {
    /// The usage rule's value for one resource, and the usage it was decided on; a fallback's
    /// reason is counted in `out`, a followed value recorded there.
    fn usage_value(
        &self,
        resource: &'r str,
        input: &UsageInput<'_>,
        out: &mut Outputs<'r>,
    ) -> Result<(Quantity, (UsageView, UsageSource)), InflateError> {
        let mut view = self
            .usage
            .and_then(|u| u.get(resource))
            .unwrap_or(UsageView {
                synced: true,
                ..UsageView::default()
            });
        view.capacity = capacity_units(resource, self.node.capacity);
        let decision = usage::usage_allocatable(
            resource,
            input.raw,
            input.current,
            input.target,
            &input.policy.min_change,
            input.fallback,
            &view,
        )
        .map_err(|source| InflateError::Quantity {
            resource: resource.to_string(),
            source,
        })?;
        match decision.source {
            UsageSource::Fallback(reason) => out.usage_fallbacks.insert(reason),
            _ => out.usage_written.push((resource, decision.allocatable)),
        }
        Ok((decision.allocatable, (view, decision.source)))
    }
}

/// `/status/allocatable/RESOURCE`: a constant for the resources every node has (one op each in
/// nearly every review), built for any other.
fn allocatable_pointer(resource: &str) -> Cow<'static, str> {
    match resource {
        "cpu" => Cow::Borrowed("/status/allocatable/cpu"),
        "memory" => Cow::Borrowed("/status/allocatable/memory"),
        "pods" => Cow::Borrowed("/status/allocatable/pods"),
        "ephemeral-storage" => Cow::Borrowed("/status/allocatable/ephemeral-storage"),
        _ => Cow::Owned(pointer_under("/status/allocatable", resource)),
    }
}

/// floor(raw x ratio) in the resource's unit, printed like the raw value (cpu: millicores).
fn inflate(resource: &str, raw: &Quantity, ratio: &Ratio) -> Result<Quantity, InflateError> {
    let (scale, format) = if resource == "cpu" {
        (3, Format::DecimalSi)
    } else {
        (0, raw.format())
    };
    let units = ratio
        .apply_floor(raw, scale)
        .map_err(|source| InflateError::Quantity {
            resource: resource.to_string(),
            source,
        })?;
    // Beyond what the API server holds as an int64 of units: refuse rather than write a value
    // that could fail the node's status write.
    if units > MAX_UNITS {
        return Err(InflateError::Quantity {
            resource: resource.to_string(),
            source: QuantityError::Overflow(raw.to_string()),
        });
    }
    Ok(Quantity::from_units(units, scale, format))
}

fn parse(resource: &str, text: &str) -> Result<Quantity, InflateError> {
    Quantity::parse(text).map_err(|source| InflateError::Quantity {
        resource: resource.to_string(),
        source,
    })
}

/// A kubelet never reports allocatable above capacity: such a value was inflated by someone.
fn check_capacity(
    resource: &str,
    incoming: &Quantity,
    incoming_text: &str,
    capacity: Option<&StrMap<'_>>,
) -> Result<(), InflateError> {
    let Some(capacity_text) = capacity.and_then(|c| c.get(resource)) else {
        return Ok(());
    };
    // An unreadable capacity is no evidence either way.
    match Quantity::parse(capacity_text) {
        Ok(capacity) if *incoming > capacity => Err(InflateError::AboveCapacity {
            resource: resource.to_string(),
            allocatable: incoming_text.to_string(),
            capacity: capacity_text.to_string(),
        }),
        _ => Ok(()),
    }
}

/// The node's capacity of `resource` in the usage rule's unit (cpu: millicores, others: whole
/// units); None when absent or unreadable (no evidence for the rule's plausibility check).
fn capacity_units(resource: &str, capacity: Option<&StrMap<'_>>) -> Option<u128> {
    let text = capacity?.get(resource)?;
    let scale = if resource == "cpu" { 3 } else { 0 };
    Quantity::parse(text).ok()?.to_units_floor(scale).ok()
}

/// Operations that make the node's annotations what they should be (none: no policy applies).
fn annotation_patch(
    node: &NodeView<'_>,
    desired: Option<Desired<'_>>,
    patch: &mut Vec<PatchOp>,
) -> Result<(), InflateError> {
    let value = |desired: &Desired<'_>, key| {
        desired
            .value(key)
            .map_err(|e| InflateError::Encode(e.to_string()))
    };
    match (desired, node.annotations) {
        (Some(desired), None) => {
            let mut annotations = serde_json::Map::new();
            for key in OVERCOMMIT_ANNOTATIONS {
                let value = value(&desired, key)?;
                annotations.insert(key.to_string(), Value::String(value));
            }
            patch.push(if node.has_metadata {
                PatchOp::Add {
                    path: pointer(["metadata", "annotations"]).into(),
                    value: Value::Object(annotations),
                }
            } else {
                let mut metadata = serde_json::Map::new();
                metadata.insert("annotations".to_string(), Value::Object(annotations));
                PatchOp::Add {
                    path: pointer(["metadata"]).into(),
                    value: Value::Object(metadata),
                }
            });
        }
        (Some(desired), Some(current)) => {
            for key in OVERCOMMIT_ANNOTATIONS {
                // Usually already what it should be: compared as it is written, not built.
                let unchanged = current
                    .get(key)
                    .is_some_and(|current| desired.is_written(key, current));
                if !unchanged {
                    patch.push(PatchOp::Add {
                        path: pointer(["metadata", "annotations", key]).into(),
                        value: Value::String(value(&desired, key)?),
                    });
                }
            }
        }
        (None, Some(current)) => {
            for key in OVERCOMMIT_ANNOTATIONS {
                if current.contains_key(key) {
                    patch.push(PatchOp::Remove {
                        path: pointer(["metadata", "annotations", key]).into(),
                    });
                }
            }
        }
        (None, None) => {}
    }
    Ok(())
}

impl NodeDecision {
    /// A short human account: which policy, raw -> new per resource.
    pub fn explain(&self) -> String {
        let mut out = match &self.outcome {
            NodeOutcome::Policy(name) => format!("policy {name} applies\n"),
            NodeOutcome::NoPolicy => {
                "no policy selects this node: allocatable back to raw\n".to_string()
            }
            NodeOutcome::OptedOut => {
                format!(
                    "node is labelled {}=true: allocatable back to raw\n",
                    crate::policy::DISABLED_LABEL
                )
            }
        };
        for line in &self.resources {
            let source = match line.raw_source {
                RawSource::Incoming => "reported by the kubelet",
                RawSource::Annotation => "from the raw-allocatable annotation",
            };
            let by_ratio = || match &line.ratio {
                Some(ratio) => format!("x {ratio}"),
                None => "restored".to_string(),
            };
            let how = match &line.usage {
                None => by_ratio(),
                Some((view, source)) => usage::explain(&line.resource, view, source, by_ratio()),
            };
            out.push_str(&format!(
                "  {}: raw {} ({source}) {how} -> {} (incoming {})\n",
                line.resource, line.raw, line.result, line.incoming
            ));
        }
        if self.resources.is_empty() {
            out.push_str("  no resource to change\n");
        }
        if let Some((quiet, lines)) = &self.heartbeats {
            for line in lines {
                out.push_str(&format!("  {}\n", line.explain(quiet.refresh)));
            }
        }
        for note in &self.notes {
            out.push_str(&format!("  note: {note}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests;
