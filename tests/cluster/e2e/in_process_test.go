package e2e

// Issue 18, in-process mode, on the real API server: the MutatingAdmissionPolicy that
// `kube-overcommit compile-inprocess` prints for a policy file, installed as it is, gives every
// node status write the result the webhook's rule gives (`kube-overcommit review` on the same
// AdmissionReview, with the same policy file): allocatable as stored (the API server stores
// quantities canonically, so the review's values are compared canonicalized) and the two
// annotations byte for byte. Replayed: registration, kubelet writes, a status writer sending
// the stored (inflated) object, a writer without annotations, a new raw value, a ratio change,
// opt-out and back, the policy deleted, overlapping policies, a usage policy's node (left to
// the webhook: stored as sent), the JSON annotations of earlier versions, and memory beyond
// 2^53 bytes (exact integer arithmetic, no float).

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"kube-overcommit/tests/cluster/install"
)

const ipPolicies = `
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: ip-batch}
spec:
  nodeSelector: {matchLabels: {ip: batch}}
  priority: 10
  nodeRatios: {cpu: "1.5", memory: "1.2", pods: "1"}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: ip-high}
spec:
  nodeSelector: {matchExpressions: [{key: ip-high, operator: Exists}]}
  priority: 50
  nodeRatios: {cpu: "3"}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: ip-big}
spec:
  nodeSelector: {matchLabels: {ip: big}}
  priority: 10
  nodeRatios: {cpu: "2.5", memory: "1.333333"}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: ip-usage}
spec:
  nodeSelector: {matchLabels: {ip: usage}}
  priority: 10
  nodeRatios: {cpu: "2"}
  usage: {targetUtilization: {cpu: "60%"}, maxRatios: {cpu: "4"}}
`

var (
	mapGVR = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingadmissionpolicies"}
	mabGVR = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingadmissionpolicybindings"}
)

const (
	rawKey     = "overcommit.dev/raw-allocatable"
	appliedKey = "overcommit.dev/applied"
)

// ipEnv is what every step needs: the binary, the policy file of the moment, clients.
type ipEnv struct {
	t      *testing.T
	ctx    context.Context
	bin    string
	dir    string
	file   string
	admin  kubernetes.Interface
	dyn    dynamic.Interface
	config *rest.Config
	// loaded: the compiled policy is in force, so registrations are compared too.
	loaded bool
	// refresh: --heartbeat-refresh of both compile-inprocess and review ("" is 5m).
	refresh string
}

func (e *ipEnv) refreshFlag() string {
	if e.refresh == "" {
		return "5m"
	}
	return e.refresh
}

// newIPEnv: the binary, clients, a context of 3 minutes; the compiled objects are deleted at the
// end.
func newIPEnv(t *testing.T, refresh string) *ipEnv {
	t.Helper()
	bin, err := install.Binary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	dyn, err := dynamic.NewForConfig(shared.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = dyn.Resource(mabGVR).Delete(bg, "nodes.overcommit.dev", metav1.DeleteOptions{})
		_ = dyn.Resource(mapGVR).Delete(bg, "nodes.overcommit.dev", metav1.DeleteOptions{})
	})
	e := &ipEnv{t: t, ctx: ctx, bin: bin, dir: t.TempDir(), admin: shared.Client, dyn: dyn, config: shared.RestConfig, refresh: refresh}
	e.noPolicyInForce()
	return e
}

