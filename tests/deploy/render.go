// Package deploytest checks kube-overcommit's install manifests (deploy/ kustomize and the Helm
// chart): statically (render, compare, security invariants, PromQL) and on the local control
// plane of tests/cluster (server-side apply, scheduling, the PodDisruptionBudget under drains).
package deploytest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// RepoRoot is the directory holding Cargo.toml and deploy/, found upwards from the working
// directory (go test runs in tests/deploy).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if fileExists(filepath.Join(dir, "Cargo.toml")) && fileExists(filepath.Join(dir, "deploy", "kustomization.yaml")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root (Cargo.toml + deploy/kustomization.yaml) not found above the working directory")
		}
		dir = parent
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Kustomize builds the kustomization in dir (relative to the repository root) in-process, with
// the same library kubectl embeds, and returns the YAML stream.
func Kustomize(root, dir string) ([]byte, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(root, dir))
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return m.AsYaml()
}

// HelmBinary is $HELM, or the helm that tests/tools.sh installs (from the Go module proxy into the
// user's cache).
func HelmBinary(root string) (string, error) {
	if h := os.Getenv("HELM"); h != "" {
		return h, nil
	}
	out, err := exec.Command(filepath.Join(root, "tests", "tools.sh"), "helm").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("tests/tools.sh helm: %w: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("tests/tools.sh helm: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// HelmTemplate renders charts/kube-overcommit into namespace ns with extra arguments (--set ...).
func HelmTemplate(root, helm, ns string, args ...string) ([]byte, error) {
	full := append([]string{"template", "kube-overcommit", filepath.Join(root, "charts", "kube-overcommit"), "--namespace", ns}, args...)
	cmd := exec.Command(helm, full...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %w: %s", strings.Join(full, " "), err, stderr.String())
	}
	return out, nil
}

// Parse splits a YAML stream into objects, skipping empty documents.
func Parse(stream []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// Find returns the object of the given kind and name, or nil.
func Find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// Key names an object: Kind/namespace/name.
func Key(o *unstructured.Unstructured) string {
	return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
}

// MonitoringCRDs generates the ServiceMonitor and PrometheusRule CRDs from the Prometheus
// Operator's Go types (the module this test already depends on), with controller-gen as the
// operator's own build does, so that the monitoring objects can be applied to the local control
// plane and validated by its API server against the real schema.
func MonitoringCRDs(root, outDir string) ([]*unstructured.Unstructured, error) {
	out, err := exec.Command(filepath.Join(root, "tests", "tools.sh"), "controller-gen").Output()
	if err != nil {
		return nil, fmt.Errorf("tests/tools.sh controller-gen: %w", err)
	}
	cg := strings.TrimSpace(string(out))
	cmd := exec.Command(cg, "crd:crdVersions=v1,allowDangerousTypes=true,maxDescLen=0",
		"paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1",
		"output:crd:dir="+outDir)
	cmd.Dir = filepath.Join(root, "tests", "deploy")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("controller-gen: %w: %s", err, b)
	}
	var objs []*unstructured.Unstructured
	for _, f := range []string{"monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml"} {
		b, err := os.ReadFile(filepath.Join(outDir, f))
		if err != nil {
			return nil, err
		}
		o, err := Parse(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		objs = append(objs, o...)
	}
	return objs, nil
}
