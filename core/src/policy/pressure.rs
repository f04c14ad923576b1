//! `spec.pressure` of an OvercommitPolicy: the pressure taint (the rule is in the crate's `pressure`).
//! The type, its checks in code, and its CRD schema.
//!
//! - `cpu`, `memory`: each optional, at least one: `{high, low}`, whole percents of the
//!   kubelet's raw allocatable from 1% to 100%, `low` below `high`.
//! - `holdTime`: how long usage must stay below `low` before the taint goes: `<integer><unit>`
//!   groups with units ms, s, m, h (the grammar of `spec.usage.window`), 10s to 1h; default 5m.
//!   Under 10 s a hold would end on the next sample or two (metrics-server measures over about
//!   10 s and is polled every `--usage-interval`), which brings back the flapping the hold
//!   exists to prevent; over an hour a relieved node stays out of scheduling for no reason.

use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::usage::{TARGET_PATTERN, TARGET_RANGE, WINDOW_PATTERN, cel_duration, percent};

/// Shortest and longest `spec.pressure.holdTime`.
pub(crate) const HOLD_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(10)..=Duration::from_secs(3600);
/// `spec.pressure.holdTime` when absent.
pub(crate) const DEFAULT_HOLD: &str = "5m";

/// `spec.pressure`, as written.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PressureSpec {
    /// How long usage must stay below `low` before the taint goes: 10s to 1h (default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_time: Option<String>,
    /// CPU watermarks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<WatermarksSpec>,
    /// Memory watermarks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<WatermarksSpec>,
}

/// One resource's watermarks, as written.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct WatermarksSpec {
    /// Usage above this share of raw allocatable taints the node (1% to 100%).
    pub high: String,
    /// Usage below this share for holdTime removes the taint (1% to 100%, below high).
    pub low: String,
}

/// One resource's watermarks, whole percents of raw allocatable, `low < high`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    pub high: u32,
    pub low: u32,
}

/// `spec.pressure`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledPressure {
    pub hold: Duration,
    pub cpu: Option<Watermarks>,
    pub memory: Option<Watermarks>,
}

impl CompiledPressure {
    /// The watermarks of `resource` (cpu, memory), if the policy sets them.
    pub fn watermarks(&self, resource: &str) -> Option<Watermarks> {
        match resource {
            "cpu" => self.cpu,
            "memory" => self.memory,
            _ => None,
        }
    }
}

/// Check `spec.pressure`; the error is the reason.
pub(super) fn compile(spec: &PressureSpec) -> Result<CompiledPressure, String> {
    if spec.cpu.is_none() && spec.memory.is_none() {
        return Err("spec.pressure must set cpu and/or memory watermarks".to_string());
    }
    let marks = |resource: &str, w: &Option<WatermarksSpec>| -> Result<_, String> {
        let Some(w) = w else { return Ok(None) };
        let at = format!("spec.pressure.{resource}");
        let high = percent(&w.high, TARGET_RANGE).map_err(|r| format!("{at}.high: {r}"))?;
        let low = percent(&w.low, TARGET_RANGE).map_err(|r| format!("{at}.low: {r}"))?;
        if low.value >= high.value {
            return Err(format!(
                "{at}: low {} must be below high {} (between them the taint stays as it is)",
                w.low, w.high
            ));
        }
        Ok(Some(Watermarks {
            high: high.value,
            low: low.value,
        }))
    };
    let cpu = marks("cpu", &spec.cpu)?;
    let memory = marks("memory", &spec.memory)?;
    let text = spec.hold_time.as_deref().unwrap_or(DEFAULT_HOLD);
    let hold = cel_duration(text).map_err(|r| format!("spec.pressure.holdTime: {r}"))?;
    if !HOLD_RANGE.contains(&hold) {
        return Err(format!(
            "spec.pressure.holdTime: {text} must be from 10s to 1h"
        ));
    }
    Ok(CompiledPressure { hold, cpu, memory })
}

fn watermarks_schema(resource: &str) -> serde_json::Value {
    serde_json::json!({
        "description": format!("{resource} watermarks: whole percents of the kubelet's raw allocatable, low below high."),
        "type": "object",
        "required": ["high", "low"],
        "properties": {
            "high": {
                "description": "Usage above this share of raw allocatable taints the node (1% to 100%).",
                "type": "string", "maxLength": 4, "pattern": TARGET_PATTERN
            },
            "low": {
                "description": "Usage below this share for holdTime removes the taint (1% to 100%, below high).",
                "type": "string", "maxLength": 4, "pattern": TARGET_PATTERN
            }
        },
        "x-kubernetes-validations": [{
            "rule": "int(self.low.replace('%', '')) < int(self.high.replace('%', ''))",
            "message": "low must be below high"
        }]
    })
}

