package deploytest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// TestClusterBinaryUnderRBAC runs the real kube-overcommit binary as two replicas with exactly the
// identity and permissions the manifests give its pods: a kubeconfig that impersonates the
// ServiceAccount kube-overcommit/kube-overcommit, under deploy/'s Role, ClusterRole and the
// webhook-guard admission policy. The replicas must bootstrap (Secrets, caBundle, webhook
// configuration), elect a leader, report themselves, become ready and inflate a node's
// allocatable by policy: proof that the RBAC is enough, not only that it is small.
func TestClusterBinaryUnderRBAC(t *testing.T) {
	cfg := clusterConfig(t)
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := os.Getenv("KUBE_OVERCOMMIT_BIN")
	if bin == "" {
		bin = filepath.Join(root, "target", "release", "kube-overcommit")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kube-overcommit binary: %v (run `make release`, or set KUBE_OVERCOMMIT_BIN)", err)
	}
	const ns = "kube-overcommit"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client := kubernetes.NewForConfigOrDie(cfg)
	ap, err := NewApplier(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// deploy/ with components/request-cap and components/in-process, without the Deployment and
	// its PDB: the replicas are local processes here, run with the flags the components add to
	// the Deployment (--request-cap, --mode=in-process), so the pod watch, the
	// ValidatingWebhookConfiguration and the compiled MutatingAdmissionPolicy are written under
	// the components' grants and the guards.
	b, err := Kustomize(root, "tests/deploy/testdata/components")
	if err != nil {
		t.Fatal(err)
	}
	all, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	var componentFlags []string
	for _, o := range all {
		if o.GetKind() != "Deployment" && o.GetKind() != "PodDisruptionBudget" {
			objs = append(objs, o)
			continue
		}
		if o.GetKind() == "Deployment" {
			d := convert[appsv1.Deployment](t, o)
			for _, a := range d.Spec.Template.Spec.Containers[0].Args {
				if a == "--request-cap" || strings.HasPrefix(a, "--mode") {
					componentFlags = append(componentFlags, a)
				}
			}
		}
	}
	if !slices.Equal(componentFlags, []string{"--request-cap", "--mode=in-process"}) {
		t.Fatalf("the components add %v to the Deployment, want --request-cap --mode=in-process", componentFlags)
	}
	// What the leader creates, removed after the test (the namespace takes the rest).
	mwc := &unstructured.Unstructured{}
	mwc.SetAPIVersion("admissionregistration.k8s.io/v1")
	mwc.SetKind("MutatingWebhookConfiguration")
	mwc.SetName("kube-overcommit")
	vwc := &unstructured.Unstructured{}
	vwc.SetAPIVersion("admissionregistration.k8s.io/v1")
	vwc.SetKind("ValidatingWebhookConfiguration")
	vwc.SetName("kube-overcommit")
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "overcommit.dev/v1alpha1", "kind": "OvercommitPolicy",
		"metadata": map[string]any{"name": "deploy-test-cpu"},
		"spec": map[string]any{
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"deploy-test": "overcommit"}},
			"nodeRatios":   map[string]any{"cpu": "2"},
		},
	}}
	// In-process mode: the compiled policy and its binding.
	compiled := func(kind string) *unstructured.Unstructured {
		o := &unstructured.Unstructured{}
		o.SetAPIVersion("admissionregistration.k8s.io/v1")
		o.SetKind(kind)
		o.SetName("kube-overcommit")
		return o
	}
	mapBinding, mapPolicy := compiled("MutatingAdmissionPolicyBinding"), compiled("MutatingAdmissionPolicy")
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer dcancel()
		if err := ap.Delete(dctx, append([]*unstructured.Unstructured{policy, mapBinding, mapPolicy, mwc, vwc}, objs...)); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := ap.Apply(ctx, objs); err != nil {
		t.Fatal(err)
	}

	// The pods' identity: the ServiceAccount, through impersonation by the admin kubeconfig.
	kc, err := clientcmd.LoadFromFile(os.Getenv("KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = "system:serviceaccount:" + ns + ":kube-overcommit"
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	dir := t.TempDir()
	saKubeconfig := filepath.Join(dir, "sa-kubeconfig")
	if err := clientcmd.WriteToFile(*kc, saKubeconfig); err != nil {
		t.Fatal(err)
	}

	kcp := filepath.Join(root, "tests", "cluster", "kcp.sh")
	type replica struct {
		name        string
		cmd, volume *exec.Cmd
		log         *syncBuffer
		done        chan struct{}
		addr        string
		probe       string
	}
	var replicas []*replica
	for i := range 2 {
		r := &replica{name: fmt.Sprintf("deploy-test-replica-%d", i), log: &syncBuffer{}, done: make(chan struct{})}
		tlsDir := filepath.Join(dir, r.name, "tls")
		if err := os.MkdirAll(tlsDir, 0o755); err != nil {
			t.Fatal(err)
		}
		// The serving Secret reaches the replica the way the kubelet mounts it.
		r.volume = exec.Command(kcp, "secret-volume", "--namespace", ns, "--name", "kube-overcommit-tls", "--dir", tlsDir, "--delay", "1s")
		r.volume.Stdout, r.volume.Stderr = os.Stderr, os.Stderr
		if err := r.volume.Start(); err != nil {
			t.Fatal(err)
		}
		r.addr, r.probe = freeAddr(t), freeAddr(t)
		r.cmd = exec.Command(bin, "serve", "--listen="+r.addr, "--probe-listen="+r.probe,
			"--tls-dir="+tlsDir, "--shutdown-grace=5s",
			// Exit with the test process, even if it is killed (a CI timeout).
			fmt.Sprintf("--exit-with-pid=%d", os.Getpid()))
		r.cmd.Args = append(r.cmd.Args, componentFlags...)
		r.cmd.Env = append(os.Environ(), "KUBECONFIG="+saKubeconfig, "POD_NAME="+r.name, "POD_NAMESPACE="+ns,
			"RUST_LOG=info,kube_client=warn,kube_runtime=warn")
		r.cmd.Stdout, r.cmd.Stderr = r.log, r.log
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = r.cmd.Wait(); close(r.done) }()
		replicas = append(replicas, r)
		out, err := exec.Command(kcp, "backend", "add", "--namespace", ns, "--service", "kube-overcommit", "--port", "443",
			"--addr", r.addr, "--ready-url", "http://"+r.probe+"/readyz").CombinedOutput()
		if err != nil {
			t.Fatalf("kcp backend add: %v: %s", err, out)
		}
	}
	t.Cleanup(func() {
		for _, r := range replicas {
			_ = r.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.done:
			case <-time.After(15 * time.Second):
				_ = r.cmd.Process.Kill()
				<-r.done
			}
			_ = r.volume.Process.Signal(syscall.SIGTERM)
			_, _ = r.volume.Process.Wait()
			_, _ = exec.Command(kcp, "backend", "remove", "--namespace", ns, "--service", "kube-overcommit", "--addr", r.addr).CombinedOutput()
			if t.Failed() {
				t.Logf("%s log:\n%s", r.name, tail(r.log.String(), 40))
			}
		}
	})

	// Every replica ready: it serves a certificate that chains to the live caBundle, which needs
	// the whole bootstrap done by the leader under the ServiceAccount's RBAC.
	httpc := &http.Client{Timeout: time.Second}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, r := range replicas {
			select {
			case <-r.done:
				return false, fmt.Errorf("%s exited", r.name)
			default:
			}
			if l := r.log.String(); strings.Contains(l, "is forbidden") {
				return false, fmt.Errorf("%s was refused by RBAC or the webhook guard:\n%s", r.name, tail(grepLines(l, "forbidden"), 3))
			}
			resp, err := httpc.Get("http://" + r.probe + "/readyz")
			if err != nil {
				return false, nil
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("replicas not ready under the ServiceAccount's RBAC: %v", err)
	}
	// What bootstrap wrote.
	for _, name := range []string{"kube-overcommit-tls", "kube-overcommit-ca"} {
		if _, err := client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("Secret %s: %v", name, err)
		}
	}
	got, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "kube-overcommit", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("webhook configuration: %v", err)
	}
	for _, w := range got.Webhooks {
		if len(w.ClientConfig.CABundle) == 0 {
			t.Errorf("webhook %s has no caBundle", w.Name)
		}
	}
	checkLeaderConfigUnderGuard(t, ctx, cfg, ns, got, replicas[0].log, replicas[1].log)
	checkLeaderValidatingConfig(t, ctx, cfg, ns, got)
	checkSecretQuota(t, ctx, cfg, ns)
	lease, err := client.CoordinationV1().Leases(ns).Get(ctx, "kube-overcommit-leader", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || !strings.HasPrefix(*lease.Spec.HolderIdentity, "deploy-test-replica-") {
		t.Errorf("leader Lease: %v %+v", err, lease)
	}
	for _, r := range replicas {
		if _, err := client.CoordinationV1().Leases(ns).Get(ctx, "kube-overcommit-leader-replica-"+r.name, metav1.GetOptions{}); err != nil {
			t.Errorf("replica report of %s: %v", r.name, err)
		}
	}

	// A node registered and kept alive like a kubelet (CREATE nodes, then PATCH nodes/status)
	// goes through the webhook and comes back inflated by the policy.
	if err := ap.Apply(ctx, []*unstructured.Unstructured{policy}); err != nil {
		t.Fatal(err)
	}
	const node = "deploy-test-node-0"
	fake := exec.Command(kcp, "fake-nodes", "--count", "1", "--prefix", "deploy-test-node", "--labels", "deploy-test=overcommit",
		// Report every 2 s even when nothing changed: if the API server's resolver has not yet
		// seen the replicas ready at registration, that review fails open (as designed) and an
		// unchanged node would otherwise not write again for 5 minutes.
		"--status-update-frequency", "1s", "--status-report-frequency", "2s", "--run-pods=false", "--delete-on-exit")
	fake.Stdout, fake.Stderr = os.Stderr, os.Stderr
	if err := fake.Start(); err != nil {
		t.Fatal(err)
	}
	fakeDone := make(chan struct{})
	go func() { _ = fake.Wait(); close(fakeDone) }()
	defer func() {
		_ = fake.Process.Signal(syscall.SIGTERM)
		select {
		case <-fakeDone:
		case <-time.After(15 * time.Second):
			_ = fake.Process.Kill()
			<-fakeDone
		}
	}()
	var last string
	var rawCPU float64 // cores, from the inflated allocatable (twice the raw value)
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		raw := n.Annotations["overcommit.dev/raw-allocatable"]
		last = fmt.Sprintf("allocatable cpu %s, raw %q", n.Status.Allocatable.Cpu(), raw)
		rawCPU = float64(n.Status.Allocatable.Cpu().MilliValue()) / 2000
		return raw != "" && inflated(n, raw), nil
	})
	if err != nil {
		t.Errorf("node %s never inflated by policy (the fake node writes its status at least every 2 s): %s", node, last)
	}
	t.Logf("node %s: %s", node, last)

	// In-process mode (--mode in-process): the leader, as the ServiceAccount, filled in the
	// placeholder policy the component ships under the component's grant (update only; a
	// refusal would be logged, checked below) and found the binding the component ships equal
	// to the one it compiles ("in place").
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		ar := client.AdmissionregistrationV1()
		p, err := ar.MutatingAdmissionPolicies().Get(ctx, "kube-overcommit", metav1.GetOptions{})
		if err != nil {
			last = fmt.Sprintf("policy: %v", err)
			return false, nil
		}
		b, err := ar.MutatingAdmissionPolicyBindings().Get(ctx, "kube-overcommit", metav1.GetOptions{})
		if err != nil {
			last = fmt.Sprintf("binding: %v", err)
			return false, nil
		}
		if p.Labels["app.kubernetes.io/managed-by"] != "kube-overcommit" || b.Spec.PolicyName != "kube-overcommit" ||
			p.Spec.MatchConstraints == nil || len(p.Spec.MatchConstraints.ResourceRules) != 2 ||
			!strings.Contains(grepLines(replicas[0].log.String()+replicas[1].log.String(), "MutatingAdmissionPolicyBinding"), "is in place") {
			last = fmt.Sprintf("policy %+v, binding %+v", p.Spec.MatchConstraints, b.Spec)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("the leader did not fill in the shipped MutatingAdmissionPolicy under the component's grant, or the binding is not the shipped one: %s", last)
	}
	// With the component, the ServiceAccount updates the policy of its name and only reads its
	// binding (TestClusterInProcessRBAC tries every write).
	user := "system:serviceaccount:" + ns + ":kube-overcommit"
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	for _, c := range []struct {
		allowed        bool
		verb, resource string
		name           string
	}{
		{false, "create", "mutatingadmissionpolicies", ""},
		{true, "update", "mutatingadmissionpolicies", "kube-overcommit"},
		{false, "patch", "mutatingadmissionpolicies", "kube-overcommit"},
		{false, "delete", "mutatingadmissionpolicies", "kube-overcommit"},
		{false, "update", "mutatingadmissionpolicies", "someone-else"},
		{true, "get", "mutatingadmissionpolicybindings", "kube-overcommit"},
		{false, "create", "mutatingadmissionpolicybindings", ""},
		{false, "update", "mutatingadmissionpolicybindings", "kube-overcommit"},
		{false, "patch", "mutatingadmissionpolicybindings", "kube-overcommit"},
		{false, "delete", "mutatingadmissionpolicybindings", "kube-overcommit"},
	} {
		attrs := authorizationv1.ResourceAttributes{Verb: c.verb, Group: "admissionregistration.k8s.io", Resource: c.resource, Name: c.name}
		if allowed, reason := accessAllowed(t, ctx, client, user, groups, attrs); allowed != c.allowed {
			t.Errorf("with components/in-process: %s %s %q allowed=%v, want %v (%s)", c.verb, c.resource, c.name, allowed, c.allowed, reason)
		}
	}

	// The leader's node metadata watch works under the ServiceAccount (list, watch nodes): its
	// /metrics has the node's raw cpu, the other replica's has none.
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		lease, err := client.CoordinationV1().Leases(ns).Get(ctx, "kube-overcommit-leader", metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil {
			return false, nil
		}
		for _, r := range replicas {
			text, err := get(httpc, "http://"+r.probe+"/metrics")
			if err != nil {
				return false, nil
			}
			series := grepLines(text, "kube_overcommit_node_raw_allocatable{")
			if r.name == *lease.Spec.HolderIdentity {
				last = fmt.Sprintf("leader %s: %q, want cpu %v", r.name, series, rawCPU)
				cpu := grepLines(series, `node="`+node+`",resource="cpu",unit="core"}`)
				v, err := strconv.ParseFloat(cpu[strings.LastIndexByte(cpu, ' ')+1:], 64)
				if err != nil || v != rawCPU {
					return false, nil
				}
			} else if series != "" {
				last = fmt.Sprintf("%s does not lead and exports %q", r.name, series)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("kube_overcommit_node_raw_allocatable of %s not exported by the leader alone: %s", node, last)
	}

	for _, r := range replicas {
		if l := strings.ToLower(r.log.String()); strings.Contains(l, "forbidden") || strings.Contains(l, " 403") {
			t.Errorf("%s logged an authorization failure:\n%s", r.name, tail(r.log.String(), 40))
		}
	}
}

// checkLeaderConfigUnderGuard: the configuration the leader wrote (live) has the match
// conditions and passes the webhook guard; a cluster admin's widening (the guard does not bind
// admins) is repaired by the leader, as the ServiceAccount, within seconds; and every widening of
// the live configuration is refused for the ServiceAccount (dry run).
func checkLeaderConfigUnderGuard(t *testing.T, ctx context.Context, cfg *rest.Config, ns string, live *admissionregistrationv1.MutatingWebhookConfiguration, logs ...*syncBuffer) {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(cfg).AdmissionregistrationV1().MutatingWebhookConfigurations()
	want := leaderConfig(ns)
	if len(live.Webhooks) != len(want.Webhooks) {
		t.Fatalf("the leader wrote %d webhooks, want %d", len(live.Webhooks), len(want.Webhooks))
	}
	for i, w := range live.Webhooks {
		if w.Name != want.Webhooks[i].Name || !reflect.DeepEqual(w.MatchConditions, want.Webhooks[i].MatchConditions) {
			t.Errorf("webhook %d: %s with matchConditions %+v, want %s with %+v", i, w.Name, w.MatchConditions, want.Webhooks[i].Name, want.Webhooks[i].MatchConditions)
		}
	}
	edited := live.DeepCopy()
	edited.Webhooks[0].MatchConditions = nil
	edited.Webhooks[0].TimeoutSeconds = ptr(int32(5))
	edited.Webhooks[1].NamespaceSelector = nil
	edited.Webhooks[1].MatchConditions = nil
	if _, err := admin.Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("admin edit of the webhook configuration: %v", err)
	}
	var last *admissionregistrationv1.MutatingWebhookConfiguration
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		m, err := admin.Get(ctx, "kube-overcommit", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = m
		return len(m.Webhooks) == 2 && len(m.Webhooks[0].MatchConditions) == 1 && len(m.Webhooks[1].MatchConditions) == 1 &&
			m.Webhooks[0].TimeoutSeconds != nil && *m.Webhooks[0].TimeoutSeconds == 2 &&
			m.Webhooks[1].NamespaceSelector != nil && len(m.Webhooks[1].NamespaceSelector.MatchExpressions) == 2, nil
	})
	if err != nil {
		t.Fatalf("the leader did not repair the widened configuration under the guard: %+v", last)
	}
	repairedBy := ""
	for i, l := range logs {
		if strings.Contains(l.String(), "repaired the webhook configuration") {
			repairedBy = fmt.Sprint(i)
		}
	}
	if repairedBy == "" {
		t.Error("no replica logged the repair")
	}
	t.Logf("the leader repaired an admin's widening as the ServiceAccount (replica %s)", repairedBy)

	sa := asServiceAccount(cfg, ns)
	asSA := kubernetes.NewForConfigOrDie(sa).AdmissionregistrationV1().MutatingWebhookConfigurations()
	dry := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := asSA.Update(ctx, last, dry); err != nil {
		t.Errorf("the leader's own configuration is refused for the ServiceAccount: %v", err)
	}
	for name, widen := range guardWidenings(ns) {
		m := last.DeepCopy()
		widen(m)
		var err error
		if m.Name != "kube-overcommit" {
			m.ResourceVersion = ""
			_, err = asSA.Create(ctx, m, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		} else {
			_, err = asSA.Update(ctx, m, dry)
		}
		if err == nil {
			t.Errorf("%s of the live configuration: allowed for the ServiceAccount", name)
		} else if !strings.Contains(err.Error(), "kube-overcommit-webhook-guard") && !apierrors.IsForbidden(err) {
			t.Errorf("%s of the live configuration: refused, but not by the guard or RBAC: %v", name, err)
		}
	}
}

