//! OpenAPI schema pieces for the CRD, stating in the schema what `validate.rs` checks in code.
//! Rules stay cheap for the API server's CEL cost estimator: bounded lists and maps, enums and
//! patterns rather than CEL where a pattern can say it.

use schemars::{Schema, SchemaGenerator, json_schema};

use super::eviction::CRITICAL_PATTERN;
use super::usage::{MEMORY_CEILING_RULE, MIN_CHANGE_PATTERN, TARGET_PATTERN, WINDOW_PATTERN};
use super::validate::MAX_NODE_RATIOS;
use crate::quantity::Ratio;

/// A label key: `[DNS-subdomain/]name`.
const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";
/// A label value: empty, or alphanumeric at both ends.
const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
/// A non-negative quantity (what `Quantity::parse` accepts).
pub(super) const QUANTITY_PATTERN: &str =
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][-+]?[0-9]+))?$";

pub(super) fn node_selector(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Nodes this policy applies to; empty or absent selects every node.",
        "type": "object",
        "x-kubernetes-map-type": "atomic",
        "properties": {
            "matchLabels": {
                "description": "Labels the node must carry with exactly these values.",
                "type": "object",
                "maxProperties": 64,
                "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN}
            },
            "matchExpressions": {
                "description": "Requirements the node's labels must all meet.",
                "type": "array",
                "maxItems": 64,
                "x-kubernetes-list-type": "atomic",
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {"type": "string", "maxLength": 317, "pattern": LABEL_KEY_PATTERN},
                        "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                        "values": {
                            "type": "array",
                            "maxItems": 256,
                            "x-kubernetes-list-type": "atomic",
                            "items": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN}
                        }
                    },
                    "x-kubernetes-validations": [{
                        "rule": "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : (!has(self.values) || size(self.values) == 0)",
                        "message": "operators In and NotIn need at least one value; Exists and DoesNotExist take none"
                    }]
                }
            }
        }
    })
}

pub(super) fn node_ratios(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Resource name (cpu, memory, ephemeral-storage, pods, or an extended resource such as example.com/gpu) -> multiplier of the kubelet's allocatable, a decimal string from 1 to 10 with at most 6 decimals.",
        "type": "object",
        "maxProperties": MAX_NODE_RATIOS,
        "additionalProperties": {"type": "string", "pattern": Ratio::PATTERN}
    })
}

pub(super) fn pod_default_requests(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "cpu and/or memory request (a quantity greater than zero) for containers that set no request and no limit for it.",
        "type": "object",
        "maxProperties": 2,
        "additionalProperties": {"type": "string", "maxLength": 64, "pattern": QUANTITY_PATTERN},
        "x-kubernetes-validations": [{
            "rule": "self.all(k, k in ['cpu', 'memory'])",
            "message": "pod default requests may name cpu and memory only"
        }]
    })
}

pub(super) fn request_to_limit_percent(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "cpu and/or memory -> percent (1 to 100): containers with a limit get request = limit x percent / 100.",
        "type": "object",
        "maxProperties": 2,
        "additionalProperties": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 100},
        "x-kubernetes-validations": [{
            "rule": "self.all(k, k in ['cpu', 'memory'])",
            "message": "requestToLimitPercent may name cpu and memory only"
        }]
    })
}

/// Spec-level rule: a fallback ratio (nodeRatios) stays under the usage ceiling (maxRatios).
/// Both are decimal strings the patterns have checked, compared as numbers.
pub(super) const USAGE_FALLBACK_RULE: &str = "!has(self.usage) || !has(self.nodeRatios) || !has(self.usage.maxRatios) || self.usage.maxRatios.all(k, !(k in self.nodeRatios) || double(self.nodeRatios[k]) <= double(self.usage.maxRatios[k]))";

