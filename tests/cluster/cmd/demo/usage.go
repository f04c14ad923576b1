package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/internal/annotations"
	"kube-overcommit/tests/cluster/internal/fakenode"
)

// usagePolicyName is the name in usage-policy.yaml.
const usagePolicyName = "demo-usage"

// usageInterval is the replicas' --usage-interval in the demo (30 s by default).
const usageInterval = 5 * time.Second

func usagePolicyPath() string {
	return filepath.Join(harness.ModuleDir(), "cmd", "demo", "usage-policy.yaml")
}

// usageStep shows allocatable following the labelled nodes' usage, read from a real
// metrics-server through metrics.k8s.io: at 20% cpu usage the scheduler is given the headroom
// below the policy's 60% target and places the pending pods; at 70% allocatable falls to what is
// already requested (never below raw) and the scheduler places nothing more there.
func (d *demo) usageStep(ctx context.Context) error {
	d.step("Usage-aware allocatable: metrics-server, and the policy %s", relPath(usagePolicyPath()))
	ms, err := d.c.StartMetricsServer()
	if err != nil {
		return fmt.Errorf("metrics-server: %w", err)
	}
	d.metricsServer = ms
	d.info("metrics-server started: it scrapes each fake kubelet's resource metrics every 10 s; the replicas list NodeMetrics every %v", usageInterval)
	if err := d.applyFile(usagePolicyPath()); err != nil {
		return err
	}

	raw := resource.MustParse(d.o.cpu)
	if err := d.setUsage(ctx, raw.MilliValue()*20/100); err != nil {
		return err
	}
	d.info("the labelled nodes now use 20%% of their cpu; allocatable = requested + 60%% x raw - peak usage, between raw and raw x 3")
	if err := d.waitUsage(ctx, "every demo pod scheduled", func(free int64, _ *corev1.Node, pending int) bool {
		return pending == 0
	}); err != nil {
		return err
	}
	d.step("Allocatable at 20%% usage")
	if err := d.printNodes(ctx); err != nil {
		return err
	}
	bound, err := d.boundPods(ctx)
	if err != nil {
		return err
	}
	d.usageCounts = append(d.usageCounts, fmt.Sprintf("%d (usage 20%%: room below the target)", bound))

	if err := d.setUsage(ctx, raw.MilliValue()*70/100); err != nil {
		return err
	}
	d.info("the labelled nodes now use 70%% of their cpu, above the 60%% target")
	if err := d.waitUsage(ctx, "no free room on the labelled nodes", func(free int64, n *corev1.Node, _ int) bool {
		cpu := n.Status.Allocatable[corev1.ResourceCPU]
		return free < 0 || cpu.Cmp(raw) == 0
	}); err != nil {
		return err
	}
	d.step("Allocatable at 70%% usage")
	if err := d.printNodes(ctx); err != nil {
		return err
	}
	d.info("allocatable is now below what is requested there (never below raw): the scheduler places nothing more on")
	d.info("these nodes, and nothing is evicted. Metrics missing or stale: the policy's nodeRatios apply (docs/policy.md)")
	bound, err = d.boundPods(ctx)
	if err != nil {
		return err
	}
	d.usageCounts = append(d.usageCounts, fmt.Sprintf("%d (usage 70%%: none added)", bound))
	return nil
}

// setUsage scripts each labelled node's cpu usage (millicores) through the fake kubelet's usage
// annotation, which its resource metrics endpoint serves to metrics-server.
func (d *demo) setUsage(ctx context.Context, milli int64) error {
	// metrics-server drops a node whose memory reads 0: some memory use too.
	usage := fmt.Sprintf(`{"cpu":"%dm","memory":"1Gi"}`, milli)
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, fakenode.UsageAnnotation, usage)
	for i, name := range d.nodes {
		if i >= d.o.labelled {
			break
		}
		if _, err := d.c.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("usage of %s: %w", name, err)
		}
	}
	return nil
}

// waitUsage waits until every labelled node carries a usage-written allocatable (the applied
// annotation's usage member) and `done` holds for each of them, given its free room (allocatable
// minus the demo pods' requests on it, millicores) and the demo pods still pending.
func (d *demo) waitUsage(ctx context.Context, what string, done func(free int64, n *corev1.Node, pending int) bool) error {
	per := resource.MustParse(d.o.podCPU)
	start := time.Now()
	err := harness.Eventually(150*time.Second, 500*time.Millisecond, func() error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		pods, err := d.podsPerNode(ctx)
		if err != nil {
			return err
		}
		bound := 0
		for _, n := range pods {
			bound += n
		}
		pending := int(d.o.pods) - bound
		var waiting []string
		for i, name := range d.nodes {
			if i >= d.o.labelled {
				break
			}
			n, err := d.c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cpu := n.Status.Allocatable[corev1.ResourceCPU]
			free := cpu.MilliValue() - int64(pods[name])*per.MilliValue()
			applied, err := annotations.ParseApplied(n.Annotations[appliedAnnot])
			if err != nil || applied.Policy != usagePolicyName || !done(free, n, pending) {
				waiting = append(waiting, fmt.Sprintf("%s (cpu %s, %d demo pods)", name, cpu.String(), pods[name]))
			}
		}
		if len(waiting) > 0 {
			return fmt.Errorf("%s: %d pending; waiting for %s", what, pending, strings.Join(waiting, ", "))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	d.info("%s after %v", what, time.Since(start).Round(100*time.Millisecond))
	return nil
}

func (d *demo) boundPods(ctx context.Context) (int, error) {
	pods, err := d.podsPerNode(ctx)
	if err != nil {
		return 0, err
	}
	bound := 0
	for _, n := range pods {
		bound += n
	}
	return bound, nil
}
