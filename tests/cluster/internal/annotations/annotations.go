// Package annotations reads kube-overcommit's node annotations as the tests and the demo check
// them: the listed format the webhook writes (`cpu=4,memory=16Gi` and
// `policy=batch;ratios=cpu=2;generation=3`, with `;maxRatios=` and `;usage=` under a usage policy, core/src/node/annotations.rs) and the JSON one earlier versions
// wrote (`{"cpu":"4"}`, `{"policy":"batch","ratios":{"cpu":"2"}}`).
package annotations

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

const (
	// Raw is the kubelet's allocatable of each inflated resource.
	Raw = "overcommit.dev/raw-allocatable"
	// Applied is the policy and the ratios (and usage values) applied.
	Applied = "overcommit.dev/applied"
)

// AppliedValue is what overcommit.dev/applied says.
type AppliedValue struct {
	Policy string            `json:"policy"`
	Ratios map[string]string `json:"ratios"`
	// Generation is the policy's metadata.generation (0: not recorded, as earlier versions
	// and policies from a file write it).
	Generation int64 `json:"generation,omitempty"`
	// MaxRatios is a usage policy's ceilings (empty: a static policy, or not recorded).
	MaxRatios map[string]string `json:"maxRatios,omitempty"`
	Usage     map[string]string `json:"usage,omitempty"`
}

func isJSON(text string) bool {
	return strings.HasPrefix(strings.TrimSpace(text), "{")
}

// ParseList reads `name=value,...` (empty: none).
func ParseList(text string) (map[string]string, error) {
	out := map[string]string{}
	if text == "" {
		return out, nil
	}
	for _, entry := range strings.Split(text, ",") {
		name, value, ok := strings.Cut(entry, "=")
		if !ok || name == "" || value == "" {
			return nil, fmt.Errorf("%q is not name=value", entry)
		}
		if _, twice := out[name]; twice {
			return nil, fmt.Errorf("%s given twice", name)
		}
		out[name] = value
	}
	return out, nil
}

// ParseRaw reads overcommit.dev/raw-allocatable: resource -> quantity.
func ParseRaw(text string) (map[string]string, error) {
	if isJSON(text) {
		var raw map[string]string
		if err := json.Unmarshal([]byte(text), &raw); err != nil {
			return nil, fmt.Errorf("%s=%q: %v", Raw, text, err)
		}
		return raw, nil
	}
	raw, err := ParseList(text)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: %v", Raw, text, err)
	}
	return raw, nil
}

// ParseApplied reads overcommit.dev/applied.
func ParseApplied(text string) (AppliedValue, error) {
	var out AppliedValue
	if isJSON(text) {
		if err := json.Unmarshal([]byte(text), &out); err != nil {
			return out, fmt.Errorf("%s=%q: %v", Applied, text, err)
		}
		return out, nil
	}
	sections := strings.Split(text, ";")
	// policy, ratios, then an optional generation, an optional maxRatios, an optional usage.
	if len(sections) > 2 {
		if value, ok := strings.CutPrefix(sections[2], "generation="); ok {
			g, err := strconv.ParseInt(value, 10, 64)
			if err != nil || g < 1 || strings.HasPrefix(value, "+") {
				return out, fmt.Errorf("%s=%q: generation %q is not a positive integer", Applied, text, value)
			}
			out.Generation = g
			sections = append(sections[:2:2], sections[3:]...)
		}
	}
	if len(sections) > 2 {
		if value, ok := strings.CutPrefix(sections[2], "maxRatios="); ok {
			max, err := ParseList(value)
			if err != nil {
				return out, fmt.Errorf("%s=%q: %v", Applied, text, err)
			}
			out.MaxRatios = max
			sections = append(sections[:2:2], sections[3:]...)
		}
	}
	for i, name := range []string{"policy", "ratios", "usage"} {
		if i >= len(sections) {
			if name == "usage" {
				break
			}
			return out, fmt.Errorf("%s=%q: no %s=", Applied, text, name)
		}
		value, ok := strings.CutPrefix(sections[i], name+"=")
		if !ok {
			return out, fmt.Errorf("%s=%q: %q where %s= belongs", Applied, text, sections[i], name)
		}
		var err error
		switch name {
		case "policy":
			out.Policy = value
		case "ratios":
			out.Ratios, err = ParseList(value)
		default:
			out.Usage, err = ParseList(value)
		}
		if err != nil {
			return out, fmt.Errorf("%s=%q: %v", Applied, text, err)
		}
	}
	if len(sections) > 3 {
		return out, fmt.Errorf("%s=%q: %q after the last section", Applied, text, sections[3])
	}
	return out, nil
}