// checkLeaderValidatingConfig: with --request-cap the leader, as the ServiceAccount under the
// guard, created the ValidatingWebhookConfiguration of the cap: the webhooks of
// leaderValidatingConfig, with the mutating configuration's caBundle; the ServiceAccount may
// write it back unchanged (dry run) but none of the widenings.
func checkLeaderValidatingConfig(t *testing.T, ctx context.Context, cfg *rest.Config, ns string, mutating *admissionregistrationv1.MutatingWebhookConfiguration) {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(cfg).AdmissionregistrationV1().ValidatingWebhookConfigurations()
	var live *admissionregistrationv1.ValidatingWebhookConfiguration
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		v, err := admin.Get(ctx, "kube-overcommit", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		live = v
		return true, nil
	})
	if err != nil {
		t.Fatalf("the leader did not create the ValidatingWebhookConfiguration under RBAC and the guard")
	}
	want := leaderValidatingConfig(ns)
	if len(live.Webhooks) != len(want.Webhooks) {
		t.Fatalf("the leader wrote %d validating webhooks, want %d", len(live.Webhooks), len(want.Webhooks))
	}
	for i, w := range live.Webhooks {
		x := want.Webhooks[i]
		if w.Name != x.Name || !reflect.DeepEqual(w.MatchConditions, x.MatchConditions) || !reflect.DeepEqual(w.Rules, x.Rules) ||
			!reflect.DeepEqual(w.NamespaceSelector, x.NamespaceSelector) || *w.FailurePolicy != *x.FailurePolicy ||
			*w.ClientConfig.Service.Path != *x.ClientConfig.Service.Path {
			t.Errorf("validating webhook %d: %+v\nwant %+v", i, w, x)
		}
		if !bytes.Equal(w.ClientConfig.CABundle, mutating.Webhooks[0].ClientConfig.CABundle) {
			t.Errorf("validating webhook %s: caBundle differs from the mutating configuration's", w.Name)
		}
	}
	sa := asServiceAccount(cfg, ns)
	asSA := kubernetes.NewForConfigOrDie(sa).AdmissionregistrationV1().ValidatingWebhookConfigurations()
	dry := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := asSA.Update(ctx, live, dry); err != nil {
		t.Errorf("the leader's own validating configuration is refused for the ServiceAccount: %v", err)
	}
	for name, widen := range validatingWidenings(ns) {
		v := live.DeepCopy()
		widen(v)
		if _, err := asSA.Update(ctx, v, dry); refusedByGuard(err) != nil {
			t.Errorf("%s of the live validating configuration: %v", name, refusedByGuard(err))
		}
	}
}

