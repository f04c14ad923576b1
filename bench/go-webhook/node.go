package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// The node rule of kube-overcommit (src/inflate.rs), rewritten on the Go types: raw value per
// resource from the annotations when the incoming allocatable is what was last written, new
// allocatable = floor(raw x ratio), annotations record the raw values of inflated resources and
// the policy applied; no policy or opted out: back to raw, annotations removed.

const (
	annotationRaw     = "overcommit.dev/raw-allocatable"
	annotationApplied = "overcommit.dev/applied"
	labelDisabled     = "overcommit.dev/disabled"
)

// applied is what overcommit.dev/applied says (JSON field names of earlier versions).
type applied struct {
	Policy string            `json:"policy"`
	Ratios map[string]string `json:"ratios"`
}

// NodeCustomDefaulter inflates status.allocatable by policy, the way kube-overcommit does.
// Shaped as kubebuilder generates a CustomDefaulter.
type NodeCustomDefaulter struct {
	Policies []policy
}

// Default implements admission.CustomDefaulter. Errors are logged and the node is left
// untouched (fail open), never denied: node heartbeats must not be blocked.
func (d *NodeCustomDefaulter) Default(ctx context.Context, obj runtime.Object) error {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return fmt.Errorf("expected a Node object but got %T", obj)
	}
	if err := d.mutate(ctx, node); err != nil {
		logf.FromContext(ctx).Error(err, "node left unchanged", "node", node.Name)
	}
	return nil
}

// previous is what this webhook wrote last time, read back from the annotations.
type previous struct {
	raw    map[string]resource.Quantity
	rawTxt map[string]string
	ratios map[string]*big.Rat
}

func (p *previous) written(name string) (resource.Quantity, bool) {
	raw, ok := p.raw[name]
	if !ok {
		return resource.Quantity{}, false
	}
	if r, ok := p.ratios[name]; ok && !isOne(r) {
		return inflateOne(name, raw, r), true
	}
	return raw, true
}

func carriesAnnotations(a map[string]string) bool {
	_, raw := a[annotationRaw]
	_, app := a[annotationApplied]
	return raw || app
}

func (d *NodeCustomDefaulter) mutate(ctx context.Context, node *corev1.Node) error {
	prevAnnotations := node.Annotations
	if !carriesAnnotations(prevAnnotations) {
		prevAnnotations = storedAnnotations(ctx)
	}
	var prev *previous
	if carriesAnnotations(prevAnnotations) {
		p, err := readPrevious(prevAnnotations)
		if err != nil {
			logf.FromContext(ctx).Info("ignoring unreadable overcommit annotations", "reason", err.Error())
		} else {
			prev = p
		}
	}
	pol := d.choose(node)

	newAlloc := node.Status.Allocatable.DeepCopy()
	rawRecord := map[string]string{}
	for name, incoming := range node.Status.Allocatable {
		var ratio *big.Rat
		if pol != nil {
			if r, ok := pol.ratios[string(name)]; ok && !isOne(r) {
				ratio = r
			}
		}
		var prevRaw resource.Quantity
		var prevRawTxt string
		var written resource.Quantity
		hasPrev := false
		if prev != nil {
			if w, ok := prev.written(string(name)); ok {
				prevRaw, prevRawTxt, written, hasPrev = prev.raw[string(name)], prev.rawTxt[string(name)], w, true
			}
		}
		if ratio == nil && !hasPrev {
			continue // neither inflated before nor now: not ours
		}
		raw, rawTxt, fromIncoming := incoming, incoming.String(), true
		if hasPrev && written.Cmp(incoming) == 0 {
			raw, rawTxt, fromIncoming = prevRaw, prevRawTxt, false
		}
		desired := raw
		if ratio != nil {
			if fromIncoming {
				if capacity, ok := node.Status.Capacity[name]; ok && incoming.Cmp(capacity) > 0 {
					return fmt.Errorf("allocatable %s %s is above capacity %s and is not what this webhook last wrote", name, incoming.String(), capacity.String())
				}
			}
			rawRecord[string(name)] = rawTxt
			desired = inflateOne(string(name), raw, ratio)
		}
		newAlloc[name] = desired
	}

	node.Status.Allocatable = newAlloc
	if pol == nil {
		delete(node.Annotations, annotationRaw)
		delete(node.Annotations, annotationApplied)
		return nil
	}
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[annotationRaw] = listed(rawRecord)
	node.Annotations[annotationApplied] = "policy=" + pol.name + ";ratios=" + listed(pol.rawRatios)
	return nil
}

