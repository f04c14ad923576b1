package e2e

// Issue 4 end-to-end tests: three replicas of the real kube-overcommit binary run as processes,
// read their certificates through `kcp secret-volume` (the kubelet's ..data swap, with a delay),
// and are reached by the API server through the Service resolver, ready only while /readyz says
// so. The leader bootstraps the CA, rotates leaves and CAs, survives being killed in every
// phase, and repairs the webhook configuration and both Secrets.
//
// Scale: LEADER_E2E_LEAF_ROTATIONS / LEADER_E2E_CA_ROTATIONS (default 5 and 1; `make
// test-e2e-leader-long` runs 20 and 3). The replicas are a local installation (package
// install): the binary is $KUBE_OVERCOMMIT_BIN, else target/release/kube-overcommit built by
// `cargo build --release --locked`.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
)

const (
	koService      = "kube-overcommit"
	koServingName  = "kube-overcommit-tls"
	koCAName       = "kube-overcommit-ca"
	koLeaseName    = "kube-overcommit-leader"
	koVolumeDelay  = 2 * time.Second
	koLeaseTTL     = "6s"
	koLeaseRenew   = "2s"
	koPropagation  = "5s" // longer than koVolumeDelay + the server's reload
	koNodeLabelKey = "e2e-leader"
)

// replicaSet is the test's local installation (package install): 3 replicas of the real
// binary with their Secret volumes, registered as backends of the Service.
type replicaSet struct {
	t  *testing.T
	ns string
	in *install.Installation
	// policy is the policy file the replicas read (--policy-file).
	policy string
}

// startReplicas starts n replicas in a fresh namespace with a policy doubling cpu on the
// test's nodes, and stops them (then removes the configuration they kept) at the end.
func startReplicas(t *testing.T, ctx context.Context, ns string, n int, extra ...string) *replicaSet {
	t.Helper()
	return startReplicasWithPolicy(t, ctx, ns, n, `  nodeRatios:
    cpu: "2"
`, extra...)
}

// startReplicasWithPolicy: startReplicas with `spec` (YAML lines under spec:, after the node
// selector) as the policy of the test's nodes.
func startReplicasWithPolicy(t *testing.T, ctx context.Context, ns string, n int, spec string, extra ...string) *replicaSet {
	t.Helper()
	// (Namespaces are unique per run: a deleted one lingers while it is finalized.)
	createNamespace(t, ctx, ns)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	doc := fmt.Sprintf(`apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata:
  name: %s
spec:
  nodeSelector:
    matchLabels:
      %s: %s
%s`, ns, koNodeLabelKey, ns, spec)
	if err := os.WriteFile(policy, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := install.Install(ctx, shared, install.Options{
		Namespace:     ns,
		Replicas:      n,
		WebhookConfig: ns,
		SecretDelay:   koVolumeDelay,
		Args: append([]string{
			"--cert-reload-interval", "1s",
			"--policy-file", policy,
			"--webhook-config-name", ns,
			"--lease-ttl", koLeaseTTL,
			"--lease-renew", koLeaseRenew,
			"--check-interval", "1s",
			"--propagation-delay", koPropagation,
			"--shutdown-grace", "5s",
		}, extra...),
	})
	if err != nil {
		t.Fatal(err)
	}
	rs := &replicaSet{t: t, ns: ns, in: in, policy: policy}
	t.Cleanup(func() {
		// The leader kept the configuration in place; with every replica gone, remove it so
		// that no other test's nodes are reviewed by a webhook without backends.
		if err := in.Uninstall(context.Background(), false); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			for _, p := range in.LogPaths() {
				tailLog(t, p, 30)
			}
		}
	})
	return rs
}

func tailLog(t *testing.T, path string, n int) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	t.Logf("--- %s (last %d lines)\n%s", filepath.Base(path), len(lines), strings.Join(lines, "\n"))
}

func fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// pemCerts parses a PEM bundle.
func pemCerts(data []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

// pki is what the API server holds: both Secrets and the caBundle.
type pki struct {
	leaf      *x509.Certificate
	servingCA []*x509.Certificate
	current   *x509.Certificate
	next      *x509.Certificate
	phase     string
	bundle    []*x509.Certificate
	// keys: the private keys in both Secrets (tls.key, ca.key, next-ca.key), PEM.
	keys [][]byte
}

func readPKI(ctx context.Context, ns string) (pki, error) {
	var p pki
	s, err := shared.Client.CoreV1().Secrets(ns).Get(ctx, koServingName, metav1.GetOptions{})
	if err != nil {
		return p, err
	}
	if certs := pemCerts(s.Data["tls.crt"]); len(certs) > 0 {
		p.leaf = certs[0]
	}
	p.servingCA = pemCerts(s.Data["ca.crt"])
	p.keys = append(p.keys, s.Data["tls.key"])
	ca, err := shared.Client.CoreV1().Secrets(ns).Get(ctx, koCAName, metav1.GetOptions{})
	if err != nil {
		return p, err
	}
	if certs := pemCerts(ca.Data["ca.crt"]); len(certs) > 0 {
		p.current = certs[0]
	}
	if certs := pemCerts(ca.Data["next-ca.crt"]); len(certs) > 0 {
		p.next = certs[0]
	}
	p.phase = ca.Annotations["overcommit.dev/ca-rotation-phase"]
	p.keys = append(p.keys, ca.Data["ca.key"], ca.Data["next-ca.key"])
	cfg, err := shared.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		return p, err
	}
	for _, w := range cfg.Webhooks {
		p.bundle = pemCerts(w.ClientConfig.CABundle)
		break
	}
	return p, nil
}

// settled: no rotation running, the leaf chains to the only CA, and every replica is ready.
func (rs *replicaSet) settled(ctx context.Context) error {
	p, err := readPKI(ctx, rs.ns)
	if err != nil {
		return err
	}
	if p.phase != "" || p.next != nil || p.current == nil || p.leaf == nil {
		return fmt.Errorf("rotation still running (phase %q)", p.phase)
	}
	if len(p.bundle) != 1 || !p.bundle[0].Equal(p.current) {
		return fmt.Errorf("caBundle has %d CAs, not just the current one", len(p.bundle))
	}
	if err := p.leaf.CheckSignatureFrom(p.current); err != nil {
		return fmt.Errorf("leaf not from the current CA: %v", err)
	}
	for _, r := range rs.in.Replicas() {
		if r.Alive() && !r.Ready() {
			return fmt.Errorf("replica %s not ready", r.Identity())
		}
	}
	return nil
}

// webhookCounts is what the API server's own /metrics say about this project's webhooks.
type webhookCounts struct {
	// FailOpen: apiserver_admission_webhook_fail_open_count (calls that failed and were ignored).
	FailOpen float64
	// Answered: apiserver_admission_webhook_request_total with code 200.
	Answered float64
	// Other: apiserver_admission_webhook_request_total with any other code.
	Other float64
}

