package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// OvercommitPolicy mirrors the product's CRD (overcommit.dev/v1alpha1), read from the same
// YAML file format the product's --policy-file takes.
type OvercommitPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              OvercommitPolicySpec `json:"spec"`
}

type OvercommitPolicySpec struct {
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	Priority     int32                 `json:"priority,omitempty"`
	NodeRatios   map[string]string     `json:"nodeRatios,omitempty"`
	PodDefaults  *PodDefaults          `json:"podDefaults,omitempty"`
}

// policy is a validated policy with its parsed selector and ratios.
type policy struct {
	name         string
	priority     int32
	nodeSelector labels.Selector
	ratios       map[string]*big.Rat
	rawRatios    map[string]string
	pods         *podRules
}

func loadPolicyFile(path string) ([]policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []policy
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var p OvercommitPolicy
		if err := yaml.UnmarshalStrict(doc, &p); err != nil {
			return nil, fmt.Errorf("parsing %s: %w", path, err)
		}
		v, err := validate(p)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	// Highest priority first, ties broken by name.
	sort.Slice(out, func(i, j int) bool {
		if out[i].priority != out[j].priority {
			return out[i].priority > out[j].priority
		}
		return out[i].name < out[j].name
	})
	return out, nil
}

func validate(p OvercommitPolicy) (policy, error) {
	v := policy{name: p.Name, priority: p.Spec.Priority, ratios: map[string]*big.Rat{}, rawRatios: p.Spec.NodeRatios}
	if p.Name == "" {
		return v, errors.New("policy without metadata.name")
	}
	sel := labels.Everything()
	if p.Spec.NodeSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(p.Spec.NodeSelector)
		if err != nil {
			return v, fmt.Errorf("policy %s: nodeSelector: %w", p.Name, err)
		}
		sel = s
	}
	v.nodeSelector = sel
	one, ten := big.NewRat(1, 1), big.NewRat(10, 1)
	for res, s := range p.Spec.NodeRatios {
		r, ok := new(big.Rat).SetString(s)
		if !ok || r.Cmp(one) < 0 || r.Cmp(ten) > 0 {
			return v, fmt.Errorf("policy %s: nodeRatios[%s]=%q: want a decimal between 1 and 10", p.Name, res, s)
		}
		v.ratios[res] = r
	}
	if p.Spec.PodDefaults != nil {
		pr, err := parsePodDefaults(p.Name, p.Spec.PodDefaults)
		if err != nil {
			return v, err
		}
		v.pods = pr
	}
	return v, nil
}
