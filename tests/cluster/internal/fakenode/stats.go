package fakenode

import (
	"strings"
	"sync"
	"time"
)

// WriteStats counts writes of one kind (node registration or status patch).
type WriteStats struct {
	Attempts  int64 `json:"attempts"`
	Failures  int64 `json:"failures"`
	Conflicts int64 `json:"conflicts"`
	// Slow counts writes whose latency exceeded the threshold (failed or not).
	Slow int64 `json:"slow"`
	// Mutated counts successful writes whose returned Node carried the mutation annotation.
	Mutated    int64 `json:"mutated"`
	NotMutated int64 `json:"notMutated"`
	// Overridden counts successful writes whose returned status.allocatable differs from the
	// one the fake kubelet sent (the webhook's effect, whatever the annotations say; an
	// annotation set once stays on the Node after the webhook stops mutating).
	Overridden    int64 `json:"overridden"`
	NotOverridden int64 `json:"notOverridden"`
	// X509Errors and WebhookErrors count failures whose message names a certificate problem or
	// a webhook (visible only with failurePolicy Fail; with Ignore the API server hides them).
	X509Errors     int64   `json:"x509Errors"`
	WebhookErrors  int64   `json:"webhookErrors"`
	TotalLatencyMs float64 `json:"totalLatencyMs"`
	MaxLatencyMs   float64 `json:"maxLatencyMs"`
	LastError      string  `json:"lastError,omitempty"`
	LastErrorAt    string  `json:"lastErrorAt,omitempty"`
}

func (w *WriteStats) record(latency, slowThreshold time.Duration, err error, mutated, overridden, conflict bool) {
	w.Attempts++
	ms := float64(latency) / float64(time.Millisecond)
	w.TotalLatencyMs += ms
	if ms > w.MaxLatencyMs {
		w.MaxLatencyMs = ms
	}
	if latency > slowThreshold {
		w.Slow++
	}
	if err != nil {
		w.Failures++
		if conflict {
			w.Conflicts++
		}
		msg := err.Error()
		if strings.Contains(msg, "x509") || strings.Contains(msg, "certificate") {
			w.X509Errors++
		}
		if strings.Contains(msg, "webhook") {
			w.WebhookErrors++
		}
		if len(msg) > 500 {
			msg = msg[:500]
		}
		w.LastError = msg
		w.LastErrorAt = time.Now().UTC().Format(time.RFC3339Nano)
		return
	}
	if mutated {
		w.Mutated++
	} else {
		w.NotMutated++
	}
	if overridden {
		w.Overridden++
	} else {
		w.NotOverridden++
	}
}

// NodeStats are the counters of one node.
type NodeStats struct {
	StatusWrites int64  `json:"statusWrites"`
	Failures     int64  `json:"failures"`
	Mutated      int64  `json:"mutated"`
	Skipped      int64  `json:"skipped"`
	LastWrite    string `json:"lastWrite,omitempty"`
}

// Stats is the JSON document a fake-nodes process publishes.
type Stats struct {
	Prefix        string    `json:"prefix"`
	Nodes         int       `json:"nodes"`
	PID           int       `json:"pid"`
	StartedAt     time.Time `json:"startedAt"`
	UpdatedAt     time.Time `json:"updatedAt"`
	SlowThreshold string    `json:"slowThreshold"`
	// Registrations are node CREATEs; StatusWrites are nodes/status PATCHes.
	Registrations WriteStats `json:"registrations"`
	StatusWrites  WriteStats `json:"statusWrites"`
	// Skipped counts status syncs that found nothing to write (status unchanged, report
	// interval not passed) — what an unmutated kubelet does most of the time.
	Skipped       int64                 `json:"skipped"`
	GetFailures   int64                 `json:"getFailures"`
	LeaseRenewals int64                 `json:"leaseRenewals"`
	LeaseFailures int64                 `json:"leaseFailures"`
	PodsStarted   int64                 `json:"podsStarted"`
	PodsDeleted   int64                 `json:"podsDeleted"`
	PodFailures   int64                 `json:"podFailures"`
	PerNode       map[string]*NodeStats `json:"perNode"`
}

type statsBox struct {
	mu sync.Mutex
	s  Stats
}

func (b *statsBox) with(f func(*Stats)) {
	b.mu.Lock()
	f(&b.s)
	b.mu.Unlock()
}

func (b *statsBox) snapshot() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.s
	s.PerNode = make(map[string]*NodeStats, len(b.s.PerNode))
	for k, v := range b.s.PerNode {
		c := *v
		s.PerNode[k] = &c
	}
	s.UpdatedAt = time.Now().UTC()
	return s
}
