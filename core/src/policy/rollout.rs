//! `spec.rollout`: a change of the policy reaches its nodes a few at a time (docs/policy.md,
//! "Staged rollout"). The spec, its validation, and the progress the leader publishes in
//! `status.rollout` as the replicas read it. Which nodes wait, and when the next step is due,
//! is the core module `rollout` (above `policy` and `node`).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::status::RolloutStatus;
use crate::duration::parse_duration;

/// `stepInterval` when the policy does not set it.
pub const DEFAULT_STEP_INTERVAL: Duration = Duration::from_secs(30);
/// Shortest and longest `stepInterval`.
const STEP_INTERVAL_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(86_400);

/// How a change of the policy reaches its nodes: at most `maxNodesPerStep` nodes take the new
/// generation per step, a step every `stepInterval`, none while `paused`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Nodes admitted to the new generation per step: a count (2) or a percentage of the nodes
    /// the policy governs ("20%", rounded up; at least 1 node).
    pub max_nodes_per_step: IntOrString,
    /// Time between two steps (the duration grammar of the flags: "10s", "2m"; 1s to 24h).
    /// Default 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_interval: Option<String>,
    /// No node is admitted while true (setting it is an edit: a node admitted and not yet moved
    /// waits again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// How many nodes a step admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepSize {
    Nodes(u32),
    /// Percent of the governed nodes, rounded up, at least 1.
    Percent(u32),
}

impl StepSize {
    /// Nodes per step when the policy governs `governed` nodes.
    pub fn nodes(self, governed: usize) -> usize {
        match self {
            StepSize::Nodes(n) => n as usize,
            StepSize::Percent(p) => (governed * p as usize).div_ceil(100).max(1),
        }
    }
}

/// `spec.rollout` validated, with what `status.rollout` says has been admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledRollout {
    pub step: StepSize,
    pub interval: Duration,
    pub paused: bool,
    /// Nodes the leader admitted to the policy's current spec that did not carry it yet when it
    /// wrote the status (`status.rollout.admitted`).
    pub admitted: BTreeSet<String>,
}

/// Validate `spec.rollout` (None: not set), reading the admitted nodes from `status` when it
/// is about `generation`, the policy's current one (nodes admitted to an earlier generation
/// wait until the leader admits them again).
pub(super) fn compile(
    spec: Option<&RolloutSpec>,
    generation: Option<i64>,
    status: Option<&RolloutStatus>,
) -> Result<Option<CompiledRollout>, String> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let step = match &spec.max_nodes_per_step {
        IntOrString::Int(n) if *n >= 1 => StepSize::Nodes(*n as u32),
        IntOrString::Int(n) => {
            return Err(format!(
                "spec.rollout.maxNodesPerStep {n} must be at least 1"
            ));
        }
        IntOrString::String(text) => parse_step(text)?,
    };
    let interval = match &spec.step_interval {
        None => DEFAULT_STEP_INTERVAL,
        Some(text) => parse_duration(text)
            .map_err(|e| format!("spec.rollout.stepInterval: {e}"))
            .and_then(|d| {
                if STEP_INTERVAL_RANGE.contains(&d) {
                    Ok(d)
                } else {
                    Err(format!(
                        "spec.rollout.stepInterval {text:?} must be between 1s and 24h"
                    ))
                }
            })?,
    };
    let admitted = status
        .filter(|s| s.generation == generation)
        .map(|s| s.admitted.iter().cloned().collect())
        .unwrap_or_default();
    Ok(Some(CompiledRollout {
        step,
        interval,
        paused: spec.paused,
        admitted,
    }))
}

/// "20%" or "2" (a count written as a string).
fn parse_step(text: &str) -> Result<StepSize, String> {
    let refuse = || {
        format!(
            "spec.rollout.maxNodesPerStep {text:?} must be a count (at least 1) or a percentage from 1% to 100%"
        )
    };
    let digits = |s: &str| {
        (!s.is_empty() && s.len() <= 6 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u32>().ok())
            .flatten()
    };
    match text.strip_suffix('%') {
        Some(p) => match digits(p) {
            Some(p) if (1..=100).contains(&p) => Ok(StepSize::Percent(p)),
            _ => Err(refuse()),
        },
        None => match digits(text) {
            Some(n) if n >= 1 => Ok(StepSize::Nodes(n)),
            _ => Err(refuse()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(step: IntOrString, interval: Option<&str>) -> RolloutSpec {
        RolloutSpec {
            max_nodes_per_step: step,
            step_interval: interval.map(str::to_string),
            paused: false,
        }
    }

    #[test]
    fn step_sizes_and_intervals() {
        let s = |x: &str| IntOrString::String(x.into());
        type Want = Result<(StepSize, u64), &'static str>;
        let cases: Vec<(RolloutSpec, Want)> = vec![
            (
                spec(IntOrString::Int(2), Some("10s")),
                Ok((StepSize::Nodes(2), 10)),
            ),
            (spec(s("2"), None), Ok((StepSize::Nodes(2), 30))),
            (spec(s("25%"), Some("2m")), Ok((StepSize::Percent(25), 120))),
            (spec(s("100%"), Some("1s")), Ok((StepSize::Percent(100), 1))),
            (spec(IntOrString::Int(0), None), Err("at least 1")),
            (spec(IntOrString::Int(-3), None), Err("at least 1")),
            (spec(s("0%"), None), Err("percentage")),
            (spec(s("101%"), None), Err("percentage")),
            (spec(s("two"), None), Err("percentage")),
            (spec(s("%"), None), Err("percentage")),
            (spec(s("0"), None), Err("percentage")),
            (spec(s("2"), Some("0s")), Err("between 1s and 24h")),
            (spec(s("2"), Some("2d")), Err("between 1s and 24h")),
            (spec(s("2"), Some("soon")), Err("stepInterval")),
        ];
        for (spec, want) in cases {
            let got = compile(Some(&spec), Some(1), None);
            match (got, want) {
                (Ok(Some(c)), Ok((step, secs))) => {
                    assert_eq!((c.step, c.interval.as_secs()), (step, secs), "{spec:?}");
                }
                (Err(e), Err(part)) => assert!(e.contains(part), "{spec:?}: {e}"),
                (got, want) => panic!("{spec:?}: got {got:?}, want {want:?}"),
            }
        }
        assert_eq!(compile(None, Some(1), None), Ok(None));
    }

    /// The admitted nodes count only for the generation the status is about.
    #[test]
    fn admitted_nodes_belong_to_a_generation() {
        let status = RolloutStatus {
            generation: Some(4),
            admitted: vec!["n1".into()],
            ..RolloutStatus::default()
        };
        let one = spec(IntOrString::Int(1), None);
        let admitted = |generation| {
            compile(Some(&one), Some(generation), Some(&status))
                .ok()
                .flatten()
                .map(|c| c.admitted.len())
        };
        assert_eq!(admitted(4), Some(1));
        assert_eq!(admitted(5), Some(0));
    }

    #[test]
    fn percent_rounds_up_and_admits_at_least_one() {
        assert_eq!(StepSize::Percent(20).nodes(10), 2);
        assert_eq!(StepSize::Percent(20).nodes(11), 3);
        assert_eq!(StepSize::Percent(1).nodes(3), 1);
        assert_eq!(StepSize::Percent(50).nodes(0), 1);
        assert_eq!(StepSize::Nodes(4).nodes(2), 4);
    }
}