pub(super) fn usage(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Allocatable that follows measured usage: per targeted resource, clamp(requested + target x raw - peak usage, raw, raw x maxRatio). nodeRatios is then the fallback while usage is unknown or stale.",
        "type": "object",
        "required": ["targetUtilization", "maxRatios"],
        "properties": {
            "targetUtilization": {
                "description": "cpu and/or memory -> share of the kubelet's allocatable that usage should reach, a whole percent from 1% to 100%.",
                "type": "object",
                "minProperties": 1,
                "maxProperties": 2,
                "additionalProperties": {"type": "string", "maxLength": 4, "pattern": TARGET_PATTERN}
            },
            "maxRatios": {
                "description": "Every targeted resource -> ceiling of allocatable as a multiple of the kubelet's value, a decimal string from 1 to 10 with at most 6 decimals; memory at most 2 unless allowHighMemoryRatio is true.",
                "type": "object",
                "maxProperties": 2,
                "additionalProperties": {"type": "string", "maxLength": 9, "pattern": Ratio::PATTERN}
            },
            "window": {
                "description": "Usage is the peak of the samples in this window: <integer><unit> groups with units ms, s, m, h, from 1m to 24h (default 15m).",
                "type": "string",
                "maxLength": 32,
                "pattern": WINDOW_PATTERN,
                "x-kubernetes-validations": [{
                    "rule": "duration(self) >= duration('1m') && duration(self) <= duration('24h')",
                    "message": "window must be from 1m to 24h"
                }]
            },
            "minChange": {
                "description": "Moves of allocatable smaller than this share of the kubelet's value are not written, a whole percent from 0% to 50% (default 5%).",
                "type": "string",
                "maxLength": 3,
                "pattern": MIN_CHANGE_PATTERN
            },
            "allowHighMemoryRatio": {
                "description": "Lets maxRatios.memory go above 2, up to 10 (default false): memory lent beyond what the node has is taken back only by OOM kills and evictions.",
                "type": "boolean"
            }
        },
        "x-kubernetes-validations": [
            {
                "rule": "self.targetUtilization.all(k, k in ['cpu', 'memory']) && self.maxRatios.all(k, k in ['cpu', 'memory'])",
                "message": "usage resources must be cpu or memory"
            },
            {
                "rule": "self.targetUtilization.all(k, k in self.maxRatios)",
                "message": "maxRatios must give a ceiling for every targeted resource"
            },
            {
                "rule": "self.maxRatios.all(k, k in self.targetUtilization)",
                "message": "maxRatios may name targeted resources only"
            },
            {
                "rule": MEMORY_CEILING_RULE,
                "message": "maxRatios.memory above 2 needs allowHighMemoryRatio: true (memory lent beyond what the node has is taken back only by OOM kills and evictions)"
            }
        ]
    })
}
pub(super) fn eviction(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Memory relief, opt-in: above memoryCritical of the kubelet's raw memory allocatable the leader evicts pods through the Eviction API (PodDisruptionBudgets hold), at most maxPodsPerNode per node per interval. Needs nodeRatios or usage.",
        "type": "object",
        "required": ["memoryCritical"],
        "properties": {
            "memoryCritical": {
                "description": "Evict when the node's memory usage is above this share of the kubelet's raw memory allocatable: a whole percent from 50% to 99%.",
                "type": "string",
                "maxLength": 3,
                "pattern": CRITICAL_PATTERN
            },
            "maxPodsPerNode": {
                "description": "At most this many evictions per node per interval, 1 to 10 (default 1).",
                "type": "integer",
                "format": "uint32",
                "minimum": 1,
                "maximum": 10
            },
            "interval": {
                "description": "The window of maxPodsPerNode: <integer><unit> groups with units s, m, h, from 10s to 1h (default 1m).",
                "type": "string",
                "maxLength": 32,
                "pattern": "^([0-9]{1,9}(ms|s|m|h))+$",
                "x-kubernetes-validations": [{
                    "rule": "duration(self) >= duration('10s') && duration(self) <= duration('1h')",
                    "message": "interval must be from 10s to 1h"
                }]
            },
            "dryRun": {
                "description": "Report (Event, metric, log) what would be evicted and evict nothing (default false).",
                "type": "boolean"
            }
        }
    })
}

/// Whole percents from 50% to 1000% (`validate::parse_percent`).
pub(super) const CAP_PERCENT_PATTERN: &str = r"^([5-9][0-9]|[1-9][0-9]{2}|1000)%$";

pub(super) fn request_cap(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "cpu and/or memory -> the most the requests of the pods on a node may add up to, as a percent of the kubelet's raw allocatable (\"110%\"; 50% to 1000%, at least the policy's ratio for that resource).",
        "type": "object",
        "maxProperties": 2,
        "additionalProperties": {"type": "string", "maxLength": 5, "pattern": CAP_PERCENT_PATTERN},
        "x-kubernetes-validations": [{
            "rule": "self.all(k, k in ['cpu', 'memory'])",
            "message": "requestCap may name cpu and memory only"
        }]
    })
}

pub(super) fn cap_mode(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "What a binding over requestCap gets: Enforce (denied, the default) or Warn (allowed, with an admission warning).",
        "type": "string",
        "enum": ["Enforce", "Warn"]
    })
}

/// Rules across fields of the spec (`validate::compile_cap`). A ratio has at most 6 decimals,
/// so ratio x 100 differs from a whole percent by 0 or at least 1e-4: the 1e-6 slack only
/// absorbs the float error of `double()`.
pub(super) fn spec_rules() -> serde_json::Value {
    serde_json::json!([
        {
            "rule": USAGE_FALLBACK_RULE,
            "message": "a nodeRatios fallback may not be above the resource's usage.maxRatios"
        },
        {
            "rule": "!has(self.pressure) || (has(self.nodeRatios) && size(self.nodeRatios) > 0) || has(self.usage)",
            "message": "spec.pressure needs spec.nodeRatios or spec.usage (a policy with neither applies to no node)"
        },
        {
            "rule": "!has(self.eviction) || (has(self.nodeRatios) && size(self.nodeRatios) > 0) || has(self.usage)",
            "message": "spec.eviction needs spec.nodeRatios or spec.usage (a policy with neither applies to no node)"
        },
        {
            "rule": "!has(self.capMode) || has(self.requestCap)",
            "message": "spec.capMode needs spec.requestCap"
        },
        {
            "rule": "!has(self.requestCap) || (has(self.nodeRatios) && size(self.nodeRatios) > 0) || has(self.usage)",
            "message": "spec.requestCap needs spec.nodeRatios or spec.usage (a policy with neither applies to no node)"
        },
        {
            "rule": "!has(self.requestCap) || !has(self.nodeRatios) || self.requestCap.all(k, !(k in self.nodeRatios) || double(self.requestCap[k].replace('%', '')) + 0.000001 >= double(self.nodeRatios[k]) * 100.0)",
            "message": "spec.requestCap is below spec.nodeRatios for the same resource: the scheduler would be shown room the cap then refuses"
        },
        {
            "rule": "!has(self.requestCap) || !has(self.usage) || !has(self.usage.maxRatios) || self.requestCap.all(k, !(k in self.usage.maxRatios) || double(self.requestCap[k].replace('%', '')) + 0.000001 >= double(self.usage.maxRatios[k]) * 100.0)",
            "message": "spec.requestCap is below spec.usage.maxRatios for the same resource: the scheduler could be shown room the cap then refuses"
        }
    ])
}