// checkSecretQuota: the ServiceAccount may create Secrets (RBAC cannot limit create by name),
// but deploy/'s ResourceQuota stops it at count/secrets, counting the two it has written.
func checkSecretQuota(t *testing.T, ctx context.Context, cfg *rest.Config, ns string) {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(cfg)
	sa := asServiceAccount(cfg, ns)
	secrets := kubernetes.NewForConfigOrDie(sa).CoreV1().Secrets(ns)
	q, err := admin.CoreV1().ResourceQuotas(ns).Get(ctx, "kube-overcommit", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("ResourceQuota: %v", err)
	}
	hard := q.Spec.Hard["count/secrets"]
	created, refusal := 0, ""
	defer func() {
		for i := range created {
			_ = admin.CoreV1().Secrets(ns).Delete(context.Background(), fmt.Sprintf("quota-probe-%d", i), metav1.DeleteOptions{})
		}
	}()
	// Until the quota controller has counted the namespace, admission answers "status unknown".
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("quota-probe-%d", created)}}, metav1.CreateOptions{})
		switch {
		case err == nil:
			created++
			return int64(created) > hard.Value(), nil
		case strings.Contains(err.Error(), "exceeded quota"):
			refusal = err.Error()
			return true, nil
		case strings.Contains(err.Error(), "status unknown for quota"):
			return false, nil
		default:
			return false, err
		}
	})
	if err != nil || refusal == "" {
		t.Fatalf("the ServiceAccount created %d Secrets without a quota refusal (count/secrets %s): %v", created, hard.String(), err)
	}
	list, err := admin.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(list.Items)) != hard.Value() {
		t.Errorf("%d Secrets in %s when the quota refused, want count/secrets %s", len(list.Items), ns, hard.String())
	}
	t.Logf("the ServiceAccount created %d Secrets beside kube-overcommit's, then: %s", created, refusal)
}

