package e2e

// --cert-source=cert-manager (issue 38) on a real cert-manager: its controllers and cainjector
// built from the github.com/cert-manager/cert-manager module (tests/cluster/certmanager), its
// CRDs, and deploy/components/cert-manager's objects, against this control plane.

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
)

const (
	cmInjectAnnotation = "cert-manager.io/inject-ca-from-secret"
	// deploy/components/cert-manager: cainjector reads ca.crt of the CA's own Secret.
	cmCASecret = "kube-overcommit-cert-manager-ca"
	// cainjector's identity here: another ServiceAccount, as in a cert-manager install.
	cmCAInjectorUser = "system:serviceaccount:cert-manager:cert-manager-cainjector"
)

var certificatesGVR = schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "certificates"}

// buildCertManager builds (or finds cached) cert-manager's controller and cainjector and its CRDs.
func buildCertManager(t *testing.T) (bin, crds string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(harness.ModuleDir(), "certmanager", "build.sh"), "build")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tests/cluster/certmanager/build.sh build: %v\n%s", err, stderr.String())
	}
	bin = strings.TrimSpace(string(out))
	return bin, bin + ".crds.yaml"
}

// startCertManager runs `cert-manager controller|cainjector` for namespace ns until the test
// ends; cainjector impersonates its own ServiceAccount (not kube-overcommit's).
func startCertManager(t *testing.T, bin, ns string) {
	t.Helper()
	kubeconfig := impersonatingKubeconfig(t, cmCAInjectorUser)
	for component, config := range map[string]string{"controller": shared.Kubeconfig, "cainjector": kubeconfig} {
		dir := filepath.Join(shared.RunDir, "logs")
		if d := os.Getenv("CERT_MANAGER_LOG_DIR"); d != "" {
			dir = d // kept after the run (the run directory is not)
		}
		logPath := filepath.Join(dir, "cert-manager-"+ns+"-"+component+".log")
		logf, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		args := []string{component, "--kubeconfig", config, "--namespace", ns}
		if v := os.Getenv("CERT_MANAGER_VERBOSITY"); v != "" {
			args = append(args, "-v", v)
		}
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		logf.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			if t.Failed() {
				tailLog(t, logPath, 60)
			}
		})
	}
}