pub(super) fn schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "The pressure taint: a node whose usage rises above high (a share of the kubelet's raw allocatable) is tainted overcommit.dev/pressure:NoSchedule until usage has stayed below low for holdTime. See docs/policy.md, \"Pressure\".",
        "type": "object",
        "properties": {
            "holdTime": {
                "description": "How long usage must stay below low before the taint goes: <integer><unit> groups with units ms, s, m, h, from 10s to 1h (default 5m).",
                "type": "string",
                "maxLength": 32,
                "pattern": WINDOW_PATTERN,
                "x-kubernetes-validations": [{
                    "rule": "duration(self) >= duration('10s') && duration(self) <= duration('1h')",
                    "message": "holdTime must be from 10s to 1h"
                }]
            },
            "cpu": watermarks_schema("cpu"),
            "memory": watermarks_schema("memory")
        },
        "x-kubernetes-validations": [{
            "rule": "has(self.cpu) || has(self.memory)",
            "message": "pressure must set cpu and/or memory watermarks"
        }]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(
        hold: Option<&str>,
        cpu: Option<(&str, &str)>,
        memory: Option<(&str, &str)>,
    ) -> PressureSpec {
        let w = |(high, low): (&str, &str)| WatermarksSpec {
            high: high.into(),
            low: low.into(),
        };
        PressureSpec {
            hold_time: hold.map(Into::into),
            cpu: cpu.map(w),
            memory: memory.map(w),
        }
    }

    /// Through the policy file: the field is known, needs nodeRatios or usage, and a typo
    /// inside it is refused.
    #[test]
    fn in_a_policy() {
        let doc = |spec: &str| {
            format!(
                "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {{name: p}}\nspec:\n{spec}\n"
            )
        };
        let ok = doc(
            "  nodeRatios: {cpu: \"2\"}\n  pressure: {holdTime: 1m, memory: {high: \"85%\", low: \"70%\"}}",
        );
        let policies = super::super::parse_policy_file(&ok).map_err(|e| e.to_string());
        let set = policies.and_then(|p| super::super::PolicySet::new(p).map_err(|e| e.to_string()));
        assert!(set.as_ref().is_ok_and(|s| s.has_pressure()), "{set:?}");
        for (spec, want) in [
            (
                "  pressure: {cpu: {high: \"90%\", low: \"75%\"}}",
                "spec.pressure needs spec.nodeRatios or spec.usage",
            ),
            (
                "  nodeRatios: {cpu: \"2\"}\n  pressure: {cpu: {high: \"90%\", lo: \"75%\"}}",
                "unknown field spec.pressure.cpu.lo",
            ),
            (
                "  nodeRatios: {cpu: \"2\"}\n  pressure: {hold: 1m, cpu: {high: \"90%\", low: \"75%\"}}",
                "unknown field spec.pressure.hold",
            ),
        ] {
            match super::super::parse_policy_file(&doc(spec)) {
                Err(e) => assert!(e.to_string().contains(want), "{spec}: {e}"),
                Ok(p) => panic!("{spec}: parsed as {p:?}"),
            }
        }
    }

    #[test]
    fn compiles_and_refuses() {
        let ok = compile(&spec(None, Some(("90%", "75%")), None));
        assert_eq!(
            ok,
            Ok(CompiledPressure {
                hold: Duration::from_secs(300),
                cpu: Some(Watermarks { high: 90, low: 75 }),
                memory: None
            })
        );
        let both = compile(&spec(
            Some("10s"),
            Some(("100%", "1%")),
            Some(("85%", "70%")),
        ));
        assert_eq!(
            both.map(|c| (c.hold, c.memory)),
            Ok((
                Duration::from_secs(10),
                Some(Watermarks { high: 85, low: 70 })
            ))
        );
        let refused: &[(PressureSpec, &str)] = &[
            (spec(None, None, None), "must set cpu and/or memory"),
            (
                spec(None, Some(("90%", "90%")), None),
                "low 90% must be below high 90%",
            ),
            (
                spec(None, None, Some(("70%", "85%"))),
                "spec.pressure.memory: low 85%",
            ),
            (
                spec(None, Some(("90", "75%")), None),
                "spec.pressure.cpu.high",
            ),
            (
                spec(None, Some(("90%", "0%")), None),
                "spec.pressure.cpu.low",
            ),
            (
                spec(Some("9s"), Some(("90%", "75%")), None),
                "from 10s to 1h",
            ),
            (
                spec(Some("1h1s"), Some(("90%", "75%")), None),
                "from 10s to 1h",
            ),
            (
                spec(Some("300"), Some(("90%", "75%")), None),
                "spec.pressure.holdTime",
            ),
            (
                spec(Some("1d"), Some(("90%", "75%")), None),
                "spec.pressure.holdTime",
            ),
        ];
        for (spec, want) in refused {
            match compile(spec) {
                Err(e) => assert!(e.contains(want), "{spec:?}: {e}"),
                Ok(c) => panic!("{spec:?} compiled to {c:?}"),
            }
        }
    }
}
