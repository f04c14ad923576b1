package e2e

// Events (issue 33): what `kubectl describe` shows of a node and a policy once the leader has
// seen nodes overcommitted and restored. Checked inside the nudge tests, whose replicas run as
// the ServiceAccount under deploy/'s RBAC (the events Role in `default`).

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"kube-overcommit/tests/cluster/harness"
)

// describedWith waits until `kubectl describe KIND NAME` shows every string of want in its Events.
func describedWith(c *harness.Cluster, timeout time.Duration, kind, name string, want ...string) (string, error) {
	var out string
	err := harness.Eventually(timeout, 500*time.Millisecond, func() error {
		var err error
		out, err = c.Kubectl("describe", kind, name)
		if err != nil {
			return fmt.Errorf("kubectl describe %s %s: %v", kind, name, err)
		}
		_, events, found := strings.Cut(out, "\nEvents:")
		if !found {
			return fmt.Errorf("kubectl describe %s %s: no Events section", kind, name)
		}
		for _, w := range want {
			if !strings.Contains(events, w) {
				return fmt.Errorf("kubectl describe %s %s: no %q in its Events:%s", kind, name, w, events)
			}
		}
		return nil
	})
	return out, err
}

// eventsSection is the Events part of a describe output, for the log.
func eventsSection(out string) string {
	_, events, _ := strings.Cut(out, "\nEvents:")
	return "Events:" + events
}

// checkPolicyEvents: the policy's summary of its first inflation (after the ratio change too).
func checkPolicyEvents(t *testing.T, c *harness.Cluster, policy string, nodes int) {
	t.Helper()
	out, err := describedWith(c, 30*time.Second, "overcommitpolicy", policy,
		"NodesOvercommitted", fmt.Sprintf("%d nodes overcommitted", nodes))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl describe overcommitpolicy %s:\n%s", policy, eventsSection(out))
}

// checkNodeEvents: a node that was overcommitted, restored (relabelled out) and overcommitted
// again, then restored with the policy's deletion.
func checkNodeEvents(t *testing.T, c *harness.Cluster, node, policy string) {
	t.Helper()
	out, err := describedWith(c, 30*time.Second, "node", node,
		"Overcommitted", "allocatable overcommitted by policy "+policy,
		"Restored", "allocatable back to the kubelet's values (was policy "+policy+")")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl describe node %s:\n%s", node, eventsSection(out))
}

// checkEventsWritten: the leader wrote Events and none failed (RBAC, the API server's checks).
func checkEventsWritten(t *testing.T, m map[string]float64) error {
	t.Helper()
	created, failed := m[`kube_overcommit_events_total{result="created"}`], m[`kube_overcommit_events_total{result="failed"}`]
	if created < 4 || failed != 0 {
		return fmt.Errorf("leader: Events created %v (want >= 4), failed %v (want 0)", created, failed)
	}
	t.Logf("leader: Events created %v, series %v, filtered %v, dropped %v, failed %v", created,
		m[`kube_overcommit_events_total{result="series"}`], m[`kube_overcommit_events_total{result="filtered"}`],
		m[`kube_overcommit_events_total{result="dropped"}`], failed)
	return nil
}
