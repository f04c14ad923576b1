package install

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// InProcessBinding is the MutatingAdmissionPolicyBinding deploy/components/in-process ships
// (the leader never writes it: it only reads it and steps back once it equals the compiled one),
// renamed for a leader started with --webhook-config-name=name: its name and policyName.
func InProcessBinding(name string) (*unstructured.Unstructured, error) {
	u, err := shipped("binding.yaml", "MutatingAdmissionPolicyBinding", name)
	if err != nil {
		return nil, err
	}
	if err := unstructured.SetNestedField(u.Object, name, "spec", "policyName"); err != nil {
		return nil, err
	}
	return u, nil
}

// InProcessPolicy is the placeholder MutatingAdmissionPolicy deploy/components/in-process ships
// (fails open, matches nothing; the leader can update it, never create it), renamed for a
// leader started with --webhook-config-name=name.
func InProcessPolicy(name string) (*unstructured.Unstructured, error) {
	return shipped("policy.yaml", "MutatingAdmissionPolicy", name)
}

func shipped(file, kind, name string) (*unstructured.Unstructured, error) {
	path := filepath.Join(RepoRoot(), "deploy", "components", "in-process", file)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var obj map[string]any
	if err := yaml.Unmarshal(b, &obj); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	u := &unstructured.Unstructured{Object: obj}
	if u.GetKind() != kind {
		return nil, fmt.Errorf("%s: kind %q, want %q", path, u.GetKind(), kind)
	}
	u.SetName(name)
	return u, nil
}