// noPolicyInForce deletes the compiled objects and waits until the API server applies none.
// The API server unloads a deleted policy a while after the delete: a test starting meanwhile
// would see the previous test's policy inflate its nodes (as its own would), take it for its
// own, and check its steps against the wrong policy. The probe is a status write of a node
// that every compiled policy changes (its annotations name a policy that no longer selects
// it: inflated again by a policy selecting ip=batch, or cleaned up) and no policy keeps as sent.
func (e *ipEnv) noPolicyInForce() {
	e.t.Helper()
	for _, gvr := range []schema.GroupVersionResource{mabGVR, mapGVR} {
		if err := e.dyn.Resource(gvr).Delete(e.ctx, "nodes.overcommit.dev", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			e.t.Fatalf("deleting %s: %v", gvr.Resource, err)
		}
	}
	const probe = "ip-probe"
	stale := map[string]string{rawKey: "cpu=15890m", appliedKey: "policy=ip-gone;ratios=cpu=2"}
	_ = e.admin.CoreV1().Nodes().Delete(e.ctx, probe, metav1.DeleteOptions{})
	e.t.Cleanup(func() { _ = e.admin.CoreV1().Nodes().Delete(context.Background(), probe, metav1.DeleteOptions{}) })
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: probe, Labels: map[string]string{"ip": "batch"}},
		Status:     corev1.NodeStatus{Capacity: ipCapacity(), Allocatable: ipRaw()},
	}
	if _, err := e.admin.CoreV1().Nodes().Create(e.ctx, node, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("probe node: %v", err)
	}
	asNode := kubeletClient(e.t, e.config, probe)
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := func() (*corev1.Node, error) {
			n, err := e.admin.CoreV1().Nodes().Get(e.ctx, probe, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			n.Annotations = stale
			n.Status.Allocatable = ipRaw()
			return asNode.CoreV1().Nodes().UpdateStatus(e.ctx, n, metav1.UpdateOptions{})
		}()
		if err == nil && reflect.DeepEqual(ours(got.Annotations), stale) && sameResources(got.Status.Allocatable, ipRaw()) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("a compiled policy still in force 60s after its deletion (probe write: %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ipCapacity and ipRaw: a node's capacity and the kubelet's allocatable.
func ipCapacity() corev1.ResourceList {
	return corev1.ResourceList{"cpu": resource.MustParse("16"), "memory": resource.MustParse("64Gi"), "pods": resource.MustParse("110")}
}

func ipRaw() corev1.ResourceList {
	return corev1.ResourceList{"cpu": resource.MustParse("15890m"), "memory": resource.MustParse("62Gi"), "pods": resource.MustParse("110")}
}

func TestInProcessMatchesWebhook(t *testing.T) {
	onShared(t)
	e := newIPEnv(t, "")
	capacity, raw := ipCapacity(), ipRaw()
	e.policies(ipPolicies)
	// Registered before the compiled policy exists (so stored as sent): node A, and node D with
	// the JSON annotations of an earlier version, its allocatable inflated by them.
	a := e.create("ip-a", map[string]string{"ip": "batch"}, nil, capacity, raw)
	oldAnn := map[string]string{
		rawKey:     `{"cpu":"15890m","memory":"62Gi"}`,
		appliedKey: `{"policy":"ip-batch","ratios":{"cpu":"1.5","memory":"1.2","pods":"1"}}`,
	}
	inflated := corev1.ResourceList{"cpu": resource.MustParse("23835m"), "memory": resource.MustParse("79886391705"), "pods": resource.MustParse("110")}
	d := e.create("ip-d", map[string]string{"ip": "batch"}, oldAnn, capacity, inflated)
	e.install(ipPolicies)

	// Node A: the compounding sequences under ip-batch.
	// The policy takes effect once the API server has loaded it: kubelet writes until then.
	e.waitInflated(a, raw)
	e.kubelet(a, "heartbeat (kubelet's raw values again)", raw)
	e.write(a, "status writer sending the stored object", func(n *corev1.Node) {})
	e.write(a, "status writer without annotations", func(n *corev1.Node) {
		delete(n.Annotations, rawKey)
		delete(n.Annotations, appliedKey)
	})
	e.kubelet(a, "heartbeat after the annotation-less writer", raw)
	newRaw := corev1.ResourceList{"cpu": resource.MustParse("15800m"), "memory": resource.MustParse("61Gi"), "pods": resource.MustParse("110")}
	e.kubelet(a, "kubelet's new raw value", newRaw)
	e.write(a, "status writer after the new raw value", func(n *corev1.Node) {})

	// Node E: overlapping policies, the higher priority wins.
	overlap := e.create("ip-e", map[string]string{"ip": "batch", "ip-high": "yes"}, nil, capacity, raw)
	e.kubelet(overlap, "overlapping policies", raw)
	if got := e.get(overlap).Annotations[appliedKey]; !strings.HasPrefix(got, "policy=ip-high;") {
		t.Fatalf("overlap: applied %q, want ip-high", got)
	}

	// Node B: memory beyond 2^53 bytes (20Pi), a ratio with 6 decimals.
	bigCap := corev1.ResourceList{"cpu": resource.MustParse("512"), "memory": resource.MustParse("20Pi"), "pods": resource.MustParse("110")}
	bigRaw := corev1.ResourceList{"cpu": resource.MustParse("511900m"), "memory": resource.MustParse("21990232551423Ki"), "pods": resource.MustParse("110")}
	b := e.create("ip-b", map[string]string{"ip": "big"}, nil, bigCap, bigRaw)
	e.kubelet(b, "big memory: kubelet write", bigRaw)
	e.write(b, "big memory: writer without annotations", func(n *corev1.Node) {
		delete(n.Annotations, rawKey)
		delete(n.Annotations, appliedKey)
	})
	e.kubelet(b, "big memory: kubelet again", bigRaw)

	// Node F: whole cores (1000 x 2.5 printed "2500"), memory below 1024 bytes in binary
	// format ("1Ki" x 1.333333 = 1365 bytes, no binary suffix fits).
	smallRaw := corev1.ResourceList{"cpu": resource.MustParse("1000"), "memory": resource.MustParse("1Ki"), "pods": resource.MustParse("110")}
	f := e.create("ip-f", map[string]string{"ip": "big"}, nil, smallRaw, smallRaw)
	e.kubelet(f, "whole cores, small memory: kubelet write", smallRaw)
	e.write(f, "whole cores, small memory: writer sending the stored object", func(n *corev1.Node) {})

	// Node G: an annotation value that is not a quantity stops the evaluation: the write is
	// admitted unchanged (the webhook would ignore the annotations and inflate).
	e.loaded = false
	bad := map[string]string{rawKey: "cpu=garbage", appliedKey: "policy=ip-batch;ratios=cpu=1.5"}
	g := e.create("ip-g", map[string]string{"ip": "batch"}, bad, capacity, raw)
	e.loaded = true
	e.kubelet(g, "", raw)
	if n := e.get(g); !sameResources(n.Status.Allocatable, raw) || n.Annotations[rawKey] != "cpu=garbage" {
		t.Fatalf("unreadable annotation: %v %v, want the write as sent", canonical(n.Status.Allocatable), ours(n.Annotations))
	}

	// Node C: a usage policy wins: the compiled policy leaves the node to the webhook.
	e.loaded = false // the review answers for the webhook, which is not installed here
	c := e.create("ip-c", map[string]string{"ip": "usage"}, nil, capacity, raw)
	e.loaded = true
	e.kubelet(c, "", raw) // not compared with review: the webhook is not installed here
	if n := e.get(c); !sameResources(n.Status.Allocatable, raw) || n.Annotations[rawKey] != "" {
		t.Fatalf("usage policy's node changed in-process: %v %v", n.Status.Allocatable, n.Annotations)
	}

	// Node D: the JSON annotations of an earlier version, as stored before the policy existed.
	e.write(d, "JSON annotations: status writer sending the stored object", func(n *corev1.Node) {})
	e.kubelet(d, "JSON annotations: kubelet write", raw)

	// Ratio change (cpu 1.5 -> 2): the compiled policy is replaced.
	changed := strings.Replace(ipPolicies, `nodeRatios: {cpu: "1.5", memory: "1.2", pods: "1"}`, `nodeRatios: {cpu: "2", memory: "1.2", pods: "1"}`, 1)
	e.install(changed)
	e.untilMatches(a, "ratio change", newRaw)
	e.write(a, "status writer after the ratio change", func(n *corev1.Node) {})

	// Opt-out and back (the label set by an ordinary update, which the policy does not see).
	e.label(a, "overcommit.dev/disabled", "true")
	e.kubelet(a, "opted out", newRaw)
	if n := e.get(a); n.Annotations[rawKey] != "" || n.Annotations[appliedKey] != "" {
		t.Fatalf("opted out: annotations left: %v", n.Annotations)
	}
	e.label(a, "overcommit.dev/disabled", "")
	e.kubelet(a, "opted back in", newRaw)

	// The policy deleted: the next kubelet write restores the raw value, annotations removed.
	var kept []string
	for _, doc := range strings.Split(changed, "---") {
		if !strings.Contains(doc, "name: ip-batch}") {
			kept = append(kept, doc)
		}
	}
	e.install(strings.Join(kept, "---"))
	e.untilMatches(a, "policy deleted", newRaw)
	if n := e.get(a); n.Annotations[rawKey] != "" || !sameResources(n.Status.Allocatable, newRaw) {
		t.Fatalf("policy deleted: %v %v", n.Status.Allocatable, n.Annotations)
	}
}

// Quiet heartbeats in the compiled policy (`node::heartbeat`), on the real API server: kubelet
// status writes replayed on a node the compiled policy inflates, each compared with `review`
// (the same --heartbeat-refresh; its clock set to the heartbeat the kubelet sends, which is the
// compiled rule's clock), conditions byte for byte: a newer heartbeat only is kept and the write
// is a no-op in storage (resourceVersion unchanged), also with 24 conditions (the CEL's cost);
// a stored heartbeat older than the refresh period, a condition's status change, a condition
// the stored node lacks and refresh 0 go through. Heartbeat times are near the real now, each
// later than the last. The node has a Lease renewed by the test, so that the node lifecycle
// controller never marks it Unknown while its stored heartbeats stand still.
func TestInProcessQuietHeartbeats(t *testing.T) {
	onShared(t)
	e := newIPEnv(t, "5m")
	capacity, raw := ipCapacity(), ipRaw()
	base := time.Now().UTC().Truncate(time.Second)
	at := func(d time.Duration) metav1.Time { return metav1.NewTime(base.Add(d)) }
	transition := at(-time.Hour)
	// The kubelet's conditions, one heartbeat time in all (as the kubelet writes them).
	kubelet := func(heartbeat metav1.Time) []corev1.NodeCondition {
		condition := func(kind corev1.NodeConditionType, status corev1.ConditionStatus, reason, message string) corev1.NodeCondition {
			return corev1.NodeCondition{Type: kind, Status: status, Reason: reason, Message: message, LastHeartbeatTime: heartbeat, LastTransitionTime: transition}
		}
		return []corev1.NodeCondition{
			condition(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
			condition(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
			condition(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
			condition(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
		}
	}
	e.policies(ipPolicies)
	// Registered before the compiled policy exists, its heartbeats 10 minutes old.
	h := e.create("ip-h", map[string]string{"ip": "batch"}, nil, capacity, raw, kubelet(at(-10*time.Minute))...)
	e.renewLease(h)
	e.install(ipPolicies)
	e.waitInflated(h, raw) // heartbeats as stored meanwhile

	e.beat(h, "stored heartbeats older than the refresh period", raw, kubelet(at(-60*time.Second)), false)
	e.heartbeats(h, map[string]metav1.Time{"Ready": at(-60 * time.Second), "MemoryPressure": at(-60 * time.Second)})
	e.beat(h, "a newer heartbeat only", raw, kubelet(at(-50*time.Second)), true)
	e.heartbeats(h, map[string]metav1.Time{"Ready": at(-60 * time.Second), "MemoryPressure": at(-60 * time.Second)})

	pressure := kubelet(at(-40 * time.Second))
	pressure[0].Status, pressure[0].Reason, pressure[0].Message = corev1.ConditionTrue, "KubeletHasInsufficientMemory", "kubelet has insufficient memory available"
	pressure[0].LastTransitionTime = at(-40 * time.Second)
	e.beat(h, "a condition's status changes", raw, pressure, false)
	e.heartbeats(h, map[string]metav1.Time{"Ready": at(-60 * time.Second), "MemoryPressure": at(-40 * time.Second)})

	// 20 condition types the stored node lacks: 24 conditions in all from here on.
	many := func(heartbeat metav1.Time) []corev1.NodeCondition {
		out := kubelet(heartbeat)
		out[0] = pressure[0]
		out[0].LastHeartbeatTime = heartbeat
		for i := range 20 {
			out = append(out, corev1.NodeCondition{Type: corev1.NodeConditionType(fmt.Sprintf("example.com/Extra%02d", i)), Status: corev1.ConditionFalse, Reason: "Fine", LastHeartbeatTime: heartbeat, LastTransitionTime: at(-30 * time.Second)})
		}
		return out
	}
	e.beat(h, "conditions the stored node lacks", raw, many(at(-30*time.Second)), false)
	e.heartbeats(h, map[string]metav1.Time{"Ready": at(-60 * time.Second), "MemoryPressure": at(-40 * time.Second), "example.com/Extra19": at(-30 * time.Second)})
	e.beat(h, "24 conditions, a newer heartbeat only", raw, many(at(-20*time.Second)), true)

	// Refresh 0: compiled without the rule; every heartbeat goes through once it is loaded.
	e.refresh = "0"
	e.install(ipPolicies)
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; ; i++ {
		sent := at(-10*time.Second + time.Duration(i)*time.Second)
		got, want := e.put(h, func(n *corev1.Node) {
			n.Status.Allocatable = raw.DeepCopy()
			n.Status.Conditions = many(sent)
		})
		if stored := heartbeatOf(got, "Ready"); compareNodes(got, want) == "" && stored.Equal(&sent) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: refresh 0 not in force after 60s: %s", h, compareNodes(got, want))
		}
		time.Sleep(time.Second)
	}
	stored := heartbeatOf(e.get(h), "Ready")
	latest := stored.Add(time.Second)
	e.beat(h, "refresh 0: a newer heartbeat only", raw, many(metav1.NewTime(latest)), false)
	e.heartbeats(h, map[string]metav1.Time{"Ready": metav1.NewTime(latest), "MemoryPressure": metav1.NewTime(latest)})
}

// beat is a kubelet status write of its raw allocatable and `conditions`, checked against the
// review; `quiet`: the write must be a no-op in storage (same resourceVersion), else stored.
func (e *ipEnv) beat(name, what string, raw corev1.ResourceList, conditions []corev1.NodeCondition, quiet bool) {
	e.t.Helper()
	write := func() (stored, got *corev1.Node) {
		got, want := e.put(name, func(n *corev1.Node) {
			stored = n.DeepCopy()
			n.Status.Allocatable = raw.DeepCopy()
			n.Status.Conditions = append([]corev1.NodeCondition(nil), conditions...)
		})
		if diff := compareNodes(got, want); diff != "" {
			e.t.Fatalf("%s: %s: %s", name, what, diff)
		}
		return stored, got
	}
	stored, got := write()
	if quiet && got.ResourceVersion != stored.ResourceVersion && managedFieldsReordered(stored, got) {
		// The API server keeps managedFields sorted by operation, then time (seconds), then
		// manager, and undoes a write that changes only timestamps by comparing the entries
		// position by position. Our entry's new time moved it past another manager's (one that
		// wrote in the same second as our last write, or later: the node controller's taint,
		// the TTL annotation), so that write was stored; from then on ours is last and a
		// heartbeat-only write is a no-op again. It happens once per such foreign write.
		e.t.Logf("%s: %s: stored once, the managedFields entries reordered (%s -> %s); written again", name, what, managers(stored), managers(got))
		stored, got = write()
	}
	if unchanged := got.ResourceVersion == stored.ResourceVersion; unchanged != quiet {
		// What the write changed, managedFields included: the storage layer writes on any byte.
		e.t.Fatalf("%s: %s: resourceVersion %s -> %s, want a no-op in storage: %v; stored object changed:\n%s\nmanagers before: %s\nmanagers after: %s",
			name, what, stored.ResourceVersion, got.ResourceVersion, quiet, lineDiff(nodeJSON(stored), nodeJSON(got)), managers(stored), managers(got))
	}
	e.t.Logf("%s: %s: resourceVersion %s -> %s, Ready heartbeat %s (sent %s)", name, what, stored.ResourceVersion, got.ResourceVersion,
		heartbeatOf(got, "Ready").UTC().Format(time.RFC3339), conditions[len(conditions)-1].LastHeartbeatTime.UTC().Format(time.RFC3339))
}

// managedFieldsReordered: `got` is `stored` but for the order of its managedFields entries
// and their times (the same entries otherwise, in another order).
func managedFieldsReordered(stored, got *corev1.Node) bool {
	entry := func(m metav1.ManagedFieldsEntry) string {
		fields := ""
		if m.FieldsV1 != nil {
			fields = m.FieldsV1.String()
		}
		return strings.Join([]string{m.Manager, string(m.Operation), m.Subresource, m.APIVersion, fields}, "|")
	}
	var before, after []string
	for _, m := range stored.ManagedFields {
		before = append(before, entry(m))
	}
	for _, m := range got.ManagedFields {
		after = append(after, entry(m))
	}
	if reflect.DeepEqual(before, after) {
		return false // same order: not this case
	}
	sort.Strings(before)
	sort.Strings(after)
	a, b := stored.DeepCopy(), got.DeepCopy()
	a.ManagedFields, b.ManagedFields = nil, nil
	return reflect.DeepEqual(before, after) && nodeJSON(a) == nodeJSON(b)
}

// managers lists a node's managedFields entries: manager, operation, subresource, time.
func managers(n *corev1.Node) string {
	var out []string
	for _, m := range n.ManagedFields {
		at := ""
		if m.Time != nil {
			at = m.Time.UTC().Format(time.RFC3339)
		}
		out = append(out, fmt.Sprintf("%s/%s/%s@%s(%dB)", m.Manager, m.Operation, m.Subresource, at, len(m.FieldsV1.String())))
	}
	return strings.Join(out, " ")
}

// nodeJSON is a node as indented JSON without its resourceVersion and type, for lineDiff.
func nodeJSON(n *corev1.Node) string {
	n = n.DeepCopy()
	n.ResourceVersion = ""
	n.TypeMeta = metav1.TypeMeta{} // set by get, not by the API server's answers
	out, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return err.Error()
	}
	return string(out)
}

// lineDiff lists the lines of a and b that the other lacks ("-" a's, "+" b's), in order.
func lineDiff(a, b string) string {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	inA, inB := count(a), count(b)
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if inB[l] > 0 {
			inB[l]--
		} else {
			out = append(out, "- "+l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if inA[l] > 0 {
			inA[l]--
		} else {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// heartbeats checks the stored heartbeat of each condition type given.
func (e *ipEnv) heartbeats(name string, want map[string]metav1.Time) {
	e.t.Helper()
	n := e.get(name)
	for kind, beat := range want {
		if got := heartbeatOf(n, kind); !got.Equal(&beat) {
			e.t.Fatalf("%s: stored %s heartbeat %s, want %s", name, kind, got, beat)
		}
	}
}

func heartbeatOf(n *corev1.Node, kind string) metav1.Time {
	for _, c := range n.Status.Conditions {
		if string(c.Type) == kind {
			return c.LastHeartbeatTime
		}
	}
	return metav1.Time{}
}

// renewLease keeps kube-node-lease/NAME renewed every 5 s until the test's context ends: the
// node lifecycle controller then takes the node for alive whatever its stored heartbeats.
func (e *ipEnv) renewLease(name string) {
	e.t.Helper()
	leases := e.admin.CoordinationV1().Leases("kube-node-lease")
	seconds := int32(40)
	renew := func() error {
		now := metav1.NewMicroTime(time.Now())
		lease, err := leases.Get(e.ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = leases.Create(e.ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &seconds, RenewTime: &now},
			}, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		lease.Spec.RenewTime = &now
		_, err = leases.Update(e.ctx, lease, metav1.UpdateOptions{})
		return err
	}
	if err := renew(); err != nil {
		e.t.Fatalf("lease of %s: %v", name, err)
	}
	e.t.Cleanup(func() { _ = leases.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	go func() {
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-e.ctx.Done():
				return
			case <-tick.C:
				_ = renew() // a missed renewal is made up 5 s later, well within 40 s
			}
		}
	}()
}

// install compiles the policy file with the real binary and creates or replaces the objects.
func (e *ipEnv) install(policies string) {
	e.t.Helper()
	e.policies(policies)
	out, err := exec.Command(e.bin, "compile-inprocess", "--policy-file", e.file, "--webhook-config-name", "nodes.overcommit.dev", "--heartbeat-refresh", e.refreshFlag()).Output()
	if err != nil {
		e.t.Fatalf("compile-inprocess: %v", err)
	}
	var list struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.Unmarshal(out, &list); err != nil || len(list.Items) != 2 {
		e.t.Fatalf("compile-inprocess output: %v %s", err, out)
	}
	for i, gvr := range []schema.GroupVersionResource{mapGVR, mabGVR} {
		obj := &unstructured.Unstructured{Object: list.Items[i]}
		client := e.dyn.Resource(gvr)
		current, err := client.Get(e.ctx, obj.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = client.Create(e.ctx, obj, metav1.CreateOptions{})
		case err == nil:
			obj.SetResourceVersion(current.GetResourceVersion())
			_, err = client.Update(e.ctx, obj, metav1.UpdateOptions{})
		}
		if err != nil {
			e.t.Fatalf("installing %s: %v", gvr.Resource, err)
		}
	}
}

// policies writes the policy file the reviews (and the next install) read.
func (e *ipEnv) policies(policies string) {
	e.t.Helper()
	e.file = filepath.Join(e.dir, fmt.Sprintf("policies-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(e.file, []byte(policies), 0o600); err != nil {
		e.t.Fatal(err)
	}
}

// create registers a node as an admin would (CREATE: the compiled policy sees it) and checks
// the result against the review.
func (e *ipEnv) create(name string, labels, annotations map[string]string, capacity, allocatable corev1.ResourceList, conditions ...corev1.NodeCondition) string {
	e.t.Helper()
	_ = e.admin.CoreV1().Nodes().Delete(e.ctx, name, metav1.DeleteOptions{})
	e.t.Cleanup(func() { _ = e.admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	node := &corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Status:     corev1.NodeStatus{Capacity: capacity, Allocatable: allocatable, Conditions: conditions},
	}
	want := e.review(node, nil, "CREATE")
	stored, err := e.admin.CoreV1().Nodes().Create(e.ctx, node, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if e.loaded {
		if diff := compareNodes(stored, want); diff != "" {
			e.t.Fatalf("%s: registration: %s", name, diff)
		}
	}
	e.t.Logf("%s created: %v %v (review: %v %v)", name, canonical(stored.Status.Allocatable), ours(stored.Annotations), canonical(want.Status.Allocatable), ours(want.Annotations))
	return name
}

// waitInflated writes the kubelet's values until the result is the review's (the policy has
// been loaded), then checks that write against the review.
func (e *ipEnv) waitInflated(name string, raw corev1.ResourceList) {
	e.untilMatches(name, "policy loaded", raw)
	e.loaded = true
}

// untilMatches repeats a kubelet write until the stored node is what the review gives (the
// API server loads a changed policy within seconds).
func (e *ipEnv) untilMatches(name, what string, raw corev1.ResourceList) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, want := e.apply(name, raw)
		diff := compareNodes(got, want)
		if diff == "" {
			e.t.Logf("%s: %s: %v %v", name, what, canonical(got.Status.Allocatable), ours(got.Annotations))
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: %s: after 60s still %s", name, what, diff)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// kubelet writes the kubelet's raw allocatable (a status PUT as system:node:NAME) and checks the
// stored node against the review; with an empty `what` it only writes.
func (e *ipEnv) kubelet(name, what string, raw corev1.ResourceList) {
	e.t.Helper()
	got, want := e.apply(name, raw)
	if what == "" {
		return
	}
	if diff := compareNodes(got, want); diff != "" {
		e.t.Fatalf("%s: %s: %s", name, what, diff)
	}
	e.t.Logf("%s: %s: %v %v", name, what, canonical(got.Status.Allocatable), ours(got.Annotations))
}

func (e *ipEnv) apply(name string, raw corev1.ResourceList) (*corev1.Node, *corev1.Node) {
	return e.put(name, func(n *corev1.Node) { n.Status.Allocatable = raw.DeepCopy() })
}

// write is a status write by another writer in system:nodes that changes the stored object
// with `edit`, checked against the review.
func (e *ipEnv) write(name, what string, edit func(*corev1.Node)) {
	e.t.Helper()
	got, want := e.put(name, edit)
	if diff := compareNodes(got, want); diff != "" {
		e.t.Fatalf("%s: %s: %s", name, what, diff)
	}
	e.t.Logf("%s: %s: %v %v", name, what, canonical(got.Status.Allocatable), ours(got.Annotations))
}

// put reads the stored node, edits it, computes the review's answer for that write and makes
// it (PUT nodes/status as the node); it returns the stored result and the review's.
// The node controller writes new nodes too (taints, annotations): a write made stale by it (a
// conflict, or NodeRestriction refusing the stale taints the PUT carries) is retried from a
// fresh read, with a fresh review.
func (e *ipEnv) put(name string, edit func(*corev1.Node)) (*corev1.Node, *corev1.Node) {
	e.t.Helper()
	asNode := kubeletClient(e.t, e.config, name)
	var got, want *corev1.Node
	stale := func(err error) bool {
		return apierrors.IsConflict(err) || (apierrors.IsForbidden(err) && strings.Contains(err.Error(), "taints"))
	}
	err := retry.OnError(wait.Backoff{Steps: 20, Duration: 50 * time.Millisecond, Factor: 1.2}, stale, func() error {
		old := e.get(name)
		next := old.DeepCopy()
		edit(next)
		want = e.review(next, old, "UPDATE")
		var err error
		got, err = asNode.CoreV1().Nodes().UpdateStatus(e.ctx, next, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("%s: status write: %v", name, err)
	}
	return got, want
}

func (e *ipEnv) get(name string) *corev1.Node {
	e.t.Helper()
	n, err := e.admin.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	n.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}
	return n
}

// label sets (or with "" removes) a label by an ordinary update.
func (e *ipEnv) label(name, key, value string) {
	e.t.Helper()
	n := e.get(name)
	if value == "" {
		delete(n.Labels, key)
	} else {
		n.Labels[key] = value
	}
	if _, err := e.admin.CoreV1().Nodes().Update(e.ctx, n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// review runs `kube-overcommit review` (the webhook's rule) on the write and returns the
// object with its patch applied.
func (e *ipEnv) review(object, old *corev1.Node, operation string) *corev1.Node {
	e.t.Helper()
	request := map[string]any{
		"uid": "in-process", "operation": operation, "name": object.Name,
		"kind":     map[string]any{"group": "", "version": "v1", "kind": "Node"},
		"resource": map[string]any{"group": "", "version": "v1", "resource": "nodes"},
		"userInfo": map[string]any{"username": "system:node:" + object.Name, "groups": []string{"system:nodes"}},
		"object":   object,
	}
	if old != nil {
		request["oldObject"] = old
		request["subResource"] = "status"
	}
	body, err := json.Marshal(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
	if err != nil {
		e.t.Fatal(err)
	}
	args := []string{"review", "--policy-file", e.file, "--heartbeat-refresh", e.refreshFlag()}
	// The compiled rule's clock is the heartbeat the kubelet sends (one time in every
	// condition): the webhook's is set to it, so that both judge the same ages.
	if c := object.Status.Conditions; len(c) > 0 && !c[0].LastHeartbeatTime.IsZero() {
		args = append(args, "--now", c[0].LastHeartbeatTime.UTC().Format(time.RFC3339))
	}
	cmd := exec.Command(e.bin, append(args, "-")...)
	cmd.Stdin = bytes.NewReader(body)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		e.t.Fatalf("review: %v: %.2000s", err, stderr.String())
	}
	var answer struct {
		Response struct {
			Allowed bool   `json:"allowed"`
			Patch   string `json:"patch"`
		} `json:"response"`
	}
	if err := json.Unmarshal(out, &answer); err != nil || !answer.Response.Allowed {
		e.t.Fatalf("review answer: %v %s", err, out)
	}
	doc, err := json.Marshal(object)
	if err != nil {
		e.t.Fatal(err)
	}
	var tree map[string]any
	if err := json.Unmarshal(doc, &tree); err != nil {
		e.t.Fatal(err)
	}
	if answer.Response.Patch != "" {
		raw, err := base64.StdEncoding.DecodeString(answer.Response.Patch)
		if err != nil {
			e.t.Fatal(err)
		}
		var ops []struct {
			Op    string `json:"op"`
			Path  string `json:"path"`
			Value any    `json:"value"`
		}
		if err := json.Unmarshal(raw, &ops); err != nil {
			e.t.Fatal(err)
		}
		for _, op := range ops {
			if err := applyOp(tree, op.Op, op.Path, op.Value); err != nil {
				e.t.Fatalf("review patch %s: %v", raw, err)
			}
		}
	}
	doc, err = json.Marshal(tree)
	if err != nil {
		e.t.Fatal(err)
	}
	var want corev1.Node
	if err := json.Unmarshal(doc, &want); err != nil {
		e.t.Fatal(err)
	}
	return &want
}

// applyOp applies one JSON Patch operation on objects (the review's patches touch maps, and
// members of list items: /status/conditions/INDEX/lastHeartbeatTime).
func applyOp(tree map[string]any, op, path string, value any) error {
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for i := range parts {
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(parts[i], "~1", "/"), "~0", "~")
	}
	at := tree
	for i, p := range parts[:len(parts)-1] {
		if list, ok := at[p].([]any); ok && i+1 < len(parts)-1 {
			// A list item, then a member of it (the next part is the index).
			var index int
			if _, err := fmt.Sscan(parts[i+1], &index); err != nil || index < 0 || index >= len(list) {
				return fmt.Errorf("%s: no item %s", path, parts[i+1])
			}
			item, ok := list[index].(map[string]any)
			if !ok {
				return fmt.Errorf("%s: item %d is not an object", path, index)
			}
			rest := make([]string, 0, len(parts)-i-2)
			for _, r := range parts[i+2:] {
				rest = append(rest, strings.ReplaceAll(strings.ReplaceAll(r, "~", "~0"), "/", "~1"))
			}
			return applyOp(item, op, "/"+strings.Join(rest, "/"), value)
		}
		next, ok := at[p].(map[string]any)
		if !ok {
			if op != "add" {
				return fmt.Errorf("%s: no %s", path, p)
			}
			next = map[string]any{}
			at[p] = next
		}
		at = next
	}
	last := parts[len(parts)-1]
	switch op {
	case "add", "replace":
		at[last] = value
	case "remove":
		delete(at, last)
	default:
		return fmt.Errorf("op %s", op)
	}
	return nil
}

// compareNodes: allocatable by canonical text (as stored), our annotations and the conditions
// byte for byte.
func compareNodes(got, want *corev1.Node) string {
	var diffs []string
	if g, w := conditionsJSON(got), conditionsJSON(want); g != w {
		diffs = append(diffs, fmt.Sprintf("conditions %s, webhook's %s", g, w))
	}
	if g, w := canonical(got.Status.Allocatable), canonical(want.Status.Allocatable); !reflect.DeepEqual(g, w) {
		diffs = append(diffs, fmt.Sprintf("allocatable %v, webhook's %v", g, w))
	}
	if g, w := ours(got.Annotations), ours(want.Annotations); !reflect.DeepEqual(g, w) {
		diffs = append(diffs, fmt.Sprintf("annotations %q, webhook's %q", g, w))
	}
	return strings.Join(diffs, "; ")
}

func ours(annotations map[string]string) map[string]string {
	out := map[string]string{}
	for _, k := range []string{rawKey, appliedKey} {
		if v, ok := annotations[k]; ok {
			out[k] = v
		}
	}
	return out
}

// canonical is a resource list as the API server prints (and stores) it.
func canonical(l corev1.ResourceList) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		out[string(k)] = v.String()
	}
	return out
}

func conditionsJSON(n *corev1.Node) string {
	doc, err := json.Marshal(n.Status.Conditions)
	if err != nil {
		return err.Error()
	}
	return string(doc)
}
