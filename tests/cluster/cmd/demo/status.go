package main

// What an operator sees of a policy and a node: the policy's status (kubectl get, -o wide) and
// the Events the leader writes (kubectl describe).

import (
	"context"
	"fmt"
	"strings"
	"time"

	"kube-overcommit/tests/cluster/harness"
)

// describeEvents waits until `kubectl describe KIND NAME` shows reason in its Events; the output.
func (d *demo) describeEvents(kind, name, reason string) (string, error) {
	var out string
	err := harness.Eventually(30*time.Second, 500*time.Millisecond, func() error {
		var err error
		if out, err = d.c.Kubectl("describe", kind, name); err != nil {
			return fmt.Errorf("kubectl describe %s %s: %w\n%s", kind, name, err, out)
		}
		if _, events, _ := strings.Cut(out, "\nEvents:"); !strings.Contains(events, reason) {
			return fmt.Errorf("kubectl describe %s %s: no %s Event yet", kind, name, reason)
		}
		return nil
	})
	return out, err
}

func (d *demo) printIndented(text string) {
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		fmt.Println("      " + l)
	}
}

// showPolicy prints `kubectl get overcommitpolicies -o wide` once the status counts every
// labelled node at the policy's generation, and the status and Events of `kubectl describe`.
func (d *demo) showPolicy(ctx context.Context, reason string) error {
	var table string
	want := fmt.Sprintf("%d", d.o.labelled)
	err := harness.Eventually(30*time.Second, 500*time.Millisecond, func() error {
		var err error
		if table, err = d.c.Kubectl("get", "overcommitpolicies", policyName, "-o",
			"custom-columns=NAME:.metadata.name,AT-GENERATION:.status.nodesAtGeneration"); err != nil {
			return err
		}
		if !strings.Contains(table, policyName+" ") || !strings.HasSuffix(strings.TrimSpace(table), " "+want) {
			return fmt.Errorf("status not yet at %s nodes:\n%s", want, table)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("policy status: %w", err)
	}
	if table, err = d.c.Kubectl("get", "overcommitpolicies", "-o", "wide"); err != nil {
		return err
	}
	d.info("kubectl get overcommitpolicies -o wide   (the status the leader writes)")
	d.printIndented(table)
	out, err := d.describeEvents("overcommitpolicy", policyName, reason)
	if err != nil {
		return err
	}
	if _, status, found := strings.Cut(out, "\nStatus:"); found {
		d.info("kubectl describe overcommitpolicy %s   (status and Events)", policyName)
		d.printIndented("Status:" + status)
	}
	return d.showNodeEvents(d.nodes[0], "Overcommitted")
}

// showNodeEvents prints the Events of `kubectl describe node` once reason is among them.
func (d *demo) showNodeEvents(node, reason string) error {
	out, err := d.describeEvents("node", node, reason)
	if err != nil {
		return err
	}
	_, events, _ := strings.Cut(out, "\nEvents:")
	d.info("kubectl describe node %s   (its Events)", node)
	d.printIndented("Events:" + events)
	return nil
}