// impersonatingKubeconfig: the admin kubeconfig acting as user (with system:masters, so that
// RBAC allows what cert-manager's own ClusterRoles would).
func impersonatingKubeconfig(t *testing.T, user string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(shared.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		a.Impersonate = user
		a.ImpersonateGroups = []string{"system:masters", "system:authenticated"}
	}
	path := filepath.Join(t.TempDir(), "cainjector.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// componentFile: a file of deploy/components/cert-manager for namespace ns (the component is
// written for kube-overcommit), with cluster-scoped names made unique to the test.
func componentFile(t *testing.T, name, ns string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(install.RepoRoot(), "deploy", "components", "cert-manager", name))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.NewReplacer(
		"namespace: kube-overcommit", "namespace: "+ns,
		"kube-overcommit.kube-overcommit", "kube-overcommit."+ns,
		"system:serviceaccount:kube-overcommit:kube-overcommit", "system:serviceaccount:"+ns+":kube-overcommit",
		"'kube-overcommit/"+cmCASecret+"'", "'"+ns+"/"+cmCASecret+"'",
		"name: kube-overcommit-cabundle-guard", "name: "+ns+"-cabundle-guard",
		"policyName: kube-overcommit-cabundle-guard", "policyName: "+ns+"-cabundle-guard",
	).Replace(string(data))
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func kubectlApply(t *testing.T, path string) {
	t.Helper()
	if out, err := shared.Kubectl("apply", "--server-side", "--force-conflicts", "-f", path); err != nil {
		t.Fatalf("kubectl apply %s: %v\n%s", path, err, out)
	}
}

var netDialer = net.Dialer{Timeout: 5 * time.Second}

// servedLeaf: the fingerprint of the leaf a replica presents on its webhook port.
func servedLeaf(addr string) (string, error) {
	conn, err := tls.DialWithDialer(&netDialer, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only reads the leaf
	if err != nil {
		return "", err
	}
	defer conn.Close()
	certs := conn.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return "", errors.New("no certificate presented")
	}
	return fingerprint(certs[0].Raw), nil
}

// apiserverX509Errors counts x509 failures in the API server's logs (the calls to a webhook
// whose certificate it does not trust).
func apiserverX509Errors(t *testing.T) int {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(shared.RunDir, "logs", "*apiserver*.log"))
	if len(logs) == 0 {
		t.Fatalf("no API server log under %s/logs", shared.RunDir)
	}
	n := 0
	for _, l := range logs {
		data, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		n += bytes.Count(data, []byte("x509:"))
	}
	return n
}

// With deploy/components/cert-manager's Issuers and Certificates and --cert-source=cert-manager:
// cert-manager issues the serving Secret, cainjector fills the caBundle of both configurations
// (under the caBundle guard, which does not match it), the replicas serve the Secret and become
// ready, and the API server's webhook calls succeed. Under fake kubelets writing status every
// second, a forced renewal (cmctl renew: the Certificate's Issuing condition), then a CA change
// (the CA Certificate renewed: a new key) followed by a renewal from the new CA: no failed
// write, no failed webhook call, no x509 error. The guard refuses a caBundle change by
// kube-overcommit's ServiceAccount and allows it the leader's repair write.
func TestCertManagerSource(t *testing.T) {
	t.Parallel()
	// Before the shared turn, which other tests wait for: on a fresh machine `make test` is
	// still building cert-manager in the background when the e2e tests start.
	bin, crds := buildCertManager(t)
	takeSharedTurn(t)
	ctx := harness.Context(t, 10*time.Minute)
	ns := uniqueName("ko-cm")
	rs, certs := certManagerInstall(t, ctx, ns, bin, crds, true)

	// cert-manager issues the Secret; cainjector fills both caBundles with its ca.crt.
	if err := harness.Eventually(3*time.Minute, 250*time.Millisecond, func() error { return injected(ctx, ns) }); err != nil {
		t.Fatalf("cert-manager: %v", err)
	}
	if err := rs.in.WaitReady(3, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := shared.WaitBackendsReady(ns, koService, 3, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// The leader issued nothing of its own.
	if _, err := shared.Client.CoreV1().Secrets(ns).Get(ctx, koCAName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the leader's CA Secret exists under --cert-source=cert-manager (err %v)", err)
	}

	m := watchMutations(t, ctx, koNodeLabelKey+"="+ns, "4", "8")
	nodes := startLeaderNodes(t, ns)
	if err := harness.Eventually(60*time.Second, 250*time.Millisecond, func() error { return m.check(len(nodes.Names)) }); err != nil {
		t.Fatalf("nodes not inflated over the cert-manager certificate: %v", err)
	}
	w := startWindow(t, ctx, nodes)
	renewed := forceRenewal(t, ctx, certs, rs)
	writesGoOn(t, nodes)
	w.seamless("renewal to leaf "+renewed[:12], m)
	caChange(t, ctx, certs, rs, nodes, m)
	checkCABundleGuard(t, ctx, ns)
}

// window: what the API server and the fake kubelets counted when it began.
type window struct {
	t      *testing.T
	ctx    context.Context
	nodes  *harness.FakeNodes
	calls  webhookCounts
	writes harness.FakeNodeStats
	x509   int
}

func startWindow(t *testing.T, ctx context.Context, nodes *harness.FakeNodes) *window {
	t.Helper()
	w := &window{t: t, ctx: ctx, nodes: nodes, x509: apiserverX509Errors(t)}
	var err error
	if w.calls, err = apiserverWebhookCounts(ctx); err != nil {
		t.Fatal(err)
	}
	if w.writes, err = nodes.Stats(); err != nil {
		t.Fatal(err)
	}
	return w
}

// seamless: since the window began, no status write failed, every one had its webhook call
// answered, none failed open or got another code, no x509 error was logged, and every stored
// status was mutated. (The kubelets' counts are read before the API server's: a write counts
// once it has returned, after its call was counted.)
func (w *window) seamless(what string, m *mutationWatch) {
	t := w.t
	t.Helper()
	st, err := w.nodes.Stats()
	if err != nil {
		t.Fatal(err)
	}
	after, err := apiserverWebhookCounts(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	x509 := apiserverX509Errors(t)
	writes := st.StatusWrites.Attempts - w.writes.StatusWrites.Attempts
	failed := st.StatusWrites.Failures - w.writes.StatusWrites.Failures
	before := w.calls
	t.Logf("%s: %d status writes, %d failed; webhook calls answered %v, fail-open %v -> %v, other codes %v -> %v; x509 errors in the API server log %d -> %d",
		what, writes, failed, after.Answered-before.Answered, before.FailOpen, after.FailOpen, before.Other, after.Other, w.x509, x509)
	if failed != 0 || after.FailOpen != before.FailOpen || after.Other != before.Other || x509 != w.x509 {
		t.Fatalf("%s was not seamless (figures above)", what)
	}
	// A kubelet counts a write when it returns, the API server its call before that: a write in
	// flight when the window began (at most one per node: each writes in turn) can be counted
	// here with its call counted before. (make test, once: 13 calls for 14 writes.)
	inFlight := int64(len(w.nodes.Names))
	if answered := after.Answered - before.Answered; answered < float64(writes-inFlight) || writes == 0 {
		t.Fatalf("%v reviews answered for %d status writes (%d may have been in flight at the start)", answered, writes, inFlight)
	}
	if err := m.check(len(w.nodes.Names)); err != nil {
		t.Fatal(err)
	}
}

// writesGoOn waits for 10 more status writes (5 s of the two nodes' writes).
func writesGoOn(t *testing.T, nodes *harness.FakeNodes) {
	t.Helper()
	from, err := nodes.Stats()
	if err != nil {
		t.Fatal(err)
	}
	err = harness.Eventually(30*time.Second, 250*time.Millisecond, func() error {
		st, err := nodes.Stats()
		if err != nil {
			return err
		}
		if n := st.StatusWrites.Attempts - from.StatusWrites.Attempts; n < 10 {
			return fmt.Errorf("%d status writes so far", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// certManagerInstall: cert-manager's CRDs, the replicas with --cert-source=cert-manager and
// --request-cap (and extra flags) in namespace ns, (with guard) the caBundle guard, cert-manager's
// controller and cainjector (bin, built by buildCertManager with its CRDs in crds), and the
// component's Issuers and Certificates.
func certManagerInstall(t *testing.T, ctx context.Context, ns, bin, crds string, guard bool, extra ...string) (*replicaSet, dynamic.ResourceInterface) {
	t.Helper()
	kubectlApply(t, crds)
	// The flags deploy/components/cert-manager adds.
	flags := []string{"--cert-source=cert-manager", "--cert-manager-ca-secret=" + cmCASecret, "--request-cap"}
	rs := startReplicasWithPolicy(t, ctx, ns, 3, "  nodeRatios:\n    cpu: \"2\"\n", append(flags, extra...)...)
	if guard {
		path := componentFile(t, "cabundle-guard.yaml", ns)
		kubectlApply(t, path)
		t.Cleanup(func() { _, _ = shared.Kubectl("delete", "--ignore-not-found", "-f", path) })
	}
	dyn, err := dynamic.NewForConfig(shared.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	certs := dyn.Resource(certificatesGVR).Namespace(ns)
	if err := harness.Eventually(60*time.Second, 250*time.Millisecond, func() error {
		_, err := certs.List(ctx, metav1.ListOptions{})
		return err
	}); err != nil {
		t.Fatalf("cert-manager CRDs not served: %v", err)
	}
	startCertManager(t, bin, ns)
	kubectlApply(t, componentFile(t, "certificates.yaml", ns))
	return rs, certs
}

// injected: the serving Secret exists and both configurations carry cainjector's annotation and
// the CA's certificate as caBundle.
func injected(ctx context.Context, ns string) error {
	secret, err := shared.Client.CoreV1().Secrets(ns).Get(ctx, koServingName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("serving Secret: %w", err)
	}
	if len(secret.Data["tls.crt"]) == 0 || len(secret.Data["ca.crt"]) == 0 {
		return errors.New("serving Secret without tls.crt or ca.crt")
	}
	return bundleInjected(ctx, ns, cmInjectAnnotation, ns+"/"+cmCASecret, secret.Data["ca.crt"])
}

// bundleInjected: both configurations carry the annotation key: value and want as caBundle.
func bundleInjected(ctx context.Context, ns, key, value string, want []byte) error {
	adm := shared.Client.AdmissionregistrationV1()
	mutating, err := adm.MutatingWebhookConfigurations().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		return err
	}
	validating, err := adm.ValidatingWebhookConfigurations().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		return err
	}
	check := func(kind string, annotations map[string]string, bundles [][]byte) error {
		if annotations[key] != value {
			return fmt.Errorf("%s: %s = %q, want %q", kind, key, annotations[key], value)
		}
		for _, b := range bundles {
			if !bytes.Equal(b, want) {
				return fmt.Errorf("%s: caBundle (%d certificates, %d bytes) is not the injected CA data (%d certificates, %d bytes) yet",
					kind, len(pemCerts(b)), len(b), len(pemCerts(want)), len(want))
			}
		}
		return nil
	}
	var mb, vb [][]byte
	for _, w := range mutating.Webhooks {
		mb = append(mb, w.ClientConfig.CABundle)
	}
	for _, w := range validating.Webhooks {
		vb = append(vb, w.ClientConfig.CABundle)
	}
	if err := check("mutating", mutating.Annotations, mb); err != nil {
		return err
	}
	return check("validating", validating.Annotations, vb)
}

// forceRenewal renews the serving Certificate (triggerIssuing) and waits until every replica
// serves the new leaf; returns its fingerprint.
func forceRenewal(t *testing.T, ctx context.Context, certs dynamic.ResourceInterface, rs *replicaSet) string {
	t.Helper()
	secret, err := shared.Client.CoreV1().Secrets(rs.ns).Get(ctx, koServingName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := pemCerts(secret.Data["tls.crt"])
	if len(old) == 0 {
		t.Fatal("no leaf in the serving Secret")
	}
	triggerIssuing(t, ctx, certs, "kube-overcommit")
	oldFP := fingerprint(old[0].Raw)
	var newFP string
	err = harness.Eventually(2*time.Minute, 250*time.Millisecond, func() error {
		s, err := shared.Client.CoreV1().Secrets(rs.ns).Get(ctx, koServingName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		leaf := pemCerts(s.Data["tls.crt"])
		if len(leaf) == 0 || fingerprint(leaf[0].Raw) == oldFP {
			return errors.New("the serving Secret still holds the old leaf")
		}
		newFP = fingerprint(leaf[0].Raw)
		for _, r := range rs.in.Replicas() {
			fp, err := servedLeaf(r.Listen)
			if err != nil {
				return fmt.Errorf("replica %s: %w", r.Identity(), err)
			}
			if fp != newFP {
				return fmt.Errorf("replica %s still serves %.12s", r.Identity(), fp)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("renewal: %v", err)
	}
	return newFP
}

// triggerIssuing does what `cmctl renew` does: the Certificate's Issuing condition, through the
// status subresource.
func triggerIssuing(t *testing.T, ctx context.Context, certs dynamic.ResourceInterface, name string) {
	t.Helper()
	err := harness.Eventually(30*time.Second, 250*time.Millisecond, func() error {
		c, err := certs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conditions, _, _ := unstructured.NestedSlice(c.Object, "status", "conditions")
		conditions = append(conditions, map[string]any{
			"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
			"message":            "Certificate re-issuance manually triggered",
			"lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
			"observedGeneration": c.GetGeneration(),
		})
		if err := unstructured.SetNestedSlice(c.Object, conditions, "status", "conditions"); err != nil {
			return err
		}
		_, err = certs.UpdateStatus(ctx, c, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("trigger the renewal of %s: %v", name, err)
	}
}

// checkCABundleGuard: kube-overcommit's ServiceAccount (with RBAC to update the configuration)
// may write the configuration with its caBundle as it is, and is refused a changed caBundle or
// another cainjector source.
func checkCABundleGuard(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	user := "system:serviceaccount:" + ns + ":kube-overcommit"
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-configs"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"admissionregistration.k8s.io"},
			Resources: []string{"mutatingwebhookconfigurations"}, ResourceNames: []string{ns}, Verbs: []string{"get", "update"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-configs"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}},
	}
	rbac := shared.Client.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rbac.ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{}) })
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rbac.ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	sa := rest.CopyConfig(shared.RestConfig)
	sa.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	client, err := kubernetes.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	configs := client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	dry := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	guardName := ns + "-cabundle-guard"
	edit := func(f func(*admissionregistrationv1.MutatingWebhookConfiguration)) error {
		cfg, err := configs.Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			return err
		}
		f(cfg)
		_, err = configs.Update(ctx, cfg, dry)
		return err
	}
	refused := func(what string, f func(*admissionregistrationv1.MutatingWebhookConfiguration)) {
		err := harness.Eventually(30*time.Second, 250*time.Millisecond, func() error {
			err := edit(f)
			if err == nil {
				return fmt.Errorf("%s: allowed for the ServiceAccount", what)
			}
			if !strings.Contains(err.Error(), guardName) {
				return fmt.Errorf("%s: refused, but not by %s: %v", what, guardName, err)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
	// The leader's repair: caBundle as it is, annotation in place (retried while the new
	// binding reaches the API server's RBAC cache).
	err = harness.Eventually(30*time.Second, 250*time.Millisecond, func() error {
		return edit(func(c *admissionregistrationv1.MutatingWebhookConfiguration) {})
	})
	if err != nil {
		t.Errorf("the leader's repair write as the ServiceAccount: %v", err)
	}
	refused("a changed caBundle", func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		ca, _ := testCA(t, koService+"."+ns+".svc")
		for i := range c.Webhooks {
			c.Webhooks[i].ClientConfig.CABundle = ca
		}
	})
	refused("no caBundle", func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		for i := range c.Webhooks {
			c.Webhooks[i].ClientConfig.CABundle = nil
		}
	})
	annotate := func(key, value string) func(*admissionregistrationv1.MutatingWebhookConfiguration) {
		return func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
			if c.Annotations == nil {
				c.Annotations = map[string]string{}
			}
			c.Annotations[key] = value
		}
	}
	refused("another Secret for cainjector", annotate(cmInjectAnnotation, ns+"/elsewhere"))
	refused("a Certificate for cainjector", annotate("cert-manager.io/inject-ca-from", ns+"/kube-overcommit"))
}