func apiserverWebhookCounts(ctx context.Context) (webhookCounts, error) {
	var c webhookCounts
	raw, err := shared.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return c, err
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `overcommit.dev"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return c, fmt.Errorf("metric line %q: %v", line, err)
		}
		switch {
		case strings.HasPrefix(line, "apiserver_admission_webhook_fail_open_count{"):
			c.FailOpen += v
		case strings.HasPrefix(line, "apiserver_admission_webhook_request_total{") && strings.Contains(line, `code="200"`):
			c.Answered += v
		case strings.HasPrefix(line, "apiserver_admission_webhook_request_total{"):
			c.Other += v
		}
	}
	return c, sc.Err()
}

// mutationWatch records every stored version of the test's nodes: once a node is inflated,
// any stored status with the kubelet's raw cpu means a status write that was not mutated.
type mutationWatch struct {
	mu        sync.Mutex
	inflated  map[string]bool
	versions  int
	unmutated []string
	stop      func()
}

func watchMutations(t *testing.T, ctx context.Context, label, raw, want string) *mutationWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	m := &mutationWatch{inflated: map[string]bool{}, stop: cancel}
	w, err := shared.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{LabelSelector: label})
	if err != nil {
		t.Fatal(err)
	}
	wantQ, rawQ := resource.MustParse(want), resource.MustParse(raw)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			cpu := n.Status.Allocatable[corev1.ResourceCPU]
			m.mu.Lock()
			m.versions++
			switch {
			case cpu.Cmp(wantQ) == 0:
				m.inflated[n.Name] = true
			case m.inflated[n.Name] && cpu.Cmp(rawQ) == 0:
				m.unmutated = append(m.unmutated, fmt.Sprintf("%s rv %s at %s", n.Name, n.ResourceVersion, time.Now().Format(time.RFC3339Nano)))
			}
			m.mu.Unlock()
		}
	}()
	t.Cleanup(cancel)
	return m
}

func (m *mutationWatch) check(nodes int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.inflated) < nodes {
		return fmt.Errorf("%d of %d nodes inflated so far", len(m.inflated), nodes)
	}
	if len(m.unmutated) > 0 {
		return fmt.Errorf("%d status writes stored unmutated: %v", len(m.unmutated), m.unmutated)
	}
	return nil
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func startLeaderNodes(t *testing.T, ns string) *harness.FakeNodes {
	t.Helper()
	return startTestNodes(t, ns, 2, "--labels="+koNodeLabelKey+"="+ns, "--cpu=8", "--allocatable-cpu=4", "--images=50",
		// A status write every second from each node, changed or not: steady review traffic.
		"--status-update-frequency=1s", "--status-report-frequency=1s")
}

// startTestNodes runs count fake nodes <prefix>-<i> with `kcp fake-nodes` args; stopped and
// deleted at the end of the test.
func startTestNodes(t *testing.T, prefix string, count int, args ...string) *harness.FakeNodes {
	t.Helper()
	nodes, err := shared.StartFakeNodes(harness.FakeNodesOptions{Prefix: prefix, Count: count, Args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = nodes.Stop()
		for _, n := range nodes.Names {
			_ = shared.Client.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	return nodes
}

// From an empty namespace, the leader creates the CA, the serving Secret and the webhook
// configuration; every replica becomes ready and the API server's reviews reach them. Then
// leaf and CA rotations run back to back, with lifetimes of seconds, while fake nodes write
// status every second: no review fails open and every stored status is mutated.
func TestLeaderBootstrapAndRotations(t *testing.T) {
	onShared(t)
	leafWant := envInt("LEADER_E2E_LEAF_ROTATIONS", 5)
	caWant := envInt("LEADER_E2E_CA_ROTATIONS", 1)
	// Leaves live 15 s (rotated every ~10 s); a CA lives 60 s beyond its 60 s backdating, so
	// it is rotated every ~20 s plus the time the rotation takes.
	budget := time.Duration(leafWant*12+caWant*40+120) * time.Second
	ctx := harness.Context(t, budget+2*time.Minute)
	ns := uniqueName("ko-rotate")
	rs := startReplicas(t, ctx, ns, 3, "--leaf-validity", "15s", "--ca-validity", "60s")

	// Bootstrap: all three ready, the API server sees three ready backends.
	err := harness.Eventually(90*time.Second, 250*time.Millisecond, func() error {
		if err := rs.settled(ctx); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	if err := shared.WaitBackendsReady(ns, koService, 3, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if rs.in.LeaderIdentity(ctx) == "" {
		t.Fatal("no leader holds the Lease")
	}

	// Nodes start only now, so every write they make has a webhook to go through.
	m := watchMutations(t, ctx, koNodeLabelKey+"="+ns, "4", "8")
	nodes := startLeaderNodes(t, ns)
	if err := harness.Eventually(60*time.Second, 250*time.Millisecond, func() error { return m.check(len(nodes.Names)) }); err != nil {
		t.Fatalf("nodes not inflated: %v", err)
	}
	before, err := apiserverWebhookCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var statsBefore harness.FakeNodeStats
	err = harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		var err error
		statsBefore, err = nodes.Stats()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	leaves := map[string]bool{}
	cas := map[string]bool{}
	keys := map[string]bool{}
	var firstCA string
	err = harness.Eventually(budget, 200*time.Millisecond, func() error {
		p, err := readPKI(ctx, ns)
		if err != nil {
			return err
		}
		for _, k := range p.keys {
			if len(k) > 0 {
				keys[string(k)] = true
			}
		}
		if p.leaf != nil {
			leaves[fingerprint(p.leaf.Raw)] = true
		}
		if p.current != nil && p.phase == "" {
			fp := fingerprint(p.current.Raw)
			if firstCA == "" {
				firstCA = fp
			}
			cas[fp] = true
		}
		if err := m.check(len(nodes.Names)); err != nil {
			return fmt.Errorf("%w (stop)", err)
		}
		if len(leaves)-1 < leafWant || len(cas)-1 < caWant {
			return fmt.Errorf("%d leaf rotations of %d, %d CA rotations of %d", len(leaves)-1, leafWant, len(cas)-1, caWant)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The last rotation settles, and the API server still sees all three replicas ready.
	if err := harness.Eventually(60*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatal(err)
	}
	if err := m.check(len(nodes.Names)); err != nil {
		t.Fatal(err)
	}
	// The fake kubelets count a write once it has returned, and the API server counts its webhook
	// call before the write returns: the writes read first all have their calls in the counts
	// read next. (Read the other way round, a write returning between the two reads counted
	// without its call: once, 85 calls for 86 writes.)
	st, err := nodes.Stats()
	if err != nil {
		t.Fatal(err)
	}
	after, err := apiserverWebhookCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.FailOpen != before.FailOpen || after.Other != before.Other {
		t.Fatalf("reviews failed during rotations: API server webhook counts went from %+v to %+v", before, after)
	}
	if st.StatusWrites.Failures != statsBefore.StatusWrites.Failures {
		t.Fatalf("status writes failed during rotations: %+v", st.StatusWrites)
	}
	m.mu.Lock()
	versions := m.versions
	m.mu.Unlock()
	// The flat counts mean something only if the API server called the webhook throughout.
	writes := st.StatusWrites.Attempts - statsBefore.StatusWrites.Attempts
	if answered := after.Answered - before.Answered; answered < float64(writes) || writes == 0 {
		t.Fatalf("%v reviews answered for %d status writes", answered, writes)
	}
	t.Logf("%d leaf rotations, %d CA rotations, %d status writes (%d stored node versions), %v reviews answered, fail-open count flat at %v",
		len(leaves)-1, len(cas)-1, writes, versions, after.Answered-before.Answered, after.FailOpen)
	// Every key the leader generated or read during bootstrap and all those rotations (each
	// serving and CA key seen in the Secrets) appears in no replica's log, in any encoding.
	if len(keys) < leafWant+caWant+1 {
		t.Fatalf("only %d distinct private keys seen in the Secrets over %d leaf and %d CA rotations", len(keys), leafWant, caWant)
	}
	checkLogsFreeOfKeys(t, rs.in.LogPaths(), keys)
}

// keyLeaks is what a log line holding key material would contain: the PEM header, the header of a
// Secret's base64-encoded data, Rust's Debug of key bytes, and for each key its DER (PEM body
// lines, base64, hex) and its private scalar (hex, base64).
func keyLeaks(t *testing.T, keys map[string]bool) map[string]string {
	t.Helper()
	leaks := map[string]string{
		"PRIVATE KEY": "a PEM private key header",
		base64.StdEncoding.EncodeToString([]byte("-----BEGIN PRIVATE KEY-----"))[:32]: "a base64-encoded PEM private key (Secret data)",
		"80, 82, 73, 86, 65, 84, 69, 32, 75, 69, 89":                                  "the bytes of \"PRIVATE KEY\" as a Debug list",
	}
	for k := range keys {
		block, _ := pem.Decode([]byte(k))
		if block == nil {
			t.Fatalf("a Secret holds a private key that is not PEM (%d bytes)", len(k))
		}
		id := fingerprint(block.Bytes)[:12]
		for i, line := range strings.Split(strings.TrimSpace(string(pem.EncodeToMemory(&pem.Block{Type: block.Type, Bytes: block.Bytes}))), "\n") {
			if !strings.HasPrefix(line, "-----") {
				leaks[line] = fmt.Sprintf("line %d of the PEM of key %s", i, id)
			}
		}
		leaks[base64.StdEncoding.EncodeToString(block.Bytes)] = "the DER of key " + id + " in base64"
		leaks[hex.EncodeToString(block.Bytes)] = "the DER of key " + id + " in hex"
		parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			t.Fatalf("key %s: %v", id, err)
		}
		ec, ok := parsed.(*ecdsa.PrivateKey)
		if !ok {
			t.Fatalf("key %s is a %T, not ECDSA", id, parsed)
		}
		scalar, err := ec.Bytes()
		if err != nil {
			t.Fatalf("key %s: %v", id, err)
		}
		leaks[hex.EncodeToString(scalar)] = "the private scalar of key " + id + " in hex"
		leaks[base64.StdEncoding.EncodeToString(scalar)] = "the private scalar of key " + id + " in base64"
		leaks[base64.RawStdEncoding.EncodeToString(scalar)] = "the private scalar of key " + id + " in unpadded base64"
	}
	return leaks
}

// checkLogsFreeOfKeys fails if any replica log holds any form of any of keys (SECURITY.md: key
// material is never logged).
func checkLogsFreeOfKeys(t *testing.T, logs []string, keys map[string]bool) {
	t.Helper()
	leaks := keyLeaks(t, keys)
	// The patterns find a key even without its PEM armour: its body, joined, as one base64 string.
	for k := range keys {
		block, _ := pem.Decode([]byte(k))
		if found := leaksIn([]byte("key="+base64.StdEncoding.EncodeToString(block.Bytes)), leaks); len(found) == 0 {
			t.Fatal("the leak patterns do not find a key's base64 DER")
		}
	}
	var total int
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		total += len(data)
		for _, what := range leaksIn(data, leaks) {
			t.Errorf("%s holds %s", filepath.Base(path), what)
		}
	}
	if len(logs) == 0 || total == 0 {
		t.Fatalf("no replica logs to check (%d files, %d bytes)", len(logs), total)
	}
	t.Logf("%d replica logs (%d bytes) hold none of %d patterns of %d private keys", len(logs), total, len(leaks), len(keys))
}

// leaksIn: what of leaks (pattern -> description) data holds.
func leaksIn(data []byte, leaks map[string]string) []string {
	var out []string
	for pattern, what := range leaks {
		if i := bytes.Index(data, []byte(pattern)); i >= 0 {
			out = append(out, fmt.Sprintf("%s (at byte %d)", what, i))
		}
	}
	return out
}

// waitPhase waits for the CA rotation phase (and a next CA) to be what is asked.
func waitPhase(ctx context.Context, ns, phase string, timeout time.Duration) (pki, error) {
	var p pki
	err := harness.Eventually(timeout, 100*time.Millisecond, func() error {
		var err error
		p, err = readPKI(ctx, ns)
		if err != nil {
			return err
		}
		if p.phase != phase {
			return fmt.Errorf("phase %q, waiting for %q", p.phase, phase)
		}
		return nil
	})
	return p, err
}

// killLeader SIGKILLs the current leader, waits until another replica leads, then starts the
// killed one again (as a new, non-leading process with the same identity, like a pod restart).
func (rs *replicaSet) killLeader(ctx context.Context, phase string) (string, string, error) {
	id := rs.in.LeaderIdentity(ctx)
	r := rs.in.ByIdentity(id)
	if r == nil {
		return "", "", fmt.Errorf("leader %q is not one of ours", id)
	}
	if err := r.Kill(); err != nil {
		return id, "", err
	}
	// The kill must have landed inside the phase (read after it: nobody else writes yet).
	if p, err := readPKI(ctx, rs.ns); err != nil || p.phase != phase {
		return id, "", fmt.Errorf("leader killed in phase %q, wanted %q (%v)", p.phase, phase, err)
	}
	var next string
	err := harness.Eventually(60*time.Second, 100*time.Millisecond, func() error {
		next = rs.in.LeaderIdentity(ctx)
		if next == "" || next == id {
			return fmt.Errorf("no new leader yet (lease holder %q)", next)
		}
		return nil
	})
	if serr := r.Start(); serr != nil && err == nil {
		err = serr
	}
	return id, next, err
}

// The leader is killed in each phase of a forced CA rotation (just published; switched, while
// waiting for the replicas), and whoever leads next finishes it.
func TestLeaderKilledInEachPhaseOfCARotation(t *testing.T) {
	onShared(t)
	ctx := harness.Context(t, 6*time.Minute)
	ns := uniqueName("ko-failover")
	rs := startReplicas(t, ctx, ns, 3, "--leaf-validity", "10m", "--ca-validity", "1h")
	if err := harness.Eventually(90*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	before, err := readPKI(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	// Nodes write meanwhile; a SIGKILLed replica costs reviews that fail open until the
	// resolver drops it (logged, not asserted: it shows the API server's counters move).
	nodes := startLeaderNodes(t, ns)
	countsBefore, err := apiserverWebhookCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rotate := exec.Command(rs.in.Binary, "rotate", "--ca", "--namespace", ns, "--wait", "60s")
	rotate.Env = append(os.Environ(), "KUBECONFIG="+shared.Kubeconfig)
	out, err := rotate.CombinedOutput()
	if err != nil {
		t.Fatalf("rotate --ca: %v: %s", err, out)
	}
	p, err := waitPhase(ctx, ns, "published", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	next := p.next
	id, next1, err := rs.killLeader(ctx, "published")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed leader %s in phase published; %s leads", id, next1)
	if _, err := waitPhase(ctx, ns, "switched", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	id, next2, err := rs.killLeader(ctx, "switched")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed leader %s in phase switched; %s leads", id, next2)
	if err := harness.Eventually(120*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatal(err)
	}
	after, err := readPKI(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if !after.current.Equal(next) || after.current.Equal(before.current) {
		t.Fatal("the rotation did not end on the CA it published")
	}
	countsAfter, err := apiserverWebhookCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := nodes.Stats()
	t.Logf("API server webhook counts %+v -> %+v; fake node status writes %+v", countsBefore, countsAfter, st.StatusWrites)
	if err := shared.WaitBackendsReady(ns, koService, 3, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// The webhook configuration and both Secrets, deleted or edited by hand, are repaired, and
// every replica is ready again.
func TestLeaderRepairsHandEdits(t *testing.T) {
	onShared(t)
	ctx := harness.Context(t, 6*time.Minute)
	ns := uniqueName("ko-repair")
	rs := startReplicas(t, ctx, ns, 3, "--leaf-validity", "10m", "--ca-validity", "1h")
	if err := harness.Eventually(90*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	mwc := shared.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	secrets := shared.Client.CoreV1().Secrets(ns)
	repairedWithin := func(what string, limit time.Duration, f func() error) {
		t.Helper()
		repairedWithin(t, what, limit, f)
	}

	// Configuration edited: failurePolicy, timeout, caBundle, rules.
	cfg, err := mwc.Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	orig := cfg.DeepCopy()
	cfg.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Fail)
	thirty := int32(30)
	cfg.Webhooks[0].TimeoutSeconds = &thirty
	cfg.Webhooks[1].ClientConfig.CABundle = []byte("garbage")
	cfg.Webhooks[1].Rules = cfg.Webhooks[1].Rules[:0]
	if _, err := mwc.Update(ctx, cfg, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	repairedWithin("edited configuration", 5*time.Second, func() error {
		got, err := mwc.Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i, w := range got.Webhooks {
			o := orig.Webhooks[i]
			if *w.FailurePolicy != *o.FailurePolicy || *w.TimeoutSeconds != *o.TimeoutSeconds ||
				!bytes.Equal(w.ClientConfig.CABundle, o.ClientConfig.CABundle) || len(w.Rules) != len(o.Rules) {
				return fmt.Errorf("webhook %s still drifted", w.Name)
			}
		}
		return nil
	})

	// Configuration deleted.
	if err := mwc.Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	repairedWithin("deleted configuration", 5*time.Second, func() error {
		_, err := mwc.Get(ctx, ns, metav1.GetOptions{})
		return err
	})

	// Serving Secret deleted: a new leaf from the same CA.
	if err := secrets.Delete(ctx, koServingName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	repairedWithin("deleted serving Secret", 5*time.Second, func() error {
		_, err := secrets.Get(ctx, koServingName, metav1.GetOptions{})
		return err
	})
	if err := harness.Eventually(60*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatal(err)
	}

	// Serving Secret edited: a key that does not match.
	s, err := secrets.Get(ctx, koServingName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data["tls.crt"] = []byte("not a certificate")
	if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	repairedWithin("edited serving Secret", 5*time.Second, func() error {
		got, err := secrets.Get(ctx, koServingName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(pemCerts(got.Data["tls.crt"])) == 0 {
			return fmt.Errorf("tls.crt still broken")
		}
		return nil
	})

	// CA Secret deleted: a new CA, with the orphaned one kept trusted until every replica
	// serves a leaf from the new one. Nodes write status meanwhile: no review may fail.
	nodes := startLeaderNodes(t, ns)
	if err := harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		st, err := nodes.Stats()
		if err == nil && st.StatusWrites.Attempts == 0 {
			return fmt.Errorf("no status write yet")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	countsBefore, err := apiserverWebhookCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before, err := readPKI(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := secrets.Delete(ctx, koCAName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	repairedWithin("deleted CA Secret", 5*time.Second, func() error {
		_, err := secrets.Get(ctx, koCAName, metav1.GetOptions{})
		return err
	})
	if err := harness.Eventually(90*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatal(err)
	}
	after, err := readPKI(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if after.current.Equal(before.current) {
		t.Fatal("the CA did not change after its Secret was deleted")
	}

	// CA Secret edited to garbage.
	ca, err := secrets.Get(ctx, koCAName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca.Data["ca.crt"] = []byte("garbage")
	if _, err := secrets.Update(ctx, ca, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	repairedWithin("edited CA Secret", 5*time.Second, func() error {
		got, err := secrets.Get(ctx, koCAName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(pemCerts(got.Data["ca.crt"])) == 0 {
			return fmt.Errorf("ca.crt still broken")
		}
		return nil
	})
	if err := harness.Eventually(90*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatal(err)
	}
	if err := shared.WaitBackendsReady(ns, koService, 3, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	countsAfter, err := apiserverWebhookCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if countsAfter.FailOpen != countsBefore.FailOpen || countsAfter.Other != countsBefore.Other || countsAfter.Answered <= countsBefore.Answered {
		t.Fatalf("CA Secret recovery: API server webhook counts went from %+v to %+v", countsBefore, countsAfter)
	}
	t.Logf("CA Secret deleted and broken: recovered with %v reviews answered and none failed", countsAfter.Answered-countsBefore.Answered)
}

// repairedWithin fails the test unless f succeeds within limit, and logs how long it took.
func repairedWithin(t *testing.T, what string, limit time.Duration, f func() error) {
	t.Helper()
	start := time.Now()
	if err := harness.Eventually(limit, 100*time.Millisecond, f); err != nil {
		t.Fatalf("%s: not repaired within %v: %v", what, limit, err)
	}
	t.Logf("%s: repaired in %v", what, time.Since(start).Round(time.Millisecond))
}

// uniqueName: namespaces of earlier runs may still be terminating.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()/1e6%1000000)
}