// listed writes name=value pairs joined by ",", sorted by name (the product's listed format).
func listed(m map[string]string) string {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, name := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(name + "=" + m[name])
	}
	return b.String()
}

// parseListed reads name=value pairs joined by "," (empty: none).
func parseListed(text string) (map[string]string, error) {
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

// parseApplied reads policy=NAME;ratios=PAIRS (a usage section is not written by this peer).
func parseApplied(text string) (applied, error) {
	var out applied
	policyPart, ratiosPart, ok := strings.Cut(text, ";")
	name, okPolicy := strings.CutPrefix(policyPart, "policy=")
	ratios, okRatios := strings.CutPrefix(ratiosPart, "ratios=")
	if !ok || !okPolicy || !okRatios || name == "" {
		return out, fmt.Errorf("%s=%q is not policy=NAME;ratios=PAIRS", annotationApplied, text)
	}
	parsed, err := parseListed(ratios)
	if err != nil {
		return out, err
	}
	return applied{Policy: name, Ratios: parsed}, nil
}

// storedAnnotations reads the stored node's (oldObject's) annotations, for a status writer
// that sent an object without them.
func storedAnnotations(ctx context.Context) map[string]string {
	req, err := admissionRequestFrom(ctx)
	if err != nil || len(req.OldObject.Raw) == 0 {
		return nil
	}
	var old struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if json.Unmarshal(req.OldObject.Raw, &old) != nil {
		return nil
	}
	return old.Metadata.Annotations
}

func readPrevious(a map[string]string) (*previous, error) {
	rawText, okRaw := a[annotationRaw]
	appliedText, okApplied := a[annotationApplied]
	if !okRaw || !okApplied {
		return nil, errors.New("one of the two overcommit annotations is missing")
	}
	// The listed format, or the JSON one of earlier versions (a text starting with "{").
	var rawStrings map[string]string
	var last applied
	var err error
	if strings.HasPrefix(strings.TrimSpace(rawText), "{") {
		err = json.Unmarshal([]byte(rawText), &rawStrings)
	} else {
		rawStrings, err = parseListed(rawText)
	}
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(strings.TrimSpace(appliedText), "{") {
		err = json.Unmarshal([]byte(appliedText), &last)
	} else {
		last, err = parseApplied(appliedText)
	}
	if err != nil {
		return nil, err
	}
	p := &previous{raw: map[string]resource.Quantity{}, rawTxt: rawStrings, ratios: map[string]*big.Rat{}}
	for k, v := range rawStrings {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, err
		}
		p.raw[k] = q
	}
	for k, v := range last.Ratios {
		r, ok := new(big.Rat).SetString(v)
		if !ok {
			return nil, fmt.Errorf("ratio %s=%q", k, v)
		}
		p.ratios[k] = r
	}
	return p, nil
}

// choose returns the highest-priority policy (ties by name) whose selector matches, or nil.
func (d *NodeCustomDefaulter) choose(node *corev1.Node) *policy {
	if node.Labels[labelDisabled] == "true" {
		return nil
	}
	set := labels.Set(node.Labels)
	for i := range d.Policies {
		if p := &d.Policies[i]; p.nodeSelector.Matches(set) {
			return p
		}
	}
	return nil
}

func isOne(r *big.Rat) bool { return r.Cmp(big.NewRat(1, 1)) == 0 }

// inflateOne is floor(raw x ratio): cpu in whole millicores, everything else in whole units.
func inflateOne(name string, raw resource.Quantity, r *big.Rat) resource.Quantity {
	if name == string(corev1.ResourceCPU) {
		return *resource.NewMilliQuantity(floorMul(raw.MilliValue(), r), resource.DecimalSI)
	}
	return *resource.NewQuantity(floorMul(raw.Value(), r), raw.Format)
}

func floorMul(v int64, r *big.Rat) int64 {
	n := new(big.Int).Mul(big.NewInt(v), r.Num())
	return new(big.Int).Div(n, r.Denom()).Int64() // Euclidean division: floor for v >= 0
}