// inflated: allocatable cpu is twice the raw value in the annotation ({"cpu":"4",...}).
func inflated(n *corev1.Node, raw string) bool {
	// The listed format (cpu=4,memory=16Gi), or the JSON one of earlier versions.
	cpu := ""
	for _, entry := range strings.Split(raw, ",") {
		if v, ok := strings.CutPrefix(entry, "cpu="); ok {
			cpu = v
		}
	}
	if i := strings.Index(raw, `"cpu":"`); i >= 0 {
		cpu, _, _ = strings.Cut(raw[i+len(`"cpu":"`):], `"`)
	}
	if cpu == "" {
		return false
	}
	q, err := resource.ParseQuantity(cpu)
	if err != nil {
		return false
	}
	return n.Status.Allocatable.Cpu().MilliValue() == 2*q.MilliValue()
}

// get returns the body of a 200 answer.
func get(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), nil
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// syncBuffer is a bytes.Buffer safe for a process writing while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// The flags the manifests pass to `serve` (kustomize, and the chart with every optional value
// set) are all accepted by the release binary: parsed up to --help, which then exits 0.
func TestClusterBinaryAcceptsManifestFlags(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := os.Getenv("KUBE_OVERCOMMIT_BIN")
	if bin == "" {
		bin = filepath.Join(root, "target", "release", "kube-overcommit")
	}
	helm, err := HelmBinary(root)
	if err != nil {
		t.Fatal(err)
	}
	kz, err := Kustomize(root, "deploy")
	if err != nil {
		t.Fatal(err)
	}
	hm, err := HelmTemplate(root, helm, "kube-overcommit",
		"--set", "webhook.timeoutSeconds=3", "--set", "certificates.caValidity=8760h", "--set", "certificates.leafValidity=72h",
		"--set", "certificates.checkInterval=10s", "--set", "certificates.propagationDelay=3m",
		"--set", "leaderElection.leaseDuration=20s", "--set", "leaderElection.renewPeriod=4s",
		"--set", "extraArgs={--idle-timeout=60s}", "--set", "requestCap.enabled=true", "--set", "inProcess.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	// deploy/ with the optional components' flags (--request-cap, --mode=in-process).
	kc, err := Kustomize(root, "tests/deploy/testdata/components")
	if err != nil {
		t.Fatal(err)
	}
	for name, stream := range map[string][]byte{"kustomize": kz, "kustomize-components": kc, "helm": hm} {
		objs, err := Parse(stream)
		if err != nil {
			t.Fatal(err)
		}
		d := Find(objs, "Deployment", "kube-overcommit")
		if d == nil {
			t.Fatalf("%s: no Deployment", name)
		}
		containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
		if name == "helm" && len(args) < 12 {
			t.Errorf("helm rendered only %v", args)
		}
		out, err := exec.Command(bin, append(args, "--help")...).CombinedOutput()
		if err != nil {
			t.Errorf("%s: kube-overcommit %s: %v\n%s", name, strings.Join(args, " "), err, tail(string(out), 10))
		}
	}
}
